// Starts `spillway serve` for node tests (the SDK test, the browser test):
// a config in `dir`, port 0, ready once /readyz says so; and stops it.
import { spawn } from 'node:child_process';
import { writeFileSync, readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';

export const BIN = process.env.SPILLWAY_BIN ?? 'build/bin';
export const MODELS = process.env.SPILLWAY_MODELS ?? 'build/models';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A [[service]] with one placement on the CPU, as TOML (the test models by name, e.g. "tiny-chat").
export function cpuService(name, model, ctx, slots) {
  return `
[[service]]
name = "${name}"
model = "${MODELS}/${model}.gguf"
[[service.placement]]
device = "cpu"
ctx = ${ctx}
slots = ${slots}
threads = 1
`;
}

// Returns { gateway, base } (base: "http://127.0.0.1:PORT"), or throws when
// it is not ready within `timeoutMs`.
export async function startGateway(dir, configToml, env = process.env, timeoutMs = 60000) {
  writeFileSync(join(dir, 'spillway.toml'), configToml);
  const gateway = spawn(`${BIN}/spillway`, ['serve', '--config', join(dir, 'spillway.toml'), '--state-dir', join(dir, 'state'),
    '--listen', '127.0.0.1:0', '--port-file', join(dir, 'port')], { stdio: ['ignore', 'inherit', 'inherit'], env });
  const until = Date.now() + timeoutMs;
  while (Date.now() < until && gateway.exitCode === null) {
    if (existsSync(join(dir, 'port'))) {
      const base = `http://127.0.0.1:${readFileSync(join(dir, 'port'), 'utf8').trim()}`;
      try {
        if ((await fetch(`${base}/readyz`)).status === 200) return { gateway, base };
      } catch {}
    }
    await sleep(50);
  }
  await stopGateway(gateway);
  throw new Error('the gateway did not become ready');
}

export async function stopGateway(gateway) {
  if (!gateway || gateway.exitCode !== null || gateway.signalCode !== null) return;
  const exited = new Promise((r) => gateway.once('exit', r));
  gateway.kill('SIGTERM');
  await exited;
}
