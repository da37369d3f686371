// The door of the console, against a real `taskmesh serve --auth` and a
// `taskmesh worker` holding a worker token (see README.md and harness.mjs):
// the binary serves the files of this tree at /ui/ with its security
// headers, without a token; the console asks for one, refuses a bad one and
// keeps the good one for the browser tab only.

import { test, describe, before } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import {
  CONSOLE_DIR, FROM_DISK, WAIT, T, useStack, runBin, consoleFiles, newPage, closePage, ready, axe, shot,
} from './harness.mjs';

const s = useStack({ auth: true });
let token; // an admin token of the default namespace

describe('serving', () => {
  // Inside the suite: it runs once the stack's own start-up has finished.
  before(async () => {
    // Made as an operator would: `taskmesh token create` with the bootstrap token.
    token = (await runBin(['token', 'create', '--server', s.server.grpc, '--role', 'admin', '--name', 'console-test'],
      { TASKMESH_TOKEN: s.bootstrap })).trim();
    assert.match(token, /^tmk_/);
  });

  test('the binary serves the console at /ui/, with its security headers and without a token', T, async (t) => {
    const redirect = await fetch(`${s.server.base}/ui`, { redirect: 'manual' });
    assert.ok([301, 302, 303, 307, 308].includes(redirect.status), `/ui answered ${redirect.status}`);
    assert.equal(new URL(redirect.headers.get('location'), s.server.base).pathname, '/ui/');
    const index = await fetch(s.server.ui);
    assert.equal(index.status, 200);
    assert.match(index.headers.get('content-type'), /^text\/html/);
    const csp = index.headers.get('content-security-policy') || '';
    for (const part of ["default-src 'self'", "object-src 'none'", "base-uri 'none'", "frame-ancestors 'none'"]) {
      assert.ok(csp.includes(part), `the CSP ${JSON.stringify(csp)} lacks ${part}`);
    }
    assert.ok(!/unsafe-inline|unsafe-eval/.test(csp), `the CSP allows inline code: ${csp}`);
    const js = await fetch(`${s.server.ui}app.js`);
    assert.match(js.headers.get('content-type'), /^text\/javascript/);
    assert.ok(js.headers.get('content-security-policy'));
    assert.equal((await fetch(`${s.server.ui}no-such-file.js`)).status, 404);
    // The API behind it does want a token.
    assert.equal((await fetch(`${s.server.base}/api/tasks`)).status, 401);
    if (FROM_DISK) {
      t.skip('CONSOLE_FROM_DISK=1: pages use the files of this tree, not the embedded ones');
      return;
    }
    // The binary under test embeds exactly the console of this tree.
    assert.equal(await index.text(), readFileSync(path.join(CONSOLE_DIR, 'index.html'), 'utf8'));
    for (const name of consoleFiles()) {
      const res = await fetch(`${s.server.ui}${name}`);
      assert.equal(res.status, 200, name);
      assert.ok(Buffer.from(await res.arrayBuffer()).equals(readFileSync(path.join(CONSOLE_DIR, name))),
        `${name} served by the binary differs from crates/gateway/console/${name}: rebuild the binary`);
    }
  });

  test('asks for a token once, refuses a bad one, keeps it for the tab only', T, async () => {
    const page = await newPage();
    const urls = [];
    const bearer = [];
    page.on('request', (r) => {
      urls.push(r.url());
      if (new URL(r.url()).pathname.startsWith('/api/')) bearer.push(r.headers().authorization || '');
    });
    await page.goto(`${s.server.ui}#/tasks`);
    const dialog = page.getByRole('dialog', { name: 'Sign in to taskmesh' });
    await dialog.waitFor({ timeout: WAIT });
    await axe(page, 'sign-in dialog');
    await shot(page, 'sign-in-light', { fullPage: false });
    await page.fill('#token-input', 'tmk_000000000000_bad');
    await page.keyboard.press('Enter');
    await dialog.getByText('The server refused that token').waitFor({ timeout: WAIT });
    await page.fill('#token-input', token);
    await page.keyboard.press('Enter');
    await ready(page, '#/tasks');
    await page.locator('header').getByText('signed in with a token').waitFor({ timeout: WAIT });
    await page.getByText('No tasks match.').waitFor({ timeout: WAIT });
    const stored = await page.evaluate(() => ({
      session: Object.values(sessionStorage), local: localStorage.length, cookies: document.cookie,
    }));
    assert.deepEqual(stored.session, [token]);
    assert.equal(stored.local, 0);
    assert.equal(stored.cookies, '');
    // Other views reuse it: no second prompt; the worker with its own token shows.
    await s.open(page, '#/workers');
    await page.locator('tr[data-worker="console-worker"]').waitFor({ timeout: WAIT });
    await s.open(page, '#/overview');
    await page.locator('svg.chart').waitFor({ timeout: WAIT });
    assert.equal(await page.getByRole('dialog').count(), 0);
    assert.ok(urls.every((u) => !u.includes(token)), 'the token appeared in a URL');
    assert.ok(bearer.length > 0 && bearer.every((b) => b === '' || b === `Bearer ${token}` || b === 'Bearer tmk_000000000000_bad'));
    assert.ok(bearer.includes(`Bearer ${token}`));
    // Another tab is another session: it asks again.
    const other = await page.context().newPage();
    await other.goto(`${s.server.ui}#/overview`);
    await other.getByRole('dialog', { name: 'Sign in to taskmesh' }).waitFor({ timeout: WAIT });
    // Signing out forgets it.
    await page.getByRole('button', { name: 'Sign out' }).click();
    assert.deepEqual(await page.evaluate(() => Object.values(sessionStorage)), []);
    await page.getByRole('dialog', { name: 'Sign in to taskmesh' }).waitFor({ timeout: WAIT });
    await closePage(page);
  });
});
