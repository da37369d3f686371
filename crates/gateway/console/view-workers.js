// Workers (ListWorkers) and circuit breakers (ListCircuitBreakers), looked
// at again every few seconds while the view is open.

import { get, post } from './api.js';
import {
  h, replace, time, badge, short, labelChips, errorNote, tableWrap, confirmDialog, announce,
} from './ui.js';

const REFRESH_MS = 5000;

/**
 * Runs load() now and every few seconds until the view closes, keeping
 * keyboard focus; resolves after the first run with a function that runs it
 * again at once.
 */
async function every(signal, box, load) {
  const tick = async () => {
    const key = box.contains(document.activeElement) ? document.activeElement.dataset.key : null;
    await load();
    if (key) box.querySelector(`[data-key="${CSS.escape(key)}"]`)?.focus();
  };
  const timer = setInterval(tick, REFRESH_MS);
  signal.addEventListener('abort', () => clearInterval(timer), { once: true });
  await tick();
  return tick;
}

// Workers are named by their host by default, so several may share a name:
// the id tells them apart.
function who(w) {
  return w.name && w.name !== w.workerId ? `${w.name} (${w.workerId})` : w.workerId;
}

function slots(w) {
  const cap = Number(w.capacity || 0);
  const act = Number(w.active || 0);
  return h('div.slots',
    h('meter', { min: '0', max: String(cap || 1), value: String(act), 'aria-label': `Slots used by ${who(w)}` }),
    ` ${act} of ${cap}`);
}

function mode(w) {
  const m = short(w.mode, 'WORKER_MODE_');
  if (!m || m === 'UNSPECIFIED') return h('span.muted', 'not reported');
  return h('span', { title: m === 'PUSH' ? 'The server calls its Worker service' : 'It holds a stream to the server' }, m.toLowerCase());
}

export async function workers(root, { signal }) {
  const note = h('div.action-note');
  const box = h('div', h('p.muted', 'Loading workers…'));
  root.append(h('h1', 'Workers'), note, box);

  const drain = async (w) => {
    const name = who(w);
    const ok = await confirmDialog({
      title: `Drain ${name}?`,
      message: 'It gets no new task and finishes those it has. It stays connected until you stop it; if it connects again, it takes tasks again.',
      confirmLabel: 'Drain worker',
    });
    if (!ok) return;
    const notReached = (why) => replace(note, h('p.error', { role: 'alert' },
      `${name} was not reached: ${why} (it may be connected to another replica, or gone). Nothing was drained.`));
    try {
      const res = await post(`/api/workers/${encodeURIComponent(w.workerId)}/drain`, {});
      const streams = Number(res.streams || 0);
      if (streams) {
        const text = `Draining ${name}: ${streams} ${streams === 1 ? 'session gets' : 'sessions get'} no new task.`;
        replace(note, h('p.ok', { role: 'status' }, text));
        announce(text);
      } else {
        notReached('the replica that answered holds no stream of it');
      }
    } catch (err) {
      if (err.status === 404) notReached(err.message);
      else replace(note, errorNote(err, `Drain of ${name} failed`));
    }
    await refresh();
    // The Drain button is gone once the worker drains: keep focus near it.
    if (!box.contains(document.activeElement) && note.firstChild) {
      note.firstChild.tabIndex = -1;
      note.firstChild.focus();
    }
  };

  const refresh = await every(signal, box, async () => {
    let res;
    try {
      res = await get('/api/workers', { signal });
    } catch (err) {
      if (!signal.aborted) replace(box, errorNote(err, 'Could not list workers'));
      return;
    }
    if (signal.aborted) return;
    const list = res.workers || [];
    if (!list.length) {
      replace(box, h('p.empty', 'No worker is connected.'));
      return;
    }
    const used = list.reduce((n, w) => n + Number(w.active || 0), 0);
    const cap = list.reduce((n, w) => n + Number(w.capacity || 0), 0);
    replace(box,
      h('p', `${list.length} connected, ${used} of ${cap} slots in use.`),
      tableWrap('Workers', h('table#workers',
        h('caption.visually-hidden', 'Connected workers'),
        h('thead', h('tr', ['Worker', 'Handlers', 'Slots used', 'Labels', 'Mode', 'State', 'CPU idle', 'Avg cost', 'Replica', 'Last seen', 'Actions']
          .map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', list.map((w) => h('tr', { 'data-worker': w.workerId },
          h('td', h('strong', w.name || w.workerId), w.name && w.name !== w.workerId ? h('div.small.mono', w.workerId) : null),
          h('td', h('ul.chips', (w.handlers || []).map((x) => h('li.chip', x)))),
          h('td', slots(w)),
          h('td', labelChips(w.labels)),
          h('td', mode(w)),
          h('td', w.draining ? badge('DRAINING') : badge('SERVING')),
          h('td.num', w.cpuIdlePercent !== undefined ? `${Number(w.cpuIdlePercent).toFixed(0)} %` : '—'),
          h('td.num', w.avgCostMs !== undefined ? `${Number(w.avgCostMs).toFixed(1)} ms` : '—'),
          h('td.mono', w.nodeId || '—'),
          h('td', time(w.lastSeenTime)),
          h('td', w.draining ? '—' : h('button', {
            type: 'button', 'data-key': `drain-${w.sessionId || w.workerId}`,
            'aria-label': `Drain ${who(w)}`, onclick: () => drain(w),
          }, 'Drain'))))))));
  });
}

export async function breakers(root, { signal }) {
  const box = h('div', h('p.muted', 'Loading breakers…'));
  root.append(h('h1', 'Circuit breakers'),
    h('p.small.muted', 'A breaker holds a handler’s retries while its recent failure rate is at or above 50 % over at least 10 outcomes, until a trial retry succeeds.'),
    box);
  await every(signal, box, async () => {
    let res;
    try {
      res = await get('/api/breakers', { signal });
    } catch (err) {
      if (!signal.aborted) replace(box, errorNote(err, 'Could not list breakers'));
      return;
    }
    if (signal.aborted) return;
    const list = res.breakers || [];
    if (!list.length) {
      replace(box, h('p.empty', 'No handler has recent outcomes.'));
      return;
    }
    replace(box, tableWrap('Circuit breakers', h('table#breakers',
      h('caption.visually-hidden', 'Circuit breakers per handler'),
      h('thead', h('tr', ['Handler', 'State', 'Failures', 'Outcomes', 'Failure rate', 'Opened', 'Namespace'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', list.map((b) => {
        const total = Number(b.total || 0);
        const fails = Number(b.failures || 0);
        return h('tr',
          h('td', b.handler),
          h('td', badge(short(b.state, 'BREAKER_STATE_') || 'UNSPECIFIED')),
          h('td.num', String(fails)),
          h('td.num', String(total)),
          h('td.num', total ? `${Math.round((100 * fails) / total)} %` : '—'),
          h('td', time(b.openedTime)),
          h('td', b.namespace || '—'));
      })))));
  });
}
