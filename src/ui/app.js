// Spillway's dashboard: reads GET /v1/events (Server-Sent Events) with fetch()
// and a stream reader, so that the API key travels in the Authorization
// header (EventSource cannot send one) and never in a URL. Everything is
// built with DOM calls and textContent: nothing the gateway sends is parsed as HTML.
'use strict';

const KEY_STORE = 'spillway-api-key';
const HISTORY_MS = 10 * 60 * 1000;
const state = { key: sessionStorage.getItem(KEY_STORE) || '', snapshot: null, history: {}, cancelling: new Set() };

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function headers() {
  return state.key ? { Authorization: `Bearer ${state.key}` } : {};
}

function mib(bytes) {
  if (bytes === undefined || bytes === null) return '–';
  const m = bytes / 1048576;
  return m >= 10240 ? `${(m / 1024).toFixed(1)} GiB` : `${m >= 100 ? m.toFixed(0) : m.toFixed(1)} MiB`;
}

function age(ms) {
  if (ms === undefined || ms === null) return '–';
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

function setConn(s, text) {
  const c = $('conn');
  c.dataset.state = s;
  c.textContent = text;
}

// ---- the event stream -------------------------------------------------------

async function connect() {
  setConn('connecting', 'connecting…');
  // The gateway sends a snapshot at least every 5 s: a stream silent for
  // 15 s is dead (a laptop that slept, a network that changed without a
  // reset), and its numbers are not live any more.
  const abort = new AbortController();
  let heard = Date.now();
  const watchdog = setInterval(() => {
    if (Date.now() - heard > 15000) abort.abort();
  }, 1000);
  let res;
  try {
    res = await fetch('/v1/events', { headers: headers(), cache: 'no-store', signal: abort.signal });
  } catch (e) {
    clearInterval(watchdog);
    return retry();
  }
  if (res.status === 401 || res.status === 403) {
    clearInterval(watchdog);
    const body = await res.json().catch(() => ({}));
    askForKey(state.key ? (body.error && body.error.message) || 'the key was refused' : '');
    return;
  }
  if (!res.ok || !res.body) {
    clearInterval(watchdog);
    return retry();
  }
  $('keyform').hidden = true;
  setConn('live', 'live');
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      heard = Date.now();
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        dispatch(block);
      }
    }
  } catch (e) {
    // the connection dropped (or fell silent and was aborted): fall through to a retry
  }
  clearInterval(watchdog);
  retry();
}

function retry() {
  setConn('reconnecting', 'reconnecting…');
  setTimeout(connect, 2000);
}

function dispatch(block) {
  let name = 'message';
  const data = [];
  for (const line of block.split('\n')) {
    if (line.startsWith('event:')) name = line.slice(6).trim();
    else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
  }
  if (!data.length) return;
  let payload;
  try {
    payload = JSON.parse(data.join('\n'));
  } catch (e) {
    return;
  }
  if (name === 'snapshot') onSnapshot(payload);
  else if (name === 'history') onHistory(payload);
  else if (name === 'incident') onIncident(payload);
}

function askForKey(error) {
  setConn('key', 'API key needed');
  $('keyform').hidden = false;
  $('keyerror').textContent = error || '';
  $('key').focus();
}

$('keyform').addEventListener('submit', (ev) => {
  ev.preventDefault();
  state.key = $('key').value.trim();
  sessionStorage.setItem(KEY_STORE, state.key);
  $('key').value = '';
  connect();
});

// ---- state -------------------------------------------------------------------

function onHistory(h) {
  state.history = {};
  for (const [device, points] of Object.entries(h)) state.history[device] = points.map((p) => [p[0], p[1], p[2]]);
}

function onSnapshot(s) {
  state.snapshot = s;
  const now = s.time_ms || Date.now();
  for (const d of s.devices || []) {
    if (d.total_bytes === undefined) continue;
    const h = (state.history[d.name] = state.history[d.name] || []);
    if (!h.length || h[h.length - 1][0] < now) h.push([now, d.used_bytes, d.total_bytes]);
    while (h.length && h[0][0] < now - HISTORY_MS) h.shift();
  }
  render();
}

function onIncident(i) {
  if (!state.snapshot) return;
  const list = state.snapshot.incidents || (state.snapshot.incidents = []);
  if (!list.some((x) => x.seq === i.seq)) list.push(i);
  renderIncidents(list);
}

// ---- rendering ---------------------------------------------------------------

