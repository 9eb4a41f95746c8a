// The official `ollama` npm client, unmodified, against `spillway serve`: Ollama's API on the
// gateway's port. The chat service's model is `ollama:tiny-chat:latest`, read from an Ollama store
// laid out here with the generated models (OLLAMA_MODELS), as a user's existing store would be.
// Run by ctest: node --test tests/clients/ollama_client.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Ollama } from 'ollama';
import { MODELS, cpuService, startGateway, stopGateway } from './gateway.mjs';

let dir, gateway, base, ollama;

// manifests/registry.ollama.ai/library/NAME/TAG -> blobs/sha256-HEX, as Ollama writes them.
function layOutStore(root, name, tag, gguf) {
  const hex = createHash('sha256').update(readFileSync(gguf)).digest('hex');
  mkdirSync(join(root, 'blobs'), { recursive: true });
  copyFileSync(gguf, join(root, 'blobs', `sha256-${hex}`));
  const manifestDir = join(root, 'manifests', 'registry.ollama.ai', 'library', name);
  mkdirSync(manifestDir, { recursive: true });
  writeFileSync(join(manifestDir, tag), JSON.stringify({
    schemaVersion: 2,
    mediaType: 'application/vnd.docker.distribution.manifest.v2+json',
    layers: [{ mediaType: 'application/vnd.ollama.image.model', digest: `sha256:${hex}`, size: statSync(gguf).size }],
  }));
  return hex;
}

let blobHex;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'spillway-ollama-'));
  const store = join(dir, 'ollama-store');
  blobHex = layOutStore(store, 'tiny-chat', 'latest', `${MODELS}/tiny-chat.gguf`);
  const chat = cpuService('chat', 'tiny-chat', 8192, 2).replace(`"${MODELS}/tiny-chat.gguf"`, '"ollama:tiny-chat:latest"');
  ({ gateway, base } = await startGateway(dir, chat + cpuService('embed', 'tiny-embed', 512, 1),
    { ...process.env, OLLAMA_MODELS: store }));
  ollama = new Ollama({ host: base });
});

after(async () => {
  await stopGateway(gateway);
  rmSync(dir, { recursive: true, force: true });
});

test('version', async () => {
  const v = await ollama.version();
  assert.match(v.version, /^\d+\.\d+\.\d+$/);
});

test('chat, whole: Ollama fields and stats', async () => {
  const r = await ollama.chat({
    model: 'chat', messages: [{ role: 'user', content: 'Hello' }], options: { temperature: 0, num_predict: 8 },
  });
  assert.equal(r.model, 'chat');
  assert.equal(r.message.role, 'assistant');
  assert.equal(typeof r.message.content, 'string');
  assert.equal(r.done, true);
  assert.ok(['stop', 'length'].includes(r.done_reason), r.done_reason);
  assert.ok(r.eval_count > 0 && r.eval_count <= 8, `eval_count ${r.eval_count}`);
  assert.ok(r.prompt_eval_count > 0);
  assert.ok(r.total_duration > 0);
  assert.ok(!Number.isNaN(Date.parse(r.created_at)));
});

test('chat streamed (the default) equals the whole answer', async () => {
  const params = { model: 'chat:latest', messages: [{ role: 'user', content: 'Stream' }], options: { temperature: 0, num_predict: 12, seed: 4 } };
  const whole = await ollama.chat({ ...params, stream: false });
  let text = '';
  let last = null;
  for await (const part of await ollama.chat({ ...params, stream: true })) {
    text += part.message.content;
    last = part;
  }
  assert.equal(text, whole.message.content);
  assert.equal(last.done, true);
  assert.equal(last.done_reason, whole.done_reason);
  assert.equal(last.eval_count, whole.eval_count);
});

