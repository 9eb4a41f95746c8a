// The official `openai` npm client, unmodified, against `spillway serve`.
// Run by ctest: node --test tests/clients/openai_sdk.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { cpuService, startGateway, stopGateway } from './gateway.mjs';

let dir, gateway, base, client;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'spillway-sdk-'));
  ({ gateway, base } = await startGateway(dir, cpuService('chat', 'tiny-chat', 8192, 2) + cpuService('embed', 'tiny-embed', 512, 1)));
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused-locally', maxRetries: 0 });
});

after(async () => {
  await stopGateway(gateway);
  rmSync(dir, { recursive: true, force: true });
});

test('chat completion', async () => {
  const r = await client.chat.completions.create({
    model: 'chat', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.match(r.id, /^req_/);
  assert.equal(r.usage.completion_tokens, r.choices[0].finish_reason === 'length' ? 8 : r.usage.completion_tokens);
});

test('streaming chat equals the non-streamed answer', async () => {
  const params = { model: 'chat', messages: [{ role: 'user', content: 'Stream' }], max_tokens: 12, temperature: 0 };
  const whole = await client.chat.completions.create(params);
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
});

test('a forced tool call, whole and streamed (the SDK accumulates the deltas)', async () => {
  const params = {
    model: 'chat', messages: [{ role: 'user', content: 'Count up' }], max_tokens: 200, temperature: 1, seed: 5,
    tools: [{ type: 'function', function: { name: 'increment', parameters: { type: 'object', properties: {} } } }],
    tool_choice: 'required', parallel_tool_calls: false,
  };
  const whole = await client.chat.completions.create(params);
  assert.equal(whole.choices[0].finish_reason, 'tool_calls');
  assert.equal(whole.choices[0].message.content, null);
  const call = whole.choices[0].message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'increment');
  assert.deepEqual(JSON.parse(call.function.arguments), {});
  assert.match(call.id, /^call_[0-9a-f]{24}$/);
  const streamed = await client.beta.chat.completions.stream(params).finalChatCompletion();
  assert.equal(streamed.choices[0].finish_reason, 'tool_calls');
  assert.equal(streamed.choices[0].message.tool_calls.length, 1);
  assert.equal(streamed.choices[0].message.tool_calls[0].function.name, 'increment');
  assert.equal(streamed.choices[0].message.tool_calls[0].function.arguments, call.function.arguments);
});

test('structured output: a json_schema response_format is honoured, whole and streamed', async () => {
  // Bounded so that even the random demo model closes the object.
  const schema = {
    type: 'object',
    properties: { n: { type: 'integer' }, ok: { type: 'boolean' }, tag: { type: 'string', enum: ['a', 'b'] } },
    required: ['n', 'ok', 'tag'], additionalProperties: false,
  };
  const params = {
    model: 'chat', messages: [{ role: 'user', content: 'Give me JSON' }], max_tokens: 120, temperature: 1, seed: 3,
    response_format: { type: 'json_schema', json_schema: { name: 'reply', strict: true, schema } },
  };
  const whole = await client.chat.completions.create(params);
  assert.equal(whole.choices[0].finish_reason, 'stop');
  const value = JSON.parse(whole.choices[0].message.content);
  assert.equal(typeof value.n, 'number');
  assert.equal(typeof value.ok, 'boolean');
  assert.ok(['a', 'b'].includes(value.tag));
  const streamed = await client.beta.chat.completions.stream(params).finalChatCompletion();
  assert.deepEqual(JSON.parse(streamed.choices[0].message.content), value);
  // What cannot be honoured is refused, never silently dropped.
  await assert.rejects(client.chat.completions.create({ ...params, response_format: undefined, mirostat: 2 }),
    (e) => e.status === 400 && /mirostat/.test(e.message));
});

test('logit_bias is accepted through the gateway; a token outside the vocabulary is a 400 naming it', async () => {
  const params = { model: 'chat', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0 };
  const plain = await client.chat.completions.create(params);
  const biased = await client.chat.completions.create({ ...params, logit_bias: { 5: -100, 6: 1.5 } });
  assert.equal(typeof biased.choices[0].message.content, 'string');
  assert.equal(biased.usage.prompt_tokens, plain.usage.prompt_tokens);
  await assert.rejects(client.chat.completions.create({ ...params, logit_bias: { 99999999: 10 } }),
    (e) => e.status === 400 && /logit_bias/.test(e.message) && /99999999/.test(e.message));
  await assert.rejects(client.chat.completions.create({ ...params, logit_bias: { 5: 101 } }),
    (e) => e.status === 400 && /logit_bias/.test(e.message));
});

test('logprobs and top_logprobs, whole and streamed', async () => {
  const params = { model: 'chat', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 6, temperature: 0,
    logprobs: true, top_logprobs: 3 };
  const whole = await client.chat.completions.create(params);
  const lp = whole.choices[0].logprobs.content;
  assert.equal(lp.length, whole.usage.completion_tokens);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    // Greedy: the chosen token is the most likely one.
    assert.equal(t.logprob, t.top_logprobs[0].logprob);
  }
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const streamed = [];
  for await (const chunk of stream) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed.map((t) => t.logprob), lp.map((t) => t.logprob));
});

