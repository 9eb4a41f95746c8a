// The dashboard in a real browser: Debian's headless Chromium, driven over
// the DevTools protocol (cdp.mjs), against `spillway serve` with chat on the
// simulated accelerator and a different, smaller fallback model on the CPU.
// The page must load without console errors, show both services, turn to the
// degraded banner naming the fallback model when the device is lost, list a
// waiting request and cancel it with its button (the journal says cancelled).
// Screenshots go to $SPILLWAY_TEST_OUTPUT (build/test-output/browser).
// Run by ctest: node --test tests/browser/dashboard.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync, mkdirSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Browser } from './cdp.mjs';
import { BIN, MODELS, cpuService, startGateway, stopGateway } from '../clients/gateway.mjs';

const CHROMIUM = process.env.CHROMIUM ?? 'chromium';
// An external server on the simulated device (tests/fakes/fake_upstream_main.cpp), holding 24 MiB there.
const FAKE_UPSTREAM = process.env.FAKE_UPSTREAM ?? 'build/tests/fake-upstream';
const OUT = process.env.SPILLWAY_TEST_OUTPUT ?? 'build/test-output/browser';
const SECRET = `browser-test-${randomBytes(8).toString('hex')}`;
let dir, env, gateway, base, browser, page;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function api(method, path, body, headers = {}) {
  const res = await fetch(`${base}${path}`, {
    method, headers: { 'Content-Type': 'application/json', ...headers }, body: body && JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, body: await res.json().catch(() => null) };
}

async function shot(name) {
  mkdirSync(OUT, { recursive: true });
  writeFileSync(join(OUT, name), await page.screenshot());
}

function chat(id, maxTokens) {
  // Not awaited by the caller: it runs (or waits) while the page watches.
  return api('POST', '/v1/chat/completions', {
    model: 'chat', messages: [{ role: 'user', content: `A long answer, please (${id})` }], max_tokens: maxTokens,
    temperature: 0, ignore_eos: true,
  }, { 'X-Request-Id': id }).catch((e) => ({ status: 0, error: e }));
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'spillway-browser-'));
  env = { ...process.env, SPILLWAY_SIM_DIR: join(dir, 'sim'), SPILLWAY_WORKER_SECRET: SECRET };
  mkdirSync(env.SPILLWAY_SIM_DIR);
  execFileSync(`${BIN}/spillway`, ['sim', 'create', 'sim:0', '--capacity-mib', '256'], { env });
  ({ gateway, base } = await startGateway(dir, `
[[device]]
name = "sim:0"
headroom_mib = 16
headroom_pct = 0
[[service]]
name = "chat"
model = "${MODELS}/tiny-chat.gguf"
max_tokens = 8000
[service.failover]
breaker_failures = 1
ejection_s = 600
max_ejection_s = 600
[service.cpu_path]
max_tokens = 7000
concurrency = 1
[[service.placement]]
device = "sim:0"
gpu_layers = 99
ctx = 2048
slots = 2
threads = 1
batch = 64
[[service.placement]]
role = "fallback"
device = "cpu"
model = "${MODELS}/tiny-chat-b.gguf"
different_model = true
ctx = 16384
slots = 2
threads = 1
` + cpuService('embed', 'tiny-embed', 512, 1) + `
[[service]]
name = "rerank"
kind = "external"
command = "${FAKE_UPSTREAM} --port \${PORT} --sim-device 0 --resident-mib 24"
routes = { "/v1/rerank" = "/v1/rerank" }
device = "sim:0"
resident_mib = 8
`, env));
  browser = await Browser.launch(CHROMIUM, join(dir, 'chromium'));
  page = await browser.newPage();
  await page.open(`${base}/`);
});

after(async () => {
  if (page) await shot('dashboard-last.png').catch(() => {});
  await browser?.close();
  await stopGateway(gateway);
  rmSync(dir, { recursive: true, force: true });
});