test('generate, whole and streamed, and a format schema is honoured', async () => {
  const params = { model: 'chat', prompt: 'Tell me', system: 'Be brief', options: { temperature: 0, num_predict: 10 } };
  const whole = await ollama.generate(params);
  assert.equal(whole.done, true);
  assert.equal(typeof whole.response, 'string');
  let text = '';
  for await (const part of await ollama.generate({ ...params, stream: true })) text += part.response;
  assert.equal(text, whole.response);
  const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
  const json = await ollama.generate({ model: 'chat', prompt: 'JSON please', format: schema, options: { temperature: 1, seed: 3, num_predict: 60 } });
  assert.equal(typeof JSON.parse(json.response).ok, 'boolean', json.response);
  // An empty prompt loads the model (keep_alive accepted).
  const load = await ollama.generate({ model: 'chat', prompt: '', keep_alive: '5m' });
  assert.equal(load.done_reason, 'load');
});

test('embed and the legacy embeddings', async () => {
  const e = await ollama.embed({ model: 'embed', input: ['one', 'two'] });
  assert.equal(e.model, 'embed');
  assert.equal(e.embeddings.length, 2);
  assert.ok(e.embeddings[0].length > 0);
  const single = await ollama.embed({ model: 'embed', input: 'one' });
  assert.deepEqual(single.embeddings[0], e.embeddings[0]);
  const legacy = await ollama.embeddings({ model: 'embed', prompt: 'one' });
  assert.deepEqual(legacy.embedding, e.embeddings[0]);
});

test('embed cuts an input past the context, as Ollama does unless told not to', async () => {
  const long = Array.from({ length: 700 }, (_, i) => `w${i}`).join(' ');  // past the service's 512 cells
  const cut = await ollama.embed({ model: 'embed', input: [long, 'one'] });
  assert.equal(cut.embeddings.length, 2);
  const one = await ollama.embed({ model: 'embed', input: 'one' });
  assert.equal(cut.prompt_eval_count, 512 + one.prompt_eval_count, 'the long input counted as cut to 512');
  const res = await fetch(`${base}/api/embed`, {
    method: 'POST',
    body: JSON.stringify({ model: 'embed', input: long }),
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('x-spillway-truncated-inputs'), '1', 'the client is told');
  await assert.rejects(ollama.embed({ model: 'embed', input: long, truncate: false }), /exceeds/);
  // The OpenAI route cuts when asked; the answer's body says so too, and so
  // does its replay under the same Idempotency-Key.
  const ask = () => fetch(`${base}/v1/embeddings`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Idempotency-Key': 'cut-once' },
    body: JSON.stringify({ model: 'embed', input: [long], truncate: true }),
  });
  const first = await ask();
  assert.equal(first.status, 200);
  assert.equal(first.headers.get('x-spillway-truncated-inputs'), '1');
  assert.equal((await first.json()).spillway.truncated_inputs, 1);
  const again = await ask();
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(again.headers.get('x-spillway-truncated-inputs'), '1', 'the replay says it too');
  assert.equal((await again.json()).spillway.truncated_inputs, 1, 'and its body');
  const ollamaReplay = () => fetch(`${base}/api/embed`, {
    method: 'POST',
    headers: { 'Idempotency-Key': 'cut-ollama' },
    body: JSON.stringify({ model: 'embed', input: long }),
  });
  assert.equal((await ollamaReplay()).headers.get('x-spillway-truncated-inputs'), '1');
  const ollamaAgain = await ollamaReplay();
  assert.equal(ollamaAgain.headers.get('idempotent-replayed'), 'true');
  assert.equal(ollamaAgain.headers.get('x-spillway-truncated-inputs'), '1', 'an Ollama replay too');
  const refused = await fetch(`${base}/v1/embeddings`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'embed', input: long }),
  });
  assert.equal(refused.status, 400, 'without truncate, as OpenAI: refused');
});

