// chat.mjs — a streaming chat from Node.js with a model compiled by `ignis compile`:
//
//     ignis compile qwen2.5-coder-0.5b-instruct -o qwen-native
//     (cd clients/node && npm install --omit=dev)
//     node examples/node/chat.mjs qwen-native system "Be brief." user "Write a haiku about C."
//     node examples/node/chat.mjs -n 64 qwen-native user "hi" assistant "Hello!" user "Who are you?"
//     node examples/node/chat.mjs -x '{"logit_bias": {"198": -100}}' qwen-native user "One line, please."
//     IGNIS_BASE_URL=http://127.0.0.1:8000/v1 node examples/node/chat.mjs -m other-model qwen-native user "hi"
//
// The conversation is given as ROLE CONTENT pairs and answered greedily (temperature 0; -n caps the
// answer's tokens; -x adds request fields, a JSON object) by the compiled library in DIR, its text
// printed as it streams. -m asks for
// another model name: with no library for it, the request goes to IGNIS_BASE_URL (`ignis serve`
// or any OpenAI-compatible server) — the same code, local or remote. An application installs the
// package (npm install --install-links PATH/clients/node) and imports it as 'ignis-client'.

import { Client, OpenAIError } from '../../clients/node/index.js';

function usage(why) {
  process.stderr.write(`${why}\nusage: node chat.mjs [-n MAX_TOKENS] [-m MODEL] [-x JSON] DIR ROLE CONTENT [ROLE CONTENT ...]\n`);
  process.exit(2);
}

const args = process.argv.slice(2);
let maxTokens = 256;
let model = null;
let extra = {};
while (args[0]?.startsWith('-')) {
  const flag = args.shift();
  const value = args.shift();
  if (value === undefined) usage(`${flag} needs a value`);
  if (flag === '-n') maxTokens = Number.parseInt(value, 10);
  else if (flag === '-m') model = value;
  else if (flag === '-x') {
    try {
      extra = JSON.parse(value);
    } catch (e) {
      usage(`-x takes a JSON object: ${e.message}`);
    }
  }
  else usage(`unknown option ${flag}`);
}
const [dir, ...turns] = args;
if (!dir || turns.length === 0 || turns.length % 2) usage('give a directory and ROLE CONTENT pairs');
const messages = [];
for (let i = 0; i < turns.length; i += 2) messages.push({ role: turns[i], content: turns[i + 1] });

let client;
try {
  // the compiled model is known by the name it was compiled as
  client = new Client({ models: [dir], baseURL: process.env.IGNIS_BASE_URL });
  const compiled = [...client.local.keys()][0];
  const stream = await client.chat.completions.create({
    model: model ?? compiled, messages, max_tokens: maxTokens, temperature: 0, ...extra, stream: true,
  });
  for await (const chunk of stream) {
    process.stdout.write(chunk.choices[0]?.delta.content ?? '');
  }
  process.stdout.write('\n');
} catch (e) {
  if (!(e instanceof OpenAIError)) throw e;
  process.stderr.write(`${e.message}\n`);
  process.exitCode = 1;
} finally {
  await client?.close();
}