function render() {
  const s = state.snapshot;
  $('updated').textContent = `updated ${clock(s.time_ms || Date.now())}`;
  renderBanners(s.services || []);
  renderServices(s.services || [], s.externals || []);
  renderDevices(s.devices || []);
  renderRequests(s.requests || []);
  renderCharts(s.devices || []);
  renderIncidents(s.incidents || []);
}

function renderBanners(services) {
  const banners = [];
  for (const s of services) {
    const v = s.serving || {};
    if (s.state === 'degraded') {
      const model = v.different_model ? `the fallback model ${v.model}` : `the same model (${v.model})`;
      banners.push(el('div', { class: 'banner', role: 'alert', 'data-service': s.name },
        el('strong', { text: `${s.name} is degraded.` }),
        `Answers come from ${model} on ${v.placement} (${v.role}). `,
        v.limits ? `Limits: ${v.limits}. ` : '',
        s.degraded ? `Why: ${s.degraded}.` : ''));
    } else if (s.state === 'unavailable') {
      banners.push(el('div', { class: 'banner down', role: 'alert', 'data-service': s.name },
        el('strong', { text: `${s.name} is ${s.state}.` }), v.summary || '',
        s.degraded ? ` Why: ${s.degraded}.` : ''));
    } else if (s.state === 'evicted') {  // unloaded (idle, or for another service): the next request loads it
      banners.push(el('div', { class: 'banner note', 'data-service': s.name },
        el('strong', { text: `${s.name} is unloaded.` }), v.summary || 'Its next request loads it again (and waits for the load).'));
    }
  }
  $('banners').replaceChildren(...banners);
}

// A starting worker that reports its load: "loading 42 % (1.2 of 2.9 GB)".
function placementState(p) {
  if (p.state === 'starting' && p.load && p.load.total_bytes > 0) {
    const gb = (b) => (b / 1e9).toFixed(b >= 1e10 ? 0 : 1);
    return `loading ${Math.floor(p.load.fraction * 100)} % (${gb(p.load.loaded_bytes)} of ${gb(p.load.total_bytes)} GB)`;
  }
  // A crash loop shows as one, not as a worker that restarts now and then.
  if (p.crashes > 1) return `${p.state} (crashed ${p.crashes}× in a row soon after starting)`;
  if (p.failed_starts > 1) return `${p.state} (failed to start ${p.failed_starts}× in a row)`;
  // On demand and stopped is no fault: its next request loads it.
  if (p.state === 'stopped' && p.on_demand) return p.ever_ready ? 'unloaded (on demand)' : 'not loaded yet (on demand)';
  return p.state || 'not started';
}

function breakerText(b) {
  if (!b) return '–';
  return b.state + (b.state !== 'closed' && b.last_reason ? `: ${b.last_reason}` : '') +
    (b.probe ? ` (one request probes it: ${b.probe})` : b.probing ? ' (one request probes it)' : '');
}

function renderServices(services, externals) {
  $('services').replaceChildren(...services.map((s) => {
    const v = s.serving || {};
    const r = s.requests || { queued: 0, running: 0 };
    // The CPU line matters only where a CPU fallback exists.
    const cpu = (s.placements || []).some((p) => p.role === 'fallback' && p.device === 'cpu') ? s.cpu_path : null;
    const rows = (s.placements || []).map((p) => el('tr', {},
      el('td', { text: p.placement }),
      el('td', { text: p.role }),
      el('td', {}, el('span', { class: `badge ${p.state === 'stopped' && p.on_demand ? 'standby' : p.state || 'stopped'}`, text: placementState(p) })),
      el('td', {}, el('span', { class: `badge ${(p.breaker && p.breaker.state) || ''}`, title: breakerText(p.breaker), text: (p.breaker && p.breaker.state) || '–' })),
      el('td', { class: 'rss', text: p.rss_bytes ? mib(p.rss_bytes) : '–' }),
      el('td', { text: p.admitted === false ? `not admitted: ${p.admission}` : [p.last_exit, p.last_error].filter(Boolean).join(': ') })));
    return el('div', { class: 'card service', 'data-service': s.name },
      el('h3', {}, s.name, el('span', { class: `badge ${s.state}`, text: s.state })),
      el('div', { class: 'summary', text: v.summary || '' }),
      el('dl', {},
        el('dt', { text: 'serving now' }), el('dd', { text: v.placement ? `${v.placement} (${v.role}), model ${v.model}` : 'nothing' }),
        el('dt', { text: 'limits' }), el('dd', { text: v.limits || '–' }),
        el('dt', { text: 'requests' }), el('dd', { text: `${r.running} running, ${r.queued} waiting` +
          (cpu ? `; CPU line: ${cpu.running} running, ${cpu.waiting} waiting of ${cpu.max_queue}` : '') }),
        el('dt', { text: 'estimated wait' }),
        el('dd', { text: waitWords(v.est_wait_s, r.queued) })),
      el('table', { class: 'placements' },
        el('thead', {}, el('tr', {}, ['placement', 'role', 'worker', 'breaker', 'host RAM', 'last problem'].map((h) => el('th', { text: h })))),
        el('tbody', {}, rows)));
  }), ...externals.map(externalCard));
}

