// The console's only door to the server: the public REST API under /api and
// its Server-Sent Event streams. Anything the console does, a script can do
// with the same calls. The token lives in sessionStorage only (it ends with
// the browser session) and travels as a bearer header, never in a URL.

const TOKEN_KEY = 'taskmesh.console.token';
const NAMESPACE_KEY = 'taskmesh.console.namespace';
/** What a namespace name may be (the contract's rule). */
export const NAMESPACE_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$/;

/** The namespace every call acts in; '' means the token's own ("default" without auth). */
export function namespace() {
  try {
    return sessionStorage.getItem(NAMESPACE_KEY) || '';
  } catch {
    return '';
  }
}
export function setNamespace(name) {
  if (name) sessionStorage.setItem(NAMESPACE_KEY, name);
  else sessionStorage.removeItem(NAMESPACE_KEY);
}

// The chosen namespace travels with every call: in a JSON body that is the
// request itself, else as a query parameter (GETs, DELETEs, and the
// schedule create/update calls whose body is the schedule alone).
function scoped(path, init) {
  const ns = namespace();
  if (!ns || !path.startsWith('/api/')) return { path, init };
  const scheduleBody = /^\/api\/schedules(\/[^/:?]+)?$/.test(path) && ['POST', 'PUT'].includes(init.method);
  if (init.body !== undefined && !scheduleBody) {
    const body = JSON.parse(init.body);
    if (body && typeof body === 'object' && !Array.isArray(body) && !('namespace' in body)) {
      return { path, init: { ...init, body: JSON.stringify({ ...body, namespace: ns }) } };
    }
    return { path, init };
  }
  const [base, q = ''] = path.split('?');
  const params = new URLSearchParams(q);
  if (!params.has('namespace')) params.set('namespace', ns);
  return { path: `${base}?${params}`, init };
}

/** An API call that failed, with the server's own words when it gave them. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status; // HTTP status; 0 when the server did not answer
    this.code = code; // gRPC code number from the JSON error body, if any
  }
}

const listeners = new Set();
/** auth: 'connecting' (no answer yet) | 'unknown' (a token is needed) | 'off' | 'token'. */
export const session = { auth: 'connecting' };

export function onAuthChange(fn) {
  listeners.add(fn);
}
function setAuth(mode) {
  if (session.auth !== mode) {
    session.auth = mode;
    listeners.forEach((fn) => fn(mode));
  }
}

export function token() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  } catch {
    return '';
  }
}
export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  setAuth('unknown');
}

// Set by the app: shows the token dialog and resolves with a token, or null
// when the person declines. One prompt is shared by every call that needs it.
let askToken = async () => null;
let pendingAsk = null;
export function setTokenPrompt(fn) {
  askToken = fn;
}
function promptOnce(refused) {
  if (!pendingAsk) {
    pendingAsk = askToken(refused).finally(() => {
      pendingAsk = null;
    });
  }
  return pendingAsk;
}

function headers(extra) {
  const h = { accept: 'application/json', ...extra };
  const t = token();
  if (t) h.authorization = `Bearer ${t}`;
  return h;
}

async function errorFrom(res) {
  let code = 0;
  let message = `HTTP ${res.status} ${res.statusText}`.trim();
  try {
    const body = await res.json();
    if (body && typeof body.message === 'string' && body.message) message = body.message;
    if (body && typeof body.code === 'number') code = body.code;
  } catch {
    /* not JSON: keep the status line */
  }
  return new ApiError(res.status, code, message);
}

// fetch with the token; on 401 ask for a token (once for all concurrent
// calls) and try again with it, until it works or the person declines.
async function send(rawPath, rawInit) {
  const { path, init } = scoped(rawPath, rawInit);
  for (;;) {
    const sent = token();
    let res;
    try {
      res = await fetch(path, { ...init, headers: headers(init.headers) });
    } catch (e) {
      if (e.name === 'AbortError') throw e;
      throw new ApiError(0, 0, 'the server did not answer (network error)');
    }
    if (res.status !== 401) {
      // An answer from the service proves the token (or none) was accepted; a
      // route the gateway lacks answers before authentication, so it proves nothing.
      if (res.ok || ![404, 405, 501].includes(res.status)) setAuth(sent ? 'token' : 'off');
      return res;
    }
    if (sent && token() !== sent) continue; // another call already got a new token
    if (sent) sessionStorage.removeItem(TOKEN_KEY);
    setAuth('unknown');
    const fresh = await promptOnce(Boolean(sent));
    if (!fresh) throw await errorFrom(res);
    sessionStorage.setItem(TOKEN_KEY, fresh);
  }
}

/** One JSON call. Returns the parsed body; throws ApiError. */
export async function api(method, path, body, { signal } = {}) {
  const init = { method, signal, headers: {} };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['content-type'] = 'application/json';
  }
  const res = await send(path, init);
  if (!res.ok) throw await errorFrom(res);
  const text = await res.text();
  return text ? JSON.parse(text) : {};
}

export const get = (path, opts) => api('GET', path, undefined, opts);
export const post = (path, body = {}, opts) => api('POST', path, body, opts);

/** A query string from an object, leaving out empty values. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

/**
 * Follows a Server-Sent Event stream with fetch (EventSource cannot send an
 * Authorization header). Calls onEvent(json) per message and onError(ApiError)
 * for an `event: error` or a failed start; resolves when the stream ends.
 * Abort with the signal.
 */
export async function stream(path, { signal, onEvent, onError }) {
  let res;
  try {
    res = await send(path, { method: 'GET', signal, headers: { accept: 'text/event-stream' } });
  } catch (e) {
    if (e.name !== 'AbortError') onError(e);
    return 'aborted';
  }
  if (!res.ok) {
    onError(await errorFrom(res));
    return 'error';
  }
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  let event = 'message';
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let nl;
      while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + (buf.startsWith('\r\n', nl) ? 2 : 1));
        if (line === '') {
          if (data.length) {
            const text = data.join('\n');
            let json;
            try {
              json = JSON.parse(text);
            } catch {
              json = { message: text };
            }
            if (event === 'error') {
              onError(new ApiError(res.status, json.code || 0, json.message || 'the stream failed'));
            } else {
              onEvent(json);
            }
          }
          event = 'message';
          data = [];
        } else if (line.startsWith(':')) {
          // keep-alive comment
        } else {
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let val = colon < 0 ? '' : line.slice(colon + 1);
          if (val.startsWith(' ')) val = val.slice(1);
          if (field === 'data') data.push(val);
          else if (field === 'event') event = val || 'message';
        }
      }
    }
  } catch (e) {
    if (e.name === 'AbortError' || signal?.aborted) return 'aborted';
    onError(new ApiError(0, 0, 'the live stream was interrupted'));
    return 'interrupted';
  }
  return 'ended';
}

/** Runs fn over items with at most `limit` calls in flight; calls onDone after each. */
export async function bounded(items, limit, fn, onDone) {
  const results = new Array(items.length);
  let next = 0;
  async function lane() {
    while (next < items.length) {
      const i = next++;
      try {
        results[i] = { ok: true, value: await fn(items[i]) };
      } catch (error) {
        results[i] = { ok: false, error };
      }
      onDone?.(results[i], i);
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
  return results;
}
