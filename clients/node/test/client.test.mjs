// ignis-client against the official `openai` package: the same requests sent through the compiled
// library (IGNIS_NODE_LIB_DIR) and by the official client to `ignis serve` (IGNIS_NODE_BASE_URL),
// the answers compared. tests/test_node_client.py sets the environment and runs this file.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { getEventListeners } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import koffi from 'koffi';
import OpenAI from 'openai';

import {
  APIError, APIUserAbortError, BadRequestError, Client, NativeLibraryError, NotFoundError, Stream,
  StreamOverflowError,
} from '../index.js';

const LIB_DIR = process.env.IGNIS_NODE_LIB_DIR;
const BASE_URL = process.env.IGNIS_NODE_BASE_URL;
const MODEL = process.env.IGNIS_NODE_MODEL;
if (!LIB_DIR || !BASE_URL || !MODEL) {
  throw new Error('set IGNIS_NODE_LIB_DIR, IGNIS_NODE_BASE_URL and IGNIS_NODE_MODEL (tests/test_node_client.py does)');
}
const HERE = path.dirname(fileURLToPath(import.meta.url));

let local;        // the compiled library only
let sdk;          // the official client, to ignis serve
before(() => {
  local = new Client({ models: { [MODEL]: LIB_DIR }, options: { threads: 1 } });
  sdk = new OpenAI({ baseURL: BASE_URL, apiKey: 'none', maxRetries: 0, timeout: 60_000 });
});
after(() => local.close());

const CONVERSATIONS = [
  [{ role: 'user', content: 'Hello!' }],
  [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'What is 2+2?' },
    { role: 'assistant', content: '4' }, { role: 'user', content: 'And 3+3?' }],
  [{ role: 'developer', content: '日本語で' }, { role: 'user', content: 'é\u0301 <|im_end|>' }],
];
// the tiny model answers a chat with newlines; without them (logit_bias) other characters come
const CHAT_SETTINGS = [
  { max_tokens: 20, temperature: 0 },
  { max_tokens: 30, temperature: 0, logit_bias: { 10: -100 } },
  { max_tokens: 25, temperature: 1.0, seed: 3, logit_bias: { 10: -100 }, stop: ['a', 'en'] },
];

/** What two answers to one request must share: all but id, created and cached_tokens (the server
 * reuses a cached prompt prefix; the library runs every prompt whole). */
function strip(r) {
  const { id, created, ...rest } = r;
  assert.equal(typeof id, 'string');
  assert.equal(typeof created, 'number');
  if (rest.usage) {
    rest.usage = { ...rest.usage };
    delete rest.usage.prompt_tokens_details;
  }
  return rest;
}

