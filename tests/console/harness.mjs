// The browser tests' kit: real `taskmesh serve` and `taskmesh worker`
// processes on free loopback ports over a temporary directory, Chromium
// (Debian's) driven by playwright-core, axe-core, and waits that are
// conditions with deadlines. A process that exits while a test expects it
// to run fails that test; every process is stopped at the end, on failure
// and on interrupt too.

import { before, after, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, readFileSync, existsSync, readdirSync } from 'node:fs';
import { tmpdir, homedir } from 'node:os';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';

const require = createRequire(import.meta.url);
const HERE = path.dirname(fileURLToPath(import.meta.url));
export const REPO = path.resolve(HERE, '..', '..');
export const CONSOLE_DIR = path.join(REPO, 'crates', 'gateway', 'console');
export const SHOTS = path.join(REPO, 'docs', 'console');
export const BIN = process.env.TASKMESH_BIN
  || path.join(process.env.CARGO_TARGET_DIR || path.join(homedir(), '.cache', 'taskmesh-target'), 'debug', 'taskmesh');
export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
// For work on the console's files without rebuilding the binary: pages get
// the files of this tree instead of the embedded ones (the binary's headers,
// CSP included, are kept). The check that the binary embeds this tree's
// files is skipped then.
export const FROM_DISK = process.env.CONSOLE_FROM_DISK === '1';
// Keeps the temporary directories (data and process logs) for a look after.
const KEEP = process.env.CONSOLE_KEEP === '1';
const AXE = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
export const WAIT = 20_000; // the deadline of any one condition
export const T = { timeout: 180_000 }; // the deadline of one test: a test that hangs fails

// ---- processes ---------------------------------------------------------------

const children = new Set();
const dirs = [];
let unexpected = null; // the first process that died while it should run

function tail(child) {
  return child.output.split('\n').slice(-40).join('\n');
}

/** Fails when a process the tests rely on has exited. */
export function assertAlive() {
  if (unexpected) {
    const c = unexpected;
    throw new Error(`${c.label} exited (code ${c.exitCode}, signal ${c.signalCode}) while the tests needed it; its last lines:\n${tail(c)}`);
  }
}

/** Polls `check` until it returns a truthy value or the deadline passes. */
export async function until(what, check, timeout = WAIT) {
  const end = Date.now() + timeout;
  let last;
  for (;;) {
    assertAlive();
    try {
      const v = await check();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}${last ? `: ${last.message}` : ''}`);
    await new Promise((r) => setTimeout(r, 100)); // polling interval, not a synchronisation
  }
}

// The children get this process's environment without TASKMESH_* (a
// developer's own settings must not change the run), plus what is named.
function env(extra) {
  const out = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('TASKMESH_')) out[k] = v;
  return { ...out, NO_COLOR: '1', ...extra };
}

function start(label, args, extra = {}) {
  const child = spawn(BIN, args, { env: env(extra), stdio: ['ignore', 'pipe', 'pipe'] });
  child.label = label;
  child.output = '';
  child.mayExit = false;
  const keep = (d) => {
    child.output = (child.output + d).slice(-200_000);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  children.add(child);
  child.on('exit', () => {
    if (!child.mayExit && !unexpected) unexpected = child;
  });
  return child;
}

/** Stops one process: SIGTERM, then SIGKILL after 10 s. */
export async function stop(child) {
  if (!child) return;
  child.mayExit = true;
  if (child.exitCode === null && child.signalCode === null) {
    const gone = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    await gone;
    clearTimeout(timer);
  }
  children.delete(child);
}

/** Stops every process and removes the temporary directories. */
export async function stopAll() {
  await Promise.all([...children].map(stop));
  for (const d of dirs.splice(0)) {
    if (KEEP) console.log(`# kept ${d}`);
    else rmSync(d, { recursive: true, force: true });
  }
}
// A crash of the test process itself still takes the servers down.
process.once('exit', () => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
});
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.once(sig, () => {
    for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
    process.exit(130);
  });
}

/**
 * A `taskmesh serve` on SQLite in a fresh temporary directory, both ports
 * picked by the kernel (127.0.0.1:0) and read back from its start-up log
 * line; resolves once /readyz answers 200.
 */
