// A compiled model (the directory `ignis compile MODEL -o DIR` writes) opened through koffi: the
// C ABI of ignis_model.h, whose JSON entry points take the OpenAI request body and answer the
// response body or an error object.
//
// Every generating call runs on a libuv worker thread (koffi's fn.async), so the event loop stays
// free while the library computes. The library serialises the calls on a handle; they are queued
// here too, so that waiting calls do not hold libuv's small pool of threads (4 by default, shared
// with fs and dns) blocked on the handle's lock. A stream's chunk callback is registered with koffi: called on
// the worker thread, koffi runs it on the main thread (the worker waits for its answer) as soon as
// the event loop turns; it queues the chunk for the stream's reader and answers nonzero once the
// stream is cancelled, which stops the generation (the library then answers "cancelled").
// Nothing here calls the library synchronously while a call may be running: the handle is locked
// by the worker, and a callback waiting for the main thread would never be answered.

import fs from 'node:fs';
import path from 'node:path';

import koffi from 'koffi';

import {
  APIUserAbortError, BadRequestError, NativeLibraryError, StreamOverflowError, errorFromAnswer,
} from './errors.js';
import { ChunkQueue, Stream } from './stream.js';

export const MANIFEST = 'manifest.json';
// A stream nobody reads would otherwise generate to max_tokens, holding every chunk and the handle
// (the calls queued behind it wait): past this many unread chunks its generation is cancelled.
export const MAX_BUFFERED_CHUNKS = 4096;

// koffi's type names are process-wide: declared once, shared by every library loaded.
koffi.opaque('ignis_model');
const CHUNK_CB = koffi.proto('int ignis_chunk_cb(const char *chunk_json, void *user)');
const CHUNK_CB_PTR = koffi.pointer(CHUNK_CB);

const libraries = new Map();   // library path -> its functions (dlopen'd once per process)

function bind(file) {
  let fns = libraries.get(file);
  if (fns) return fns;
  let lib;
  try {
    lib = koffi.load(file);
  } catch (e) {
    throw new NativeLibraryError(`the compiled library ${file} does not load: ${e.message}`);
  }
  const free = lib.func('void ignis_free(void *s)');
  // a string the library allocated: read as UTF-8, then handed back to ignis_free
  const owned = koffi.disposable('str', free);
  const optional = (name, ret, args) => {
    try {
      return lib.func(name, ret, args);
    } catch {
      return null;         // a library compiled by an older ignis (before issue 18's embeddings)
    }
  };
  fns = {
    abiVersion: lib.func('int ignis_abi_version(void)'),
    open: lib.func('ignis_model *ignis_open(const char *dir, const char *options_json)'),
    lastError: lib.func('const char *ignis_last_error(void)'),
    close: lib.func('void ignis_close(ignis_model *m)'),
    info: lib.func('ignis_model_info', owned, ['ignis_model *']),
    chat: lib.func('ignis_chat_completions', owned, ['ignis_model *', 'const char *', 'ignis_chunk_cb *', 'void *']),
    completions: lib.func('ignis_completions', owned, ['ignis_model *', 'const char *', 'ignis_chunk_cb *', 'void *']),
    embeddings: optional('ignis_embeddings', owned, ['ignis_model *', 'const char *']),
  };
  libraries.set(file, fns);
  return fns;
}

function readManifest(directory) {
  const file = path.join(directory, MANIFEST);
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    if (e.code === 'ENOENT') {
      throw new NativeLibraryError(`${directory} is not a compiled model directory: it has no ${MANIFEST} ` +
                                   '(write one with `ignis compile MODEL -o DIR`)');
    }
    throw new NativeLibraryError(`${file} cannot be read: ${e.message}`);
  }
  let manifest;
  try {
    manifest = JSON.parse(text);
  } catch (e) {
    throw new NativeLibraryError(`${file} cannot be read as JSON: ${e.message}`);
  }
  const lib = manifest?.library;
  if (typeof lib !== 'string' || !lib || lib.includes('/')) {
    throw new NativeLibraryError(`${file} names no library file (its "library" field is ` +
                                 `${JSON.stringify(lib ?? null).slice(0, 80)})`);
  }
  return manifest;
}

// A handle dropped without close() is closed when collected (no call can be running then: every
// running call holds its model).
const handles = new FinalizationRegistry(({ close, handle }) => close(handle));

function encode(body) {
  try {
    return JSON.stringify(body);
  } catch (e) {
    throw new BadRequestError(400, {
      message: `the request cannot be sent as JSON: ${e.message}`, type: 'invalid_request_error',
      param: null, code: 'invalid_type',
    });
  }
}