// A server behind the gateway that Spillway does not load itself (kind =
// "external"): started and supervised by Spillway, or already running (url).
function externalCard(e) {
  const r = e.requests || {};
  const m = e.memory || {};
  const where = e.url ? `already running at ${e.url}` : `started by Spillway${e.pid ? `, pid ${e.pid}` : ''}`;
  const onDevice = e.device && e.device !== 'cpu'
    ? `${mib(m.device_bytes > 0 ? m.device_bytes : m.resident_bytes)} on ${e.device}` +
      (m.device_bytes > 0 ? ' (held now)' : ` (resident, ${m.resident_source || 'declared'})`)
    : null;
  return el('div', { class: 'card service external', 'data-service': e.name },
    el('h3', {}, e.name, el('span', { class: `badge ${e.state || 'stopped'}`, text: e.state || 'stopped' })),
    el('div', { class: 'summary', text: `external server, ${where}` }),
    el('dl', {},
      el('dt', { text: 'routes' }), el('dd', { text: Object.keys(e.routes || {}).join(', ') || '–' }),
      el('dt', { text: 'requests' }), el('dd', {
        text: `${r.running || 0} running, ${r.waiting || 0} waiting` + (r.max_queue ? ` of ${r.max_queue}` : ''),
      }),
      el('dt', { text: 'memory' }), el('dd', {
        text: [onDevice, m.host_rss_bytes ? `${mib(m.host_rss_bytes)} host RAM` : null].filter(Boolean).join('; ') || '–',
      }),
      e.residency ? el('dt', { text: 'residency' }) : null,
      e.residency ? el('dd', { text: e.residency + (e.residency !== 'pinned' && e.keep_alive_s ? `, stopped after ${e.keep_alive_s} s idle` : '') }) : null,
      e.last_error || e.last_exit ? el('dt', { text: 'last problem' }) : null,
      e.last_error || e.last_exit ? el('dd', {
        text: (e.state === 'unreachable' && e.unreachable_s >= 0 ? `unreachable for ${Math.round(e.unreachable_s)} s: ` : '') +
          [e.last_exit, e.last_error].filter(Boolean).join(': '),
      }) : null));
}

// A new request's wait before it starts, from the gateway's rough estimate.
function waitWords(est, queued) {
  if (est === null || est === undefined) return queued ? 'not measured yet' : 'none';
  return est < 1 ? 'none' : `about ${Math.ceil(est)} s (default-length answers ahead)`;
}

const KINDS = ['weights', 'kv', 'compute', 'transient'];
const KIND_WORDS = {
  weights: 'weights', kv: 'KV cache', compute: 'compute', transient: 'transient', external: 'external servers',
  other: 'not Spillway',
};

// An external server's memory: what the device says its process holds, else
// what its config declares (or was measured) as resident.
// What an external server holds on the device: measured, or for one at a
// url (no pid of its own here) its resident size; one Spillway starts holds
// nothing while stopped or starting.
function externalBytes(u) {
  return u.held_bytes > 0 ? u.held_bytes : u.url ? (u.resident_bytes || 0) : 0;
}