async function collect(stream) {
  assert.ok(stream instanceof Stream || typeof stream[Symbol.asyncIterator] === 'function');
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

describe('chat and completions equal the official client against ignis serve', () => {
  test('chat.completions.create', async () => {
    const texts = new Set();
    for (const messages of CONVERSATIONS) {
      for (const s of CHAT_SETTINGS) {
        const req = { model: MODEL, messages, ...s };
        const got = await local.chat.completions.create(req);
        const want = await sdk.chat.completions.create(req);
        assert.deepEqual(strip(got), strip(want));
        assert.match(got.id, /^chatcmpl-/);
        assert.equal(got.object, 'chat.completion');
        assert.ok(got.usage.total_tokens > got.usage.prompt_tokens);
        texts.add(got.choices[0].message.content);
      }
    }
    assert.ok(texts.size >= 4, 'the requests are answered differently');
  });

  test('completions.create', async () => {
    for (const prompt of ['Hello world', 'The cat sat on', [5, 17, 3, 33, 42]]) {
      for (const s of [{ max_tokens: 30, temperature: 0 },
        { max_tokens: 20, temperature: 1.1, seed: 4, presence_penalty: 0.5, stop: ['e ', 'at'] }]) {
        const req = { model: MODEL, prompt, ...s };
        const got = await local.completions.create(req);
        const want = await sdk.completions.create(req);
        assert.deepEqual(strip(got), strip(want));
        assert.equal(got.object, 'text_completion');
      }
    }
  });

  test('ignis sampling fields pass through (top_k, min_p, repetition_penalty)', async () => {
    const req = { model: MODEL, prompt: 'Hello', max_tokens: 10, seed: 2, n: 2, top_k: 3, min_p: 0.05,
      repetition_penalty: 1.2 };
    const got = await local.completions.create(req);
    assert.deepEqual(strip(got), strip(await sdk.completions.create(req)));
    assert.equal(got.choices.length, 2);
  });
});

describe('streams', () => {
  for (const endpoint of ['chat', 'completions']) {
    test(`${endpoint}: chunks are the server's and concatenate to the whole answer`, async () => {
      const req = endpoint === 'chat'
        ? { model: MODEL, messages: CONVERSATIONS[1], max_tokens: 30, seed: 2, logit_bias: { 10: -100 } }
        : { model: MODEL, prompt: 'The cat sat on', max_tokens: 30, seed: 5 };
      const api = (c) => (endpoint === 'chat' ? c.chat.completions : c.completions);
      const sreq = { ...req, stream: true, stream_options: { include_usage: true } };
      const got = await collect(await api(local).create(sreq));
      const want = await collect(await api(sdk).create(sreq));
      assert.ok(got.length >= 3);
      assert.equal(got.length, want.length);
      got.forEach((g, i) => assert.deepEqual(strip(g), strip(want[i])));
      const whole = await api(local).create(req);
      const text = endpoint === 'chat'
        ? got.map((c) => c.choices[0]?.delta.content ?? '').join('')
        : got.map((c) => c.choices[0]?.text ?? '').join('');
      const wholeText = endpoint === 'chat' ? whole.choices[0].message.content : whole.choices[0].text;
      assert.equal(text, wholeText);
      assert.ok(text.length > 0);
      assert.equal(got.at(-1).usage.completion_tokens, whole.usage.completion_tokens);
      assert.equal(got[0].object, endpoint === 'chat' ? 'chat.completion.chunk' : 'text_completion');
    });
  }

  const long = () => local.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 200,
    temperature: 1.0, seed: 3, stream: true, ignore_eos: true });

  test('chunks arrive while the library generates; leaving the loop cancels it', async () => {
    const stream = await long();
    let n = 0;
    for await (const chunk of stream) {
      n += 1;
      assert.equal(chunk.choices[0].finish_reason, null);
      // the worker waits for this thread to take each chunk: it cannot have finished 200 tokens
      assert.equal(stream._ignis.finished(), false);
      if (n === 3) break;
    }
    // break waited for the call to end: cancelled through the callback's nonzero answer
    assert.equal(stream._ignis.finished(), true);
    const answer = await stream._ignis.answer;
    assert.equal(answer.error.code, 'cancelled');
    assert.ok(stream._ignis.chunks() <= 5, `${stream._ignis.chunks()} chunks were made`);
    // the handle answers afterwards
    const r = await local.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 3 });
    assert.ok(r.usage.completion_tokens <= 3);
  });

  test('controller.abort() ends the stream and the generation', async () => {
    const stream = await long();
    const seen = [];
    for await (const chunk of stream) {
      seen.push(chunk);
      if (seen.length === 2) stream.controller.abort();
    }
    assert.ok(seen.length < 10);
    assert.equal((await stream._ignis.answer).error.code, 'cancelled');
  });

  test('an aborted request signal stops a stream as its controller does', async () => {
    const ac = new AbortController();
    const stream = await local.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 200,
      temperature: 1.0, seed: 3, stream: true, ignore_eos: true }, { signal: ac.signal });
    let n = 0;
    for await (const chunk of stream) {
      void chunk;
      if (++n === 2) ac.abort();
    }
    assert.ok(n < 10);
    assert.equal((await stream._ignis.answer).error.code, 'cancelled');
  });

  test('concurrent calls on one client each get their own answer', async () => {
    const reqs = ['Hello world', 'The cat', '日本語', 'abc', 'Hello world', 'xyz'].map((prompt, i) => ({
      model: MODEL, prompt, max_tokens: 20, temperature: 0.8, seed: i }));
    const text = async (req, i) => {
      if (i % 2 === 0) return (await local.completions.create(req)).choices[0].text;
      const chunks = await collect(await local.completions.create({ ...req, stream: true }));
      return chunks.map((c) => c.choices[0]?.text ?? '').join('');
    };
    const got = await Promise.all(reqs.map(text));
    const want = [];
    for (const req of reqs) want.push((await sdk.completions.create(req)).choices[0].text);
    assert.deepEqual(got, want);
    assert.ok(new Set(got).size >= 4);
  });

  test('a stream read to its end equals the same request not streamed', async () => {
    const stream = await long();
    const text = (await collect(stream)).map((c) => c.choices[0]?.text ?? '').join('');
    const whole = await local.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 200,
      temperature: 1.0, seed: 3, ignore_eos: true });
    assert.equal(text, whole.choices[0].text);
    assert.equal(whole.choices[0].finish_reason, 'length');
    await assert.rejects(async () => { for await (const c of stream) void c; }, /consumed/);
  });

  test('calls made while a stream is unread are answered', async () => {
    const stream = await long();
    const r = await local.chat.completions.create({ model: MODEL, messages: CONVERSATIONS[0], max_tokens: 8,
      temperature: 0 });
    const want = await sdk.chat.completions.create({ model: MODEL, messages: CONVERSATIONS[0], max_tokens: 8,
      temperature: 0 });
    assert.equal(r.choices[0].message.content, want.choices[0].message.content);
    const chunks = await collect(stream);
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
  });
});