export async function startServe({ auth = false, bootstrap } = {}) {
  assert.ok(existsSync(BIN), `no taskmesh binary at ${BIN} (set TASKMESH_BIN, or build it: cargo build -p taskmesh-cli)`);
  const dir = mkdtempSync(path.join(tmpdir(), 'tm-console-'));
  dirs.push(dir);
  const args = ['serve', '--data-dir', path.join(dir, 'data'),
    '--grpc-addr', '127.0.0.1:0', '--http-addr', '127.0.0.1:0', '--log-format', 'json'];
  if (auth) args.push('--auth');
  const child = start(auth ? 'taskmesh serve --auth' : 'taskmesh serve', args,
    auth ? { TASKMESH_BOOTSTRAP_TOKEN: bootstrap } : {});
  const addrs = await until('taskmesh serve to log its addresses', () => {
    const line = child.output.split('\n').find((l) => l.includes('taskmesh node started'));
    if (!line) return null;
    const grpc = /grpc_addr"?[=:]\s*"?([0-9.]+:\d+)/.exec(line)?.[1];
    const http = /http_addr"?[=:]\s*"?([0-9.]+:\d+)/.exec(line)?.[1];
    return grpc && http ? { grpc, http } : null;
  }, 60_000);
  const base = `http://${addrs.http}`;
  await until('taskmesh serve to be ready', async () => (await fetch(`${base}/readyz`)).ok, 60_000);
  return { base, ui: `${base}/ui/`, grpc: `http://${addrs.grpc}`, dir, child };
}

/** A `taskmesh worker` process with the built-in handlers, connected to `server`. */
export function startWorker(server, { workerId, handlers = 'echo,sleep,fail,log', labels = [], token, concurrency = 8 } = {}) {
  const args = ['worker', '--server', server.grpc, '--handlers', handlers, '--concurrency', String(concurrency), '--log-format', 'json'];
  if (workerId) args.push('--worker-id', workerId);
  for (const l of labels) args.push('--label', l);
  return start(`taskmesh worker ${workerId || ''}`.trim(), args, token ? { TASKMESH_TOKEN: token } : {});
}

/** Runs a short taskmesh command (e.g. `token create`); resolves with its stdout. */
export async function runBin(args, extra = {}) {
  const { stdout } = await promisify(execFile)(BIN, args, { env: env(extra), timeout: WAIT });
  return stdout;
}

// ---- the REST API, as a script would call it -----------------------------------

/** A REST client of one server. */
export function client(base, token) {
  async function call(method, p, body) {
    const headers = { 'content-type': 'application/json' };
    if (token) headers.authorization = `Bearer ${token}`;
    const res = await fetch(`${base}${p}`, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let json = {};
    try {
      json = text ? JSON.parse(text) : {};
    } catch {
      json = { text };
    }
    if (!res.ok) {
      const err = new Error(`${method} ${p} ${body === undefined ? '' : JSON.stringify(body)}: HTTP ${res.status} ${text}`);
      err.status = res.status;
      err.body = json;
      throw err;
    }
    return json;
  }
  const b64 = (v) => Buffer.from(JSON.stringify(v)).toString('base64');
  return {
    call,
    async submit(handler, payload, extra = {}) {
      const res = await call('POST', '/api/tasks', {
        handler, payload: payload === undefined ? undefined : { data: b64(payload), contentType: 'application/json' }, ...extra,
      });
      return res.taskId;
    },
    task: async (id) => (await call('GET', `/api/tasks/${id}`)).task,
    state: async (id) => (await call('GET', `/api/tasks/${id}`)).task.state,
    stats: () => call('GET', '/api/stats?windowMinutes=60'),
    workers: async () => (await call('GET', '/api/workers')).workers || [],
  };
}

// ---- the browser ------------------------------------------------------------------

let browser;
export async function launchBrowser() {
  assert.ok(existsSync(CHROMIUM), `no Chromium at ${CHROMIUM} (apt-get install -y chromium; never npx playwright install)`);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  return browser;
}
export async function closeBrowser() {
  await browser?.close();
  browser = null;
}

/**
 * A page in a fresh browser context (its own sessionStorage). The console's
 * content-security policy is enforced: a script, style or call it refuses
 * is recorded and fails the test at closePage().
 */
export async function newPage({ colorScheme = 'light', width = 1280, height = 800 } = {}) {
  const context = await browser.newContext({ viewport: { width, height }, colorScheme });
  if (FROM_DISK) {
    await context.route(/\/ui\/[^?#]*$/, async (route) => {
      const response = await route.fetch();
      const name = new URL(route.request().url()).pathname.replace(/^\/ui\/?/, '') || 'index.html';
      const file = path.join(CONSOLE_DIR, name);
      if (response.ok() && existsSync(file)) await route.fulfill({ response, body: readFileSync(file) });
      else await route.fulfill({ response });
    });
  }
  const page = await context.newPage();
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (/Content Security Policy/i.test(m.text())) page.errors.push(`CSP: ${m.text()}`);
  });
  return page;
}

