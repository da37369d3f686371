// Overview: tasks by state and handler, queues, workers, breakers, and the
// per-minute chart, all from the server (GET /api/stats counts in the store,
// so every replica answers the same; nothing is counted in the browser).

import { get, query } from './api.js';
import {
  h, replace, time, clock, badge, short, errorNote, tableWrap, TASK_STATES, humanMs,
} from './ui.js';

const REFRESH_MS = 15000;
const WINDOW_MINUTES = 60;

const n = (v) => Number(v || 0);

/** The stats answer as the views draw it. */
function fromStats(st) {
  const byState = TASK_STATES.map((s) => ({
    state: s,
    count: n((st.byState || []).find((x) => x.state === `TASK_STATE_${s}`)?.count),
  }));
  const handlers = new Map();
  for (const x of st.byHandler || []) {
    const row = handlers.get(x.handler) || {};
    row[short(x.state, 'TASK_STATE_')] = n(x.count);
    handlers.set(x.handler, row);
  }
  const queues = new Map((st.queues || []).map((q) => [q.handler, { ready: n(q.ready), oldest: q.oldestReadyTime }]));
  return { byState, handlers, queues };
}

function chart(points) {
  const series = [['completed', 'Completed', 's-ok'], ['failed', 'Failed', 's-fail'], ['retried', 'Retried', 's-retry']];
  const W = 600;
  const H = 160;
  const max = Math.max(1, ...points.flatMap((p) => series.map(([k]) => n(p[k]))));
  const x = (i) => (points.length < 2 ? 0 : (i * W) / (points.length - 1));
  const y = (v) => H - (n(v) * (H - 10)) / max;
  const svgNS = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(svgNS, 'svg');
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.setAttribute('class', 'chart');
  svg.setAttribute('role', 'img');
  const totals = series.map(([k]) => points.reduce((a, p) => a + n(p[k]), 0));
  svg.setAttribute('aria-label', `Per minute over the last ${points.length} minutes: ${series.map(([, label], i) => `${totals[i]} ${label.toLowerCase()}`).join(', ')}`);
  for (const [k, , cls] of series) {
    const path = document.createElementNS(svgNS, 'polyline');
    path.setAttribute('points', points.map((p, i) => `${x(i).toFixed(1)},${y(p[k]).toFixed(1)}`).join(' '));
    path.setAttribute('class', cls);
    svg.append(path);
  }
  const first = points[0]?.minute;
  const last = points[points.length - 1]?.minute;
  return h('figure',
    svg,
    h('figcaption',
      h('p.axis.small.muted', clock(first), h('span', `peak ${max}/min`), clock(last)),
      h('ul.legend', series.map(([k, label, cls], i) => h('li', { 'data-series': k },
        h(`span.key.${cls}`, { 'aria-hidden': 'true' }),
        `${label}: `, h('strong.total', String(totals[i])), ` in the hour (peak ${Math.max(0, ...points.map((p) => n(p[k])))}/min)`)))));
}

