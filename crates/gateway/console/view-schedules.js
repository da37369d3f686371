// Schedules: the list, one schedule with its fire history, and the create /
// edit form. Fire times are shown in the schedule's own time zone.

import { get, post, api, query } from './api.js';
import {
  h, replace, time, badge, short, errorNote, tableWrap,
  confirmDialog, announce, durationMs, humanMs, labelChips, labelsText,
} from './ui.js';

const REFRESH_MS = 5000;
const browserZone = Intl.DateTimeFormat().resolvedOptions().timeZone;

function kindText(s) {
  const kind = short(s.kind, 'SCHEDULE_KIND_');
  if (kind === 'CRON') return h('span', 'cron ', h('code', s.cronExpression || ''));
  const every = humanMs(durationMs(s.interval));
  return kind === 'FIXED_DELAY' ? `${every} after each run ends` : `every ${every}`;
}
const zoneOf = (s) => s.timeZone || 'UTC';

/** A fire time in the schedule's zone, the browser's zone and UTC on hover. */
function fireTime(iso, s) {
  if (!iso) return h('span.muted', s.paused ? 'paused' : 'none left');
  const zone = zoneOf(s);
  const el = time(iso, zone);
  if (zone !== browserZone) {
    el.title = `${el.title} · your time ${new Date(iso).toLocaleString()}`;
  }
  return el;
}

/** The server's preview of a definition's next fires (PreviewSchedule). */
async function previewFires(def, signal, count = 5) {
  const res = await post('/api/schedules:preview', { schedule: def, count }, { signal });
  return { times: res.fireTimes || [], warnings: res.warnings || [] };
}

// The next fires of a saved schedule: FIXED_RATE ones follow from its
// next_fire_time; CRON ones need the calendar of its zone (DST rules), which
// the server's preview knows.
async function nextFires(s, signal, count = 5) {
  const kind = short(s.kind, 'SCHEDULE_KIND_');
  if (!s.nextFireTime) return { times: [] };
  if (kind === 'FIXED_RATE') {
    const step = durationMs(s.interval);
    const t0 = new Date(s.nextFireTime).getTime();
    return { times: Array.from({ length: count }, (_, i) => new Date(t0 + i * step).toISOString()) };
  }
  if (kind === 'FIXED_DELAY') return { times: [s.nextFireTime], note: 'Later fires depend on when each run ends.' };
  try {
    return await previewFires(definition(s), signal, count);
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    return { times: [s.nextFireTime], error: err };
  }
}

function firesList(res, s) {
  return h('div',
    res.times.length ? h('ol.fires', res.times.map((t) => h('li', fireTime(t, s)))) : h('p.muted', s.paused ? 'Paused: no fire is due.' : 'No fire left.'),
    (res.warnings || []).map((w) => h('p.warn', h('strong', 'Daylight saving: '), w)),
    res.note ? h('p.small.muted', res.note) : null,
    res.error ? errorNote(res.error, 'Could not preview the later fires') : null);
}

// The fields a create or update takes (output-only ones left out).
function definition(s) {
  const d = {
    name: s.name || '', kind: s.kind, timeZone: s.timeZone || '',
    misfirePolicy: s.misfirePolicy, overlapPolicy: s.overlapPolicy,
    maxCatchUp: s.maxCatchUp, template: s.template, paused: s.paused || undefined,
  };
  if (short(s.kind, 'SCHEDULE_KIND_') === 'CRON') d.cronExpression = s.cronExpression;
  else d.interval = s.interval;
  return d;
}

async function act(s, verb, note, signal) {
  try {
    const res = await post(`/api/schedules/${s.scheduleId}/${verb}`, {}, { signal });
    return res;
  } catch (err) {
    replace(note, errorNote(err, `${verb[0].toUpperCase()}${verb.slice(1)} failed`));
    return null;
  }
}

async function deleteSchedule(s, note) {
  const ok = await confirmDialog({
    title: 'Delete this schedule?',
    message: `Schedule “${s.name || s.scheduleId}” stops firing and is removed with its fire history. Tasks it already created stay. This cannot be undone.`,
    confirmLabel: 'Delete schedule',
  });
  if (!ok) return false;
  try {
    await api('DELETE', `/api/schedules/${s.scheduleId}`);
    announce('Schedule deleted');
    return true;
  } catch (err) {
    replace(note, errorNote(err, 'Delete failed'));
    return false;
  }
}

