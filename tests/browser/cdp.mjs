// A minimal Chrome DevTools Protocol client over Chromium's
// --remote-debugging-pipe (fd 3: commands to the browser, fd 4: its answers
// and events, each message JSON ended by a NUL byte). No WebSocket and no npm
// package needed: node's child_process is enough.
import { spawn } from 'node:child_process';

export class Browser {
  static async launch(binary, userDataDir) {
    const args = [
      '--headless=new', '--remote-debugging-pipe', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
      '--no-first-run', '--no-default-browser-check', '--disable-extensions', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--metrics-recording-only', '--mute-audio',
      `--user-data-dir=${userDataDir}`, '--window-size=1400,1000', 'about:blank',
    ];
    const proc = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
    const b = new Browser(proc);
    await b.send('Browser.getVersion');
    return b;
  }

  constructor(proc) {
    this.proc = proc;
    this.nextId = 1;
    this.pending = new Map();
    this.listeners = [];
    this.stderr = '';
    this.exited = false;
    let buffer = Buffer.alloc(0);
    proc.stdio[4].on('data', (chunk) => {
      buffer = Buffer.concat([buffer, chunk]);
      let end;
      while ((end = buffer.indexOf(0)) >= 0) {
        const msg = JSON.parse(buffer.subarray(0, end).toString('utf8'));
        buffer = buffer.subarray(end + 1);
        this.onMessage(msg);
      }
    });
    proc.stderr.on('data', (d) => { this.stderr = (this.stderr + d).slice(-4000); });
    proc.on('exit', () => {
      this.exited = true;
      for (const { reject } of this.pending.values()) reject(new Error(`chromium exited: ${this.stderr}`));
      this.pending.clear();
    });
  }

  onMessage(msg) {
    if (msg.id && this.pending.has(msg.id)) {
      const { resolve, reject, method } = this.pending.get(msg.id);
      this.pending.delete(msg.id);
      if (msg.error) reject(new Error(`${method}: ${msg.error.message}`));
      else resolve(msg.result);
      return;
    }
    for (const l of this.listeners) l(msg);
  }

  send(method, params = {}, sessionId = undefined) {
    const id = this.nextId++;
    const msg = { id, method, params };
    if (sessionId) msg.sessionId = sessionId;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      this.proc.stdio[3].write(JSON.stringify(msg) + '\0');
    });
  }

  on(listener) {
    this.listeners.push(listener);
  }

  // A new tab, attached: returns a Page whose commands go to its session.
  async newPage() {
    const { targetId } = await this.send('Target.createTarget', { url: 'about:blank' });
    const { sessionId } = await this.send('Target.attachToTarget', { targetId, flatten: true });
    return new Page(this, sessionId);
  }

  async close() {
    if (this.exited) return;
    const exited = new Promise((r) => this.proc.once('exit', r));
    this.send('Browser.close').catch(() => {});
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
  }
}

export class Page {
  constructor(browser, sessionId) {
    this.browser = browser;
    this.sessionId = sessionId;
    this.errors = [];  // console errors, uncaught exceptions, failed loads
    browser.on((msg) => {
      if (msg.sessionId !== sessionId) return;
      const p = msg.params;
      if (msg.method === 'Runtime.consoleAPICalled' && (p.type === 'error' || p.type === 'assert')) {
        this.errors.push(`console.${p.type}: ${p.args.map((a) => a.value ?? a.description).join(' ')}`);
      } else if (msg.method === 'Runtime.exceptionThrown') {
        this.errors.push(`exception: ${p.exceptionDetails.exception?.description ?? p.exceptionDetails.text}`);
      } else if (msg.method === 'Log.entryAdded' && p.entry.level === 'error') {
        this.errors.push(`log: ${p.entry.text} ${p.entry.url ?? ''}`);
      }
    });
  }

  send(method, params = {}) {
    return this.browser.send(method, params, this.sessionId);
  }

  async open(url) {
    await this.send('Runtime.enable');
    await this.send('Log.enable');
    await this.send('Page.enable');
    await this.send('Emulation.setDeviceMetricsOverride', { width: 1400, height: 1000, deviceScaleFactor: 1, mobile: false });
    await this.send('Page.navigate', { url });
  }

  async eval(expression) {
    const r = await this.send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) throw new Error(`${expression}: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
    return r.result.value;
  }

  // Polls `expression` until it is truthy; returns its value.
  async waitFor(expression, what, timeoutMs = 30000) {
    const until = Date.now() + timeoutMs;
    let last;
    while (Date.now() < until) {
      last = await this.eval(expression).catch((e) => e.message);
      if (last && !(typeof last === 'string' && last.includes('Error'))) return last;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`timed out waiting for ${what} (last: ${JSON.stringify(last)})`);
  }

  // A real mouse click in the middle of the element `selector` matches.
  async click(selector) {
    const box = await this.eval(`(() => {
      const e = document.querySelector(${JSON.stringify(selector)});
      if (!e) return null;
      e.scrollIntoView({ block: 'center' });
      const r = e.getBoundingClientRect();
      return { x: r.left + r.width / 2, y: r.top + r.height / 2 };
    })()`);
    if (!box) throw new Error(`nothing matches ${selector}`);
    for (const type of ['mouseMoved', 'mousePressed', 'mouseReleased']) {
      await this.send('Input.dispatchMouseEvent', { type, x: box.x, y: box.y, button: 'left', clickCount: 1 });
    }
  }

  // The whole page, as tall as its content.
  async screenshot() {
    const { cssContentSize: size } = await this.send('Page.getLayoutMetrics');
    const clip = { x: 0, y: 0, width: Math.ceil(size.width), height: Math.ceil(size.height), scale: 1 };
    const { data } = await this.send('Page.captureScreenshot', { format: 'png', captureBeyondViewport: true, clip });
    return Buffer.from(data, 'base64');
  }
}
