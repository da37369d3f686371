// What a person notices, checked against a real `taskmesh serve` and
// `taskmesh worker` (see README.md and harness.mjs): the main flows with the
// keyboard alone; axe-core on every view, light and dark, and on a dialog;
// nothing wider than a 390 px phone; and the screenshots in docs/console/.

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import {
  WAIT, T, until, useStack, newPage, closePage, ready, axe, tabTo, focused, shot,
} from './harness.mjs';

const s = useStack();

describe('quality', () => {
  test('the main flow works with the keyboard alone', T, async () => {
    const id = await s.api.submit('sleep', { ms: 120000 });
    await until('the sleep task to run', async () => (await s.api.state(id)) === 'TASK_STATE_RUNNING');
    const page = await newPage();
    await s.open(page, '#/overview');
    await page.keyboard.press('Tab');
    assert.equal((await focused(page)).text, 'Skip to content');
    await tabTo(page, 'nav a[href="#/tasks"]');
    const outline = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
    assert.notEqual(outline, 'none', 'focus is visible');
    await page.keyboard.press('Enter');
    await ready(page, '#/tasks');
    assert.equal((await focused(page)).tag, 'H1');
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
      assert.ok((await focused(page)).inDialog, 'focus left the dialog');
      await page.keyboard.press('Tab');
    }
    await page.keyboard.press('Escape');
    await dialog.waitFor({ state: 'detached' });
    assert.equal((await focused(page)).id, 'cancel-task');
    assert.equal(await s.api.state(id), 'TASK_STATE_RUNNING');
    await page.keyboard.press('Enter');
    await dialog.waitFor();
    assert.equal((await focused(page)).text, 'Keep');
    await page.keyboard.press('Tab');
    assert.equal((await focused(page)).text, 'Cancel task');
    await page.keyboard.press('Enter');
    await page.waitForSelector('#task-state[data-state="CANCELLED"]', { timeout: WAIT });
    // Retry it, still by keyboard: focus rests on the state, Retry follows it.
    await tabTo(page, '#retry-task', 10);
    await page.keyboard.press('Enter');
    await page.getByRole('dialog', { name: 'Retry this task?' }).waitFor();
    await page.keyboard.press('Tab');
    assert.equal((await focused(page)).text, 'Retry task');
    await page.keyboard.press('Enter');
    await page.locator('.action-note').getByText('Retried').waitFor({ timeout: WAIT });
    await until('the retried task to run', async () => (await s.api.state(id)) === 'TASK_STATE_RUNNING');
    await s.api.call('POST', `/api/tasks/${id}/cancel`, {});
    // On to a new schedule with the keyboard, and its live preview.
    await tabTo(page, 'nav a[href="#/schedules"]', 80, 'Shift+Tab');
    await page.keyboard.press('Enter');
    await ready(page, '#/schedules');
    await tabTo(page, 'a[href="#/schedules/new"]');
    await page.keyboard.press('Enter');
    await ready(page, '#/schedules/new');
    await tabTo(page, '#s-handler');
    await page.keyboard.type('echo');
    await tabTo(page, '#s-cron');
    await page.keyboard.type('0 0 12 * * *');
    await page.locator('#preview ol.fires li').nth(4).waitFor({ timeout: WAIT });
    // The workers' Drain buttons are reachable too.
    await tabTo(page, 'nav a[href="#/workers"]', 80, 'Shift+Tab');
    await page.keyboard.press('Enter');
    await ready(page, '#/workers');
    await tabTo(page, 'tr[data-worker="console-worker"] button');
    await page.keyboard.press('Enter');
    await page.getByRole('dialog', { name: /^Drain .*console-worker.*\?$/ }).waitFor();
    await page.keyboard.press('Escape'); // not this one: the other tests need it
    await page.getByRole('dialog').waitFor({ state: 'detached' });
    assert.equal((await focused(page)).text, 'Drain');
    await closePage(page);
  });

  test('every view: no serious axe violation, screenshots light and dark, readable at 390 px', T, async () => {
    // Something to look at: a success with logs, a failure, a waiting task, a schedule.
    const done = await s.api.submit('log', { lines: 6, every_ms: 50 });
    const failed = await s.api.submit('fail', { times: 10 }, { retryPolicy: { maxAttempts: 2, initialBackoff: '0.2s' } });
    const waiting = await s.api.submit('nobody.serves.this', { waiting: true }, { labels: { team: 'billing' } });
    const { schedule } = await s.api.call('POST', '/api/schedules', {
      name: 'nightly-report', kind: 'SCHEDULE_KIND_CRON', cronExpression: '0 30 2 * * *',
      timeZone: 'America/New_York', template: { handler: 'echo' },
    });
    await until('the log task to succeed', async () => (await s.api.state(done)) === 'TASK_STATE_SUCCEEDED');
    await until('the fail task to fail', async () => (await s.api.state(failed)) === 'TASK_STATE_FAILED', 30_000);
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
    // What a view loads after it has drawn, before it is looked at.
    const settle = async (page, name) => {
      if (name === 'overview') await page.locator('svg.chart').waitFor({ timeout: WAIT });
      if (name === 'task') await page.locator('#log-lines li').nth(5).waitFor({ timeout: WAIT });
      if (name === 'schedule') await page.locator('section[aria-labelledby="s-next"] ol.fires li').nth(4).waitFor({ timeout: WAIT });
      if (name === 'schedule-form') await page.locator('#preview p').first().waitFor({ timeout: WAIT });
      if (name === 'workers') await page.locator('#workers').waitFor({ timeout: WAIT });
    };
    for (const colorScheme of ['light', 'dark']) {
      const page = await newPage({ colorScheme });
      for (const [name, hash] of views) {
        await s.open(page, hash);
        await settle(page, name);
        await axe(page, `${name} (${colorScheme})`);
        await shot(page, `${name}-${colorScheme}`);
      }
      // The next five fires of a listed schedule, opened in place.
      await s.open(page, '#/schedules');
      await page.locator('details.later summary').first().click();
      await page.locator('details.later[open] ol.fires li').nth(4).waitFor({ timeout: WAIT });
      await axe(page, `schedules with the next five open (${colorScheme})`);
      // A dialog too.
      await s.open(page, '#/tasks');
      await page.check('#sel-all');
      await page.getByRole('button', { name: 'Cancel selected' }).click();
      await page.getByRole('dialog').waitFor();
      await axe(page, `confirm dialog (${colorScheme})`);
      await shot(page, `confirm-${colorScheme}`, { fullPage: false });
      await page.keyboard.press('Escape');
      await closePage(page);
    }
    // A phone: nothing wider than the screen but the scrollable tables.
    const phone = await newPage({ width: 390, height: 844 });
    for (const [name, hash] of views) {
      await s.open(phone, hash);
      await settle(phone, name);
      const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 1, `${name} is ${overflow}px wider than a 390px screen`);
      if (['overview', 'tasks', 'task', 'schedule-form', 'workers'].includes(name)) await shot(phone, `${name}-phone`);
    }
    await closePage(phone);
    await s.api.call('POST', `/api/tasks/${waiting}/cancel`, {});
    await s.api.call('DELETE', `/api/schedules/${schedule.scheduleId}`);
  });});