describe('embeddings', () => {
  const decode = (b64) => {
    const buf = Buffer.from(b64, 'base64');
    return Array.from(new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4));
  };
  const close = (got, want) => {
    assert.equal(got.length, want.length);
    let worst = 0;
    got.forEach((v, i) => { worst = Math.max(worst, Math.abs(v - want[i])); });
    assert.ok(worst <= 1e-6, `max |difference| ${worst}`);
  };

  test('float and base64 equal the server within 1e-6', async () => {
    const input = ['hi', 'The cat sat on', '日本語'];
    const got = await local.embeddings.create({ model: MODEL, input });
    const want = await sdk.embeddings.create({ model: MODEL, input });     // the SDK asks base64, decodes
    assert.equal(got.object, 'list');
    assert.equal(got.model, want.model);
    assert.deepEqual(got.usage, want.usage);
    assert.equal(got.data.length, 3);
    got.data.forEach((d, i) => {
      assert.equal(d.object, 'embedding');
      assert.equal(d.index, i);
      assert.ok(Array.isArray(d.embedding) && d.embedding.length > 8);
      close(d.embedding, want.data[i].embedding);
    });
    const b64 = await local.embeddings.create({ model: MODEL, input, encoding_format: 'base64' });
    const b64want = await sdk.embeddings.create({ model: MODEL, input, encoding_format: 'base64' });
    b64.data.forEach((d, i) => {
      assert.equal(typeof d.embedding, 'string');
      close(decode(d.embedding), decode(b64want.data[i].embedding));
      close(decode(d.embedding), got.data[i].embedding);
    });
  });
});