function renderDevices(devices) {
  $('devices').replaceChildren(...devices.map((d) => {
    const total = d.total_bytes || 0;
    const segs = [];
    const pct = (b) => `${total ? (100 * b) / total : 0}%`;
    for (const u of d.services || []) {
      if (u.kind === 'external') {
        const b = externalBytes(u);
        if (b > 0) {
          const seg = el('div', { class: 'seg external', title: `${u.service} (external server): ${mib(b)}` });
          seg.style.width = pct(b);
          segs.push(seg);
        }
        continue;
      }
      for (const k of KINDS) {
        const b = u[`${k}_bytes`] || 0;
        if (b > 0) {
          const seg = el('div', { class: `seg ${k}`, title: `${u.service} ${u.placement}: ${KIND_WORDS[k]} ${mib(b)}` });
          seg.style.width = pct(b);
          segs.push(seg);
        }
      }
    }
    if (d.other_bytes > 0) {
      const seg = el('div', { class: 'seg other', title: `other processes: ${mib(d.other_bytes)}` });
      seg.style.width = pct(d.other_bytes);
      segs.push(seg);
    }
    const headroom = el('div', { class: 'headroom', title: `headroom kept free: ${mib(d.headroom_bytes)}` });
    headroom.style.width = pct(d.headroom_bytes || 0);
    const usage = (d.services || []).map((u) => (u.kind === 'external'
      ? el('tr', { 'data-external': u.service },
        el('td', { text: `${u.service} · external server` }),
        el('td', { colspan: KINDS.length, text: `${mib(externalBytes(u))} ` +
          (u.held_bytes > 0 ? 'held now' : 'resident, as declared or last measured') }))
      : el('tr', {},
        el('td', { text: `${u.service} · ${u.placement}` }),
        ...KINDS.map((k) => el('td', { text: mib(u[`${k}_bytes`] || 0) })))));
    usage.push(el('tr', {}, el('td', { text: 'other processes' }), el('td', { text: mib(d.other_bytes) }),
      el('td'), el('td'), el('td')));
    return el('div', { class: 'card device', 'data-device': d.name },
      el('h3', {}, d.name, d.breaker ? el('span', { class: `badge ${d.breaker.state}`, text: `breaker ${d.breaker.state}` }) : null),
      d.error ? el('p', { class: 'error', text: d.error }) : null,
      el('dl', {},
        el('dt', { text: 'capacity' }), el('dd', { text: mib(d.total_bytes) }),
        el('dt', { text: 'in use' }), el('dd', { text: mib(d.used_bytes) }),
        el('dt', { text: 'free' }), el('dd', { text: mib(d.free_bytes) }),
        el('dt', { text: 'headroom' }), el('dd', { text: `${mib(d.headroom_bytes)} kept free; ` +
          `${mib(Math.max(0, (d.free_bytes || 0) - (d.headroom_bytes || 0)))} left to admit` }),
        d.breaker && d.breaker.state !== 'closed' ? el('dt', { text: 'breaker' }) : null,
        d.breaker && d.breaker.state !== 'closed' ? el('dd', { text: breakerText(d.breaker) }) : null),
      el('div', { class: 'bar' }, segs, headroom),
      el('div', { class: 'legend' }, [...KINDS, 'external', 'other'].map((k) => el('span', {}, el('i', { class: k }), KIND_WORDS[k]))),
      el('table', { class: 'usage' },
        el('thead', {}, el('tr', {}, el('th', { text: 'service' }), ...KINDS.map((k) => el('th', { text: KIND_WORDS[k] })))),
        el('tbody', {}, usage)));
  }));
}

function renderRequests(requests) {
  const tbody = $('requests').querySelector('tbody');
  tbody.replaceChildren(...requests.map((r) => el('tr', { 'data-request': r.id },
    el('td', {}, el('code', { text: r.id })),
    el('td', { text: r.service }),
    el('td', {}, el('span', { class: `badge ${r.phase}`, text: r.phase === 'queued' ? 'waiting' : r.phase })),
    el('td', {
      class: 'num', title: r.reason || '',
      text: r.position ? `${r.position}` + (r.estimated_wait_s != null ? ` (about ${Math.ceil(r.estimated_wait_s)} s)` : '') : '',
    }),
    el('td', { class: 'num', text: age(r.age_ms) }),
    el('td', { text: r.placement || '–' }),
    el('td', { class: 'num', text: `${r.attempts || 0}` }),
    el('td', {}, el('button', {
      class: 'cancel', type: 'button', 'data-cancel': r.id, disabled: state.cancelling.has(r.id),
      text: state.cancelling.has(r.id) ? 'Cancelling…' : 'Cancel', onclick: () => cancel(r.id),
    })))));
  $('requests').hidden = requests.length === 0;
  $('no-requests').hidden = requests.length !== 0;
  $('request-count').textContent = requests.length ? `(${requests.length})` : '';
}