function parseAnswer(text) {
  if (text == null) {
    throw new NativeLibraryError('the compiled library answered nothing (out of memory)');
  }
  const answer = JSON.parse(text);
  if (answer && typeof answer === 'object' && answer.error != null) throw errorFromAnswer(answer.error);
  return answer;
}

/** One open handle of a compiled model's library. */
export class NativeModel {
  /** `options`: ignis_open's; `maxBufferedChunks`: how many chunks a stream may hold unread
   * before its generation is cancelled (a StreamOverflowError for its reader). */
  constructor(directory, options, { maxBufferedChunks = MAX_BUFFERED_CHUNKS } = {}) {
    this.directory = path.resolve(directory);
    this.maxBufferedChunks = maxBufferedChunks;
    let st;
    try {
      st = fs.statSync(this.directory);
    } catch {
      st = null;
    }
    if (!st?.isDirectory()) {
      throw new NativeLibraryError(`${this.directory} is not a directory (a compiled model directory ` +
                                   'is written by `ignis compile MODEL -o DIR`)');
    }
    this.manifest = readManifest(this.directory);
    this.name = this.manifest.model;
    this.created = Math.floor(fs.statSync(path.join(this.directory, MANIFEST)).mtimeMs / 1000);
    this._fns = bind(path.join(this.directory, this.manifest.library));
    const opts = options == null ? null : encode(options);
    const handle = this._fns.open(this.directory, opts);
    if (!handle) {
      throw new NativeLibraryError(`ignis_open(${JSON.stringify(this.directory)}): ${this._fns.lastError()}`);
    }
    this._handle = handle;
    this._running = new Set();     // the promises of the calls queued or running
    this._last = Promise.resolve();  // the end of the last call queued: the next one starts after it
    this._streams = new Set();     // the cancel functions of the open streams
    this._closing = null;
    handles.register(this, { close: this._fns.close, handle }, this);
  }

  get closed() {
    return this._handle === null;
  }

  /** What the handle runs (kernels, threads, context, the compiled model's record). Read before
   * any call, or between calls: it takes the handle's lock on the calling thread. */
  info() {
    this._check();
    if (this._running.size) throw new NativeLibraryError('info() while a call is running on the handle');
    return JSON.parse(this._fns.info(this._handle));
  }

  _check() {
    if (this._handle === null || this._closing) {
      throw new NativeLibraryError(`the compiled model in ${this.directory} is closed`);
    }
  }

  /** The library's answer text to one request, on a worker thread. `skip()`, asked when the
   * call's turn comes, says it was abandoned while queued: it then rejects with what skip() gave,
   * without calling the library. */
  _call(endpoint, text, onChunk, skip) {
    const fn = this._fns[endpoint];
    const done = this._last.then(() => new Promise((resolve, reject) => {
      const abandoned = skip?.();
      if (abandoned) {
        reject(abandoned);
        return;
      }
      let registered = null;
      const finish = (err, res) => {
        if (registered !== null) koffi.unregister(registered);
        registered = null;
        if (err) reject(err);
        else resolve(res);
      };
      try {
        if (endpoint === 'embeddings') {
          fn.async(this._handle, text, finish);
        } else {
          if (onChunk) {
            registered = koffi.register((chunk) => {
              try {
                return onChunk(chunk);
              } catch {
                return 1;      // never unwind into C: stop the generation instead
              }
            }, CHUNK_CB_PTR);
          }
          fn.async(this._handle, text, registered, null, finish);
        }
      } catch (e) {          // refused before it started: nothing will call finish
        finish(e);
      }
    }));
    this._last = done.then(() => undefined, () => undefined);
    this._running.add(done);
    const forget = () => this._running.delete(done);
    done.then(forget, forget);
    return done;
  }