/** Closes a page's context, failing on any page error or CSP refusal it saw. */
export async function closePage(page) {
  const errors = page.errors.slice();
  await page.context().close();
  assert.deepEqual(errors, [], 'the page logged errors');
}

/** Waits until the view for `hash` has drawn (app.js marks main[data-ready]). */
export async function ready(page, hash) {
  const p = hash.replace(/^#/, '').split('?')[0];
  await page.waitForSelector(`main[data-ready="${p}"]`, { timeout: WAIT });
}
export async function open(page, ui, hash) {
  await page.goto(`${ui}${hash}`);
  await ready(page, hash);
}

/** axe-core on the page as it is: no serious or critical violation. */
export async function axe(page, label) {
  // Evaluated through the DevTools protocol, which the page's CSP does not
  // govern (a <script> tag of it would be refused).
  if (!(await page.evaluate(() => typeof window.axe === 'object'))) await page.evaluate(AXE);
  const violations = await page.evaluate(async () => {
    const r = await window.axe.run(document, { resultTypes: ['violations'] });
    return r.violations.map((v) => ({ id: v.id, impact: v.impact, targets: v.nodes.map((n) => n.target.join(' ')).slice(0, 5) }));
  });
  const bad = violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  assert.deepEqual(bad, [], `${label}: axe found ${JSON.stringify(bad, null, 1)}`);
  return violations;
}

/** Presses Tab (or `key`) until the focused element matches `selector`. */
export async function tabTo(page, selector, max = 150, key = 'Tab') {
  for (let i = 0; i < max; i++) {
    await page.keyboard.press(key);
    if (await page.evaluate((s) => document.activeElement?.matches(s), selector)) return;
  }
  throw new Error(`${key} never reached ${selector}`);
}
export const focused = (page) => page.evaluate(() => ({
  tag: document.activeElement?.tagName, id: document.activeElement?.id, text: document.activeElement?.textContent?.trim(),
  inDialog: Boolean(document.activeElement?.closest('dialog')),
}));

/** The console's files on disk (what the binary must embed). */
export function consoleFiles() {
  return readdirSync(CONSOLE_DIR).filter((n) => !n.startsWith('.'));
}

/** A full-page screenshot into docs/console/NAME.png. */
export function shot(page, name, opts = {}) {
  mkdirSync(SHOTS, { recursive: true });
  return page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true, ...opts });
}

// ---- one test file's stack ----------------------------------------------------------

/**
 * Registers the hooks of a test file: before it, a `taskmesh serve` (with
 * --auth and a bootstrap token when asked), a separate `taskmesh worker`
 * (unless `worker: false`) and the browser; after each test, a check that
 * none of the processes died; after it, everything stopped. Returns an
 * object filled in by the time the tests run: { server, api, open(page,
 * hash), bootstrap }.
 */
export function useStack({ auth = false, worker = true } = {}) {
  const s = {};
  before(async () => {
    if (auth) s.bootstrap = randomHex(32);
    s.server = await startServe({ auth, bootstrap: s.bootstrap });
    s.api = client(s.server.base, s.bootstrap);
    s.open = (page, hash) => open(page, s.server.ui, hash);
    if (worker) {
      // With --auth, a worker token of its own, made as an operator would.
      const token = auth ? (await runBin(['token', 'create', '--server', s.server.grpc, '--role', 'worker', '--name', 'console-worker'],
        { TASKMESH_TOKEN: s.bootstrap })).trim() : undefined;
      s.worker = startWorker(s.server, { workerId: 'console-worker', token });
      await until('the worker to register', async () => (await s.api.workers()).some((w) => w.workerId === 'console-worker'));
    }
    await launchBrowser();
  });
  afterEach(() => assertAlive());
  after(async () => {
    await closeBrowser();
    await stopAll();
  });
  return s;
}

function randomHex(bytes) {
  return Array.from(crypto.getRandomValues(new Uint8Array(bytes)), (b) => b.toString(16).padStart(2, '0')).join('');
}