test('the page loads live, without console errors, and shows both demo services and the devices', async () => {
  await page.waitFor(`document.getElementById('conn').dataset.state === 'live'`, 'the event stream');
  const services = await page.waitFor(`(() => {
    const s = [...document.querySelectorAll('.card.service')].map((e) => e.dataset.service);
    return s.length === 3 ? s : null;
  })()`, 'three service cards');
  assert.deepEqual(services, ['chat', 'embed', 'rerank']);
  // The external server's own card: supervised by Spillway, its memory on the device.
  const rerank = await page.waitFor(`(() => {
    const c = document.querySelector('.card.service.external[data-service="rerank"]');
    return c && c.querySelector('.badge').textContent === 'ready' ? c.textContent : null;
  })()`, "the external server's card");
  assert.match(rerank, /external server, started by Spillway, pid [0-9]+/);
  assert.match(rerank, /24\.0 MiB on sim:0 \(held now\)/);
  assert.match(rerank, /0 running, 0 waiting of [0-9]+/);
  assert.equal(await page.eval(`document.querySelector('.card.service[data-service="chat"] .badge').textContent`), 'ready');
  assert.equal(await page.eval(`document.getElementById('banners').children.length`), 0);
  const devices = await page.eval(`[...document.querySelectorAll('.card.device')].map((e) => e.dataset.device)`);
  assert.deepEqual(devices, ['sim:0', 'cpu']);
  // The simulated device's bar holds chat's weights and KV cache, and the
  // external server's memory as the device reports it (not its declared 8 MiB).
  assert.ok(await page.eval(`document.querySelectorAll('.card.device[data-device="sim:0"] .bar .seg.weights').length`) >= 1);
  const external = await page.waitFor(`(() => {
    const t = document.querySelector('.card.device[data-device="sim:0"] tr[data-external="rerank"]')?.textContent;
    return t && t.includes('held now') ? t : null;
  })()`, "the external server's row");
  assert.equal(external, 'rerank · external server24.0 MiB held now');
  assert.equal(await page.eval(`document.querySelectorAll('.card.device[data-device="sim:0"] .bar .seg.external').length`), 1);
  assert.equal(await page.waitFor(`document.querySelectorAll('#charts canvas').length`, 'the memory charts'), 2);
  // Each running worker's host RAM, as the supervisor samples it.
  const rss = await page.waitFor(`(() => {
    const t = document.querySelector('.card.service[data-service="chat"] table.placements tbody tr td.rss')?.textContent;
    return t && t.endsWith('MiB') ? t : null;
  })()`, "the chat worker's host RAM");
  assert.match(rss, /^[0-9.]+ MiB$/);
  await shot('dashboard-healthy.png');
  assert.deepEqual(page.errors, []);
});

test('a lost device turns the page to the degraded banner naming the fallback model', async () => {
  const status = (await api('GET', '/v1/status')).body;
  const gpu = status.services[0].placements[0];
  const armed = await fetch(`http://127.0.0.1:${gpu.port}/v1/worker/faults`, {
    method: 'POST', headers: { Authorization: `Bearer ${SECRET}` }, body: JSON.stringify({ faults: ['lose-at-token=2'] }),
  });
  assert.equal(armed.status, 200);
  const r = await chat('br-lost', 8);
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('x-spillway-placement'), 'cpu');
  const banner = await page.waitFor(`document.querySelector('.banner[data-service="chat"]')?.textContent`, 'the degraded banner');
  assert.match(banner, /chat is degraded/);
  assert.match(banner, /fallback model tiny-chat-b on cpu/);
  assert.match(banner, /answers of up to 7000 tokens/);
  assert.equal(await page.eval(`document.querySelector('.card.service[data-service="chat"] .badge').textContent`), 'degraded');
  await page.waitFor(`document.querySelector('#incidents li[data-kind="failover"]')?.textContent.includes('br-lost')`,
    'the failover incident');
  await shot('dashboard-degraded.png');
  assert.deepEqual(page.errors, []);
});