function scheduleActions(s, note, after) {
  const name = s.name || s.scheduleId;
  return h('div.actions',
    s.paused
      ? h('button', { type: 'button', 'aria-label': `Resume ${name}`, onclick: async () => (await act(s, 'resume', note)) && after('resumed') }, 'Resume')
      : h('button', { type: 'button', 'aria-label': `Pause ${name}`, onclick: async () => (await act(s, 'pause', note)) && after('paused') }, 'Pause'),
    h('button', {
      type: 'button', 'aria-label': `Trigger now: ${name}`,
      onclick: async () => {
        const res = await act(s, 'trigger', note);
        if (res?.task) {
          replace(note, h('p.ok', { role: 'status' }, 'Triggered: ', h('a.mono', { href: `#/tasks/${res.task.taskId}` }, res.task.taskId)));
          after(null);
        }
      },
    }, 'Trigger now'),
    h('a.button', { href: `#/schedules/${s.scheduleId}/edit`, 'aria-label': `Edit ${name}` }, 'Edit'),
    h('button.danger', { type: 'button', 'aria-label': `Delete ${name}`, onclick: async () => (await deleteSchedule(s, note)) && after('deleted') }, 'Delete'));
}

// The next five fires of a listed schedule, asked for when opened (one
// preview per schedule the person looks at, not one per row).
function laterFires(s, signal) {
  const box = h('div', h('p.muted.small', 'Loading…'));
  let loaded = false;
  return h('details.later', {
    ontoggle: async (e) => {
      if (!e.target.open || loaded) return;
      loaded = true;
      try {
        replace(box, firesList(await nextFires(s, signal), s));
      } catch {
        /* the view closed */
      }
    },
  }, h('summary', { 'aria-label': `Next five fires of ${s.name || s.scheduleId}` }, 'next five'), box);
}

export async function scheduleList(root, { params, signal, go }) {
  const token = params.get('page') || '';
  const box = h('div', h('p.muted', 'Loading schedules…'));
  root.append(
    h('div.title-row', h('h1', 'Schedules'), h('a.button.primary', { href: '#/schedules/new' }, 'New schedule')),
    box);
  let res;
  try {
    res = await get(`/api/schedules${query({ pageSize: 100, pageToken: token })}`, { signal });
  } catch (err) {
    if (!signal.aborted) replace(box, errorNote(err, 'Could not list schedules'));
    return;
  }
  if (signal.aborted) return;
  const list = res.schedules || [];
  if (!list.length) {
    replace(box, h('p.empty', 'No schedules yet. ', h('a', { href: '#/schedules/new' }, 'Create one'), '.'));
    return;
  }
  const note = h('div.action-note');
  const reload = () => go(location.hash);
  replace(box, note, tableWrap('Schedules', h('table',
    h('caption.visually-hidden', 'Schedules'),
    h('thead', h('tr', ['Name', 'Handler', 'When', 'Zone', 'Next fire (its zone)', 'Fires', 'State', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', list.map((s) => h('tr', { 'data-schedule': s.scheduleId },
      h('td', h('a', { href: `#/schedules/${s.scheduleId}` }, s.name || s.scheduleId.slice(0, 8))),
      h('td', s.template?.handler || '—'),
      h('td', kindText(s)),
      h('td', zoneOf(s)),
      h('td', fireTime(s.nextFireTime, s), s.nextFireTime ? laterFires(s, signal) : null),
      h('td.num', `${Number(s.fireCount || 0)}${Number(s.skippedCount || 0) ? ` (+${s.skippedCount} skipped)` : ''}`),
      h('td', s.paused ? badge('PAUSED') : badge('ACTIVE')),
      h('td', scheduleActions(s, note, (what) => {
        if (what) announce(`Schedule ${what}`);
        if (what) reload();
      }))))))),
  res.nextPageToken
    ? h('nav.pager', { 'aria-label': 'Pages' }, h('a.button', { href: `#/schedules?page=${res.nextPageToken}` }, 'More →'))
    : null);
}

