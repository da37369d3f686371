// One task: its fields, attempts as a timeline, callback, payload and output,
// logs; kept current by WatchTask (SSE) and followed logs while it runs.

import { get, post, stream, query } from './api.js';
import {
  h, replace, time, badge, taskState, short, labelChips, errorNote,
  payloadView, confirmDialog, announce, durationMs, humanMs, TERMINAL,
} from './ui.js';

const LOG_PAGE = 1000;
const LOG_INITIAL_MAX = 5000; // lines loaded before "Load more"

export async function taskDetail(root, { args: [id], signal }) {
  let task;
  try {
    task = (await get(`/api/tasks/${id}`, { signal })).task;
  } catch (err) {
    if (signal.aborted) return;
    root.append(h('h1', 'Task'), h('p.mono', id), errorNote(err, 'Could not load the task'),
      h('p', h('a', { href: '#/tasks' }, 'Back to tasks')));
    return;
  }
  if (signal.aborted) return;

  const stateBox = h('span#task-state', { tabindex: '-1' });
  const actions = h('div.actions');
  const actionNote = h('div.action-note');
  const liveNote = h('div.small.muted#live-note');
  const summary = h('dl.fields');
  const attemptsBox = h('div');
  const callbackBox = h('div');
  const payloadBox = h('div');
  const outputBox = h('div');
  const logs = logsSection(id, signal);

  root.append(
    h('p.crumbs', h('a', { href: '#/tasks' }, 'Tasks'), ' / ', h('span.mono', id)),
    h('div.title-row',
      h('h1', 'Task ', h('span.mono.id', id)),
      stateBox),
    actions, actionNote, liveNote,
    h('section', { 'aria-labelledby': 's-summary' }, h('h2#s-summary', 'Summary'), summary),
    h('section', { 'aria-labelledby': 's-attempts' }, h('h2#s-attempts', 'Attempts'), attemptsBox),
    h('section', { 'aria-labelledby': 's-callback' }, h('h2#s-callback', 'Callback'), callbackBox),
    h('div.two',
      h('section', { 'aria-labelledby': 's-payload' }, h('h2#s-payload', 'Payload'), payloadBox),
      h('section', { 'aria-labelledby': 's-output' }, h('h2#s-output', 'Output'), outputBox)),
    logs.section,
  );

  let lastState = null;
  let outputShown = null;
  let payloadShown = false;
  function render(t) {
    // WatchTask events may leave attempts out; keep the ones we have.
    if (!t.attempts && task?.attempts) t = { ...t, attempts: task.attempts };
    if (!t.payload && task?.payload) t = { ...t, payload: task.payload };
    task = t;
    const st = taskState(t);
    replace(stateBox, badge(st));
    stateBox.setAttribute('data-state', st);
    if (lastState && lastState !== st) announce(`Task is now ${st.replace('_', ' ')}`);
    lastState = st;
    renderActions(t, st);
    renderSummary(t);
    renderAttempts(t.attempts || []);
    renderCallback(t);
    if (!payloadShown) {
      replace(payloadBox, payloadView(t.payload, `payload-${id}`));
      payloadShown = true;
    }
    const outKey = t.output?.data ?? null;
    if (outKey !== outputShown || !outputBox.firstChild) {
      replace(outputBox, t.output?.data ? payloadView(t.output, `output-${id}`)
        : h('p.muted', st === 'SUCCEEDED' ? 'Empty.'
          : TERMINAL.has(st) ? 'None: the task did not succeed.' : 'None yet: the output is set once the task succeeds.'));
      outputShown = outKey;
    }
  }

  function renderActions(t, st) {
    const btns = [];
    if (!TERMINAL.has(st)) {
      btns.push(h('button.danger#cancel-task', { type: 'button', onclick: cancel }, 'Cancel task'));
    }
    if (['FAILED', 'TIMED_OUT', 'CANCELLED'].includes(st)) {
      btns.push(h('button#retry-task', { type: 'button', onclick: retry }, 'Retry task'));
    }
    // The same buttons stay put (and keep focus) across updates.
    const key = btns.map((b) => b.id).join(' ');
    if (actions.dataset.key === key) return;
    actions.dataset.key = key;
    const focused = document.activeElement?.id;
    replace(actions, btns);
    if (focused && actions.querySelector(`#${focused}`)) actions.querySelector(`#${focused}`).focus();
  }

  function renderSummary(t) {
    const traceId = (t.traceparent || '').split('-')[1] || '';
    const rows = [
      ['Handler', t.handler],
      ['Namespace', t.namespace],
      // A retry gives a fresh run budget; the attempts before it stay.
      ['Runs', `${t.runCount || 0} of ${t.maxAttempts || '—'}`,
        (t.attempts?.length || 0) > (t.runCount || 0) ? ` (${t.attempts.length} attempts in all)` : ''],
      ['Priority', String(t.priority || 0)],
      ['Created', time(t.createTime)],
      ['Runs at', time(t.runAt)],
      ['Started', time(t.stateTimes?.runningTime)],
      ['Ended', time(t.stateTimes?.endTime)],
      ['Last change', time(t.updateTime)],
      ['Timeout', t.timeout ? humanMs(durationMs(t.timeout)) : '—'],
      ['Worker', t.workerId || '—'],
      ['Labels', labelChips(t.labels)],
      ['Trace id', traceId ? h('code', traceId) : '—'],
      ['Client request id', t.clientRequestId || '—'],
      ['Schedule', t.scheduleId ? h('a.mono', { href: `#/schedules/${t.scheduleId}` }, t.scheduleId) : '—'],
      ['Error', t.errorMessage || '—'],
    ];
    replace(summary, rows.map(([k, ...v]) => [h('dt', k), h('dd', v)]));
  }

  function renderAttempts(attempts) {
    if (!attempts.length) {
      replace(attemptsBox, h('p.muted', 'No attempt yet.'));
      return;
    }
    replace(attemptsBox, h('ol.timeline', attempts.map((a) => {
      const outcome = short(a.outcome, 'ATTEMPT_OUTCOME_') || 'UNDER WAY';
      const shownOutcome = outcome === 'UNSPECIFIED' ? 'UNDER WAY' : outcome;
      const took = a.endTime && a.startTime ? humanMs(new Date(a.endTime) - new Date(a.startTime)) : null;
      return h('li',
        h('div.t-head', h('strong', `Attempt ${a.number}`), ' ', badge(shownOutcome, shownOutcome === 'UNDER WAY' ? 'running' : shownOutcome)),
        h('div.t-body',
          h('span', 'worker ', h('code', a.workerId || '—')), ' · ',
          h('span', 'started ', time(a.startTime)), ' · ',
          h('span', a.endTime ? ['ended ', time(a.endTime), took ? ` (${took})` : ''] : 'not ended')),
        a.message ? h('div.t-msg', a.message) : null);
    })));
  }

  function renderCallback(t) {
    if (!t.callbackUrl) {
      replace(callbackBox, h('p.muted', 'No callback URL.'));
      return;
    }
    const c = t.callback || {};
    const st = short(c.state, 'CALLBACK_STATE_');
    replace(callbackBox, h('dl.fields',
      h('dt', 'URL'), h('dd', h('code', t.callbackUrl)),
      h('dt', 'Delivery'), h('dd', !st || st === 'UNSPECIFIED' ? 'not yet (sent when the task ends)' : badge(st)),
      h('dt', 'Delivery attempts'), h('dd', String(c.attempts || 0)),
      c.deliveredTime ? [h('dt', 'Delivered'), h('dd', time(c.deliveredTime))] : null,
      c.nextAttemptTime ? [h('dt', 'Next attempt'), h('dd', time(c.nextAttemptTime))] : null,
      c.lastError ? [h('dt', 'Last error'), h('dd', c.lastError)] : null));
  }

  async function cancel() {
    const ok = await confirmDialog({
      title: 'Cancel this task?',
      message: `Task ${id} (${task.handler}) will be cancelled; a running attempt is told to stop. This cannot be undone.`,
      confirmLabel: 'Cancel task',
    });
    if (!ok) return;
    replace(actionNote, h('p', { role: 'status' }, 'Cancelling…'));
    try {
      const res = await post(`/api/tasks/${id}/cancel`, { reason: 'cancelled from the console' });
      replace(actionNote);
      if (res.task) render(res.task);
      if (!actions.contains(document.activeElement)) stateBox.focus();
    } catch (err) {
      replace(actionNote, errorNote(err, 'Cancel failed'));
    }
  }

  async function retry() {
    const ok = await confirmDialog({
      title: 'Retry this task?',
      message: `Task ${id} (${task.handler}) goes back to READY and runs again, with a fresh run budget. Its earlier attempts stay in the list.`,
      confirmLabel: 'Retry task', danger: false,
    });
    if (!ok) return;
    replace(actionNote, h('p', { role: 'status' }, 'Retrying…'));
    try {
      const res = await post(`/api/tasks/${id}/retry`, {});
      replace(actionNote, res.retried
        ? h('p.ok', { role: 'status' }, 'Retried: the task went back to READY to run again.')
        : h('p', { role: 'status' }, 'The task had not ended, so it was left as it is.'));
      if (res.task) render(res.task);
      if (!actions.contains(document.activeElement)) stateBox.focus();
      follow();
      logs.follow(task);
    } catch (err) {
      replace(actionNote, errorNote(err, 'Retry failed'));
    }
  }

  render(task);
  logs.load(task);

  // Live state: WatchTask sends the current state, then each change, and ends
  // with the task. A dropped connection is resumed while the task runs.
  let watching = false;
  async function follow() {
    if (watching || signal.aborted) return;
    watching = true;
    let backoff = 500;
    while (!signal.aborted && !TERMINAL.has(taskState(task))) {
      liveNote.textContent = 'Updating live.';
      let failed = null;
      const how = await stream(`/api/tasks/${id}/watch`, {
        signal,
        onEvent: (ev) => {
          backoff = 500;
          if (ev.task) {
            const was = taskState(task);
            render(ev.task);
            const now = taskState(ev.task);
            if (now !== was && (TERMINAL.has(now) || !ev.task.attempts)) refresh();
            logs.follow(task);
          }
        },
        onError: (err) => {
          failed = err;
        },
      });
      if (signal.aborted || how === 'aborted') break;
      if (failed && failed.status && failed.status !== 503) {
        replace(liveNote, errorNote(failed, 'Live updates stopped'));
        watching = false;
        return;
      }
      if (!TERMINAL.has(taskState(task))) {
        liveNote.textContent = 'Live updates interrupted; reconnecting…';
        await wait(backoff, signal);
        backoff = Math.min(backoff * 2, 10000);
      }
    }
    watching = false;
    if (!signal.aborted) liveNote.textContent = TERMINAL.has(taskState(task)) ? 'The task has ended.' : '';
  }

  // GetTask has the attempts and output that watch events may leave out.
  async function refresh() {
    try {
      const res = await get(`/api/tasks/${id}`, { signal });
      if (!signal.aborted && res.task && Number(res.task.version || 0) >= Number(task.version || 0)) render(res.task);
    } catch {
      /* the watch carries on; the next change tries again */
    }
  }

  follow();
}