describe('remote fallback through baseURL', () => {
  let hybrid;
  before(() => {
    // the library under another name; MODEL itself is only known to the server
    hybrid = new Client({ models: { 'local-tiny': LIB_DIR }, baseURL: BASE_URL, apiKey: 'none',
      options: { threads: 1 } });
  });
  after(() => hybrid.close());

  test('a model name with no library goes to the server; the same code runs local or remote', async () => {
    const req = { messages: CONVERSATIONS[1], max_tokens: 20, temperature: 0 };
    const remote = await hybrid.chat.completions.create({ model: MODEL, ...req });
    const viaLibrary = await hybrid.chat.completions.create({ model: 'local-tiny', ...req });
    const want = await sdk.chat.completions.create({ model: MODEL, ...req });
    assert.deepEqual(strip(remote), strip(want));
    assert.deepEqual(strip(viaLibrary), strip(want));     // the library answers to its own name
    const comp = { model: MODEL, prompt: [5, 17, 3], max_tokens: 12, temperature: 0 };
    assert.deepEqual(strip(await hybrid.completions.create(comp)), strip(await sdk.completions.create(comp)));
    const emb = { model: MODEL, input: 'hi', encoding_format: 'base64' };
    assert.deepEqual(await hybrid.embeddings.create(emb), await sdk.embeddings.create(emb));
  });

  test('remote streams are parsed from server-sent events', async () => {
    const req = { model: MODEL, messages: CONVERSATIONS[0], max_tokens: 20, seed: 1, logit_bias: { 10: -100 },
      stream: true, stream_options: { include_usage: true } };
    const got = await collect(await hybrid.chat.completions.create(req));
    const want = await collect(await sdk.chat.completions.create(req));
    assert.deepEqual(got.map(strip), want.map(strip));
    assert.ok(got.length >= 3);
    // leaving early closes the connection; the client goes on
    const stream = await hybrid.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 200,
      ignore_eos: true, stream: true });
    let n = 0;
    for await (const c of stream) { void c; if (++n === 2) break; }
    const r = await hybrid.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 2 });
    assert.equal(r.choices.length, 1);
  });

  test('remote errors are the official client\'s', async () => {
    const req = { model: MODEL, messages: [{ role: 'user', content: 'hi' }], temperature: -1 };
    const got = await hybrid.chat.completions.create(req).catch((e) => e);
    const want = await sdk.chat.completions.create(req).catch((e) => e);
    assert.ok(got instanceof BadRequestError);
    for (const k of ['status', 'code', 'param', 'type', 'message']) assert.deepEqual(got[k], want[k], k);
    assert.deepEqual(got.error, want.error);
  });

  test('models.list() has the local names and the server\'s', async () => {
    const page = await hybrid.models.list();
    const ids = page.data.map((m) => m.id);
    assert.deepEqual(ids, ['local-tiny', MODEL]);
    const remote = [];
    for await (const m of await sdk.models.list()) remote.push(m);
    assert.deepEqual(page.data[1], remote[0]);
    const listed = [];
    for await (const m of page) listed.push(m.id);
    assert.deepEqual(listed, ids);
    assert.deepEqual((await local.models.list()).data.map((m) => [m.id, m.object, m.owned_by]),
      [[MODEL, 'model', 'ignis']]);
    // a list of directories: each known by its compiled name
    const listed2 = new Client({ models: [LIB_DIR], options: { threads: 1 } });
    try {
      assert.deepEqual([...listed2.local.keys()], [MODEL]);
      assert.equal(listed2.local.get(MODEL).name, MODEL);
    } finally {
      await listed2.close();
    }
  });
});