test('a chat past the context loses its oldest messages, as Ollama does unless told not to', async () => {
  // Past the chat service's 4096 cells a request (8192 over 2 slots): an
  // Open WebUI conversation that has gone on long enough.
  const messages = [{ role: 'system', content: 'You keep a lighthouse.' }];
  for (let i = 0; i < 60; i++) {
    const words = Array.from({ length: 12 }, (_, k) => `turn${i}word${k}`).join(' ');
    messages.push({ role: 'user', content: `question ${words}` }, { role: 'assistant', content: `answer ${words}` });
  }
  messages.push({ role: 'user', content: 'And the storm tonight?' });
  const r = await ollama.chat({ model: 'chat', messages, options: { temperature: 0, num_predict: 4 } });
  assert.equal(r.done, true);
  const dropped = r.spillway?.dropped_messages;
  assert.ok(dropped > 0 && dropped % 2 === 0, `dropped ${dropped}`);
  assert.ok(r.prompt_eval_count < 4096 && r.prompt_eval_count > 3000, `prompt_eval_count ${r.prompt_eval_count}`);
  // Streamed: the same, in the last line; and the header says it.
  let last = null;
  for await (const part of await ollama.chat({ model: 'chat', messages, stream: true, options: { num_predict: 2 } })) last = part;
  assert.equal(last.spillway?.dropped_messages, dropped);
  const res = await fetch(`${base}/api/chat`, {
    method: 'POST',
    body: JSON.stringify({ model: 'chat', messages, stream: false, options: { num_predict: 2 } }),
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('x-spillway-dropped-messages'), String(dropped));
  await assert.rejects(ollama.chat({ model: 'chat', messages, truncate: false, options: { num_predict: 2 } }), /does not fit/);
  // The OpenAI route keeps OpenAI's refusal unless asked.
  const openai = (extra, key) => fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...(key ? { 'Idempotency-Key': key } : {}) },
    body: JSON.stringify({ model: 'chat', messages, max_tokens: 2, ...extra }),
  });
  const refused = await openai({});
  assert.equal(refused.status, 400);
  assert.equal((await refused.json()).error.code, 'context_length_exceeded', "OpenAI's code, which clients look for");
  const asked = await openai({ truncate: true }, 'long-chat');
  assert.equal(asked.status, 200);
  assert.equal(asked.headers.get('x-spillway-dropped-messages'), String(dropped));
  assert.equal((await asked.json()).spillway.dropped_messages, dropped);
  const replayed = await openai({ truncate: true }, 'long-chat');
  assert.equal(replayed.headers.get('idempotent-replayed'), 'true');
  assert.equal(replayed.headers.get('x-spillway-dropped-messages'), String(dropped), 'a replay says it again');
});

test('tags, show and ps', async () => {
  const tags = await ollama.list();
  const chat = tags.models.find((m) => m.name === 'chat:latest');
  assert.ok(chat, JSON.stringify(tags));
  assert.equal(chat.digest, blobHex, 'an ollama: model carries its blob digest');
  assert.equal(chat.details.format, 'gguf');
  assert.equal(chat.details.family, 'llama');
  assert.ok(chat.details.quantization_level);
  assert.ok(chat.size > 0);
  assert.ok(tags.models.some((m) => m.name === 'embed:latest'));

  const show = await ollama.show({ model: 'chat' });
  assert.ok(show.template.includes('im_start'));
  assert.equal(show.model_info['general.architecture'], 'llama');
  // Arrays as Ollama gives them unless verbose: a long one (the vocabulary) empty, not null.
  assert.deepEqual(show.model_info['tokenizer.ggml.tokens'], []);
  assert.ok(show.capabilities.includes('completion'));
  assert.ok((await ollama.show({ model: 'embed' })).capabilities.includes('embedding'));

  const ps = await ollama.ps();
  const running = ps.models.find((m) => m.name === 'chat:latest');
  assert.ok(running, JSON.stringify(ps));
  assert.equal(running.context_length, 4096, "one request's context: its slot's share of 8192 cells in 2 slots");
  assert.ok(running.size > 0);
  assert.ok(!Number.isNaN(Date.parse(running.expires_at)));
});

