// Browser tests of the web console: a real `taskmesh dev` node, the dev
// server (console at /ui/, /api proxied) and Debian's Chromium driven by
// playwright-core. Every wait is a condition with a deadline.
//
//   cd tests/console && npm ci && node --test
//
// TASKMESH_BIN (default $CARGO_TARGET_DIR/debug/taskmesh, else
// ~/.cache/taskmesh-target/debug/taskmesh) and CHROMIUM (default
// /usr/bin/chromium) name the binaries.

import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { mkdtempSync, rmSync, mkdirSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir, homedir } from 'node:os';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const require = createRequire(import.meta.url);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, '..', '..');
const SHOTS = path.join(REPO, 'docs', 'console');
const BIN = process.env.TASKMESH_BIN
  || path.join(process.env.CARGO_TARGET_DIR || path.join(homedir(), '.cache', 'taskmesh-target'), 'debug', 'taskmesh');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const AXE = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const WAIT = 20_000; // the deadline of any one condition

// ---- harness ---------------------------------------------------------------

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Polls `check` until it returns a truthy value or the deadline passes. */
async function until(what, check, timeout = WAIT) {
  const end = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      const v = await check();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}${last ? `: ${last.message}` : ''}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const children = [];
function start(cmd, args, env = {}) {
  const child = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  child.output = '';
  const keep = (d) => {
    child.output = (child.output + d).slice(-20_000);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  children.push(child);
  return child;
}

/** A node on free ports; resolves once /readyz answers 200. */
async function startNode({ auth = false, token } = {}) {
  const dir = mkdtempSync(path.join(tmpdir(), 'tm-console-'));
  const http = await freePort();
  const args = auth
    ? ['serve', '--auth', '--data-dir', dir, '--grpc-addr', '127.0.0.1:0', '--http-addr', `127.0.0.1:${http}`]
    : ['dev', '--data-dir', dir, '--grpc-addr', '127.0.0.1:0', '--http-addr', `127.0.0.1:${http}`];
  const child = start(BIN, args, auth ? { TASKMESH_BOOTSTRAP_TOKEN: token } : {});
  const base = `http://127.0.0.1:${http}`;
  await until('taskmesh to be ready', async () => {
    if (child.exitCode !== null) throw new Error(`taskmesh exited: ${child.output}`);
    return (await fetch(`${base}/readyz`)).ok;
  }, 60_000);
  return { base, dir, child };
}

/** The dev server in front of a node; resolves with its /ui/ URL. */
async function startDevserver(apiBase) {
  const child = start('python3', [path.join(HERE, 'devserver.py'), '--port', '0', '--api', apiBase]);
  const url = await until('the dev server to listen', () => {
    if (child.exitCode !== null) throw new Error(`devserver exited: ${child.output}`);
    return /listening on (http:\S+\/ui\/)/.exec(child.output)?.[1];
  });
  return url;
}

let node;
let ui;
let browser;

async function call(method, p, body, headers = {}) {
  const res = await fetch(`${node.base}${p}`, {
    method,
    headers: { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${JSON.stringify(json)}`);
  return json;
}
const b64 = (v) => Buffer.from(JSON.stringify(v)).toString('base64');
async function submit(handler, payload, extra = {}) {
  const res = await call('POST', '/api/tasks', {
    handler, payload: payload === undefined ? undefined : { data: b64(payload), contentType: 'application/json' }, ...extra,
  });
  return res.taskId;
}
const getTask = async (id) => (await call('GET', `/api/tasks/${id}`)).task;
const stateOf = async (id) => (await getTask(id)).state;

async function newPage({ colorScheme = 'light', width = 1280, height = 800 } = {}) {
  // bypassCSP: axe is injected as an inline script, which the console's CSP refuses.
  const context = await browser.newContext({ viewport: { width, height }, colorScheme, bypassCSP: true });
  const page = await context.newPage();
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(e.message));
  return page;
}
async function open(page, hash, base = ui) {
  await page.goto(`${base}${hash}`);
  await ready(page, hash);
}
/** Waits until the view for `hash` has drawn. */
async function ready(page, hash) {
  const p = hash.replace(/^#/, '').split('?')[0];
  await page.waitForSelector(`main[data-ready="${p}"]`, { timeout: WAIT });
}
async function axe(page, label) {
  await page.addScriptTag({ content: AXE });
  const violations = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { resultTypes: ['violations'] });
    return r.violations.map((v) => ({ id: v.id, impact: v.impact, targets: v.nodes.map((n) => n.target.join(' ')).slice(0, 5) }));
  });
  const bad = violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  assert.deepEqual(bad, [], `${label}: axe found ${JSON.stringify(bad, null, 1)}`);
  return violations;
}
/** Presses Tab until the focused element matches `selector` (at most `max` times). */
async function tabTo(page, selector, max = 150, key = 'Tab') {
  for (let i = 0; i < max; i++) {
    await page.keyboard.press(key);
    if (await page.evaluate((s) => document.activeElement?.matches(s), selector)) return;
  }
  throw new Error(`${key} never reached ${selector}`);
}
const stateBadge = (page) => page.locator('#task-state').getAttribute('data-state');

before(async () => {
  assert.ok(existsSync(BIN), `no taskmesh binary at ${BIN} (set TASKMESH_BIN)`);
  assert.ok(existsSync(CHROMIUM), `no Chromium at ${CHROMIUM} (apt-get install -y chromium)`);
  mkdirSync(SHOTS, { recursive: true });
  node = await startNode();
  ui = await startDevserver(node.base);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  await until('the in-process worker', async () => (await call('GET', '/api/workers')).workers?.length > 0);
});

after(async () => {
  await browser?.close();
  for (const c of children) if (c.exitCode === null) c.kill('SIGTERM');
  await Promise.all(children.map((c) => (c.exitCode === null ? new Promise((r) => c.once('exit', r)) : null)));
  if (node) rmSync(node.dir, { recursive: true, force: true });
});

// ---- the flows ---------------------------------------------------------------

describe('console', () => {
  test('a task submitted through the API shows in the list', async () => {
    const id = await submit('echo', { from: 'list test' });
    const page = await newPage();
    await open(page, '#/tasks');
    await page.locator(`a[href="#/tasks/${id}"]`).waitFor({ timeout: WAIT });
    await page.locator('body').getByText('authentication off').waitFor({ timeout: WAIT });
    // The state filter narrows the list through the API.
    await until('the echo task to succeed', async () => (await stateOf(id)) === 'TASK_STATE_SUCCEEDED');
    await page.selectOption('#f-state', 'TASK_STATE_SUCCEEDED');
    await page.fill('#f-handler', 'echo');
    await page.click('form.filters button[type=submit]');
    await ready(page, '#/tasks');
    await page.locator(`a[href="#/tasks/${id}"]`).waitFor({ timeout: WAIT });
    assert.match(page.url(), /state=TASK_STATE_SUCCEEDED/);
    // Lookup by id opens the task; a bad id is explained next to the field.
    await page.fill('#lookup-id', 'not-a-uuid');
    await page.click('form[role=search] button');
    await page.locator('form[role=search] .error').waitFor({ timeout: WAIT });
    await page.fill('#lookup-id', id);
    await page.click('form[role=search] button');
    await ready(page, `#/tasks/${id}`);
    assert.deepEqual(page.errors, []);
    await page.context().close();
  });

  test('a task detail goes to SUCCEEDED without a reload', async () => {
    const id = await submit('sleep', { ms: 1500 }, { delay: '1s' });
    const page = await newPage();
    await open(page, `#/tasks/${id}`);
    const loads = [];
    page.on('load', () => loads.push(Date.now()));
    await page.evaluate(() => {
      window.__sameDocument = true;
    });
    await until('a state before SUCCEEDED', async () => (await stateBadge(page)) !== 'SUCCEEDED', 5000);
    await page.waitForSelector('#task-state[data-state="SUCCEEDED"]', { timeout: WAIT });
    assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page was reloaded');
    assert.equal(loads.length, 0);
    // The output and the attempt arrive with the end.
    await page.locator('ol.timeline li').first().getByText('SUCCEEDED').waitFor({ timeout: WAIT });
    await page.locator('#s-logs').waitFor();
    await page.locator('#log-lines li').first().waitFor({ timeout: WAIT }); // sleep logs its start and end
    assert.deepEqual(page.errors, []);
    await page.context().close();
  });

  test('a running sleep task is cancelled from its page', async () => {
    const id = await submit('sleep', { ms: 120000 });
    const page = await newPage();
    await open(page, `#/tasks/${id}`);
    await page.waitForSelector('#task-state[data-state="RUNNING"]', { timeout: WAIT });
    await page.click('#cancel-task');
    const dialog = page.getByRole('dialog', { name: 'Cancel this task?' });
    await dialog.waitFor({ timeout: WAIT });
    // Keeping it changes nothing.
    await dialog.getByRole('button', { name: 'Keep' }).click();
    await dialog.waitFor({ state: 'detached', timeout: WAIT });
    assert.equal(await stateOf(id), 'TASK_STATE_RUNNING');
    await page.click('#cancel-task');
    await dialog.getByRole('button', { name: 'Cancel task' }).click();
    await page.waitForSelector('#task-state[data-state="CANCELLED"]', { timeout: WAIT });
    assert.equal(await stateOf(id), 'TASK_STATE_CANCELLED');
    await page.context().close();
  });

  test('select several tasks and cancel them in bulk', async () => {
    const handler = 'bulk.target'; // no worker serves it: the tasks wait READY
    const ids = [];
    for (let i = 0; i < 3; i++) ids.push(await submit(handler, { i }));
    const keep = await submit(handler, { i: 'kept' });
    const page = await newPage();
    await open(page, `#/tasks?handler=${handler}`);
    for (const id of ids) await page.check(`input[type=checkbox][value="${id}"]`);
    await page.locator('#sel-count').getByText('3 selected').waitFor();
    await page.getByRole('button', { name: 'Cancel selected' }).click();
    const dialog = page.getByRole('dialog', { name: 'Cancel 3 tasks?' });
    await dialog.waitFor({ timeout: WAIT });
    await dialog.getByRole('button', { name: 'Cancel 3 tasks' }).click();
    await page.locator('.action-note').getByText('Cancelled 3 of 3.').waitFor({ timeout: WAIT });
    for (const id of ids) assert.equal(await stateOf(id), 'TASK_STATE_CANCELLED');
    assert.notEqual(await stateOf(keep), 'TASK_STATE_CANCELLED');
    // The reloaded page shows them cancelled.
    await page.locator(`tr[data-task="${ids[0]}"] .badge`).getByText('CANCELLED').waitFor({ timeout: WAIT });
    // Retry is not on the server yet: it says so instead of failing.
    await page.check(`input[type=checkbox][value="${ids[0]}"]`);
    await page.getByRole('button', { name: 'Retry selected' }).click();
    await page.getByRole('dialog', { name: 'Retry 1 task?' }).getByRole('button', { name: 'Retry 1' }).click();
    await page.locator('.action-note').getByText(/Retry: not available on this server|Retried/).waitFor({ timeout: WAIT });
    await call('POST', `/api/tasks/${keep}/cancel`, {});
    await page.context().close();
  });

  test('a schedule created in the form fires', async () => {
    const page = await newPage();
    await open(page, '#/schedules/new');
    await page.fill('#s-name', 'console-every-2s');
    await page.fill('#s-handler', 'echo');
    await page.selectOption('#s-kind', 'FIXED_RATE');
    await page.fill('#s-interval', '2');
    await page.fill('#s-zone', 'Europe/London');
    await page.fill('#s-payload', '{"from": "the form"}');
    // A bad payload is explained next to its field, and nothing is sent.
    await page.fill('#s-labels', 'oops');
    await page.click('form.schedule-form button[type=submit]');
    await page.locator('#e-labels').getByText(/not key=value/).waitFor();
    await page.fill('#s-labels', '');
    await page.click('form.schedule-form button[type=submit]');
    await page.waitForURL(/#\/schedules\/[0-9a-f-]{36}$/, { timeout: WAIT });
    const sid = /schedules\/([0-9a-f-]{36})/.exec(page.url())[1];
    const { schedule } = await call('GET', `/api/schedules/${sid}`);
    assert.equal(schedule.name, 'console-every-2s');
    assert.equal(schedule.timeZone, 'Europe/London');
    assert.equal(schedule.interval, '2s');
    // Its fires arrive on the page without a reload.
    await page.locator('#fires tbody tr').first().waitFor({ timeout: 30_000 });
    await page.locator('ol.fires li').first().waitFor();
    // Pause it from the page.
    await page.getByRole('button', { name: 'Pause console-every-2s' }).click();
    await until('the schedule to be paused', async () => (await call('GET', `/api/schedules/${sid}`)).schedule.paused);
    // It is in the list; delete asks first.
    await open(page, '#/schedules');
    await page.locator(`tr[data-schedule="${sid}"]`).waitFor();
    await page.getByRole('button', { name: 'Delete console-every-2s' }).click();
    await page.getByRole('dialog', { name: 'Delete this schedule?' }).getByRole('button', { name: 'Delete schedule' }).click();
    await page.locator(`tr[data-schedule="${sid}"]`).waitFor({ state: 'detached', timeout: WAIT });
    assert.deepEqual(page.errors, []);
    await page.context().close();
  });

  test('the overview says the chart is missing, and draws it once /api/stats answers', async () => {
    const page = await newPage();
    await open(page, '#/overview');
    await page.getByText('Per-minute completions, failures and retries: not available on this server.').waitFor();
    await page.locator('ul.cards li').first().waitFor();
    // The shape the console expects of the stats endpoint (see the report).
    const now = Date.now() - (Date.now() % 60000);
    const stats = {
      byState: [{ state: 'TASK_STATE_SUCCEEDED', count: '1234' }, { state: 'TASK_STATE_READY', count: '7' }],
      byHandler: [{ handler: 'echo', state: 'TASK_STATE_SUCCEEDED', count: '1234' }, { handler: 'echo', state: 'TASK_STATE_READY', count: '7' }],
      perMinute: Array.from({ length: 60 }, (_, i) => ({
        minute: new Date(now - (59 - i) * 60000).toISOString(),
        completed: String(20 + (i % 7)), failed: String(i % 5 === 0 ? 3 : 0), retried: String(i % 9 === 0 ? 2 : 0),
      })),
      queues: [{ handler: 'echo', ready: '7', oldestReadyTime: new Date(now - 90000).toISOString() }],
      leader: { nodeId: 'node-a' },
    };
    await page.route('**/api/stats*', (route) => route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(stats) }));
    await page.getByRole('button', { name: 'Refresh' }).click();
    await page.locator('svg.chart').waitFor({ timeout: WAIT });
    await page.locator('ul.cards').getByText('1,234').waitFor();
    await page.getByText('Leader replica:').waitFor();
    await axe(page, 'overview with stats');
    await page.screenshot({ path: path.join(SHOTS, 'overview-stats-light.png'), fullPage: true });
    assert.deepEqual(page.errors, []);
    await page.context().close();
  });

  test('the main flow works with the keyboard alone', async () => {
    const id = await submit('sleep', { ms: 120000 });
    const page = await newPage();
    await open(page, '#/overview');
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Skip to content');
    await tabTo(page, 'nav a[href="#/tasks"]');
    const outline = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
    assert.notEqual(outline, 'none', 'focus is visible');
    await page.keyboard.press('Enter');
    await ready(page, '#/tasks');
    assert.equal(await page.evaluate(() => document.activeElement.tagName), 'H1');
    await tabTo(page, `a[href="#/tasks/${id}"]`);
    await page.keyboard.press('Enter');
    await ready(page, `#/tasks/${id}`);
    await page.waitForSelector('#task-state[data-state="RUNNING"]', { timeout: WAIT });
    await tabTo(page, '#cancel-task');
    await page.keyboard.press('Enter');
    const dialog = page.getByRole('dialog', { name: 'Cancel this task?' });
    await dialog.waitFor();
    // Focus is in the dialog and stays there; Escape closes it and returns focus.
    for (let i = 0; i < 4; i++) {
      assert.ok(await page.evaluate(() => Boolean(document.activeElement.closest('dialog'))), 'focus left the dialog');
      await page.keyboard.press('Tab');
    }
    await page.keyboard.press('Escape');
    await dialog.waitFor({ state: 'detached' });
    assert.equal(await page.evaluate(() => document.activeElement.id), 'cancel-task');
    assert.equal(await stateOf(id), 'TASK_STATE_RUNNING');
    await page.keyboard.press('Enter');
    await dialog.waitFor();
    assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Keep');
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Cancel task');
    await page.keyboard.press('Enter');
    await page.waitForSelector('#task-state[data-state="CANCELLED"]', { timeout: WAIT });
    // On to the schedules with the keyboard.
    await tabTo(page, 'nav a[href="#/schedules"]', 50, 'Shift+Tab');
    await page.keyboard.press('Enter');
    await ready(page, '#/schedules');
    await page.context().close();
  });

  test('every view: no serious axe violation, screenshots light and dark, readable at 390 px', async () => {
    // Something to look at: a success with logs, a failure, a waiting task, a schedule.
    const done = await submit('log', { lines: 6, every_ms: 50 });
    const failed = await submit('fail', { times: 10 }, { retryPolicy: { maxAttempts: 2, initialBackoff: '0.2s' } });
    await submit('nobody.serves.this', { waiting: true }, { labels: { team: 'billing' } });
    const { schedule } = await call('POST', '/api/schedules', {
      name: 'nightly-report', kind: 'SCHEDULE_KIND_CRON', cronExpression: '0 30 2 * * *',
      timeZone: 'America/New_York', template: { handler: 'echo' },
    });
    await until('the log task to succeed', async () => (await stateOf(done)) === 'TASK_STATE_SUCCEEDED');
    await until('the fail task to fail', async () => (await stateOf(failed)) === 'TASK_STATE_FAILED', 30_000);
    const views = [
      ['overview', '#/overview'],
      ['tasks', '#/tasks'],
      ['task', `#/tasks/${done}`],
      ['task-failed', `#/tasks/${failed}`],
      ['schedules', '#/schedules'],
      ['schedule', `#/schedules/${schedule.scheduleId}`],
      ['schedule-form', '#/schedules/new'],
      ['workers', '#/workers'],
      ['breakers', '#/breakers'],
    ];
    for (const colorScheme of ['light', 'dark']) {
      const page = await newPage({ colorScheme });
      for (const [name, hash] of views) {
        await open(page, hash);
        if (name === 'task') await page.locator('#log-lines li').nth(5).waitFor({ timeout: WAIT });
        await axe(page, `${name} (${colorScheme})`);
        await page.screenshot({ path: path.join(SHOTS, `${name}-${colorScheme}.png`), fullPage: true });
      }
      // A dialog too.
      await open(page, '#/tasks');
      await page.check('#sel-all');
      await page.getByRole('button', { name: 'Cancel selected' }).click();
      await page.getByRole('dialog').waitFor();
      await axe(page, `confirm dialog (${colorScheme})`);
      await page.screenshot({ path: path.join(SHOTS, `confirm-${colorScheme}.png`) });
      await page.keyboard.press('Escape');
      assert.deepEqual(page.errors, []);
      await page.context().close();
    }
    // A phone: nothing wider than the screen but the scrollable tables.
    const phone = await newPage({ width: 390, height: 844 });
    for (const [name, hash] of views) {
      await open(phone, hash);
      const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 1, `${name} is ${overflow}px wider than a 390px screen`);
      if (['tasks', 'task', 'overview'].includes(name)) {
        await phone.screenshot({ path: path.join(SHOTS, `${name}-phone.png`), fullPage: true });
      }
    }
    await phone.context().close();
  });
});