describe('errors', () => {
  const user = [{ role: 'user', content: 'hi' }];
  const BAD = [
    ['chat', { messages: [] }],
    ['chat', { messages: [{ role: 'boss', content: 'hi' }] }],
    ['chat', { messages: [{ role: 'user', content: 5 }] }],
    ['chat', { messages: user, temperature: -1 }],
    ['chat', { messages: user, max_tokens: 300 }],
    ['chat', { messages: user, max_tokens: 5, max_completion_tokens: 6 }],
    ['chat', { messages: user, stream_options: { include_usage: true } }],
    ['chat', { messages: user, stream: true, top_p: 7 }],
    ['completions', { prompt: [] }],
    ['completions', { prompt: 'hi', max_tokens: 0 }],
    ['completions', { prompt: 'hi', logprobs: 9 }],
    ['completions', { prompt: 'hi', top_k: 'many' }],
    ['completions', { prompt: 'hi', stream: true, max_tokens: 1000 }],
    ['embeddings', { input: [] }],
    ['embeddings', { input: 'hi', encoding_format: 'hex' }],
  ];

  test('bad requests raise what the official client raises from the server', async () => {
    for (const [endpoint, body] of BAD) {
      const req = { model: MODEL, ...body };
      const api = (c) => (endpoint === 'chat' ? c.chat.completions : c[endpoint]);
      // a stream's error may come at create() or while it is read
      const run = async (c) => { const r = await api(c).create(req); if (req.stream) for await (const x of r) void x; };
      const got = await run(local).then(() => null, (e) => e);
      const want = await run(sdk).then(() => null, (e) => e);
      const what = `${endpoint} ${JSON.stringify(body)}`;
      assert.ok(want instanceof OpenAI.APIError, `${what}: the server accepted it`);
      assert.ok(got instanceof APIError, `${what}: ${got}`);
      assert.equal(got.constructor.name, want.constructor.name, what);
      for (const k of ['status', 'code', 'param', 'type', 'message']) assert.deepEqual(got[k], want[k], `${what}: ${k}`);
      assert.deepEqual(got.error, want.error, what);
    }
  });

  test('an unknown model: 404 model_not_found naming the configured models', async () => {
    const req = { model: 'gpt-4o', messages: user };
    const got = await local.chat.completions.create(req).catch((e) => e);
    const want = await sdk.chat.completions.create(req).catch((e) => e);
    assert.ok(got instanceof NotFoundError && want instanceof OpenAI.NotFoundError);
    for (const k of ['status', 'code', 'param', 'type']) assert.equal(got[k], want[k], k);
    assert.match(got.message, /^404 .*"gpt-4o".*"tiny-chat".*no baseURL/);
  });

  test('a request that is not JSON-serialisable is a BadRequestError', async () => {
    const got = await local.completions.create({ model: MODEL, prompt: 'hi', seed: 10n }).catch((e) => e);
    assert.ok(got instanceof BadRequestError);
    assert.equal(got.code, 'invalid_type');
  });

  test('missing or damaged directories are NativeLibraryErrors', () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ignis-node-'));
    try {
      assert.throws(() => new Client({ models: { x: path.join(tmp, 'nowhere') } }),
        (e) => e instanceof NativeLibraryError && /is not a directory/.test(e.message));
      assert.throws(() => new Client({ models: { x: tmp } }),
        (e) => e instanceof NativeLibraryError && /has no manifest\.json/.test(e.message));
      fs.writeFileSync(path.join(tmp, 'manifest.json'), '{not json');
      assert.throws(() => new Client({ models: { x: tmp } }), /cannot be read as JSON/);
      // an unknown open option is the library's own error
      assert.throws(() => new Client({ models: { x: LIB_DIR }, options: { bogus: 1 } }),
        (e) => e instanceof NativeLibraryError && /ignis_open\(.*bogus/.test(e.message));
      assert.throws(() => new Client({ models: { x: 5 } }), TypeError);
      assert.throws(() => new Client({ models: [LIB_DIR, LIB_DIR] }), /two compiled models are named "tiny-chat"/);
    } finally {
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  });

  test('close() cancels open streams, twice is safe, calls afterwards are clear errors', async () => {
    const c = new Client({ models: { [MODEL]: LIB_DIR }, options: { threads: 1 } });
    assert.equal(c.local.get(MODEL).info().threads, 1);
    const stream = await c.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 200,
      ignore_eos: true, stream: true });
    await c.close();
    assert.equal((await stream._ignis.answer).error.code, 'cancelled');
    await c.close();
    assert.equal(c.local.get(MODEL).closed, true);
    await assert.rejects(c.completions.create({ model: MODEL, prompt: 'hi' }),
      (e) => e instanceof NativeLibraryError && /closed/.test(e.message));
    await assert.rejects(c.models.list(), NativeLibraryError);
    assert.throws(() => c.local.get(MODEL).info(), /closed/);
  });
});

/** Counts koffi.register and koffi.unregister calls (the chunk callbacks of local streams) until
 * restore(). */
function trackCallbacks() {
  const { register, unregister } = koffi;
  const t = {
    registered: 0,
    unregistered: 0,
    restore() {
      koffi.register = register;
      koffi.unregister = unregister;
    },
  };
  koffi.register = (...args) => { t.registered += 1; return register.apply(koffi, args); };
  koffi.unregister = (...args) => { t.unregistered += 1; return unregister.apply(koffi, args); };
  return t;
}