  /** chat.completions.create / completions.create / embeddings.create with `body`. `options.signal`
   * aborts the request as the official client's does: already aborted, nothing starts; a stream
   * stops at its next chunk; a call not streamed rejects at once (the library cannot stop one
   * that has started: it runs to its end on its worker thread, and the handle's later calls wait). */
  async create(endpoint, body, options = {}) {
    this._check();
    if (endpoint === 'embeddings' && !this._fns.embeddings) {
      throw new BadRequestError(400, {
        message: `the compiled model in ${this.directory} has no embeddings: its library was compiled by ` +
                 'an older ignis; compile it again',
        type: 'invalid_request_error', param: null, code: 'unsupported_endpoint',
      });
    }
    // the library answers to the name it was compiled as; the client may know it by another
    const text = encode({ ...body, model: this.name });
    const signal = options?.signal ?? null;
    if (signal?.aborted) throw new APIUserAbortError();
    if (body.stream && endpoint !== 'embeddings') return this._stream(endpoint, text, signal);
    if (!signal) return parseAnswer(await this._call(endpoint, text, null));
    let aborted = null;
    const call = this._call(endpoint, text, null, () => aborted);
    return new Promise((resolve, reject) => {
      const onAbort = () => {
        aborted = new APIUserAbortError();
        reject(aborted);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      // the listener goes before the caller hears the outcome
      const release = () => signal.removeEventListener('abort', onAbort);
      call.then((answer) => {
        release();
        try {
          resolve(parseAnswer(answer));
        } catch (e) {
          reject(e);
        }
      }, (err) => {
        release();
        reject(err);
      });
    });
  }

  async _stream(endpoint, text, signal) {
    const queue = new ChunkQueue();
    const limit = this.maxBufferedChunks;
    let cancelled = null;    // why the stream was cancelled: an error, or true when its reader left
    let returned = false;
    let answer = null;
    let failure = null;
    let made = 0;
    // a cancelled stream wakes its waiting reader (and create()) at once; the library call
    // ends at its next chunk, or is never started if still queued
    const cancel = (why) => {
      if (cancelled) return;
      cancelled = why;
      queue.finish();
    };
    const controller = new AbortController();
    const onAbort = () => controller.abort();
    controller.signal.addEventListener('abort', () => cancel(new APIUserAbortError()));
    if (signal) signal.addEventListener('abort', onAbort, { once: true });
    const skip = () => (cancelled instanceof Error ? cancelled : null);
    const call = this._call(endpoint, text, (chunk) => {
      made += 1;
      if (cancelled) return 1;
      if (queue.items.length >= limit) {
        cancel(new StreamOverflowError(`a stream's reader left ${limit} chunks unread, so its generation ` +
                                       'was cancelled: read a stream as it comes (or raise the Client\'s ' +
                                       'maxBufferedChunks)'));
        return 1;
      }
      queue.push(chunk);
      return 0;
    }, skip).then((res) => { answer = res; }, (err) => { failure = err; }).finally(() => {
      // the call is over: nothing is left to cancel, and the caller's signal is let go
      returned = true;
      queue.finish();
      signal?.removeEventListener('abort', onAbort);
    });
    const onClose = () => cancel(new APIUserAbortError({ message: 'Request was aborted: the client was closed.' }));
    this._streams.add(onClose);
    call.then(() => this._streams.delete(onClose));
    const end = async () => {
      cancel(true);
      await call;
    };
    const outcome = () => {
      if (cancelled instanceof StreamOverflowError) throw cancelled;
      if (failure) throw failure;
      if (!cancelled) parseAnswer(answer);
    };
    // a refused request rejects here, as the official client's create() does, not at the first
    // chunk; so does one aborted (or closed) before create() has resolved
    await queue.wait();
    if (cancelled instanceof APIUserAbortError) throw cancelled;
    if (queue.items.length === 0) {
      await call;
      outcome();
    }
    const stream = new Stream(async function* chunks(own) {
      // the caller's signal is asked too: its listener is gone once the call has returned
      const stopped = () => own.aborted || signal?.aborted;
      try {
        for (;;) {
          const chunk = await queue.next();
          if (chunk === undefined || stopped()) break;
          yield JSON.parse(chunk);
        }
        if (!stopped()) outcome();
      } finally {           // read to the end, left early or aborted: the call ends either way
        await end();
      }
    }, controller);
    // for tests and debugging: whether the library call has returned, the chunks its callback
    // was handed, and its final answer (the whole response, or the error object: "cancelled")
    Object.defineProperty(stream, '_ignis', {
      value: {
        finished: () => returned,
        chunks: () => made,
        answer: call.then(() => (answer == null ? null : JSON.parse(answer))),
      },
    });
    return stream;
  }

  /** Cancel the open streams, wait for the running calls, close the handle. Safe to call twice. */
  close() {
    if (this._closing) return this._closing;
    for (const cancel of this._streams) cancel();
    this._closing = Promise.allSettled([...this._running]).then(() => {
      handles.unregister(this);
      if (this._handle !== null) this._fns.close(this._handle);
      this._handle = null;
    });
    return this._closing;
  }
}