export async function scheduleDetail(root, { args: [id], signal, go }) {
  const head = h('div');
  const note = h('div.action-note');
  const defBox = h('dl.fields');
  const nextBox = h('div');
  const firesBox = h('div');
  root.append(
    h('p.crumbs', h('a', { href: '#/schedules' }, 'Schedules'), ' / ', h('span.mono', id)),
    head, note,
    h('section', { 'aria-labelledby': 's-def' }, h('h2#s-def', 'Definition'), defBox),
    h('section', { 'aria-labelledby': 's-next' }, h('h2#s-next', 'Next fires'), nextBox),
    h('section', { 'aria-labelledby': 's-fires' }, h('h2#s-fires', 'Recent fires'), firesBox));

  let lastNext = null;
  async function load(first) {
    let res;
    try {
      res = await get(`/api/schedules/${id}`, { signal });
    } catch (err) {
      if (signal.aborted) return false;
      if (first) replace(head, h('h1', 'Schedule'), errorNote(err, 'Could not load the schedule'));
      else replace(note, errorNote(err, 'Refreshing failed'));
      return !first;
    }
    if (signal.aborted) return false;
    const s = res.schedule;
    const zone = zoneOf(s);
    if (first) {
      replace(head, h('div.title-row', h('h1', 'Schedule ', s.name ? `“${s.name}”` : h('span.mono', id)), s.paused ? badge('PAUSED') : badge('ACTIVE')));
    } else {
      head.querySelector('.badge')?.replaceWith(s.paused ? badge('PAUSED') : badge('ACTIVE'));
    }
    const actionsBox = head.querySelector('.actions');
    const focusedLabel = actionsBox?.contains(document.activeElement) ? document.activeElement.textContent : null;
    const fresh = scheduleActions(s, note, (what) => {
      if (what === 'deleted') go('#/schedules');
      else {
        if (what) announce(`Schedule ${what}`);
        load(false);
      }
    });
    if (actionsBox) actionsBox.replaceWith(fresh);
    else head.append(fresh);
    if (focusedLabel) [...fresh.children].find((b) => b.textContent === focusedLabel)?.focus();
    const tpl = s.template || {};
    replace(defBox,
      h('dt', 'Id'), h('dd', h('code', s.scheduleId)),
      h('dt', 'When'), h('dd', kindText(s)),
      h('dt', 'Time zone'), h('dd', zone),
      h('dt', 'Handler'), h('dd', tpl.handler || '—'),
      h('dt', 'Labels'), h('dd', labelChips(tpl.labels)),
      h('dt', 'Misfires'), h('dd', short(s.misfirePolicy, 'MISFIRE_POLICY_').replace(/_/g, ' ').toLowerCase() || 'fire once now'),
      h('dt', 'Overlap'), h('dd', short(s.overlapPolicy, 'OVERLAP_POLICY_').replace(/_/g, ' ').toLowerCase() || 'allow'),
      h('dt', 'Fires'), h('dd', `${Number(s.fireCount || 0)} created, ${Number(s.skippedCount || 0)} skipped`),
      h('dt', 'Last fire'), h('dd', s.lastFireTime ? fireTime(s.lastFireTime, s) : '—'),
      h('dt', 'Last task'), h('dd', s.lastTaskId ? h('a.mono', { href: `#/tasks/${s.lastTaskId}` }, s.lastTaskId) : '—'),
      h('dt', 'Created'), h('dd', time(s.createTime)));
    if (lastNext !== (s.nextFireTime || '') + s.paused) {
      lastNext = (s.nextFireTime || '') + s.paused;
      try {
        replace(nextBox, firesList(await nextFires(s, signal), s));
      } catch {
        return false;
      }
    }
    const fires = res.recentFires || [];
    replace(firesBox, fires.length
      ? tableWrap('Recent fires', h('table#fires',
        h('caption.visually-hidden', 'Recent fires, newest first'),
        h('thead', h('tr', ['Fire time (its zone)', 'Handled', 'Outcome', 'Task'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', fires.map((f) => h('tr',
          h('td', fireTime(f.fireTime, s)),
          h('td', time(f.handledTime)),
          h('td', badge(short(f.outcome, 'FIRE_OUTCOME_') || 'UNSPECIFIED', /SKIPPED/.test(f.outcome) ? 'skipped' : 'created')),
          h('td', f.taskId ? h('a.mono', { href: `#/tasks/${f.taskId}` }, f.taskId) : '—'))))))
      : h('p.muted', 'No fires yet.'));
    return true;
  }
  if (!(await load(true))) return;
  // Fires arrive on the server's clock: look again every few seconds.
  const timer = setInterval(() => load(false), REFRESH_MS);
  signal.addEventListener('abort', () => clearInterval(timer), { once: true });
}

