// Browser tests of the console's Workers view and Overview against a real
// `taskmesh serve` and `taskmesh worker` (see README.md and harness.mjs): a
// drain from the console, and the overview's counts and per-minute chart
// from /api/stats.

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import {
  WAIT, T, until, useStack, startWorker, stop, newPage, closePage, shot,
} from './harness.mjs';

const s = useStack();
const digits = (v) => Number(String(v).replace(/\D/g, ''));

describe('workers and overview', () => {
  test('a worker drained from the Workers view shows as draining', T, async () => {
    // A worker of its own, kept busy (a task only it may take, by label) so
    // that its drain lasts until the test ends it.
    const drained = startWorker(s.server, { workerId: 'console-drain-me', handlers: 'sleep', labels: ['pool=drain'] });
    await until('the second worker to register', async () => (await s.api.workers()).some((w) => w.workerId === 'console-drain-me'));
    const busy = await s.api.submit('sleep', { ms: 120000 }, { labels: { pool: 'drain' } });
    await until('its task to run', async () => (await s.api.state(busy)) === 'TASK_STATE_RUNNING');
    const page = await newPage();
    await s.open(page, '#/workers');
    const row = page.locator('tr[data-worker="console-drain-me"]');
    await row.getByText('SERVING', { exact: true }).waitFor({ timeout: WAIT });
    await row.getByText('stream', { exact: true }).waitFor();
    await row.getByRole('button', { name: /^Drain .*console-drain-me/ }).click();
    await page.getByRole('dialog', { name: /^Drain .*console-drain-me.*\?$/ }).getByRole('button', { name: 'Drain worker' }).click();
    await page.locator('.action-note').getByText(/^Draining .*console-drain-me.*: 1 session gets no new task\.$/).waitFor({ timeout: WAIT });
    await row.getByText('DRAINING', { exact: true }).waitFor({ timeout: WAIT });
    assert.equal(await row.getByRole('button').count(), 0, 'a draining worker offers no Drain');
    const other = page.locator('tr[data-worker="console-worker"]');
    assert.equal(await other.getByText('SERVING', { exact: true }).count(), 1, 'the other worker goes on serving');
    const listed = (await s.api.workers()).find((w) => w.workerId === 'console-drain-me');
    assert.equal(listed.draining, true);
    assert.equal(listed.mode, 'WORKER_MODE_STREAM');
    await shot(page, 'workers-draining-light');
    // A worker the answering replica does not hold: nothing is drained. (The
    // server answers NOT_FOUND here; {streams: 0} would say the same.)
    const unknown = await s.api.call('POST', '/api/workers/no-such-worker/drain', {}).catch((e) => e);
    assert.ok(unknown.status === 404 ? /not connected/.test(unknown.body.message) : Number(unknown.streams || 0) === 0,
      `drain of an unknown worker: ${unknown.message || JSON.stringify(unknown)}`);
    await s.api.call('POST', `/api/tasks/${busy}/cancel`, {});
    await stop(drained);
    await closePage(page);
  });

  test('the overview shows the exact counts and the per-minute chart from /api/stats', T, async () => {
    const done = [];
    for (let i = 0; i < 3; i++) done.push(await s.api.submit('echo', { i }));
    const failed = await s.api.submit('fail', { times: 5 }, { retryPolicy: { maxAttempts: 1 } });
    await until('the echo tasks to succeed', async () => (await Promise.all(done.map(s.api.state))).every((s) => s === 'TASK_STATE_SUCCEEDED'));
    await until('the fail task to fail', async () => (await s.api.state(failed)) === 'TASK_STATE_FAILED');
    const page = await newPage();
    const statsCalls = [];
    page.on('request', (r) => {
      if (new URL(r.url()).pathname === '/api/stats') statsCalls.push(r.url());
    });
    await s.open(page, '#/overview');
    await page.locator('svg.chart').waitFor({ timeout: WAIT });
    // The page shows what the server counted: compare with a read of our own
    // (read again until nothing moved in between).
    let stats;
    await until('the overview to match /api/stats', async () => {
      const before = await s.api.stats();
      const was = await page.locator('#refreshed').getAttribute('data-loads');
      await page.getByRole('button', { name: 'Refresh' }).click();
      await page.waitForFunction((w) => document.querySelector('#refreshed')?.dataset.loads !== w, was, { timeout: WAIT });
      const shown = await page.evaluate(() => ({
        cards: Object.fromEntries([...document.querySelectorAll('li.card')].map((c) => [c.dataset.state, c.querySelector('.card-num').textContent])),
        totals: Object.fromEntries([...document.querySelectorAll('.legend li')].map((l) => [l.dataset.series, l.querySelector('.total').textContent])),
        points: document.querySelector('svg.chart polyline')?.getAttribute('points').trim().split(/\s+/).length,
      }));
      stats = await s.api.stats();
      if (JSON.stringify(before.byState) !== JSON.stringify(stats.byState)) return false;
      for (const s of stats.byState) {
        const name = s.state.replace('TASK_STATE_', '');
        if (digits(shown.cards[name]) !== Number(s.count || 0)) return false;
      }
      const sum = (k) => stats.perMinute.reduce((a, p) => a + Number(p[k] || 0), 0);
      if (['completed', 'failed', 'retried'].some((k) => digits(shown.totals[k]) !== sum(k))) return false;
      return shown.points === stats.perMinute.length;
    });
    assert.ok(statsCalls.every((u) => new URL(u).searchParams.get('windowMinutes') === '60'));
    assert.equal(stats.perMinute.length, 60, 'one entry per minute of the hour');
    const count = (s) => Number(stats.byState.find((x) => x.state === s)?.count || 0);
    assert.ok(count('TASK_STATE_SUCCEEDED') >= 3);
    assert.ok(count('TASK_STATE_FAILED') >= 1);
    assert.ok(stats.perMinute.reduce((a, p) => a + Number(p.completed || 0), 0) >= 3);
    assert.ok(stats.perMinute.reduce((a, p) => a + Number(p.failed || 0), 0) >= 1);
    // Handlers and the leader come from the same answer.
    await page.locator('#by-handler').getByRole('link', { name: 'echo' }).waitFor();
    if (stats.leader?.nodeId) await page.locator('#leader').getByText(stats.leader.nodeId).waitFor();
    await closePage(page);
  });
});
