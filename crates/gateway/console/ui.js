// Small DOM helpers shared by the views: an element builder, times, states,
// JSON payloads, errors in plain words and the modal dialogs.

/** h('tag.class#id', {attrs}, ...children): children may be strings, nodes, arrays, null. */
export function h(spec, attrs, ...children) {
  const [tag, ...rest] = spec.split(/(?=[.#])/);
  const el = document.createElement(tag || 'div');
  for (const part of rest) {
    if (part[0] === '.') el.classList.add(part.slice(1));
    else el.id = part.slice(1);
  }
  if (attrs && (typeof attrs !== 'object' || attrs instanceof Node || Array.isArray(attrs))) {
    children.unshift(attrs);
    attrs = null;
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className += ` ${v}`;
    else if (k in el && typeof v !== 'string') el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  append(el, children);
  return el;
}
function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const localFmt = new Intl.DateTimeFormat(undefined, {
  year: 'numeric', month: 'short', day: '2-digit',
  hour: '2-digit', minute: '2-digit', second: '2-digit',
});
const zoneFmts = new Map();
function zoneFmt(zone) {
  if (!zoneFmts.has(zone)) {
    zoneFmts.set(zone, new Intl.DateTimeFormat(undefined, {
      timeZone: zone, year: 'numeric', month: 'short', day: '2-digit',
      hour: '2-digit', minute: '2-digit', second: '2-digit', timeZoneName: 'short',
    }));
  }
  return zoneFmts.get(zone);
}

/** A <time> in the browser's zone (or `zone`), with UTC on hover. */
export function time(iso, zone) {
  if (!iso) return h('span.muted', '—');
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return h('span', iso);
  let text;
  try {
    text = zone ? zoneFmt(zone).format(d) : localFmt.format(d);
  } catch {
    text = localFmt.format(d);
  }
  return h('time', { datetime: d.toISOString(), title: `UTC ${d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z')}` }, text);
}

const clockFmt = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit' });

/** A <time> as the browser's clock time only (for chart axes), with UTC on hover. */
export function clock(iso) {
  const el = time(iso);
  if (el.tagName === 'TIME') el.textContent = clockFmt.format(new Date(iso));
  return el;
}

/** "1.5s" (proto Duration JSON) to milliseconds. */
export function durationMs(s) {
  const m = /^(-?\d+(?:\.\d+)?)s$/.exec(s || '');
  return m ? Number(m[1]) * 1000 : NaN;
}
export function humanMs(ms) {
  if (!Number.isFinite(ms)) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  const hr = Math.floor(m / 60);
  if (hr < 48) return `${hr} h ${m % 60} min`;
  return `${Math.floor(hr / 24)} d ${hr % 24} h`;
}

export const TASK_STATES = [
  'PENDING', 'READY', 'DISPATCHING', 'RUNNING', 'RETRYING',
  'SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED',
];
export const TERMINAL = new Set(['SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED']);

/** 'TASK_STATE_RUNNING' -> 'RUNNING'. */
export function short(enumValue, prefix) {
  if (!enumValue) return '';
  return String(enumValue).replace(prefix, '');
}
export const taskState = (t) => short(t?.state, 'TASK_STATE_') || 'UNSPECIFIED';

/** A state as a badge: word plus colour, never colour alone. */
export function badge(word, kind) {
  return h(`span.badge.b-${(kind || word).toLowerCase().replace(/[^a-z]+/g, '-')}`, word.replace(/_/g, ' '));
}

export function labelsText(labels) {
  return Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`).join(', ');
}
export function labelChips(labels) {
  const entries = Object.entries(labels || {});
  if (!entries.length) return h('span.muted', '—');
  return h('ul.chips', entries.map(([k, v]) => h('li.chip', `${k}=${v}`)));
}

/** An error in plain words, meant to sit next to what failed. */
export function errorNote(err, what) {
  const msg = err?.message || String(err);
  const status = err?.status ? ` (HTTP ${err.status})` : '';
  return h('p.error', { role: 'alert' }, what ? `${what}: ` : '', msg, status);
}

const CUT = 16 * 1024;

function b64bytes(b64) {
  const bin = atob(b64 || '');
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

/** A task Payload ({data: base64, contentType}) shown as formatted JSON when it is JSON, cut when large. */
export function payloadView(payload, name) {
  if (!payload || !payload.data) return h('p.muted', 'Empty.');
  let bytes;
  try {
    bytes = b64bytes(payload.data);
  } catch {
    return h('p.error', 'The payload is not valid base64.');
  }
  const type = payload.contentType || 'application/octet-stream';
  let text = null;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    /* binary */
  }
  let shown;
  if (text !== null) {
    try {
      shown = JSON.stringify(JSON.parse(text), null, 2);
    } catch {
      shown = text;
    }
  }
  const blob = new Blob([bytes], { type });
  const ext = /json/.test(type) ? 'json' : text !== null ? 'txt' : 'bin';
  const link = h('a', { href: URL.createObjectURL(blob), download: `${name}.${ext}` },
    `Download ${name} (${bytes.length.toLocaleString()} bytes)`);
  if (shown === undefined) {
    return h('div', h('p', `Binary data (${type}).`), link);
  }
  const cut = shown.length > CUT;
  return h('div',
    h('pre.json', { tabindex: '0', role: 'region', 'aria-label': `${name} as text` }, cut ? `${shown.slice(0, CUT)}\n…` : shown),
    h('p.small', cut ? `Showing the first ${CUT.toLocaleString()} characters of ${shown.length.toLocaleString()}. ` : '', type, ' · ', link));
}

/** A scrollable table wrapper that keyboard users can scroll too. */
export function tableWrap(label, table) {
  return h('div.table-wrap', { tabindex: '0', role: 'region', 'aria-label': label }, table);
}

// ---- dialogs -------------------------------------------------------------
// Native modal <dialog>: the rest of the page is inert while it is open, so
// focus stays inside; Escape closes it (the `cancel` event). Focus goes back
// to what opened it.

function modal(build) {
  return new Promise((resolve) => {
    const opener = document.activeElement;
    const openerId = opener?.id;
    const openerKey = opener?.dataset?.key;
    const dlg = h('dialog.modal');
    let result = null;
    const close = (value) => {
      result = value;
      dlg.close();
    };
    dlg.addEventListener('close', () => {
      dlg.remove();
      // Back to what opened it, or to its stand-in if a live update redrew it.
      const back = opener?.isConnected ? opener
        : (openerId && document.getElementById(openerId))
          || (openerKey && document.querySelector(`[data-key="${CSS.escape(openerKey)}"]`));
      back?.focus();
      resolve(result);
    });
    build(dlg, close);
    // The page behind is inert; this keeps Tab cycling inside the dialog
    // rather than leaving for the browser's own controls.
    dlg.addEventListener('keydown', (e) => {
      if (e.key !== 'Tab') return;
      const items = [...dlg.querySelectorAll('button, input, select, textarea, a[href]')].filter((el) => !el.disabled);
      if (!items.length) return;
      const first = items[0];
      const last = items[items.length - 1];
      if (e.shiftKey && document.activeElement === first) {
        e.preventDefault();
        last.focus();
      } else if (!e.shiftKey && document.activeElement === last) {
        e.preventDefault();
        first.focus();
      }
    });
    document.body.append(dlg);
    dlg.showModal();
    const first = dlg.querySelector('[autofocus]') || dlg.querySelector('input, button');
    first?.focus();
  });
}

/** Asks before something destructive. Resolves true only on the explicit confirm button. */
export function confirmDialog({ title, message, confirmLabel, danger = true }) {
  return modal((dlg, close) => {
    const id = `dlg-${Math.random().toString(36).slice(2)}`;
    dlg.setAttribute('aria-labelledby', `${id}-t`);
    dlg.setAttribute('aria-describedby', `${id}-m`);
    dlg.append(
      h('h2', { id: `${id}-t` }, title),
      h('p', { id: `${id}-m` }, message),
      h('div.actions',
        h('button', { type: 'button', autofocus: true, onclick: () => close(false) }, 'Keep'),
        h(`button${danger ? '.danger' : '.primary'}`, { type: 'button', onclick: () => close(true) }, confirmLabel)),
    );
  }).then((v) => v === true);
}

/** The sign-in dialog: resolves with the token typed, or null. */
export function tokenDialog(refused) {
  return modal((dlg, close) => {
    dlg.setAttribute('aria-labelledby', 'token-title');
    const input = h('input#token-input', {
      type: 'password', name: 'token', autocomplete: 'off', required: true,
      spellcheck: 'false', autofocus: true, 'aria-describedby': 'token-help',
    });
    const form = h('form', {
      method: 'dialog',
      onsubmit: (e) => {
        e.preventDefault();
        const v = input.value.trim();
        if (v) close(v);
        else input.focus();
      },
    },
    h('h2#token-title', 'Sign in to taskmesh'),
    refused ? h('p.error', { role: 'alert' }, 'The server refused that token. Check it and try again.') : null,
    h('p#token-help', 'This server requires an API token. It is kept for this browser tab only (session storage) and sent as a bearer header.'),
    h('label', { for: 'token-input' }, 'API token'),
    input,
    h('div.actions',
      h('button', { type: 'button', onclick: () => close(null) }, 'Cancel'),
      h('button.primary', { type: 'submit' }, 'Sign in')));
    dlg.append(form);
  });
}

/** Politely tells screen readers about a change that happened without a page load. */
export function announce(text) {
  const live = document.getElementById('live');
  if (live) {
    live.textContent = '';
    setTimeout(() => {
      live.textContent = text;
    }, 50);
  }
}
