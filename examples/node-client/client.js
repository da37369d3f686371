#!/usr/bin/env node
// A taskmesh client in Node.js, built from nothing but proto/: it loads the
// .proto files at run time with @grpc/proto-loader (no generated code) and
// talks to TaskApi with @grpc/grpc-js.
//
//   node client.js run --server 127.0.0.1:50051 --handler echo --count 100 --check-echo [--ids-file ids.txt]
//   node client.js submit --handler py.sleep --payload '{"ms":2000}' --count 2 --until RUNNING --ids-file ids.txt
//   node client.js watch --ids-file ids.txt --expect SUCCEEDED
//   node client.js workers --handler echo --wait 30
//
// Every command exits 0 only when what it checks holds, so scripts can rely
// on it; each waits on a condition with a deadline (--timeout, --wait).
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = process.env.TASKMESH_PROTO_DIR || path.resolve(__dirname, '..', '..', 'proto');
const TERMINAL = new Set(['SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED']);

/** The TaskApi client for `server` (host:port; http:// is accepted). */
function connect(server) {
  const definition = protoLoader.loadSync('taskmesh/v1/task_api.proto', {
    includeDirs: [PROTO_DIR],
    keepCase: false,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const { TaskApi } = grpc.loadPackageDefinition(definition).taskmesh.v1;
  // An API token (`taskmesh token create`), from the environment only:
  // never a flag, which `ps` would show.
  const token = process.env.TASKMESH_TOKEN;
  const options = token ? { interceptors: [bearer(token)] } : {};
  // TLS for an https:// server, or when $TASKMESH_TLS_CA names the CA to
  // trust (without one, the system's roots).
  const ca = process.env.TASKMESH_TLS_CA;
  const credentials =
    server.startsWith('https://') || ca
      ? grpc.credentials.createSsl(ca ? fs.readFileSync(ca) : null)
      : grpc.credentials.createInsecure();
  return new TaskApi(server.replace(/^https?:\/\//, ''), credentials, options);
}

/** An interceptor presenting `token` on every call (`authorization: Bearer …`). */
function bearer(token) {
  return (options, nextCall) =>
    new grpc.InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set('authorization', `Bearer ${token}`);
        next(metadata, listener);
      },
    });
}

/** `TASK_STATE_SUCCEEDED` -> `SUCCEEDED`. */
const stateName = (task) => String(task.state).replace(/^TASK_STATE_/, '');

/** Calls a unary method with a deadline and returns a promise of its answer. */
function unary(client, method, request, timeoutMs) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + timeoutMs }, (err, response) =>
      err ? reject(err) : resolve(response),
    );
  });
}

/**
 * Follows one task with WatchTask until `until(state)` holds or the stream
 * ends (it ends after a terminal state). Resolves to the last task seen.
 */
function watch(client, taskId, deadline, until = (s) => TERMINAL.has(s)) {
  return new Promise((resolve, reject) => {
    let last = null;
    let settled = false;
    const call = client.watchTask({ taskId }, { deadline });
    const finish = (fn, value) => {
      if (!settled) {
        settled = true;
        fn(value);
      }
    };
    call.on('data', ({ task }) => {
      last = task;
      if (until(stateName(task))) {
        finish(resolve, task);
        call.cancel();
      }
    });
    call.on('error', (err) => {
      if (err.code !== grpc.status.CANCELLED || !settled) finish(reject, err);
    });
    call.on('end', () => finish(resolve, last));
  });
}

/** Runs `fn` over `items` with at most `limit` in flight; keeps order. */
async function pool(items, limit, fn) {
  const results = new Array(items.length);
  let next = 0;
  const lanes = Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i], i);
    }
  });
  await Promise.all(lanes);
  return results;
}

/** Submits `count` tasks; the payload gets `n` (its index) and the run id. */
async function submitMany(client, opts) {
  const base = opts.payload ? JSON.parse(opts.payload) : {};
  const run = `${Date.now().toString(36)}-${process.pid}`;
  const indexes = Array.from({ length: Number(opts.count) }, (_, i) => i);
  return pool(indexes, 16, async (n) => {
    const payload = Buffer.from(JSON.stringify({ ...base, n, run }));
    const response = await unary(
      client,
      'submitTask',
      {
        handler: opts.handler,
        payload: { data: payload, contentType: 'application/json' },
        // The idempotency key makes a retried submit return the same task.
        clientRequestId: `node-${run}-${n}`,
      },
      10_000,
    );
    return { taskId: response.taskId, payload };
  });
}

/**
 * Watches every task to its end, then reads it back with GetTask: the state
 * must be `expect` both ways, and with `checkEcho` the output must equal the
 * payload. Returns the number of tasks that failed the check.
 */
