// An OpenAI-compatible server (`ignis serve`, or any provider) over Node's fetch: the requests the
// official client sends, its errors for non-2xx answers, and server-sent events for streams.

import { APIConnectionError, APIError, APIUserAbortError } from './errors.js';
import { Stream } from './stream.js';

const PATHS = { chat: '/chat/completions', completions: '/completions', embeddings: '/embeddings' };

export class Remote {
  constructor({ baseURL, apiKey, headers, fetch: fetchFn }) {
    this.baseURL = String(baseURL).replace(/\/+$/, '');
    this.apiKey = apiKey;
    this.headers = headers ?? {};
    this.fetch = fetchFn ?? globalThis.fetch;
  }

  async request(method, path, body, { signal, headers } = {}) {
    const init = {
      method,
      headers: {
        Accept: 'application/json',
        ...(this.apiKey ? { Authorization: `Bearer ${this.apiKey}` } : {}),
        ...(body !== undefined ? { 'Content-Type': 'application/json' } : {}),
        ...this.headers,
        ...headers,
      },
      body: body !== undefined ? JSON.stringify(body) : undefined,
      signal,
    };
    let res;
    try {
      res = await this.fetch(this.baseURL + path, init);
    } catch (e) {
      if (signal?.aborted) throw new APIUserAbortError();
      throw new APIConnectionError({ message: `Connection error: ${this.baseURL}${path}: ${e.message}`, cause: e });
    }
    if (!res.ok) {
      const text = await res.text().catch(() => '');
      let json;
      try {
        json = JSON.parse(text);
      } catch {
        json = undefined;
      }
      throw APIError.generate(res.status, json?.error ?? json, json ? undefined : text, res.headers);
    }
    return res;
  }

  /** A request's own controller, aborted with the caller's signal until release(): fetch is
   * never given the caller's signal, whose listeners (undici's too) would otherwise outlive the
   * request on a signal that serves many. Already aborted: APIUserAbortError, nothing sent (as the
   * official client). */
  static link(outer) {
    if (outer?.aborted) throw new APIUserAbortError();
    const controller = new AbortController();
    const onAbort = () => controller.abort();
    outer?.addEventListener('abort', onAbort, { once: true });
    return { controller, release: () => outer?.removeEventListener('abort', onAbort) };
  }

  /** The JSON body of one request that is not a stream. */
  async json(method, path, body, options = {}) {
    const { controller, release } = Remote.link(options.signal);
    const inner = { ...options, signal: controller.signal };
    try {
      const res = await this.request(method, path, body, inner);
      try {
        return await res.json();
      } catch (e) {
        if (inner.signal.aborted) throw new APIUserAbortError();
        throw e;
      }
    } finally {
      release();
    }
  }

  /** create() of `endpoint` ("chat", "completions", "embeddings"). */
  async create(endpoint, body, options = {}) {
    if (!body.stream) return this.json('POST', PATHS[endpoint], body, options);
    // the stream's controller is aborted by the caller's signal until the stream ends
    const { controller, release } = Remote.link(options.signal);
    let res;
    try {
      res = await this.request('POST', PATHS[endpoint], body, { ...options, signal: controller.signal });
    } catch (e) {
      release();
      throw e;
    }
    return new Stream(async function* chunks(signal) {
      let finished = false;
      try {
        for await (const event of serverSentEvents(res.body)) {
          if (event.data.startsWith('[DONE]')) {
            finished = true;
            break;
          }
          const data = JSON.parse(event.data);
          if (data && data.error) throw new APIError(undefined, data.error, undefined, res.headers);
          yield data;
        }
        finished = true;
      } catch (e) {
        if (!signal.aborted) throw e;     // aborted by its reader: the stream just ends
      } finally {
        release();
        if (!finished) controller.abort();   // the server sees the request go and stops generating
      }
    }, controller);
  }

  async listModels(options) {
    return (await this.json('GET', '/models', undefined, options)).data ?? [];
  }
}

/** The events of a text/event-stream body: {event, data} for each block ending in a blank line. */
export async function* serverSentEvents(body) {
  const decoder = new TextDecoder();
  let buffer = '';
  let data = [];
  let event = null;
  const line = function* (text) {
    if (text === '') {
      if (data.length) yield { event, data: data.join('\n') };
      data = [];
      event = null;
      return;
    }
    if (text.startsWith(':')) return;          // a comment (keep-alive)
    const colon = text.indexOf(':');
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? '' : text.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') data.push(value);
    else if (field === 'event') event = value;
  };
  for await (const bytes of body) {
    buffer += decoder.decode(bytes, { stream: true });
    for (;;) {
      const m = /\r\n|\r|\n/.exec(buffer);
      // a CR at the very end may be the first half of a CRLF split across reads
      if (!m || (m[0] === '\r' && m.index === buffer.length - 1)) break;
      const text = buffer.slice(0, m.index);
      buffer = buffer.slice(m.index + m[0].length);
      yield* line(text);
    }
  }
  buffer += decoder.decode();
  for (const text of buffer.split(/\r\n|\r|\n/)) yield* line(text);
  yield* line('');
}
