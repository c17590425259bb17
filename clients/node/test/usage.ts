// Compiled by tsc --noEmit in client.test.mjs: the declarations in index.d.ts type what an
// application writes, and refuse what it must not (each @ts-expect-error line must be an error).
import Client, {
  APIError, APIUserAbortError, BadRequestError, ChatCompletion, ChatCompletionChunk, Completion,
  CreateEmbeddingResponse, NativeLibraryError, Stream, StreamOverflowError,
} from '../index.js';

async function main(): Promise<void> {
  const client = new Client({ models: { 'qwen2.5-coder-0.5b-instruct': './dir' }, baseURL: 'http://127.0.0.1:8000/v1',
    apiKey: 'none', options: { threads: 2 } });
  const r: ChatCompletion = await client.chat.completions.create({
    model: 'qwen2.5-coder-0.5b-instruct', messages: [{ role: 'user', content: 'hi' }], temperature: 0,
  });
  const text: string | null = r.choices[0].message.content;
  const tokens: number | undefined = r.usage?.completion_tokens;
  const s: Stream<ChatCompletionChunk> = await client.chat.completions.create({
    model: 'm', messages: [{ role: 'system', content: [{ type: 'text', text: 'x' }] }], stream: true,
    stream_options: { include_usage: true }, top_k: 20,
  });
  for await (const chunk of s) {
    const piece: string | null | undefined = chunk.choices[0]?.delta.content;
    void piece;
  }
  s.controller.abort();
  const c: Completion = await client.completions.create({ model: 'm', prompt: [1, 2, 3], max_tokens: 4 });
  const ac = new AbortController();
  const cs: Stream<Completion> = await client.completions.create({ model: 'm', prompt: 'x', stream: true },
    { signal: ac.signal });
  try {
    for await (const chunk of cs) void chunk;
  } catch (err) {
    if (err instanceof StreamOverflowError) void err.message;
    else if (err instanceof APIUserAbortError) void err.status;
  }
  new Client({ models: ['./a'], maxBufferedChunks: Infinity });
  const e: CreateEmbeddingResponse = await client.embeddings.create({ model: 'm', input: ['a'], encoding_format: 'base64' });
  new Client({ models: ['./a', './b'] });
  const ids: string[] = (await client.models.list()).data.map((m) => m.id);
  try {
    await client.embeddings.create({ model: 'm', input: 'a' });
  } catch (err) {
    if (err instanceof BadRequestError) {
      const status: number | undefined = err.status;
      const code: string | null | undefined = err.code;
      void status; void code;
    } else if (err instanceof APIError) {
      void err.param;
    } else if (err instanceof NativeLibraryError) {
      void err.message;
    }
  }
  await client.close();
  void text; void tokens; void c; void cs; void e; void ids;

  // @ts-expect-error: a stream is not a completion
  const wrong: ChatCompletion = await client.chat.completions.create({ model: 'm', messages: [], stream: true });
  // @ts-expect-error: messages are required
  await client.chat.completions.create({ model: 'm' });
  // @ts-expect-error: no such role
  await client.chat.completions.create({ model: 'm', messages: [{ role: 'boss', content: 'x' }] });
  // @ts-expect-error: models maps names to directories
  new Client({ models: { m: 5 } });
  // @ts-expect-error: a number of chunks
  new Client({ maxBufferedChunks: '10' });
  void wrong;
}
void main;