test('a waiting request is listed and its Cancel button cancels it in the journal', async () => {
  // The CPU path runs one request at a time: one runs, the next two wait.
  const running = chat('br-run', 7000);
  await page.waitFor(`document.querySelector('tr[data-request="br-run"]')`, 'the running request');
  const waiting = [chat('br-wait-1', 7000)];
  await page.waitFor(`document.querySelector('tr[data-request="br-wait-1"]')`, 'the first waiting request');
  waiting.push(chat('br-wait-2', 7000));
  const row = await page.waitFor(`(() => {
    const r = document.querySelector('tr[data-request="br-wait-2"]');
    return r && r.textContent.includes('waiting') ? r.textContent : null;
  })()`, 'the waiting request');
  assert.match(row, /^br-wait-2chatwaiting[12]/);  // id, service, phase, position (2, or 1 once br-run ended)
  await shot('dashboard-waiting.png');
  // A cancel that fails (the gateway did not answer) can be tried again:
  // the button comes back instead of staying "Cancelling…".
  await page.eval(`window.realFetch = window.fetch;
    window.fetch = (u, o) => (o && o.method === 'DELETE') ? Promise.reject(new Error('down')) : window.realFetch(u, o)`);
  await page.click('button[data-cancel="br-wait-1"]');
  await page.waitFor(`document.getElementById('action').textContent === 'br-wait-1: the gateway did not answer'`,
    'the failed cancel');
  await page.waitFor(`(() => {
    const b = document.querySelector('button[data-cancel="br-wait-1"]');
    return b && !b.disabled && b.textContent === 'Cancel';
  })()`, 'the Cancel button back');
  await page.eval(`window.fetch = window.realFetch`);
  await page.click('button[data-cancel="br-wait-2"]');
  // The journal says cancelled, and so does the page.
  let state;
  for (let i = 0; i < 100 && state !== 'cancelled'; i++) {
    state = (await api('GET', '/v1/requests/br-wait-2')).body.state;
    if (state !== 'cancelled') await sleep(100);
  }
  assert.equal(state, 'cancelled');
  assert.equal((await waiting[1]).status, 499);
  await page.waitFor(`document.getElementById('action').textContent === 'br-wait-2: cancelled'`, 'the cancel answer');
  await page.waitFor(`!document.querySelector('tr[data-request="br-wait-2"]')`, 'the row to go');
  await page.waitFor(`document.querySelector('#incidents li[data-kind="cancelled"]')?.textContent.includes('br-wait-2')`,
    'the cancel incident');
  await shot('dashboard-cancelled.png');
  assert.deepEqual(page.errors, []);
  for (const id of ['br-wait-1', 'br-run']) await api('DELETE', `/v1/requests/${id}`);
  await Promise.all([running, waiting[0]]);
});

test('with API keys the page asks for one, sends it in the header only and goes live', async () => {
  const keyed = mkdtempSync(join(tmpdir(), 'spillway-browser-keys-'));
  const { gateway: gw, base: keyedBase } = await startGateway(keyed, 'api_keys = ["sk-browser-test"]\n' +
    cpuService('chat', 'tiny-chat', 1024, 1) + cpuService('embed', 'tiny-embed', 512, 1));
  try {
    const p = await browser.newPage();
    await p.open(`${keyedBase}/`);
    await p.waitFor(`!document.getElementById('keyform').hidden && document.getElementById('conn').dataset.state === 'key'`,
      'the key form');
    // A wrong key is refused and said so.
    await p.click('#key');
    await p.send('Input.insertText', { text: 'sk-wrong' });
    await p.click('#keyform button');
    await p.waitFor(`document.getElementById('keyerror').textContent.includes('valid API key')`, 'the refusal');
    await p.click('#key');
    await p.send('Input.insertText', { text: 'sk-browser-test' });
    await p.click('#keyform button');
    await p.waitFor(`document.getElementById('conn').dataset.state === 'live'`, 'the stream with the key');
    await p.waitFor(`document.querySelectorAll('.card.service').length === 2`, 'both services');
    assert.equal(await p.eval(`document.getElementById('keyform').hidden`), true);
    assert.equal(await p.eval(`location.href`), `${keyedBase}/`, 'no key in the URL');
    // The only errors are the browser's notes on the two refused streams (401), never the key itself.
    assert.equal(p.errors.length, 2, p.errors.join('\n'));
    for (const e of p.errors) {
      assert.match(e, /401/);
      assert.doesNotMatch(e, /sk-/);
    }
    await p.send('Page.close');
  } finally {
    await stopGateway(gw);
    rmSync(keyed, { recursive: true, force: true });
  }
});