async function verify(client, submitted, opts) {
  const deadline = Date.now() + Number(opts.timeout) * 1000;
  const problems = [];
  await pool(submitted, 32, async ({ taskId, payload }) => {
    let watched;
    try {
      watched = await watch(client, taskId, deadline);
    } catch (err) {
      problems.push(`${taskId}: watch failed: ${err.code} ${err.details || err.message}`);
      return;
    }
    const { task } = await unary(client, 'getTask', { taskId }, 10_000);
    const seen = watched ? stateName(watched) : 'nothing';
    if (seen !== opts.expect || stateName(task) !== opts.expect) {
      problems.push(`${taskId}: watched ${seen}, got ${stateName(task)}, want ${opts.expect}` +
        (task.errorMessage ? ` (${task.errorMessage})` : ''));
    } else if (opts['check-echo'] && payload && !Buffer.from(task.output.data).equals(payload)) {
      problems.push(`${taskId}: output ${task.output.data} is not the payload ${payload}`);
    }
  });
  for (const p of problems.slice(0, 20)) console.error(`node client: ${p}`);
  return problems.length;
}

/** Writes the submitted task ids, one a line, to --ids-file if given. */
function writeIds(opts, submitted) {
  if (opts['ids-file']) {
    fs.writeFileSync(opts['ids-file'], submitted.map((s) => s.taskId).join('\n') + '\n');
  }
}

async function cmdRun(client, opts) {
  const started = Date.now();
  const submitted = await submitMany(client, opts);
  writeIds(opts, submitted);
  console.log(`node client: submitted ${submitted.length} ${opts.handler} tasks`);
  const bad = await verify(client, submitted, opts);
  const good = submitted.length - bad;
  console.log(`node client: ${good}/${submitted.length} tasks ${opts.expect} ` +
    `(watched to the end and confirmed by GetTask) in ${Date.now() - started} ms`);
  return bad === 0 ? 0 : 1;
}

async function cmdSubmit(client, opts) {
  const submitted = await submitMany(client, opts);
  writeIds(opts, submitted);
  if (opts.until) {
    // Wait until each task has reached `until` (or ended): e.g. RUNNING, so
    // the caller knows the work is in a worker's hands.
    const deadline = Date.now() + Number(opts.timeout) * 1000;
    const reached = await Promise.all(submitted.map(({ taskId }) =>
      watch(client, taskId, deadline, (s) => s === opts.until || TERMINAL.has(s))));
    const states = reached.map((t) => (t ? stateName(t) : 'nothing'));
    const off = states.filter((s) => s !== opts.until);
    console.log(`node client: ${submitted.length} ${opts.handler} tasks submitted, ` +
      `${states.length - off.length} ${opts.until}`);
    return off.length === 0 ? 0 : 1;
  }
  console.log(`node client: ${submitted.length} ${opts.handler} tasks submitted`);
  return 0;
}

async function cmdWatch(client, opts) {
  const ids = fs.readFileSync(opts['ids-file'], 'utf8').split('\n').filter(Boolean);
  const bad = await verify(client, ids.map((taskId) => ({ taskId })), opts);
  console.log(`node client: ${ids.length - bad}/${ids.length} tasks ${opts.expect}`);
  return bad === 0 ? 0 : 1;
}

async function cmdWorkers(client, opts) {
  const deadline = Date.now() + Number(opts.wait) * 1000;
  for (;;) {
    try {
      const { workers } = await unary(client, 'listWorkers', { handler: opts.handler || '' }, 5_000);
      const match = workers.filter((w) => !opts['worker-id'] || w.workerId === opts['worker-id']);
      if (match.length > 0) {
        for (const w of match) {
          console.log(`node client: worker ${w.workerId} serves ${w.handlers.join(',')} ` +
            `with ${w.capacity} slots (session ${w.sessionId})`);
        }
        return 0;
      }
    } catch (err) {
      if (Date.now() >= deadline) throw err;
    }
    if (Date.now() >= deadline) {
      console.error(`node client: no worker for ${opts.handler || 'any handler'} after ${opts.wait} s`);
      return 1;
    }
    await new Promise((r) => setTimeout(r, 100)); // polling interval of a condition with a deadline
  }
}

const COMMANDS = { run: cmdRun, submit: cmdSubmit, watch: cmdWatch, workers: cmdWorkers };

async function main(argv) {
  const { values: opts, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      server: { type: 'string', default: process.env.TASKMESH_SERVER || '127.0.0.1:50051' },
      handler: { type: 'string', default: 'echo' },
      count: { type: 'string', default: '1' },
      payload: { type: 'string' },
      expect: { type: 'string', default: 'SUCCEEDED' },
      'check-echo': { type: 'boolean', default: false },
      until: { type: 'string' },
      'ids-file': { type: 'string' },
      timeout: { type: 'string', default: '120' },
      wait: { type: 'string', default: '30' },
      'worker-id': { type: 'string' },
    },
  });
  const command = COMMANDS[positionals[0]];
  if (!command) {
    console.error(`usage: client.js {${Object.keys(COMMANDS).join('|')}} [options] (see the header of client.js)`);
    return 2;
  }
  if (!(Number(opts.count) >= 1)) throw new Error(`--count must be a positive number, got ${opts.count}`);
  const client = connect(opts.server);
  try {
    return await command(client, opts);
  } finally {
    client.close();
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`node client: ${err.details || err.message}`);
    process.exit(1);
  },
);