describe('console with authentication on', () => {
  let secure;
  let secureUi;
  const token = Array.from({ length: 32 }, (_, i) => ((i * 37 + 11) % 256).toString(16).padStart(2, '0')).join('');

  before(async () => {
    secure = await startNode({ auth: true, token });
    secureUi = await startDevserver(secure.base);
  });
  after(async () => {
    if (secure?.child.exitCode === null) {
      secure.child.kill('SIGTERM');
      await new Promise((r) => secure.child.once('exit', r));
    }
    if (secure) rmSync(secure.dir, { recursive: true, force: true });
  });

  test('asks for a token once, refuses a bad one, keeps it for the session only', async () => {
    const page = await newPage();
    await page.goto(`${secureUi}#/tasks`);
    const dialog = page.getByRole('dialog', { name: 'Sign in to taskmesh' });
    await dialog.waitFor({ timeout: WAIT });
    await axe(page, 'sign-in dialog');
    await page.screenshot({ path: path.join(SHOTS, 'sign-in-light.png') });
    await page.fill('#token-input', 'tmk_000000000000_bad');
    await page.keyboard.press('Enter');
    await dialog.getByText('The server refused that token').waitFor({ timeout: WAIT });
    await page.fill('#token-input', token);
    await page.keyboard.press('Enter');
    await ready(page, '#/tasks');
    await page.getByText('signed in with a token').waitFor({ timeout: WAIT });
    await page.getByText('No tasks match.').waitFor({ timeout: WAIT });
    const stored = await page.evaluate(() => ({
      session: Object.values(sessionStorage), local: localStorage.length, url: location.href,
    }));
    assert.deepEqual(stored.session, [token]);
    assert.equal(stored.local, 0);
    assert.ok(!stored.url.includes(token));
    // Other views reuse it: no second prompt.
    await open(page, '#/workers', secureUi);
    await open(page, '#/overview', secureUi);
    assert.equal(await page.getByRole('dialog').count(), 0);
    await page.context().close();
  });
});
