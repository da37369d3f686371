// Browser tests of the console's task views against a real `taskmesh
// serve` and `taskmesh worker` (see README.md and harness.mjs): the list
// with the server's filters and lookup, a task's live page, cancel, retry,
// bulk actions and cancel-all-that-match.

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import {
  WAIT, T, until, useStack, newPage, closePage, ready, axe, shot,
} from './harness.mjs';

const s = useStack();
const stateBadge = (page) => page.locator('#task-state').getAttribute('data-state');

describe('tasks', () => {
  test('a task submitted through the API shows in the list; filters and lookup go to the server', T, async () => {
    const id = await s.api.submit('echo', { from: 'list test' }, { clientRequestId: 'console-order-1042' });
    const page = await newPage();
    await s.open(page, '#/tasks');
    await page.locator(`a[href="#/tasks/${id}"]`).waitFor({ timeout: WAIT });
    await page.locator('header').getByText('authentication off').waitFor({ timeout: WAIT });
    // The state filter narrows the list through the API.
    await until('the echo task to succeed', async () => (await s.api.state(id)) === 'TASK_STATE_SUCCEEDED');
    await page.selectOption('#f-state', 'TASK_STATE_SUCCEEDED');
    await page.fill('#f-handler', 'echo');
    await page.click('form.filters button[type=submit]');
    await ready(page, '#/tasks');
    await page.locator(`a[href="#/tasks/${id}"]`).waitFor({ timeout: WAIT });
    assert.match(page.url(), /state=TASK_STATE_SUCCEEDED/);

    // Label and creation time are server filters: the request carries them.
    const a = await s.api.submit('nobody.serves.list', { n: 1 }, { labels: { team: 'billing', tier: 'gold' } });
    const b = await s.api.submit('nobody.serves.list', { n: 2 }, { labels: { team: 'search' } });
    const asked = [];
    page.on('request', (r) => {
      if (new URL(r.url()).pathname === '/api/tasks') asked.push(new URL(r.url()).searchParams);
    });
    await s.open(page, '#/tasks?label=team%3Dbilling');
    await page.locator(`tr[data-task="${a}"]`).waitFor({ timeout: WAIT });
    assert.equal(await page.locator(`tr[data-task="${b}"]`).count(), 0);
    assert.equal(asked.at(-1).get('label'), 'team=billing');
    await page.fill('#f-label', 'team');
    await page.click('form.filters button[type=submit]');
    await ready(page, '#/tasks');
    await page.locator(`tr[data-task="${b}"]`).waitFor({ timeout: WAIT });
    await page.locator(`tr[data-task="${a}"]`).waitFor({ timeout: WAIT });
    assert.equal(asked.at(-1).get('label'), 'team');
    // A time range in the future matches nothing; the instants are sent as UTC.
    await page.fill('#f-label', '');
    await page.fill('#f-after', '2099-01-01T00:00:00');
    await page.click('form.filters button[type=submit]');
    await ready(page, '#/tasks');
    await page.getByText('No tasks match.').waitFor({ timeout: WAIT });
    assert.equal(asked.at(-1).get('createdAfter'), new Date('2099-01-01T00:00:00').toISOString());
    await s.open(page, '#/tasks');

    // Lookup: a task id, a client_request_id, and something that is neither.
    await page.fill('#lookup-id', 'no-such-request-id');
    await page.click('form[role=search] button');
    await page.locator('form[role=search] .error').getByText('No task has the id or client request id').waitFor({ timeout: WAIT });
    await page.fill('#lookup-id', 'console-order-1042');
    await page.click('form[role=search] button');
    await ready(page, `#/tasks/${id}`);
    await s.open(page, '#/tasks');
    await page.fill('#lookup-id', id);
    await page.click('form[role=search] button');
    await ready(page, `#/tasks/${id}`);
    await page.locator('dl.fields').getByText('console-order-1042').waitFor();
    await s.api.call('POST', `/api/tasks/${a}/cancel`, {});
    await s.api.call('POST', `/api/tasks/${b}/cancel`, {});
    await closePage(page);
  });

  test('the namespace chosen in the header scopes the lists, a task page and its actions', T, async () => {
    const other = await s.api.submit('nobody.serves.ns', { n: 1 }, { namespace: 'console-ns', delay: '3600s' });
    const page = await newPage();
    await s.open(page, '#/tasks');
    assert.equal(await page.locator(`tr[data-task="${other}"]`).count(), 0, 'not in the default namespace');
    await page.fill('#ns-input', '-bad');
    await page.click('#ns-form button[type=submit]');
    await page.locator('#ns-form .error').waitFor({ timeout: WAIT });
    assert.equal(await page.getAttribute('#ns-input', 'aria-invalid'), 'true');
    await page.fill('#ns-input', 'console-ns');
    await page.press('#ns-input', 'Enter');
    await page.locator(`tr[data-task="${other}"]`).waitFor({ timeout: WAIT });
    assert.equal(await page.evaluate(() => sessionStorage.getItem('taskmesh.console.namespace')), 'console-ns');
    await s.open(page, `#/tasks/${other}`);
    await page.locator('dl.fields').getByText('console-ns').waitFor({ timeout: WAIT });
    // An action on the page acts in that namespace too.
    await page.getByRole('button', { name: 'Cancel task' }).click();
    await page.getByRole('dialog').getByRole('button', { name: 'Cancel task' }).click();
    await until('the task in console-ns to be cancelled', async () => {
      const t = (await s.api.call('GET', `/api/tasks/${other}?namespace=console-ns`)).task;
      return t.state === 'TASK_STATE_CANCELLED';
    });
    await closePage(page);
  });

  test('a task detail goes to SUCCEEDED without a reload', T, async () => {
    const id = await s.api.submit('sleep', { ms: 1500 }, { delay: '1s' });
    const page = await newPage();
    await s.open(page, `#/tasks/${id}`);
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
    await page.locator('#log-lines li').first().waitFor({ timeout: WAIT }); // sleep logs its start
    await closePage(page);
  });

  test('a running sleep task is cancelled from its page', T, async () => {
    const id = await s.api.submit('sleep', { ms: 120000 });
    const page = await newPage();
    await s.open(page, `#/tasks/${id}`);
    await page.waitForSelector('#task-state[data-state="RUNNING"]', { timeout: WAIT });
    await page.click('#cancel-task');
    const dialog = page.getByRole('dialog', { name: 'Cancel this task?' });
    await dialog.waitFor({ timeout: WAIT });
    // Keeping it changes nothing.
    await dialog.getByRole('button', { name: 'Keep' }).click();
    await dialog.waitFor({ state: 'detached', timeout: WAIT });
    assert.equal(await s.api.state(id), 'TASK_STATE_RUNNING');
    await page.click('#cancel-task');
    await dialog.getByRole('button', { name: 'Cancel task' }).click();
    await page.waitForSelector('#task-state[data-state="CANCELLED"]', { timeout: WAIT });
    assert.equal(await s.api.state(id), 'TASK_STATE_CANCELLED');
    await closePage(page);
  });

  test('a failed task is retried from its page and runs again', T, async () => {
    // Fails its first attempt only; one run allowed, so it ends FAILED.
    const id = await s.api.submit('fail', { times: 1 }, { retryPolicy: { maxAttempts: 1 } });
    await until('the fail task to fail', async () => (await s.api.state(id)) === 'TASK_STATE_FAILED');
    const page = await newPage();
    await s.open(page, `#/tasks/${id}`);
    await page.waitForSelector('#task-state[data-state="FAILED"]');
    assert.equal(await page.locator('ol.timeline > li').count(), 1);
    assert.equal(await page.locator('#cancel-task').count(), 0, 'an ended task offers no cancel');
    await page.click('#retry-task');
    const dialog = page.getByRole('dialog', { name: 'Retry this task?' });
    await dialog.getByRole('button', { name: 'Retry task' }).click();
    await page.locator('.action-note').getByText('Retried: the task went back to READY to run again.').waitFor({ timeout: WAIT });
    // It runs again (its second attempt succeeds) and the page follows it live.
    await page.waitForSelector('#task-state[data-state="SUCCEEDED"]', { timeout: WAIT });
    await until('the second attempt in the timeline', async () => (await page.locator('ol.timeline > li').count()) === 2);
    await page.locator('ol.timeline > li').nth(1).getByText('SUCCEEDED').waitFor({ timeout: WAIT });
    const task = await s.api.task(id);
    assert.equal(task.state, 'TASK_STATE_SUCCEEDED');
    assert.equal(task.attempts.length, 2);
    // A SUCCEEDED task cannot be retried: the button is gone, and the API says why.
    assert.equal(await page.locator('#retry-task').count(), 0);
    await assert.rejects(s.api.call('POST', `/api/tasks/${id}/retry`, {}), (e) => e.status >= 400 && e.status < 500 && Boolean(e.body.message));
    await shot(page, 'task-retried-light');
    await closePage(page);
  });

  test('select several tasks and cancel them in bulk; retry the selected', T, async () => {
    const handler = 'bulk.target'; // no worker serves it: the tasks wait READY
    const ids = [];
    for (let i = 0; i < 3; i++) ids.push(await s.api.submit(handler, { i }));
    const keep = await s.api.submit(handler, { i: 'kept' });
    const page = await newPage();
    await s.open(page, `#/tasks?handler=${handler}`);
    for (const id of ids) await page.check(`input[type=checkbox][value="${id}"]`);
    await page.locator('#sel-count').getByText('3 selected').waitFor();
    await page.getByRole('button', { name: 'Cancel selected' }).click();
    const dialog = page.getByRole('dialog', { name: 'Cancel 3 tasks?' });
    await dialog.waitFor({ timeout: WAIT });
    await dialog.getByRole('button', { name: 'Cancel 3 tasks' }).click();
    await page.locator('.action-note').getByText('Cancelled 3 of 3.').waitFor({ timeout: WAIT });
    for (const id of ids) assert.equal(await s.api.state(id), 'TASK_STATE_CANCELLED');
    assert.equal(await s.api.state(keep), 'TASK_STATE_READY');
    // The reloaded page shows them cancelled.
    await page.locator(`tr[data-task="${ids[0]}"] .badge`).getByText('CANCELLED').waitFor({ timeout: WAIT });
    // Retry two of the cancelled ones: they wait READY again.
    await page.check(`input[type=checkbox][value="${ids[0]}"]`);
    await page.check(`input[type=checkbox][value="${ids[1]}"]`);
    await page.getByRole('button', { name: 'Retry selected' }).click();
    await page.getByRole('dialog', { name: 'Retry 2 tasks?' }).getByRole('button', { name: 'Retry 2' }).click();
    await page.locator('.action-note').getByText('Retried 2 of 2.').waitFor({ timeout: WAIT });
    assert.equal(await s.api.state(ids[0]), 'TASK_STATE_READY');
    assert.equal(await s.api.state(ids[1]), 'TASK_STATE_READY');
    assert.equal(await s.api.state(ids[2]), 'TASK_STATE_CANCELLED');
    for (const id of [ids[0], ids[1], keep]) await s.api.call('POST', `/api/tasks/${id}/cancel`, {});
    await closePage(page);
  });

  test('cancel all that match goes through POST /api/tasks:cancel and states the count', T, async () => {
    const handler = 'match.target'; // unserved: the tasks wait READY
    const batch = 'import-42'; // this file's server is its own: a fixed label is unique
    const matching = [];
    for (let i = 0; i < 5; i++) matching.push(await s.api.submit(handler, { i }, { labels: { batch } }));
    const others = [await s.api.submit(handler, { other: 1 }, { labels: { batch: 'other' } }), await s.api.submit(handler, { other: 2 })];
    const calls = [];
    const page = await newPage();
    page.on('request', (r) => {
      if (new URL(r.url()).pathname === '/api/tasks:cancel') calls.push(JSON.parse(r.postData() || '{}'));
    });
    await s.open(page, `#/tasks?handler=${handler}&label=${encodeURIComponent(`batch=${batch}`)}`);
    await page.locator(`tr[data-task="${matching[0]}"]`).waitFor({ timeout: WAIT });
    await page.getByRole('button', { name: 'Cancel all that match…' }).click();
    const dialog = page.getByRole('dialog', { name: 'Cancel 5 tasks that match?' });
    await dialog.waitFor({ timeout: WAIT });
    await dialog.getByText(`5 tasks match these filters (handler ${handler}, label batch=${batch})`).waitFor();
    await axe(page, 'cancel-all-that-match dialog');
    await shot(page, 'cancel-matching-light', { fullPage: false });
    // Keep: only the dry run was sent.
    await dialog.getByRole('button', { name: 'Keep' }).click();
    await dialog.waitFor({ state: 'detached' });
    assert.equal(calls.length, 1);
    assert.equal(calls[0].dryRun, true);
    assert.equal(calls[0].label, `batch=${batch}`);
    assert.equal(calls[0].handler, handler);
    assert.equal(calls[0].labels, undefined, 'label is one string, not a map');
    for (const id of matching) assert.equal(await s.api.state(id), 'TASK_STATE_READY');
    // Confirm: one call cancels them, at most as many as were counted.
    await page.getByRole('button', { name: 'Cancel all that match…' }).click();
    await dialog.getByRole('button', { name: 'Cancel 5' }).click();
    await page.locator('.action-note').getByText('Cancelled 5 of 5 tasks that matched.').waitFor({ timeout: WAIT });
    assert.equal(calls.length, 3);
    assert.ok(!calls[2].dryRun);
    assert.equal(calls[2].limit, 5);
    for (const id of matching) assert.equal(await s.api.state(id), 'TASK_STATE_CANCELLED');
    for (const id of others) assert.equal(await s.api.state(id), 'TASK_STATE_READY');
    // Nothing left to cancel: said so, no dialog.
    await page.getByRole('button', { name: 'Cancel all that match…' }).click();
    await page.locator('.action-note').getByText('nothing to cancel').waitFor({ timeout: WAIT });
    assert.equal(await page.getByRole('dialog').count(), 0);
    for (const id of others) await s.api.call('POST', `/api/tasks/${id}/cancel`, {});
    await closePage(page);
  });
});