// ---- the form --------------------------------------------------------------

function toBase64(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}
function fromBase64(b64) {
  try {
    const bin = atob(b64 || '');
    return new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0)));
  } catch {
    return '';
  }
}

let zones = null;
function zoneList() {
  if (!zones) {
    try {
      zones = Intl.supportedValuesOf('timeZone');
    } catch {
      zones = [];
    }
    if (!zones.includes('UTC')) zones = ['UTC', ...zones];
  }
  return zones;
}

export async function scheduleForm(root, { args: [id], signal, go }) {
  let existing = null;
  if (id) {
    try {
      existing = (await get(`/api/schedules/${id}`, { signal })).schedule;
    } catch (err) {
      if (!signal.aborted) root.append(h('h1', 'Edit schedule'), errorNote(err, 'Could not load the schedule'));
      return;
    }
    if (signal.aborted) return;
  }
  const s = existing || {};
  const tpl = s.template || {};
  const kindNow = short(s.kind, 'SCHEDULE_KIND_') || 'CRON';

  const errs = {};
  const field = (name, label, input, help) => {
    const eid = `e-${name}`;
    errs[name] = h(`p.field-error#${eid}`);
    input.id = `s-${name}`;
    input.name = name;
    const described = [help ? `h-${name}` : null, eid].filter(Boolean).join(' ');
    input.setAttribute('aria-describedby', described);
    return h('div.field', h('label', { for: input.id }, label), input,
      help ? h('p.help', { id: `h-${name}` }, help) : null, errs[name]);
  };
  const opt = (value, text, cur) => h('option', { value, selected: value === cur }, text);

  const name = h('input', { value: s.name || '', autocomplete: 'off' });
  const handler = h('input', { value: tpl.handler || '', required: true, autocomplete: 'off', placeholder: 'e.g. echo' });
  const kind = h('select', {},
    opt('CRON', 'Cron expression', kindNow), opt('FIXED_RATE', 'Fixed rate', kindNow), opt('FIXED_DELAY', 'Fixed delay after each run', kindNow));
  const cron = h('input', { value: s.cronExpression || '', autocomplete: 'off', spellcheck: 'false', placeholder: '0 30 9 * * 1-5' });
  const interval = h('input', { type: 'number', min: '1', step: '1', value: s.interval ? String(durationMs(s.interval) / 1000) : '60' });
  const zone = h('input', { value: s.timeZone || browserZone || 'UTC', list: 'zones', autocomplete: 'off' });
  const zonesList = h('datalist#zones', zoneList().map((z) => h('option', { value: z })));
  const misfire = h('select', {},
    opt('MISFIRE_POLICY_FIRE_ONCE_NOW', 'Fire once now', s.misfirePolicy || 'MISFIRE_POLICY_FIRE_ONCE_NOW'),
    opt('MISFIRE_POLICY_SKIP', 'Skip', s.misfirePolicy),
    opt('MISFIRE_POLICY_CATCH_UP', 'Catch up', s.misfirePolicy));
  const catchUp = h('input', { type: 'number', min: '0', step: '1', value: String(s.maxCatchUp || 0) });
  const overlap = h('select', {},
    opt('OVERLAP_POLICY_ALLOW', 'Allow', s.overlapPolicy || 'OVERLAP_POLICY_ALLOW'),
    opt('OVERLAP_POLICY_SKIP', 'Skip while the last run goes on', s.overlapPolicy),
    opt('OVERLAP_POLICY_CANCEL_PREVIOUS', 'Cancel the previous run', s.overlapPolicy));
  const payload = h('textarea', { rows: '5', spellcheck: 'false' }, tpl.payload?.data ? fromBase64(tpl.payload.data) : '{}');
  const labels = h('input', { value: labelsText(tpl.labels), autocomplete: 'off', placeholder: 'region=eu, gpu=yes' });
  const priority = h('input', { type: 'number', step: '1', value: String(tpl.priority || 0) });
  const maxAttempts = h('input', { type: 'number', min: '0', step: '1', value: String(tpl.retryPolicy?.maxAttempts || 0) });

  const cronField = field('cron', 'Cron expression', cron, '5 fields, or 6 with seconds first; in the time zone below.');
  const intervalField = field('interval', 'Interval (seconds)', interval);
  const catchField = field('catchUp', 'Most missed fires to catch up', catchUp, '0 means 10.');
  const sync = () => {
    cronField.hidden = kind.value !== 'CRON';
    intervalField.hidden = kind.value === 'CRON';
    catchField.hidden = misfire.value !== 'MISFIRE_POLICY_CATCH_UP';
  };
  kind.addEventListener('change', sync);
  misfire.addEventListener('change', sync);
  sync();

  // A live preview of the next fires as the definition is typed: the
  // server's PreviewSchedule, asked a moment after the typing stops, with
  // its warnings where a DST change skips or repeats a fire.
  const preview = h('div#preview', { 'aria-live': 'polite' });
  let previewTimer = null;
  let previewAbort = null;
  signal.addEventListener('abort', () => {
    clearTimeout(previewTimer);
    previewAbort?.abort();
  }, { once: true });
  const draft = () => {
    const zoneName = zone.value.trim() || 'UTC';
    try {
      new Intl.DateTimeFormat(undefined, { timeZone: zoneName });
    } catch {
      return 'Give a valid time zone to see the fires.';
    }
    const handlerName = handler.value.trim();
    const d = {
      kind: `SCHEDULE_KIND_${kind.value}`, timeZone: zoneName,
      misfirePolicy: misfire.value, overlapPolicy: overlap.value,
      template: { handler: /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/.test(handlerName) ? handlerName : 'preview' },
    };
    if (kind.value === 'CRON') {
      if (!cron.value.trim()) return 'Give a cron expression to see the fires.';
      d.cronExpression = cron.value.trim();
    } else {
      if (!(Number(interval.value) >= 1)) return 'Give an interval of at least 1 second to see the fires.';
      d.interval = `${Math.round(Number(interval.value))}s`;
    }
    return d;
  };
  const updatePreview = () => {
    clearTimeout(previewTimer);
    previewTimer = setTimeout(async () => {
      previewAbort?.abort();
      previewAbort = new AbortController();
      const d = draft();
      if (typeof d === 'string') {
        replace(preview, h('p.muted', d));
        return;
      }
      preview.setAttribute('aria-busy', 'true');
      try {
        const res = await previewFires(d, previewAbort.signal);
        if (kind.value === 'FIXED_DELAY') res.note = 'Later fires depend on when each run ends.';
        replace(preview, firesList(res, d));
      } catch (err) {
        if (err.name === 'AbortError') return;
        // Said next to the preview, without interrupting the typing.
        replace(preview, h('p.error', 'No preview: ', err.message));
      }
      preview.removeAttribute('aria-busy');
    }, 400);
  };
  for (const el of [kind, cron, interval, zone, handler]) el.addEventListener('input', updatePreview);
  for (const el of [kind, misfire, overlap]) el.addEventListener('change', updatePreview);
  updatePreview();

  const formNote = h('div');
  const submit = h('button.primary', { type: 'submit' }, existing ? 'Save schedule' : 'Create schedule');
  const form = h('form.schedule-form', { novalidate: true, 'aria-labelledby': 'form-title', onsubmit: onSubmit },
    field('name', 'Name', name),
    field('handler', 'Handler', handler),
    field('kind', 'Kind', kind),
    cronField, intervalField,
    field('zone', 'Time zone', zone, 'An IANA zone such as Europe/London.'),
    zonesList,
    field('misfire', 'Missed fires', misfire),
    catchField,
    field('overlap', 'When the previous run is still going', overlap),
    h('div.preview', h('h2', 'Next fires'), preview),
    field('payload', 'Payload (JSON)', payload),
    field('labels', 'Worker labels', labels, 'key=value pairs, separated by commas.'),
    field('priority', 'Priority', priority),
    field('maxAttempts', 'Attempts allowed', maxAttempts, '0 means the server default (3).'),
    formNote,
    h('div.actions', submit, h('a.button', { href: existing ? `#/schedules/${s.scheduleId}` : '#/schedules' }, 'Cancel')));

  root.append(
    h('p.crumbs', h('a', { href: '#/schedules' }, 'Schedules'), ' / ', existing ? 'edit' : 'new'),
    h('h1#form-title', existing ? `Edit schedule ${s.name ? `“${s.name}”` : ''}`.trim() : 'New schedule'),
    form);

  function invalid(name, input, message) {
    errs[name].textContent = message;
    input.setAttribute('aria-invalid', 'true');
    return false;
  }

  async function onSubmit(e) {
    e.preventDefault();
    for (const [k, el] of Object.entries(errs)) {
      el.textContent = '';
      form.querySelector(`#s-${k}`)?.removeAttribute('aria-invalid');
    }
    replace(formNote);
    let ok = true;
    if (!/^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/.test(handler.value.trim())) {
      ok = invalid('handler', handler, 'A handler name: letters, digits and _ . : - (starting with a letter or digit).');
    }
    if (kind.value === 'CRON' && !cron.value.trim()) ok = invalid('cron', cron, 'A cron expression is needed.');
    if (kind.value !== 'CRON' && !(Number(interval.value) >= 1)) ok = invalid('interval', interval, 'At least 1 second.');
    try {
      new Intl.DateTimeFormat(undefined, { timeZone: zone.value.trim() || 'UTC' });
    } catch {
      ok = invalid('zone', zone, 'Not a time zone this browser knows.');
    }
    let payloadText = payload.value.trim();
    if (payloadText) {
      try {
        payloadText = JSON.stringify(JSON.parse(payloadText));
      } catch (err) {
        ok = invalid('payload', payload, `Not valid JSON: ${err.message}`);
      }
    }
    const labelMap = {};
    for (const part of labels.value.split(',').map((p) => p.trim()).filter(Boolean)) {
      const [k, v] = part.split(/=(.*)/s);
      if (!k || v === undefined) {
        ok = invalid('labels', labels, `“${part}” is not key=value.`);
        break;
      }
      labelMap[k.trim()] = v.trim();
    }
    if (!ok) {
      form.querySelector('[aria-invalid="true"]')?.focus();
      return;
    }
    const template = {
      ...tpl,
      handler: handler.value.trim(),
      labels: labelMap,
      priority: Number(priority.value) || 0,
      payload: payloadText && payloadText !== '{}' ? { data: toBase64(payloadText), contentType: 'application/json' } : undefined,
      retryPolicy: { ...(tpl.retryPolicy || {}), maxAttempts: Number(maxAttempts.value) || 0 },
    };
    if (!template.payload) delete template.payload;
    const body = {
      name: name.value.trim(),
      kind: `SCHEDULE_KIND_${kind.value}`,
      timeZone: zone.value.trim(),
      misfirePolicy: misfire.value,
      overlapPolicy: overlap.value,
      template,
    };
    if (kind.value === 'CRON') body.cronExpression = cron.value.trim();
    else body.interval = `${Math.round(Number(interval.value))}s`;
    if (misfire.value === 'MISFIRE_POLICY_CATCH_UP') body.maxCatchUp = Number(catchUp.value) || 0;
    if (existing?.paused) body.paused = true;
    submit.disabled = true;
    try {
      const res = existing
        ? await api('PUT', `/api/schedules/${s.scheduleId}`, body)
        : await post('/api/schedules', body);
      announce(existing ? 'Schedule saved' : 'Schedule created');
      go(`#/schedules/${res.schedule.scheduleId}`);
    } catch (err) {
      replace(formNote, errorNote(err, existing ? 'Could not save the schedule' : 'Could not create the schedule'));
      submit.disabled = false;
    }
  }
}