export async function overview(root, { signal }) {
  const countsBox = h('div', h('p.muted', 'Counting tasks…'));
  const chartBox = h('div', h('p.muted', 'Loading…'));
  const handlersBox = h('div');
  const queuesBox = h('div');
  const workersBox = h('div', h('p.muted', 'Loading…'));
  const breakersBox = h('div', h('p.muted', 'Loading…'));
  const clusterBox = h('div');
  const refreshed = h('span.small.muted#refreshed');
  root.append(
    h('div.title-row', h('h1', 'Overview'),
      h('div', refreshed, ' ', h('button', { type: 'button', onclick: () => load() }, 'Refresh'))),
    h('section', { 'aria-labelledby': 'o-states' }, h('h2#o-states', 'Tasks by state'), countsBox),
    h('section', { 'aria-labelledby': 'o-chart' }, h('h2#o-chart', 'The last hour, per minute'), chartBox),
    h('div.two',
      h('section', { 'aria-labelledby': 'o-workers' }, h('h2#o-workers', 'Workers'), workersBox, clusterBox),
      h('section', { 'aria-labelledby': 'o-breakers' }, h('h2#o-breakers', 'Breakers'), breakersBox)),
    h('section', { 'aria-labelledby': 'o-queues' }, h('h2#o-queues', 'Queues (READY tasks)'), queuesBox),
    h('section', { 'aria-labelledby': 'o-handlers' }, h('h2#o-handlers', 'Tasks by handler'), handlersBox),
  );

  // Returns the store's clock of the figures, or null when they failed.
  async function loadStats() {
    let stats;
    try {
      stats = await get(`/api/stats${query({ windowMinutes: WINDOW_MINUTES })}`, { signal });
    } catch (err) {
      if (signal.aborted) return null;
      replace(countsBox, errorNote(err, 'Could not load the task counts'));
      replace(chartBox, errorNote(err, 'Could not load the per-minute figures'));
      replace(handlersBox);
      replace(queuesBox);
      replace(clusterBox);
      return null;
    }
    if (signal.aborted) return null;
    const points = stats.perMinute || [];
    replace(chartBox, points.length ? chart(points) : h('p.muted', 'No per-minute figures.'));
    replace(clusterBox, h('p', 'Leader replica: ', stats.leader?.nodeId
      ? h('code#leader', stats.leader.nodeId)
      : h('span.muted', 'none holds the lease right now')));

    const data = fromStats(stats);
    replace(countsBox,
      h('ul.cards', data.byState.map((c) => h('li.card', { 'data-state': c.state },
        h('a', { href: `#/tasks?state=TASK_STATE_${c.state}`, 'aria-label': `${c.count.toLocaleString()} ${c.state.replace('_', ' ')} tasks` },
          h('span.card-num', c.count.toLocaleString()), ' ', badge(c.state))))));

    const states = TASK_STATES.filter((s) => [...data.handlers.values()].some((r) => r[s]));
    replace(handlersBox, data.handlers.size
      ? tableWrap('Tasks by handler', h('table#by-handler',
        h('caption.visually-hidden', 'Tasks by handler and state'),
        h('thead', h('tr', h('th', { scope: 'col' }, 'Handler'), states.map((s) => h('th.num', { scope: 'col' }, s.replace('_', ' '))))),
        h('tbody', [...data.handlers.entries()].sort().map(([handler, row]) => h('tr',
          h('th', { scope: 'row' }, h('a', { href: `#/tasks?handler=${encodeURIComponent(handler)}` }, handler)),
          states.map((s) => h('td.num', row[s] ? row[s].toLocaleString() : '—')))))))
      : h('p.muted', 'No tasks.'));

    // Waiting is measured on the store's clock, not the browser's.
    const now = stats.readTime ? new Date(stats.readTime).getTime() : Date.now();
    replace(queuesBox, data.queues.size
      ? tableWrap('Queues', h('table#queues',
        h('caption.visually-hidden', 'READY tasks per handler'),
        h('thead', h('tr', ['Handler', 'READY', 'Oldest READY since', 'Waiting'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', [...data.queues.entries()].sort().map(([handler, q]) => h('tr',
          h('th', { scope: 'row' }, handler),
          h('td.num', q.ready.toLocaleString()),
          h('td', time(q.oldest)),
          h('td', q.oldest ? humanMs(Math.max(0, now - new Date(q.oldest).getTime())) : '—'))))))
      : h('p.muted', 'Nothing is waiting for a worker.'));
    return stats.readTime || new Date().toISOString();
  }

  async function loadWorkers() {
    try {
      const list = (await get('/api/workers', { signal })).workers || [];
      if (signal.aborted) return;
      const used = list.reduce((a, w) => a + n(w.active), 0);
      const cap = list.reduce((a, w) => a + n(w.capacity), 0);
      const draining = list.filter((w) => w.draining).length;
      replace(workersBox,
        h('p.big', `${list.length} connected`),
        h('p', `${used} of ${cap} slots in use`, draining ? `, ${draining} draining` : ''),
        h('p', h('a', { href: '#/workers' }, 'See the workers')));
    } catch (err) {
      if (!signal.aborted) replace(workersBox, errorNote(err, 'Could not list workers'));
    }
  }

  async function loadBreakers() {
    try {
      const list = (await get('/api/breakers', { signal })).breakers || [];
      if (signal.aborted) return;
      const open = list.filter((b) => /OPEN/.test(b.state || ''));
      replace(breakersBox,
        h('p.big', `${open.length} open`),
        open.length ? h('ul', open.map((b) => h('li', b.handler, ' ', badge(short(b.state, 'BREAKER_STATE_'))))) : h('p', `of ${list.length} handlers with recent outcomes`),
        h('p', h('a', { href: '#/breakers' }, 'See the breakers')));
    } catch (err) {
      if (!signal.aborted) replace(breakersBox, errorNote(err, 'Could not list breakers'));
    }
  }

  let loads = 0;
  async function load() {
    const [read] = await Promise.all([loadStats(), loadWorkers(), loadBreakers()]);
    if (signal.aborted) return;
    if (read) replace(refreshed, 'Figures of ', time(read));
    else replace(refreshed);
    refreshed.dataset.loads = String(++loads); // for tests and tools: a load has drawn
  }
  await load();
  const timer = setInterval(load, REFRESH_MS);
  signal.addEventListener('abort', () => clearInterval(timer), { once: true });
}
