// The console's entry: hash routes to views, the header's auth state, and
// the token prompt. Each view gets an AbortSignal that fires when the person
// leaves it, so its streams and timers end with it.

import {
  onAuthChange, setTokenPrompt, forgetToken, session, namespace, setNamespace, NAMESPACE_PATTERN,
} from './api.js';
import { h, replace, tokenDialog } from './ui.js';
import { overview } from './view-overview.js';
import { taskList } from './view-tasks.js';
import { taskDetail } from './view-task.js';
import { scheduleList, scheduleDetail, scheduleForm } from './view-schedules.js';
import { workers, breakers } from './view-workers.js';

const ID = '([0-9a-fA-F-]{36})';
const routes = [
  [/^\/overview$/, 'overview', overview],
  [/^\/tasks$/, 'tasks', taskList],
  [new RegExp(`^/tasks/${ID}$`), 'tasks', taskDetail],
  [/^\/schedules$/, 'schedules', scheduleList],
  [/^\/schedules\/new$/, 'schedules', scheduleForm],
  [new RegExp(`^/schedules/${ID}/edit$`), 'schedules', scheduleForm],
  [new RegExp(`^/schedules/${ID}$`), 'schedules', scheduleDetail],
  [/^\/workers$/, 'workers', workers],
  [/^\/breakers$/, 'breakers', breakers],
];

const main = document.getElementById('main');
let current = null; // { controller }
let firstRender = true;

function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/overview';
  const at = raw.indexOf('?');
  const path = decodeURIComponent(at < 0 ? raw : raw.slice(0, at));
  return { path, params: new URLSearchParams(at < 0 ? '' : raw.slice(at + 1)) };
}

/** Navigates to a hash route (adds a history entry). */
export function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

async function route() {
  current?.controller.abort();
  const controller = new AbortController();
  current = { controller };
  const { path, params } = parseHash();
  let match = null;
  for (const [re, nav, view] of routes) {
    const m = re.exec(path);
    if (m) {
      match = { nav, view, args: m.slice(1) };
      break;
    }
  }
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (match && a.dataset.nav === match.nav) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  main.removeAttribute('data-ready');
  const focus = !firstRender;
  firstRender = false;
  if (!match) {
    replace(main, h('h1', { tabindex: '-1' }, 'Not found'),
      h('p', 'There is no page at ', h('code', location.hash), '. ', h('a', { href: '#/overview' }, 'Go to the overview'), '.'));
    if (focus) main.querySelector('h1').focus();
    return;
  }
  const root = h('div.view');
  replace(main, root);
  try {
    await match.view(root, { args: match.args, params, signal: controller.signal, go });
  } catch (e) {
    if (controller.signal.aborted) return;
    root.append(h('p.error', { role: 'alert' }, `This page failed to load: ${e.message}`));
  }
  if (controller.signal.aborted) return;
  main.dataset.ready = path; // for tests and tools: the view has drawn
  const h1 = root.querySelector('h1');
  if (h1) {
    h1.tabIndex = -1;
    document.title = `${h1.textContent} · taskmesh`;
    if (focus) h1.focus({ preventScroll: false });
  }
}

function renderAuth(mode) {
  const box = document.getElementById('auth');
  if (mode === 'off') {
    replace(box, h('span.badge.b-auth-off', { title: 'The server accepts calls without a token' }, 'authentication off'));
  } else if (mode === 'token') {
    replace(box, h('span.badge.b-auth-on', 'signed in with a token'), ' ',
      h('button.link', {
        type: 'button',
        onclick: () => {
          forgetToken();
          route();
        },
      }, 'Sign out'));
  } else {
    replace(box, h('span.muted', 'not signed in'), ' ',
      h('button.link', { type: 'button', onclick: () => route() }, 'Sign in'));
  }
}

// The namespace every view shows: kept for the browser session, sent with
// every call (api.js); changing it redraws the current view.
function setupNamespace() {
  const form = document.getElementById('ns-form');
  const input = document.getElementById('ns-input');
  input.value = namespace();
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const name = input.value.trim();
    form.querySelector('.error')?.remove();
    if (name && !NAMESPACE_PATTERN.test(name)) {
      input.setAttribute('aria-invalid', 'true');
      form.append(h('span.error', { role: 'alert' }, 'A namespace is 1-64 letters, digits or _ . : - and starts with a letter or digit.'));
      input.focus();
      return;
    }
    input.removeAttribute('aria-invalid');
    input.value = name;
    setNamespace(name);
    route();
  });
}

setupNamespace();
setTokenPrompt(tokenDialog);
onAuthChange(renderAuth);
document.querySelector('.skip').addEventListener('click', (e) => {
  e.preventDefault();
  (main.querySelector('h1') || main).focus();
});
window.addEventListener('hashchange', route);
if (!location.hash) history.replaceState(null, '', '#/overview');
route().then(() => {
  if (session.auth === 'connecting') renderAuth('unknown');
});