function wait(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(t);
      resolve();
    }, { once: true });
  });
}

// The logs: every stored line (paged), then new ones from WatchTaskLogs while
// the task runs.
function logsSection(id, signal) {
  const list = h('ol.logs#log-lines');
  const box = h('div.log-box', { tabindex: '0', role: 'log', 'aria-label': 'Task log lines' }, list);
  const status = h('p.small.muted');
  const more = h('div');
  const note = h('div');
  const section = h('section', { 'aria-labelledby': 's-logs' }, h('h2#s-logs', 'Logs'), status, note, box, more);
  let token = '';
  let count = 0;
  let loaded = false;
  let following = false;

  function add(lines) {
    const stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 8;
    list.append(...lines.map((l) => {
      const lvl = short(l.level, 'LOG_LEVEL_') || 'INFO';
      return h(`li.lvl-${lvl.toLowerCase()}`,
        time(l.time), ' ', h('span.lvl', lvl.padEnd(5)), ' ', h('span.att', `[${l.attempt}]`), ' ', h('span.msg', l.message));
    }));
    count += lines.length;
    if (stick) box.scrollTop = box.scrollHeight;
    status.textContent = count ? `${count.toLocaleString()} ${count === 1 ? 'line' : 'lines'}.` : 'No lines yet.';
  }

  async function page(max) {
    let got = 0;
    for (;;) {
      const res = await get(`/api/tasks/${id}/logs${query({ pageSize: LOG_PAGE, pageToken: token })}`, { signal });
      const lines = res.lines || [];
      add(lines);
      got += lines.length;
      if (res.nextPageToken) token = res.nextPageToken;
      if (res.attempts?.length) {
        const kept = res.attempts.filter((a) => a.truncated || Number(a.dropped || 0) > 0);
        replace(note, kept.map((a) => h('p.note', `Attempt ${a.attempt}: `,
          a.truncated ? `reached the server's cap; ${Number(a.truncatedLines || 0).toLocaleString()} later lines were not stored. ` : '',
          Number(a.dropped || 0) ? `${Number(a.dropped).toLocaleString()} lines were dropped by the worker.` : '')));
      }
      if (res.end || !lines.length) return true;
      if (got >= max) return false;
    }
  }

  async function load(task) {
    status.textContent = 'Loading lines…';
    try {
      const done = await page(LOG_INITIAL_MAX);
      if (signal.aborted) return;
      if (!done) {
        replace(more, h('button', {
          type: 'button',
          onclick: async () => {
            replace(more);
            try {
              if (!(await page(LOG_INITIAL_MAX))) load(task);
            } catch (err) {
              replace(more, errorNote(err, 'Could not load more lines'));
            }
          },
        }, 'Load more lines'));
      }
      loaded = true;
      if (!count) status.textContent = TERMINAL.has(taskState(task)) ? 'No lines.' : 'No lines yet.';
      followLogs(task);
    } catch (err) {
      if (signal.aborted) return;
      status.textContent = '';
      replace(note, errorNote(err, 'Could not load the logs'));
    }
  }

  let finalRead = false;
  async function followLogs(task) {
    if (!loaded || following || signal.aborted) return;
    if (TERMINAL.has(taskState(task))) {
      // Lines sent between the first read and the end, with no stream open.
      if (!finalRead) {
        finalRead = true;
        page(LOG_INITIAL_MAX).catch(() => {});
      }
      return;
    }
    following = true;
    await stream(`/api/tasks/${id}/logs/watch${query({ pageToken: token })}`, {
      signal,
      onEvent: (ev) => {
        if (ev.lines?.length) add(ev.lines);
        if (ev.nextPageToken) token = ev.nextPageToken;
      },
      onError: (err) => {
        if (!signal.aborted) replace(note, errorNote(err, 'Following the logs stopped'));
      },
    });
    following = false;
  }

  return { section, load, follow: followLogs };
}
