// Overview: tasks by state and handler, queues, workers, breakers, and the
// per-minute chart. The chart and exact counts come from a stats endpoint
// (GET /api/stats) once the server has one; until then counts are bounded
// page reads of ListTasks, labelled as such, and the chart says it is not
// available.

import { get, query, bounded, ApiError } from './api.js';
import {
  h, replace, time, badge, short, errorNote, notAvailable, tableWrap, TASK_STATES, humanMs,
} from './ui.js';

const COUNT_CAP = 1000; // tasks read per state without a stats endpoint
const REFRESH_MS = 15000;

/** GET /api/stats, or null when the server has none (404/501). */
export async function getStats(signal) {
  try {
    return await get(`/api/stats${query({ windowMinutes: 60 })}`, { signal });
  } catch (err) {
    if (err instanceof ApiError && err.missing) return null;
    throw err;
  }
}

const n = (v) => Number(v || 0);

// Without stats: one page of up to COUNT_CAP per state (SUMMARY view, so a
// page costs little), counting "1000+" when there is more.
async function countByPages(signal) {
  const pages = await bounded(TASK_STATES, 3, (s) =>
    get(`/api/tasks${query({ state: `TASK_STATE_${s}`, pageSize: COUNT_CAP })}`, { signal }));
  const byState = [];
  const handlers = new Map();
  const queues = new Map();
  pages.forEach((r, i) => {
    const state = TASK_STATES[i];
    if (!r.ok) throw r.error;
    const tasks = r.value.tasks || [];
    const more = Boolean(r.value.nextPageToken);
    byState.push({ state, count: tasks.length, more });
    for (const t of tasks) {
      const row = handlers.get(t.handler) || {};
      row[state] = (row[state] || 0) + 1;
      handlers.set(t.handler, row);
      if (state === 'READY') {
        const q = queues.get(t.handler) || { ready: 0, oldest: t.createTime, exact: !more };
        q.ready++;
        if (t.createTime < q.oldest) q.oldest = t.createTime;
        queues.set(t.handler, q);
      }
    }
  });
  return { byState, handlers, queues, bounded: true };
}

function fromStats(st) {
  const byState = TASK_STATES.map((s) => ({
    state: s,
    count: n((st.byState || []).find((x) => x.state === `TASK_STATE_${s}`)?.count),
    more: false,
  }));
  const handlers = new Map();
  for (const x of st.byHandler || []) {
    const row = handlers.get(x.handler) || {};
    row[short(x.state, 'TASK_STATE_')] = n(x.count);
    handlers.set(x.handler, row);
  }
  const queues = new Map((st.queues || []).map((q) => [q.handler, { ready: n(q.ready), oldest: q.oldestReadyTime, exact: true }]));
  return { byState, handlers, queues, bounded: false };
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
  const totals = series.map(([k, label]) => `${points.reduce((a, p) => a + n(p[k]), 0)} ${label.toLowerCase()}`);
  svg.setAttribute('aria-label', `Per minute over the last hour: ${totals.join(', ')}`);
  for (const [k, , cls] of series) {
    const path = document.createElementNS(svgNS, 'polyline');
    path.setAttribute('points', points.map((p, i) => `${x(i).toFixed(1)},${y(p[k]).toFixed(1)}`).join(' '));
    path.setAttribute('class', cls);
    svg.append(path);
  }
  return h('figure',
    svg,
    h('figcaption', h('ul.legend', series.map(([k, label, cls], i) => h('li', h(`span.key.${cls}`, { 'aria-hidden': 'true' }), `${label}: ${totals[i].split(' ')[0]} in the hour (peak ${Math.max(0, ...points.map((p) => n(p[k])))}/min)`)))));
}