describe('cancellation, listeners and unread streams', () => {
  const LONG = { model: MODEL, prompt: 'Hello', max_tokens: 200, temperature: 1.0, seed: 3, ignore_eos: true };
  const sameAbort = (got, want, what) => {
    assert.ok(want instanceof OpenAI.APIUserAbortError, `${what}: the official client gave ${want}`);
    assert.ok(got instanceof APIUserAbortError, `${what}: ${got}`);
    for (const k of ['status', 'message', 'error', 'code']) assert.deepEqual(got[k], want[k], `${what}: ${k}`);
  };

  test('an already aborted signal rejects create() as the official client does, starting nothing', async () => {
    const hybrid = new Client({ models: { 'local-tiny': LIB_DIR }, baseURL: BASE_URL, apiKey: 'none',
      options: { threads: 1 } });
    const t = trackCallbacks();
    try {
      const signal = AbortSignal.abort();
      const want = await sdk.completions.create({ ...LONG, max_tokens: 5 }, { signal }).catch((e) => e);
      const wantStream = await sdk.completions.create({ ...LONG, stream: true }, { signal }).catch((e) => e);
      assert.ok(wantStream instanceof OpenAI.APIUserAbortError, String(wantStream));
      assert.equal(wantStream.message, want.message);
      const cases = [
        ['local', hybrid.completions, { ...LONG, model: 'local-tiny', max_tokens: 5 }],
        ['local stream', hybrid.completions, { ...LONG, model: 'local-tiny', stream: true }],
        ['local chat stream', hybrid.chat.completions,
          { model: 'local-tiny', messages: CONVERSATIONS[0], stream: true }],
        ['local embeddings', hybrid.embeddings, { model: 'local-tiny', input: 'hi' }],
        ['remote', hybrid.completions, { ...LONG, max_tokens: 5 }],
        ['remote stream', hybrid.completions, { ...LONG, stream: true }],
      ];
      for (const [what, api, req] of cases) sameAbort(await api.create(req, { signal }).catch((e) => e), want, what);
      assert.equal(t.registered, 0, 'no library call started');
    } finally {
      t.restore();
      await hybrid.close();
    }
  });

  test('a signal aborted while a stream waits for the handle rejects create() at once; it never runs', async () => {
    const t = trackCallbacks();
    try {
      const running = await local.completions.create({ ...LONG, stream: true });     // left unread
      const ac = new AbortController();
      const queued = local.completions.create({ ...LONG, seed: 4, stream: true }, { signal: ac.signal });
      const queuedWhole = local.completions.create({ ...LONG, seed: 5 }, { signal: ac.signal });
      ac.abort();
      const want = await sdk.completions.create({ ...LONG, max_tokens: 5 }, { signal: ac.signal }).catch((e) => e);
      sameAbort(await queued.catch((e) => e), want, 'a queued stream');
      sameAbort(await queuedWhole.catch((e) => e), want, 'a queued call');
      // before the running stream, which needs this thread for each chunk, could have ended
      assert.equal(running._ignis.finished(), false);
      assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
      const chunks = await collect(running);
      assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
      // the handle goes on; neither aborted call reached the library (one callback: the running one)
      const r = await local.completions.create({ model: MODEL, prompt: 'The cat', max_tokens: 6, temperature: 0 });
      assert.equal(r.choices[0].text,
        (await sdk.completions.create({ model: MODEL, prompt: 'The cat', max_tokens: 6, temperature: 0 })).choices[0].text);
      assert.equal(t.registered, 1);
      assert.equal(t.unregistered, 1);
    } finally {
      t.restore();
    }
  });

  test('a call not streamed rejects when its signal aborts; the handle then answers as before', async () => {
    const ac = new AbortController();
    const whole = local.completions.create(LONG, { signal: ac.signal });
    setImmediate(() => ac.abort());
    const got = await whole.catch((e) => e);
    assert.ok(got instanceof APIUserAbortError, String(got));
    assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
    const req = { model: MODEL, messages: CONVERSATIONS[1], max_tokens: 12, temperature: 0 };
    assert.deepEqual(strip(await local.chat.completions.create(req)), strip(await sdk.chat.completions.create(req)));
  });

  test('close() rejects a stream still waiting for the handle with APIUserAbortError', async () => {
    const c = new Client({ models: { [MODEL]: LIB_DIR }, options: { threads: 1 } });
    const running = await c.completions.create({ ...LONG, stream: true });
    const queued = c.completions.create({ ...LONG, seed: 9, stream: true }).catch((e) => e);
    await c.close();
    const got = await queued;
    assert.ok(got instanceof APIUserAbortError, String(got));
    assert.match(got.message, /closed/);
    assert.equal((await running._ignis.answer).error.code, 'cancelled');
  });

  test('one long-lived signal over many requests keeps no listeners', async () => {
    const hybrid = new Client({ models: { 'local-tiny': LIB_DIR }, baseURL: BASE_URL, apiKey: 'none',
      options: { threads: 1 } });
    const { signal } = new AbortController();
    const count = () => getEventListeners(signal, 'abort').length;
    const opts = { signal };
    try {
      for (const model of ['local-tiny', MODEL]) {       // the library, then the server
        for (let i = 0; i < 5; i++) {
          const req = { model, prompt: 'Hello', max_tokens: 8, seed: i };
          await hybrid.completions.create(req, opts);
          await hybrid.embeddings.create({ model, input: 'hi' }, opts);
          await collect(await hybrid.completions.create({ ...req, stream: true }, opts));
          const early = await hybrid.completions.create({ ...LONG, model, stream: true }, opts);
          assert.equal(count(), 1, `an open stream listens: ${model}, round ${i}`);
          for await (const c of early) { void c; break; }
          await assert.rejects(hybrid.completions.create({ ...req, max_tokens: 0 }, opts), BadRequestError);
          await assert.rejects(hybrid.completions.create({ ...req, max_tokens: 0, stream: true }, opts),
            BadRequestError);
          assert.equal(count(), 0, `${model}, round ${i}`);
        }
      }
    } finally {
      await hybrid.close();
    }
  });

  test('a stream left unread is cancelled past maxBufferedChunks; its reader then gets StreamOverflowError',
    async () => {
      const c = new Client({ models: { [MODEL]: LIB_DIR }, options: { threads: 1 }, maxBufferedChunks: 4 });
      try {
        const stream = await c.completions.create({ ...LONG, stream: true });
        assert.equal((await stream._ignis.answer).error.code, 'cancelled');
        assert.equal(stream._ignis.chunks(), 5);         // four held, the fifth refused
        const seen = [];
        const err = await (async () => { for await (const chunk of stream) seen.push(chunk); })().catch((e) => e);
        assert.ok(err instanceof StreamOverflowError, String(err));
        assert.match(err.message, /4 chunks unread.*maxBufferedChunks/);
        // what came before is the start of the whole answer
        const whole = await c.completions.create(LONG);
        assert.equal(seen.length, 4);
        assert.ok(whole.choices[0].text.startsWith(seen.map((x) => x.choices[0].text).join('')));
        // a stream read as it comes is never near the limit
        const text = (await collect(await c.completions.create({ ...LONG, stream: true })))
          .map((x) => x.choices[0]?.text ?? '').join('');
        assert.equal(text, whole.choices[0].text);
      } finally {
        await c.close();
      }
      for (const bad of [0, -1, 2.5, '10', NaN, null]) {
        assert.throws(() => new Client({ models: { [MODEL]: LIB_DIR }, maxBufferedChunks: bad }),
          (e) => e instanceof TypeError && /maxBufferedChunks/.test(e.message), String(bad));
      }
    });

  test('a library call refused as it starts unregisters its callback and leaves the handle usable', async () => {
    const m = local.local.get(MODEL);
    const fns = m._fns;
    const t = trackCallbacks();
    try {
      m._fns = { ...fns, completions: { async() { throw new TypeError('refused by koffi'); } } };
      await assert.rejects(local.completions.create({ ...LONG, stream: true }), /refused by koffi/);
      await assert.rejects(local.completions.create(LONG), /refused by koffi/);
      assert.equal(t.registered, 1);
      assert.equal(t.unregistered, 1);
    } finally {
      m._fns = fns;
      t.restore();
    }
    const r = await local.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 3 });
    assert.ok(r.usage.completion_tokens <= 3);
  });
});

test('the TypeScript declarations compile against a usage file (tsc --noEmit)', () => {
  const tsc = path.join(HERE, '..', 'node_modules', 'typescript', 'bin', 'tsc');
  const p = spawnSync(process.execPath, [tsc, '--noEmit', '-p', path.join(HERE, 'tsconfig.json')],
    { encoding: 'utf8' });
  assert.equal(p.status, 0, `tsc failed:\n${p.stdout}${p.stderr}`);
});
