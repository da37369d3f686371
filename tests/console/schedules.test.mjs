// Browser tests of the console's schedule views against a real `taskmesh
// serve` and `taskmesh worker` (see README.md and harness.mjs): the form's
// live preview with its DST warning, and a schedule made in the form that
// fires.

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import {
  WAIT, T, until, useStack, newPage, closePage, axe, shot,
} from './harness.mjs';

const s = useStack();

describe('schedules', () => {
  test('the schedule form previews the next fires live, with a DST warning', T, async () => {
    const page = await newPage();
    const previews = [];
    page.on('request', (r) => {
      if (new URL(r.url()).pathname === '/api/schedules:preview') previews.push(JSON.parse(r.postData() || '{}'));
    });
    await s.open(page, '#/schedules/new');
    await page.fill('#s-handler', 'echo');
    await page.selectOption('#s-kind', 'CRON');
    await page.fill('#s-zone', 'Europe/Berlin');
    await page.fill('#s-cron', '0 30 2 * * *'); // seconds first: 02:30:00 every day
    const fires = page.locator('#preview ol.fires li');
    await until('five fire times of the daily cron', async () => (await fires.count()) === 5
      && previews.at(-1)?.schedule?.cronExpression === '0 30 2 * * *');
    // Typing is debounced: one preview for the whole expression, not one per key.
    assert.ok(previews.length <= 3, `${previews.length} previews for one expression`);
    assert.equal(previews.at(-1).count, 5);
    assert.equal(previews.at(-1).schedule.timeZone, 'Europe/Berlin');
    const berlin = new Intl.DateTimeFormat('en-GB', { timeZone: 'Europe/Berlin', hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });
    for (const iso of await fires.locator('time').evaluateAll((els) => els.map((e) => e.getAttribute('datetime')))) {
      assert.match(berlin.format(new Date(iso)), /^0(2:30|3:00)$/, `${iso} is not 02:30 in Berlin`);
    }
    // Sundays of March at 02:30: the last one falls in the spring-forward
    // gap, whatever the date of the run, and the preview says so.
    await page.fill('#s-cron', '0 30 2 * 3 0');
    const warning = page.locator('#preview p.warn');
    await warning.first().waitFor({ timeout: WAIT });
    assert.equal(await fires.count(), 5);
    assert.match(await warning.first().textContent(), /Daylight saving/);
    await axe(page, 'schedule form with a DST warning');
    await shot(page, 'schedule-preview-light');
    // A bad expression: the server's words, next to the preview.
    await page.fill('#s-cron', '0 61 * * *');
    await page.locator('#preview p.error').getByText('No preview').waitFor({ timeout: WAIT });
    await closePage(page);
  });

  test('a schedule created in the form fires', T, async () => {
    const page = await newPage();
    await s.open(page, '#/schedules/new');
    await page.fill('#s-name', 'console-every-2s');
    await page.fill('#s-handler', 'echo');
    await page.selectOption('#s-kind', 'FIXED_RATE');
    await page.fill('#s-interval', '2');
    await page.fill('#s-zone', 'Europe/London');
    await page.locator('#preview ol.fires li').nth(4).waitFor({ timeout: WAIT });
    await page.fill('#s-payload', '{"from": "the form"}');
    // A bad field is explained next to it, and nothing is sent.
    await page.fill('#s-labels', 'oops');
    await page.click('form.schedule-form button[type=submit]');
    await page.locator('#e-labels').getByText(/not key=value/).waitFor();
    await page.fill('#s-labels', '');
    await page.click('form.schedule-form button[type=submit]');
    await page.waitForURL(/#\/schedules\/[0-9a-f-]{36}$/, { timeout: WAIT });
    const sid = /schedules\/([0-9a-f-]{36})/.exec(page.url())[1];
    const { schedule } = await s.api.call('GET', `/api/schedules/${sid}`);
    assert.equal(schedule.name, 'console-every-2s');
    assert.equal(schedule.timeZone, 'Europe/London');
    assert.equal(schedule.interval, '2s');
    // Its fires arrive on the page without a reload.
    await page.locator('#fires tbody tr').first().waitFor({ timeout: 30_000 });
    await page.locator('ol.fires li').first().waitFor();
    // Pause it from the page.
    await page.getByRole('button', { name: 'Pause console-every-2s' }).click();
    await until('the schedule to be paused', async () => (await s.api.call('GET', `/api/schedules/${sid}`)).schedule.paused);
    // It is in the list; delete asks first.
    await s.open(page, '#/schedules');
    await page.locator(`tr[data-schedule="${sid}"]`).waitFor();
    await page.getByRole('button', { name: 'Delete console-every-2s' }).click();
    await page.getByRole('dialog', { name: 'Delete this schedule?' }).getByRole('button', { name: 'Delete schedule' }).click();
    await page.locator(`tr[data-schedule="${sid}"]`).waitFor({ state: 'detached', timeout: WAIT });
    await closePage(page);
  });
});