async function cancel(id) {
  state.cancelling.add(id);
  if (state.snapshot) renderRequests(state.snapshot.requests || []);
  let text;
  let ok = false;
  let final = false;
  try {
    const res = await fetch(`/v1/requests/${encodeURIComponent(id)}`, { method: 'DELETE', headers: headers() });
    const body = await res.json().catch(() => ({}));
    ok = res.ok;
    final = ['completed', 'failed', 'failed_resumable', 'cancelled'].includes(body.state);
    text = !res.ok ? `${id}: ${(body.error && body.error.message) || res.status}`
      : final ? `${id}: ${body.state}`
      : `${id}: cancel requested (an answer already on its way may still win)`;
  } catch (e) {
    text = `${id}: the gateway did not answer`;
  }
  // A cancel that failed, or that was only requested (an answer on its way
  // may still win, and the request run on), can be tried again: the button
  // stayed "Cancelling…" for the life of the page.
  if (!ok || !final) {
    state.cancelling.delete(id);
    if (state.snapshot) renderRequests(state.snapshot.requests || []);
  }
  $('action').textContent = text;
}

function renderCharts(devices) {
  const figures = [];
  for (const d of devices) {
    const points = state.history[d.name] || [];
    let fig = document.querySelector(`#charts figure[data-device="${CSS.escape(d.name)}"]`);
    if (!fig) {
      fig = el('figure', { 'data-device': d.name }, el('figcaption'), el('canvas', { width: 600, height: 140 }));
    }
    fig.querySelector('figcaption').textContent =
      `${d.name}: ${mib(d.used_bytes)} of ${mib(d.total_bytes)} in use (last ${Math.round(HISTORY_MS / 60000)} minutes)`;
    drawChart(fig.querySelector('canvas'), points, d.headroom_bytes || 0);
    figures.push(fig);
  }
  $('charts').replaceChildren(...figures);
}

function drawChart(canvas, points, headroom) {
  const ctx = canvas.getContext('2d');
  const w = canvas.width, h = canvas.height;
  const css = getComputedStyle(document.documentElement);
  ctx.clearRect(0, 0, w, h);
  if (!points.length) return;
  const total = Math.max(...points.map((p) => p[2]), 1);
  // The last ten minutes, or since the page (or gateway) started, at least one minute.
  const t1 = points[points.length - 1][0];
  const span = Math.min(HISTORY_MS, Math.max(60000, t1 - points[0][0]));
  const t0 = t1 - span;
  const x = (t) => ((t - t0) / span) * w;
  const y = (b) => h - 4 - (b / total) * (h - 8);
  // the headroom line: above it, admission refuses
  ctx.strokeStyle = css.getPropertyValue('--bad');
  ctx.setLineDash([4, 4]);
  ctx.beginPath();
  ctx.moveTo(0, y(total - headroom));
  ctx.lineTo(w, y(total - headroom));
  ctx.stroke();
  ctx.setLineDash([]);
  ctx.fillStyle = css.getPropertyValue('--weights');
  ctx.globalAlpha = 0.25;
  ctx.beginPath();
  ctx.moveTo(x(points[0][0]), h);
  for (const p of points) ctx.lineTo(x(p[0]), y(p[1]));
  ctx.lineTo(x(t1), h);
  ctx.fill();
  ctx.globalAlpha = 1;
  ctx.strokeStyle = css.getPropertyValue('--weights');
  ctx.lineWidth = 2;
  ctx.beginPath();
  points.forEach((p, i) => (i ? ctx.lineTo(x(p[0]), y(p[1])) : ctx.moveTo(x(p[0]), y(p[1]))));
  ctx.stroke();
}

function renderIncidents(incidents) {
  const items = [...incidents].sort((a, b) => b.seq - a.seq).slice(0, 50).map((i) => el('li', { 'data-kind': i.kind },
    el('time', { datetime: new Date(i.time_ms).toISOString(), text: clock(i.time_ms) }),
    el('span', { class: `kind ${i.kind}`, text: i.kind }),
    el('span', {}, [i.service, i.placement || i.device].filter(Boolean).join(' · ') + (i.service || i.device ? ': ' : ''),
      i.request_id ? el('code', { text: `${i.request_id} ` }) : null, i.reason)));
  $('incidents').replaceChildren(...items);
  $('no-incidents').hidden = items.length !== 0;
}

connect();
