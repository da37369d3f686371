// Tasks: a filtered, paged list (the server filters and pages: one page at
// a time, never everything) with bulk cancel and retry of the selected
// tasks, and cancel of every task that matches the filters (the server's
// CancelTasks, bounded, counted first).

import { get, post, query, bounded } from './api.js';
import {
  h, replace, time, badge, taskState, labelChips, errorNote,
  tableWrap, confirmDialog, announce, TASK_STATES, TERMINAL,
} from './ui.js';

const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;
const BULK_LIMIT = 1000; // most tasks one bulk action touches
const IN_FLIGHT = 4; // cancels or retries sent at once
const MATCH_LIMIT = 10000; // most tasks "cancel all that match" may touch

// Tokens of the pages before the current one, per filter, for "Newer".
const history = new Map();

export async function taskList(root, { params, signal, go }) {
  const f = {
    state: params.get('state') || '',
    handler: params.get('handler') || '',
    label: params.get('label') || '',
    after: params.get('after') || '',
    before: params.get('before') || '',
    size: params.get('size') || '50',
  };
  const pageToken = params.get('page') || '';
  const filterKey = JSON.stringify(f);
  const stack = history.get(filterKey) || [];
  history.clear();
  history.set(filterKey, stack);

  const toHash = (over) => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries({ ...f, ...over })) if (v) q.set(k, v);
    if (q.get('size') === '50') q.delete('size');
    const s = q.toString();
    return `#/tasks${s ? `?${s}` : ''}`;
  };

  // Look up by task id or by the client_request_id it was submitted with.
  const idInput = h('input#lookup-id', {
    name: 'id', placeholder: 'a task id or client request id', autocomplete: 'off', spellcheck: 'false', size: '38',
    'aria-describedby': 'lookup-help',
  });
  const lookupNote = h('div');
  const lookup = h('form.inline', {
    role: 'search', 'aria-label': 'Look up a task',
    onsubmit: async (e) => {
      e.preventDefault();
      const key = idInput.value.trim();
      replace(lookupNote);
      if (!key) {
        replace(lookupNote, h('p.error', { role: 'alert' }, 'Type a task id (a UUID) or the client request id it was submitted with.'));
        idInput.focus();
        return;
      }
      try {
        const id = await lookUp(key, signal);
        if (id) go(`#/tasks/${id}`);
        else replace(lookupNote, h('p.error', { role: 'alert' }, `No task has the id or client request id “${key}”.`));
      } catch (err) {
        replace(lookupNote, errorNote(err, 'Lookup failed'));
      }
    },
  },
  h('label', { for: 'lookup-id' }, 'Task id or client request id'), idInput, h('button', { type: 'submit' }, 'Open'),
  h('p.help#lookup-help', 'A task id is a UUID; a client request id is the key the task was submitted with.'),
  lookupNote);

  // Filters.
  const field = (id, label, input) => h('div.field', h('label', { for: id }, label), input);
  const stateSel = h('select#f-state', { name: 'state' },
    h('option', { value: '' }, 'Any state'),
    TASK_STATES.map((s) => h('option', { value: `TASK_STATE_${s}`, selected: f.state === `TASK_STATE_${s}` }, s.replace('_', ' '))));
  const handlerIn = h('input#f-handler', { name: 'handler', value: f.handler, autocomplete: 'off', placeholder: 'e.g. echo' });
  const labelIn = h('input#f-label', { name: 'label', value: f.label, autocomplete: 'off', placeholder: 'key or key=value' });
  const afterIn = h('input#f-after', { type: 'datetime-local', name: 'after', value: f.after, step: '1' });
  const beforeIn = h('input#f-before', { type: 'datetime-local', name: 'before', value: f.before, step: '1' });
  const sizeSel = h('select#f-size', { name: 'size' },
    ['25', '50', '100', '200'].map((n) => h('option', { value: n, selected: f.size === n }, n)));
  const filters = h('form.filters', {
    'aria-label': 'Filter tasks',
    onsubmit: (e) => {
      e.preventDefault();
      go(toHash({
        state: stateSel.value, handler: handlerIn.value.trim(), label: labelIn.value.trim(),
        after: afterIn.value, before: beforeIn.value, size: sizeSel.value, page: '',
      }));
    },
  },
  field('f-state', 'State', stateSel),
  field('f-handler', 'Handler', handlerIn),
  field('f-label', 'Label', labelIn),
  field('f-after', 'Created from', afterIn),
  field('f-before', 'Created until', beforeIn),
  field('f-size', 'Per page', sizeSel),
  h('div.field.buttons', h('button.primary', { type: 'submit' }, 'Apply'), h('a.button', { href: '#/tasks' }, 'Clear')));

  const listBox = h('div', { 'aria-busy': 'true' }, h('p.muted', 'Loading tasks…'));
  root.append(
    h('h1', 'Tasks'),
    lookup,
    filters,
    listBox,
  );

  // datetime-local inputs are in the browser's zone; the API takes instants.
  const instant = (v) => {
    const d = v ? new Date(v) : null;
    return d && !Number.isNaN(d.getTime()) ? d.toISOString() : undefined;
  };
  const filter = {
    state: f.state || undefined,
    handler: f.handler || undefined,
    label: f.label || undefined,
    createdAfter: instant(f.after),
    createdBefore: instant(f.before),
  };

  let tasks = [];
  let next = '';
  try {
    const res = await get(`/api/tasks${query({ ...filter, pageSize: f.size, pageToken })}`, { signal });
    tasks = res.tasks || [];
    next = res.nextPageToken || '';
  } catch (err) {
    if (signal.aborted) return;
    replace(listBox, errorNote(err, 'Could not list tasks'));
    listBox.removeAttribute('aria-busy');
    return;
  }
  if (signal.aborted) return;

  const selected = new Set();
  const count = h('span#sel-count', '0 selected');
  const actionNote = h('div.action-note');
  const cancelBtn = h('button.danger', { type: 'button', disabled: true, onclick: () => bulkCancel() }, 'Cancel selected');
  const retryBtn = h('button', { type: 'button', disabled: true, onclick: () => bulkRetry() }, 'Retry selected');
  const matchBtn = h('button', { type: 'button', onclick: () => cancelMatching() }, 'Cancel all that match…');
  const boxes = [];
  const refreshSel = () => {
    count.textContent = `${selected.size} selected`;
    cancelBtn.disabled = retryBtn.disabled = selected.size === 0;
    all.checked = tasks.length > 0 && selected.size === tasks.length;
    all.indeterminate = selected.size > 0 && selected.size < tasks.length;
  };
  const all = h('input#sel-all', {
    type: 'checkbox', 'aria-label': 'Select every task on this page',
    onchange: () => {
      boxes.forEach((b) => {
        b.checked = all.checked;
        if (all.checked) selected.add(b.value);
        else selected.delete(b.value);
      });
      refreshSel();
    },
  });

  const rows = tasks.map((t) => {
    const box = h('input', {
      type: 'checkbox', value: t.taskId, 'aria-label': `Select task ${t.taskId}`,
      onchange: () => {
        if (box.checked) selected.add(t.taskId);
        else selected.delete(t.taskId);
        refreshSel();
      },
    });
    boxes.push(box);
    const st = taskState(t);
    return h('tr', { 'data-task': t.taskId },
      h('td.sel', box),
      h('td', h('a.mono', { href: `#/tasks/${t.taskId}` }, t.taskId)),
      h('td', t.handler),
      h('td', badge(st)),
      h('td', time(t.createTime)),
      h('td.num', `${t.runCount || 0} of ${t.maxAttempts || '—'}`),
      h('td', labelChips(t.labels)));
  });

  const table = h('table.tasks',
    h('caption.visually-hidden', 'Tasks, newest first'),
    h('thead', h('tr',
      h('th.sel', { scope: 'col' }, all),
      ['Task', 'Handler', 'State', 'Created', 'Runs', 'Labels'].map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', rows));

  const pager = h('nav.pager', { 'aria-label': 'Pages' },
    stack.length || pageToken
      ? h('button', {
        type: 'button',
        onclick: () => {
          const prev = stack.pop();
          go(toHash({ page: prev || '' }));
        },
      }, '← Newer')
      : null,
    h('span', `Page ${stack.length + 1}`),
    next
      ? h('button', {
        type: 'button',
        onclick: () => {
          stack.push(pageToken);
          go(toHash({ page: next }));
        },
      }, 'Older →')
      : null);

  replace(listBox,
    h('div.toolbar', { role: 'group', 'aria-label': 'Bulk actions' },
      count, cancelBtn, retryBtn, matchBtn, h('button', { type: 'button', onclick: () => go(toHash({ page: pageToken })) }, 'Refresh')),
    actionNote,
    tasks.length
      ? tableWrap('Tasks', table)
      : h('p.empty', next ? 'No task on this page matches; older pages may hold some.' : 'No tasks match.'),
    pager);
  listBox.removeAttribute('aria-busy');

  async function bulkCancel() {
    const ids = [...selected].slice(0, BULK_LIMIT);
    const n = ids.length;
    const ok = await confirmDialog({
      title: `Cancel ${n} ${n === 1 ? 'task' : 'tasks'}?`,
      message: `${n} selected ${n === 1 ? 'task' : 'tasks'} will be cancelled; running attempts are told to stop. Tasks that already ended stay as they are. This cannot be undone.`,
      confirmLabel: `Cancel ${n} ${n === 1 ? 'task' : 'tasks'}`,
    });
    if (!ok) return;
    await runBulk(ids, 'Cancelling', 'cancelled', (id) => post(`/api/tasks/${id}/cancel`, { reason: 'cancelled from the console' }));
  }

  async function bulkRetry() {
    const ids = [...selected].slice(0, BULK_LIMIT);
    const ended = ids.filter((id) => {
      const t = tasks.find((x) => x.taskId === id);
      return t && TERMINAL.has(taskState(t)) && taskState(t) !== 'SUCCEEDED';
    });
    if (!ended.length) {
      replace(actionNote, h('p.error', { role: 'alert' }, 'Only tasks that FAILED, TIMED OUT or were CANCELLED can be retried.'));
      return;
    }
    const n = ended.length;
    const ok = await confirmDialog({
      title: `Retry ${n} ${n === 1 ? 'task' : 'tasks'}?`,
      message: `${n} ended ${n === 1 ? 'task runs' : 'tasks run'} again${n < ids.length ? ` (${ids.length - n} selected that did not fail are left alone)` : ''}.`,
      confirmLabel: `Retry ${n}`, danger: false,
    });
    if (!ok) return;
    await runBulk(ended, 'Retrying', 'retried', (id) => post(`/api/tasks/${id}/retry`, {}));
  }

  async function runBulk(ids, doing, done, call) {
    const total = ids.length;
    const progress = h('p', { role: 'status' }, `${doing} 0 of ${total}…`);
    replace(actionNote, progress);
    cancelBtn.disabled = retryBtn.disabled = true;
    let finished = 0;
    const results = await bounded(ids, IN_FLIGHT, call, () => {
      finished++;
      progress.textContent = `${doing} ${finished} of ${total}…`;
    });
    const failed = results.map((r, i) => [ids[i], r]).filter(([, r]) => !r.ok);
    // RetryTask leaves a task that has not ended as it is (retried false,
    // which proto3 JSON leaves out); a cancel has no such flag.
    const unchanged = done === 'retried' ? results.filter((r) => r.ok && !r.value?.retried).length : 0;
    const okCount = total - failed.length - unchanged;
    const summary = `${done[0].toUpperCase()}${done.slice(1)} ${okCount} of ${total}.`
      + (unchanged ? ` ${unchanged} had not ended and ${unchanged === 1 ? 'was' : 'were'} left as ${unchanged === 1 ? 'it was' : 'they were'}.` : '');
    announce(summary);
    selected.clear();
    // Show the outcome on a fresh copy of this page.
    const note = failed.length
      ? h('div', { role: 'alert' }, h('p.error', `${summary} ${failed.length} failed:`),
        h('ul.errors', failed.map(([id, r]) => h('li', h('a.mono', { href: `#/tasks/${id}` }, id), `: ${r.error.message}`))))
      : h('p.ok', { role: 'status' }, summary);
    pendingNote = note;
    go(toHash({ page: pageToken }));
  }

  // Counts first (a dry run), asks with that count, then cancels at most
  // that many: tasks submitted in between are not swept up unseen.
  async function cancelMatching() {
    if (f.state && TERMINAL.has(f.state.replace('TASK_STATE_', ''))) {
      replace(actionNote, h('p', { role: 'status' }, `${f.state.replace('TASK_STATE_', '').replace('_', ' ')} tasks have ended: there is nothing to cancel.`));
      return;
    }
    const body = { ...filter, reason: 'cancelled from the console' };
    let matched;
    try {
      const res = await post('/api/tasks:cancel', { ...body, limit: MATCH_LIMIT, dryRun: true });
      matched = Number(res.matched || 0);
    } catch (err) {
      replace(actionNote, errorNote(err, 'Could not count the matching tasks'));
      return;
    }
    if (!matched) {
      replace(actionNote, h('p', { role: 'status' }, 'No task that matches these filters is waiting or running: nothing to cancel.'));
      return;
    }
    const capped = matched >= MATCH_LIMIT;
    const one = matched === 1;
    const what = `${capped ? 'At least ' : ''}${matched.toLocaleString()} ${one ? 'task matches' : 'tasks match'}`;
    const filters = [
      f.state && `state ${f.state.replace('TASK_STATE_', '')}`,
      f.handler && `handler ${f.handler}`,
      f.label && `label ${f.label}`,
      filter.createdAfter && `created from ${new Date(filter.createdAfter).toLocaleString()}`,
      filter.createdBefore && `created until ${new Date(filter.createdBefore).toLocaleString()}`,
    ].filter(Boolean);
    const ok = await confirmDialog({
      title: `Cancel ${matched.toLocaleString()} ${one ? 'task' : 'tasks'} that match?`,
      message: `${what} ${filters.length ? `these filters (${filters.join(', ')})` : 'no filter: every task that has not ended'} and ${one ? 'has' : 'have'} not ended. `
        + `${capped ? `The newest ${MATCH_LIMIT.toLocaleString()} will be cancelled` : `${one ? 'It' : 'They'} will be cancelled`}; running attempts are told to stop. This cannot be undone.`,
      confirmLabel: `Cancel ${matched.toLocaleString()}`,
    });
    if (!ok) return;
    replace(actionNote, h('p', { role: 'status' }, `Cancelling ${matched.toLocaleString()}…`));
    try {
      const res = await post('/api/tasks:cancel', { ...body, limit: matched });
      const n = Number(res.cancelled || 0);
      const summary = `Cancelled ${n.toLocaleString()} of ${matched.toLocaleString()} ${matched === 1 ? 'task' : 'tasks'} that matched.`;
      announce(summary);
      pendingNote = h('p.ok', { role: 'status' }, summary,
        n < matched ? ' The others ended before they could be cancelled.' : '');
      go(toHash({ page: '' }));
    } catch (err) {
      replace(actionNote, errorNote(err, 'Cancel all that match failed'));
    }
  }

  if (pendingNote) {
    replace(actionNote, pendingNote);
    pendingNote = null;
  }
}

// The outcome of a bulk action, shown on the reloaded page.
let pendingNote = null;

/** The id of the task with this id or client_request_id, or null. */
async function lookUp(key, signal) {
  if (UUID.test(key)) {
    try {
      return (await get(`/api/tasks/${key}`, { signal })).task.taskId;
    } catch (err) {
      if (err.status !== 404) throw err; // a UUID may be a client request id too
    }
  }
  const res = await get(`/api/tasks${query({ clientRequestId: key, pageSize: 1 })}`, { signal });
  return res.tasks?.[0]?.taskId || null;
}