test('completions', async () => {
  const r = await client.completions.create({ model: 'chat', prompt: 'Once upon', max_tokens: 5, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
});

test('embeddings (the SDK asks for base64 and decodes it)', async () => {
  const r = await client.embeddings.create({ model: 'embed', input: ['hello', 'world'] });
  assert.equal(r.data.length, 2);
  assert.equal(r.data[0].embedding.length, 64);
  const norm = Math.sqrt(r.data[0].embedding.reduce((s, x) => s + x * x, 0));
  assert.ok(Math.abs(norm - 1) < 1e-3, `norm ${norm}`);
  const f = await client.embeddings.create({ model: 'embed', input: 'hello', encoding_format: 'float' });
  assert.deepEqual(f.data[0].embedding.map((x) => Math.fround(x)), r.data[0].embedding.map((x) => Math.fround(x)));
});

test('model listing', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids.sort(), ['chat', 'embed']);
});

test('an error status surfaces as the SDK error class', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'nosuch', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(
    client.chat.completions.create({ model: 'chat', messages: [{ role: 'user', content: 'x' }], temperature: 9 }),
    (e) => e instanceof OpenAI.BadRequestError && /temperature/.test(e.message) && e.code === 'invalid_argument');
});

test("a prompt past the context is OpenAI's 400 with code context_length_exceeded, whole and streamed", async () => {
  // Past the 4096 cells one request holds (8192 over 2 slots).
  const messages = [];
  for (let i = 0; i < 60; i++) {
    const words = Array.from({ length: 12 }, (_, k) => `turn${i}word${k}`).join(' ');
    messages.push({ role: 'user', content: `question ${words}` }, { role: 'assistant', content: `answer ${words}` });
  }
  messages.push({ role: 'user', content: 'And now?' });
  const past = (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded';
  await assert.rejects(client.chat.completions.create({ model: 'chat', messages, max_tokens: 2 }), past);
  await assert.rejects(async () => {
    for await (const _ of await client.chat.completions.create({ model: 'chat', messages, max_tokens: 2, stream: true }));
  }, past);
  // A short prompt whose max_tokens no context holds.
  await assert.rejects(client.completions.create({ model: 'chat', prompt: 'Hi', max_tokens: 4096 }), past);
});

async function waitUntilRunning(id) {
  let state;
  for (let i = 0; i < 400; i++) {
    const r = await fetch(`${base}/v1/requests/${id}`);
    state = r.status === 200 ? (await r.json()).state : undefined;
    if (state === 'running' || (state !== undefined && state !== 'queued')) break;
    await sleep(25);
  }
  return state;
}

async function waitState(id) {
  let state;
  for (let i = 0; i < 200; i++) {
    state = (await (await fetch(`${base}/v1/requests/${id}`)).json()).state;
    if (state !== 'running' && state !== 'queued') break;
    await sleep(25);
  }
  return state;
}

test('an AbortController abort shows up as a cancelled request', async () => {
  const long = { model: 'chat', messages: [{ role: 'user', content: 'long' }], max_tokens: 3500, ignore_eos: true };
  // Non-streaming: the SDK rejects with its abort error.
  const controller = new AbortController();
  const pending = client.chat.completions.create(long, { signal: controller.signal, headers: { 'X-Request-Id': 'sdk-abort-1' } });
  pending.catch(() => {});  // (awaited below; not an unhandled rejection meanwhile)
  // Aborted once it runs (a fixed pause could abort it before it was sent).
  assert.equal(await waitUntilRunning('sdk-abort-1'), 'running');
  controller.abort();
  await assert.rejects(pending, (e) => e instanceof OpenAI.APIUserAbortError);
  assert.equal(await waitState('sdk-abort-1'), 'cancelled');

  // Streaming: the SDK ends the iteration quietly; the request is cancelled, not finished.
  const c2 = new AbortController();
  const stream = await client.chat.completions.create({ ...long, stream: true },
    { signal: c2.signal, headers: { 'X-Request-Id': 'sdk-abort-2' } });
  let chunks = 0;
  setTimeout(() => c2.abort(), 150);
  try {
    for await (const _ of stream) chunks++;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
  }
  assert.ok(chunks < 3500, `stream ran to the end (${chunks} chunks)`);
  assert.equal(await waitState('sdk-abort-2'), 'cancelled');
});