export async function overview(root, { signal }) {
  const countsBox = h('div', h('p.muted', 'Counting tasks…'));
  const chartBox = h('div', h('p.muted', 'Loading…'));
  const handlersBox = h('div');
  const queuesBox = h('div');
  const workersBox = h('div', h('p.muted', 'Loading…'));
  const breakersBox = h('div', h('p.muted', 'Loading…'));
  const clusterBox = h('div');
  const refreshed = h('span.small.muted');
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

  let hasStats = false;
  async function loadTasks() {
    let stats;
    try {
      stats = await getStats(signal);
    } catch (err) {
      if (!signal.aborted) replace(chartBox, errorNote(err, 'Could not load the stats'));
      stats = null;
    }
    hasStats = Boolean(stats);
    if (signal.aborted) return;
    if (stats?.perMinute?.length) replace(chartBox, chart(stats.perMinute));
    else if (stats) replace(chartBox, h('p.muted', 'No completions, failures or retries in the last hour.'));
    else if (!chartBox.querySelector('.error')) replace(chartBox, notAvailable('Per-minute completions, failures and retries'));
    replace(clusterBox, stats?.leader?.nodeId
      ? h('p', 'Leader replica: ', h('code', stats.leader.nodeId))
      : null);

    let data;
    try {
      data = stats ? fromStats(stats) : await countByPages(signal);
    } catch (err) {
      if (!signal.aborted) replace(countsBox, errorNote(err, 'Could not count tasks'));
      return;
    }
    if (signal.aborted) return;
    const fmt = (c) => (c.more ? `${c.count.toLocaleString()}+` : c.count.toLocaleString());
    replace(countsBox,
      h('ul.cards', data.byState.map((c) => h('li.card',
        h('a', { href: `#/tasks?state=TASK_STATE_${c.state}`, 'aria-label': `${fmt(c)} ${c.state.replace('_', ' ')} tasks` },
          h('span.card-num', fmt(c)), ' ', badge(c.state))))),
      data.bounded ? h('p.small.muted', `Counted from up to ${COUNT_CAP.toLocaleString()} tasks per state (“+” means more); exact counts need the server’s stats endpoint.`) : null);

    const states = TASK_STATES.filter((s) => [...data.handlers.values()].some((r) => r[s]));
    replace(handlersBox, data.handlers.size
      ? tableWrap('Tasks by handler', h('table',
        h('caption.visually-hidden', 'Tasks by handler and state'),
        h('thead', h('tr', h('th', { scope: 'col' }, 'Handler'), states.map((s) => h('th.num', { scope: 'col' }, s.replace('_', ' '))))),
        h('tbody', [...data.handlers.entries()].sort().map(([handler, row]) => h('tr',
          h('th', { scope: 'row' }, h('a', { href: `#/tasks?handler=${encodeURIComponent(handler)}` }, handler)),
          states.map((s) => h('td.num', row[s] ? String(row[s]) : '—')))))))
      : h('p.muted', 'No tasks.'));

    replace(queuesBox, data.queues.size
      ? tableWrap('Queues', h('table',
        h('caption.visually-hidden', 'READY tasks per handler'),
        h('thead', h('tr', ['Handler', 'READY', 'Oldest READY', 'Waiting'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', [...data.queues.entries()].sort().map(([handler, q]) => h('tr',
          h('th', { scope: 'row' }, handler),
          h('td.num', String(q.ready)),
          h('td', q.exact ? time(q.oldest) : ['older than ', time(q.oldest)]),
          h('td', humanMs(Date.now() - new Date(q.oldest).getTime())))))))
      : h('p.muted', 'Nothing is waiting for a worker.'));
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

  async function load() {
    await Promise.all([loadTasks(), loadWorkers(), loadBreakers()]);
    if (!signal.aborted) replace(refreshed, 'Updated ', time(new Date().toISOString()));
  }
  await load();
  // With a stats endpoint a refresh is one cheap call; page counting is
  // left to the Refresh button.
  const timer = setInterval(() => {
    if (hasStats) load();
    else Promise.all([loadWorkers(), loadBreakers()]);
  }, REFRESH_MS);
  signal.addEventListener('abort', () => clearInterval(timer), { once: true });
}
