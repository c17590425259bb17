// Errors shaped as the official `openai` package's: APIError carries the HTTP status, the error
// object of the answer ({message, type, param, code}) and those fields, and its message reads
// "<status> <error.message>". The compiled library answers with the same error objects as
// `ignis serve`; statusFor() gives the status the server sends with each.

export class OpenAIError extends Error {}

export class APIError extends OpenAIError {
  constructor(status, error, message, headers) {
    super(APIError.makeMessage(status, error, message));
    this.name = new.target.name;
    this.status = status;
    this.headers = headers;
    this.requestID = headers?.get?.('x-request-id') ?? undefined;
    this.error = error;
    this.code = error?.code;
    this.param = error?.param;
    this.type = error?.type;
  }

  static makeMessage(status, error, message) {
    let text = message;
    if (error?.message) text = typeof error.message === 'string' ? error.message : JSON.stringify(error.message);
    else if (error) text = JSON.stringify(error);
    if (status && text) return `${status} ${text}`;
    if (status) return `${status} status code (no body)`;
    return text || '(no status code or body)';
  }

  /** The error subclass for an HTTP status (as the official package picks it). */
  static generate(status, error, message, headers) {
    const cls = CLASS_BY_STATUS[status] ?? (status >= 500 ? InternalServerError : APIError);
    return new cls(status, error, message, headers);
  }
}

export class BadRequestError extends APIError {}
export class AuthenticationError extends APIError {}
export class PermissionDeniedError extends APIError {}
export class NotFoundError extends APIError {}
export class ConflictError extends APIError {}
export class UnprocessableEntityError extends APIError {}
export class RateLimitError extends APIError {}
export class InternalServerError extends APIError {}

export class APIConnectionError extends APIError {
  constructor({ message, cause } = {}) {
    super(undefined, undefined, message || 'Connection error.', undefined);
    if (cause) this.cause = cause;
  }
}

export class APIUserAbortError extends APIError {
  constructor({ message } = {}) {
    super(undefined, undefined, message || 'Request was aborted.', undefined);
  }
}

/** A compiled-model directory that cannot be used (no manifest, a library that does not load,
 * ignis_open refusing it), or a client used after close(). */
export class NativeLibraryError extends OpenAIError {
  constructor(message) {
    super(message);
    this.name = 'NativeLibraryError';
  }
}

/** A stream left unread until the Client's maxBufferedChunks chunks waited: its generation was
 * cancelled; its reader gets the chunks made before, then this. */
export class StreamOverflowError extends OpenAIError {
  constructor(message) {
    super(message);
    this.name = 'StreamOverflowError';
  }
}

const CLASS_BY_STATUS = {
  400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError,
  409: ConflictError, 422: UnprocessableEntityError, 429: RateLimitError,
};

/** The HTTP status `ignis serve` answers an error object with (mirrors ignis/api/native_client.py:
 * model_not_found is 404, any other invalid_request_error 400, the rest 500). */
export function statusFor(error) {
  if (error?.code === 'model_not_found') return 404;
  if ((error?.type ?? 'invalid_request_error') === 'invalid_request_error') return 400;
  return 500;
}

/** The error object of a library answer as the exception the official package raises. */
export function errorFromAnswer(error) {
  return APIError.generate(statusFor(error), error, undefined, undefined);
}