test('an unknown model is Ollama\'s 404, a bad body a clear 400', async () => {
  await assert.rejects(ollama.chat({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status_code === 404 && e.error === "model 'nope' not found");
  await assert.rejects(ollama.show({ model: 'nope' }), (e) => e.status_code === 404);
  await assert.rejects(ollama.generate({ model: 'chat', prompt: 'x', options: { num_predict: -3 } }),
    (e) => e.status_code === 400 && e.error.includes('options.num_predict'));
  await assert.rejects(ollama.pull({ model: 'llama3' }), (e) => e.status_code === 501);
});

test('who served it is said in the headers, as on the OpenAI API', async () => {
  const res = await fetch(`${base}/api/generate`, {
    method: 'POST', body: JSON.stringify({ model: 'chat', prompt: 'hi', stream: false, keep_alive: 0, options: { num_predict: 2 } }),
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('x-spillway-placement'), 'cpu');
  assert.match(res.headers.get('x-request-id'), /^req_/);
  assert.match(res.headers.get('x-spillway-keep-alive'), /not applied/);
  const stream = await fetch(`${base}/api/chat`, {
    method: 'POST', body: JSON.stringify({ model: 'chat', messages: [{ role: 'user', content: 'hi' }], options: { num_predict: 2 } }),
  });
  assert.equal(stream.headers.get('content-type'), 'application/x-ndjson');
  assert.equal(stream.headers.get('x-spillway-placement'), 'cpu');
  const lines = (await stream.text()).trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(lines.at(-1).done, true);
});

test('Idempotency-Key through the client: a replay is the same answer, another body Ollama\'s 422', async () => {
  const keyed = new Ollama({ host: base, headers: { 'Idempotency-Key': `k-${process.pid}` } });
  const params = { model: 'chat', prompt: 'once', options: { temperature: 1, num_predict: 6 } };
  const first = await keyed.generate(params);
  const again = await keyed.generate(params);
  assert.equal(again.response, first.response);
  assert.equal(again.eval_count, first.eval_count);
  await assert.rejects(keyed.generate({ ...params, prompt: 'another' }),
    (e) => e.status_code === 422 && typeof e.error === 'string' && e.error.includes('Idempotency-Key'));
});

test('tools are accepted, thinking refused as Ollama does; an aborted stream is a cancelled request', async () => {
  const tools = [{ type: 'function', function: { name: 'increment', parameters: { type: 'object', properties: {} } } }];
  const r = await ollama.chat({ model: 'chat', messages: [{ role: 'user', content: 'Count' }], tools, think: false,
    options: { num_predict: 8 } });
  assert.equal(r.done, true);
  assert.ok(Array.isArray(r.message.tool_calls ?? []));
  // The demo's template (Qwen2.5's) does not reason: `think` is Ollama's 400, and /api/show agrees.
  await assert.rejects(ollama.chat({ model: 'chat', messages: [{ role: 'user', content: 'Count' }], think: true }),
    (e) => e.status_code === 400 && e.error === '"chat" does not support thinking');
  const caps = (await ollama.show({ model: 'chat' })).capabilities;
  assert.ok(caps.includes('tools') && !caps.includes('thinking'), JSON.stringify(caps));

  // A seeded generation that runs to its num_predict (checked: done_reason "length"), then the same, aborted.
  const long = { model: 'chat', prompt: 'long', options: { num_predict: 3000, seed: 11, temperature: 1 } };
  const client = new Ollama({ host: base, headers: { 'X-Request-Id': `ollama-abort-${process.pid}` } });
  const stream = await client.generate({ ...long, stream: true });
  let parts = 0;
  try {
    for await (const _ of stream) {
      if (++parts === 3) client.abort();
    }
  } catch (e) {
    assert.equal(e.name, 'AbortError', String(e));
  }
  assert.ok(parts < 3000, `the stream ran to its end (${parts} parts)`);
  let state;
  for (let i = 0; i < 200; i++) {
    state = (await (await fetch(`${base}/v1/requests/ollama-abort-${process.pid}`)).json()).state;
    if (state !== 'running' && state !== 'queued') break;
    await new Promise((res) => setTimeout(res, 25));
  }
  assert.equal(state, 'cancelled');
  const whole = await ollama.generate({ ...long, options: { ...long.options, num_predict: 3000 } });
  assert.equal(whole.done_reason, 'length', 'the seeded generation does not end early, so the abort is what ended it');
});
