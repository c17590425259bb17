// ignis-client: the official `openai` package's calls (chat.completions, completions, embeddings,
// models) answered by a model compiled with `ignis compile` (a native library loaded through koffi)
// or, for a model name with no library, by an OpenAI-compatible server at `baseURL`: the same
// application code runs local or remote.

import { MAX_BUFFERED_CHUNKS, NativeModel } from './lib/native.js';
import { Remote } from './lib/remote.js';
import { NativeLibraryError, NotFoundError } from './lib/errors.js';

export {
  APIConnectionError, APIError, APIUserAbortError, AuthenticationError, BadRequestError, ConflictError,
  InternalServerError, NativeLibraryError, NotFoundError, OpenAIError, PermissionDeniedError, RateLimitError,
  StreamOverflowError, UnprocessableEntityError,
} from './lib/errors.js';
export { Stream } from './lib/stream.js';

export class Client {
  /**
   * @param {object} [config]
   * @param {Record<string, string> | string[]} [config.models] model name -> directory `ignis compile`
   *   wrote, or a list of such directories (each model then known by the name it was compiled as)
   * @param {string} [config.baseURL] the server other model names go to (e.g. http://127.0.0.1:8000/v1)
   * @param {string} [config.apiKey] sent to baseURL as a bearer token (default: OPENAI_API_KEY)
   * @param {object} [config.options] ignis_open's options for every library ({threads, kernels, ...})
   * @param {number} [config.maxBufferedChunks] unread chunks a local stream may hold before its
   *   generation is cancelled (default 4096; Infinity for no limit)
   */
  constructor({ models = {}, baseURL, apiKey, options, defaultHeaders, fetch,
    maxBufferedChunks = MAX_BUFFERED_CHUNKS } = {}) {
    if (models === null || typeof models !== 'object') {
      throw new TypeError('models must map model names to compiled model directories, or list directories');
    }
    if (!(maxBufferedChunks === Infinity || (Number.isInteger(maxBufferedChunks) && maxBufferedChunks >= 1))) {
      throw new TypeError(`maxBufferedChunks must be a whole number of chunks, at least 1 (or Infinity), ` +
                          `not ${String(maxBufferedChunks)}`);
    }
    this._native = new Map();
    try {
      // a list of directories: each model known by the name it was compiled as
      const entries = Array.isArray(models) ? models.map((d) => [null, d]) : Object.entries(models);
      for (const [key, directory] of entries) {
        if (typeof directory !== 'string') {
          throw new TypeError(`models${key === null ? '' : `[${JSON.stringify(key)}]`} must be a directory ` +
                              `path, not ${typeof directory}`);
        }
        const m = new NativeModel(directory, options, { maxBufferedChunks });
        const name = key ?? m.name;
        if (this._native.has(name)) {
          m.close();
          throw new TypeError(`two compiled models are named ${JSON.stringify(name)}`);
        }
        this._native.set(name, m);
      }
    } catch (e) {
      for (const m of this._native.values()) m.close();
      throw e;
    }
    this.baseURL = baseURL ?? null;
    this._remote = baseURL == null ? null
      : new Remote({ baseURL, apiKey: apiKey ?? process.env.OPENAI_API_KEY, headers: defaultHeaders, fetch });
    this._closed = null;
    this.chat = { completions: { create: (body, opts) => this._create('chat', body, opts) } };
    this.completions = { create: (body, opts) => this._create('completions', body, opts) };
    this.embeddings = { create: (body, opts) => this._create('embeddings', body, opts) };
    this.models = { list: (opts) => this._listModels(opts) };
  }

  /** The compiled models this client opened, by the names it knows them by. */
  get local() {
    return this._native;
  }

  _check() {
    if (this._closed) throw new NativeLibraryError('this ignis Client is closed');
  }

  async _create(endpoint, body, options) {
    this._check();
    if (body === null || typeof body !== 'object' || Array.isArray(body)) {
      throw new TypeError('create() takes the request body as an object');
    }
    const native = this._native.get(body.model);
    if (native) return native.create(endpoint, body, options);
    if (this._remote) return this._remote.create(endpoint, body, options);
    const known = [...this._native.keys()];
    throw new NotFoundError(404, {
      message: `The model ${JSON.stringify(body.model ?? null)} has no compiled library in this Client ` +
               `(its models: ${known.length ? known.map((n) => JSON.stringify(n)).join(', ') : 'none'}) ` +
               'and no baseURL is configured to send it to',
      type: 'invalid_request_error', param: 'model', code: 'model_not_found',
    });
  }

  async _listModels(options) {
    this._check();
    const data = [...this._native].map(([id, m]) => ({ id, object: 'model', created: m.created, owned_by: 'ignis' }));
    if (this._remote) {
      for (const m of await this._remote.listModels(options)) {
        if (!this._native.has(m.id)) data.push(m);
      }
    }
    return {
      object: 'list',
      data,
      async* [Symbol.asyncIterator]() {
        yield* data;
      },
    };
  }

  /** Cancel open streams, wait for running calls and close every library handle. Safe to call
   * twice; any call afterwards is a NativeLibraryError. */
  close() {
    this._closed ??= Promise.all([...this._native.values()].map((m) => m.close())).then(() => undefined);
    return this._closed;
  }
}

export default Client;
