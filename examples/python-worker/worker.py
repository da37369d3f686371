#!/usr/bin/env python3
"""A taskmesh worker in Python, built from nothing but proto/.

It holds one `Dispatcher.Connect` stream to a taskmesh server: registers its
handlers, sends a heartbeat every `heartbeat_interval` the server asks for,
ACKs each assignment before running it, runs handlers on a bounded thread pool
(answering BUSY when every slot is taken), reports each result, and on
SIGTERM drains: it takes nothing new, finishes what runs, then closes. The
Rust SDK (crates/worker/src/session.rs) is the reference for every step.

    .venv/bin/python worker.py --server 127.0.0.1:50051 --concurrency 8

Push mode (serving the `Worker` service so the dispatcher calls in) is not
here yet: the server side of push mode does not exist. See README.md.
"""

# SIGTERM and SIGINT are blocked before any thread exists (gRPC's core starts
# its own on import), so every thread inherits the mask and only the main
# thread takes them, with sigwait(). That way no Python handler runs at an
# arbitrary point inside a lock, and SIGTERM's default action never kills the
# process behind the drain's back. SIGUSR1 is the session thread telling the
# main thread that it ended by itself.
import signal

SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}
if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import queue  # noqa: E402
import random  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Callable, Dict, Optional  # noqa: E402

import grpc  # noqa: E402

GEN = os.environ.get(
    "TASKMESH_PY_GEN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen")
)
sys.path.insert(0, GEN)
try:
    from taskmesh.v1 import dispatcher_pb2 as pb  # noqa: E402
    from taskmesh.v1 import dispatcher_pb2_grpc  # noqa: E402
    from taskmesh.v1 import task_pb2  # noqa: E402
except ImportError as err:  # pragma: no cover - set-up error
    sys.exit(f"py-worker: stubs not found in {GEN} ({err}); run setup.sh first")

CONNECT_TIMEOUT = 5.0
REGISTER_TIMEOUT = 10.0
DEFAULT_HEARTBEAT = 5.0
# How long a closing worker waits for the server to end its half of the stream.
CLOSE_GRACE = 2.0
RECONNECT_INITIAL = 0.1
RECONNECT_MAX = 5.0

log = logging.getLogger("py-worker")


def event(level: int, message: str, **fields) -> None:
    """Logs a lowercase message with structured key=value fields."""
    if log.isEnabledFor(level):
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        log.log(level, "%s %s", message, text)


class HandlerError(Exception):
    """A handler's failure; `retryable=False` ends the task FAILED at once."""

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.message = message
        self.retryable = retryable


@dataclass
class Task:
    """What a handler gets: the assignment plus a cancellation flag."""

    task_id: str
    attempt: int
    execution_id: str
    handler: str
    payload: bytes
    content_type: str
    labels: Dict[str, str]
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class Output:
    """What a successful handler returns."""

    data: bytes
    content_type: str = ""


Handler = Callable[[Task], Output]


def echo(task: Task) -> Output:
    """Returns the payload unchanged."""
    return Output(task.payload, task.content_type)


def sleep(task: Task) -> Output:
    """Sleeps `{"ms": N}` milliseconds, stopping early when cancelled."""
    ms = int(json.loads(task.payload or b"{}").get("ms", 0))
    if task.cancelled.wait(ms / 1000.0):
        raise HandlerError("cancelled while sleeping", retryable=True)
    return Output(json.dumps({"slept_ms": ms}).encode(), "application/json")


def fail(task: Task) -> Output:
    """Fails with `{"message": ..., "retryable": bool}`."""
    spec = json.loads(task.payload or b"{}")
    raise HandlerError(spec.get("message", "failed on purpose"), bool(spec.get("retryable", False)))


BUILTIN: Dict[str, Handler] = {"echo": echo, "py.echo": echo, "py.sleep": sleep, "py.fail": fail}


class Stats:
    """Counters reported at exit; the end-to-end test cross-checks them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Dict[str, int] = collections.Counter()
        self.succeeded_tasks = set()

    def add(self, name: str, task_id: Optional[str] = None) -> None:
        with self._lock:
            self.counts[name] += 1
            if name == "succeeded" and task_id:
                self.succeeded_tasks.add(task_id)

    def snapshot(self) -> dict:
        with self._lock:
            out = {k: self.counts.get(k, 0) for k in (
                "assigned", "succeeded", "failed", "rejected", "results_accepted",
                "results_refused", "sessions")}
            out["distinct_succeeded_tasks"] = len(self.succeeded_tasks)
            return out


class CpuIdle:
    """CPU idle percentage between two samples of /proc/stat (100 elsewhere)."""

    def __init__(self) -> None:
        self._last = self._read()

    @staticmethod
    def _read():
        try:
            with open("/proc/stat") as f:
                values = [int(v) for v in f.readline().split()[1:]]
            return values[3] + (values[4] if len(values) > 4 else 0), sum(values)
        except (OSError, ValueError, IndexError):
            return None

    def sample(self) -> float:
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return 100.0
        return max(0.0, min(100.0, 100.0 * (now[0] - last[0]) / (now[1] - last[1])))


class Session:
    """One `Dispatcher.Connect` stream and everything that lives as long as it."""

    def __init__(self, worker: "Worker") -> None:
        self.worker = worker
        self.out: "queue.Queue[Optional[pb.ConnectRequest]]" = queue.Queue()
        self.lock = threading.Lock()
        self.inflight: Dict[str, Task] = {}  # by execution id
        self.acks: Dict[str, int] = collections.Counter()  # acks sent per execution id
        self.receipts: Dict[str, int] = collections.Counter()  # receipts seen
        self.reported = set()  # execution ids whose complete was sent
        self.draining = False
        self.closed = False  # our half of the stream is closed
        self.ended = threading.Event()  # the stream is over
        self.call = None

    def requests(self):
        """The outbound half: what was queued, in order, until closed."""
        while True:
            message = self.out.get()
            if message is None:
                return
            yield message

    def send(self, **message) -> bool:
        with self.lock:
            return self._send_locked(**message)

    def _send_locked(self, **message) -> bool:
        if self.closed:
            return False
        self.out.put(pb.ConnectRequest(**message))
        return True

    def _close_locked(self) -> None:
        if not self.closed:
            self.closed = True
            self.out.put(None)
            # The server ends its half once ours is closed; if it does not in
            # time, cut the call so the session cannot hang.
            timer = threading.Timer(CLOSE_GRACE, self._cancel_call)
            timer.daemon = True
            timer.start()

    def _cancel_call(self) -> None:
        if self.call is not None and not self.ended.is_set():
            self.call.cancel()

    def start_drain(self, reason: str) -> None:
        """Takes nothing new, finishes what runs, then closes the stream."""
        with self.lock:
            if self.draining:
                return
            self.draining = True
            event(logging.INFO, "draining", worker_id=self.worker.worker_id, reason=reason,
                  running=len(self.inflight))
            self._send_locked(draining=pb.WorkerDraining(reason=reason))
            if not self.inflight:
                self._close_locked()

    def end(self) -> None:
        """The stream is over: stop its handlers' work and its heartbeats."""
        with self.lock:
            self.ended.set()
            self._close_locked()
            for task in self.inflight.values():
                task.cancelled.set()

    def heartbeats(self, interval: float) -> None:
        cpu = CpuIdle()
        while not self.ended.wait(interval):
            with self.lock:
                active = len(self.inflight)
            self.send(heartbeat=pb.WorkerHeartbeat(
                active=active, cpu_idle_percent=cpu.sample(),
                avg_cost_ms=self.worker.average_cost_ms()))

    def on_message(self, message: pb.ConnectResponse) -> None:
        kind = message.WhichOneof("message")
        if kind == "assign":
            self.on_assign(message.assign)
        elif kind == "cancel":
            self.on_cancel(message.cancel)
        elif kind == "drain":
            event(logging.INFO, "server asked to drain", worker_id=self.worker.worker_id,
                  reason=message.drain.reason)
            self.start_drain(message.drain.reason or "server drain")
        elif kind == "recorded":
            self.on_recorded(message.recorded)
        elif kind == "registered":
            event(logging.WARNING, "ignoring a second registered", worker_id=self.worker.worker_id)

    def on_assign(self, a: pb.TaskAssignment) -> None:
        w = self.worker
        fields = dict(worker_id=w.worker_id, task_id=a.task_id, attempt=a.attempt,
                      execution_id=a.execution_id)
        w.stats.add("assigned")
        with self.lock:
            if self.draining:
                return self._reject_locked(a, pb.REJECT_REASON_BUSY, "worker is draining")
            if a.execution_id in self.inflight:
                event(logging.DEBUG, "duplicate assignment; acking again", **fields)
                return self._ack_locked(a)
            handler = w.handlers.get(a.handler)
            if handler is None:
                event(logging.INFO, "unknown handler", handler=a.handler, **fields)
                return self._reject_locked(a, pb.REJECT_REASON_UNKNOWN_HANDLER,
                                           f"handler {a.handler!r} is not served by this worker")
            if not w.slots.acquire(blocking=False):
                return self._reject_locked(a, pb.REJECT_REASON_BUSY,
                                           f"all {w.capacity} slots are taken")
            task = Task(a.task_id, a.attempt, a.execution_id, a.handler, a.payload.data,
                        a.payload.content_type, dict(a.labels))
            self.inflight[a.execution_id] = task
            # The ACK is queued before the handler can finish, so the server
            # always reads it before the result.
            self._ack_locked(a)
        event(logging.DEBUG, "task accepted", handler=a.handler, **fields)
        w.pool.submit(self.run, handler, task)

    def _ack_locked(self, a: pb.TaskAssignment) -> None:
        if self._send_locked(ack=pb.TaskAck(task_id=a.task_id, execution_id=a.execution_id)):
            self.acks[a.execution_id] += 1

    def _reject_locked(self, a: pb.TaskAssignment, reason: int, message: str) -> None:
        self.worker.stats.add("rejected")
        self._send_locked(reject=pb.TaskReject(
            task_id=a.task_id, execution_id=a.execution_id, reason=reason, message=message))

    def on_cancel(self, c: pb.TaskCancel) -> None:
        with self.lock:
            task = self.inflight.get(c.execution_id)
        if task is not None:
            event(logging.INFO, "cancelling task", worker_id=self.worker.worker_id,
                  task_id=c.task_id, attempt=task.attempt, execution_id=c.execution_id,
                  reason=c.reason)
            task.cancelled.set()

    def on_recorded(self, r: pb.ResultRecorded) -> None:
        """Receipts come in the order of our reports: one per ACK, then one
        for the result, so the receipt after the last ACK's is the result's."""
        with self.lock:
            self.receipts[r.execution_id] += 1
            is_result = (r.execution_id in self.reported
                         and self.receipts[r.execution_id] == self.acks[r.execution_id] + 1)
            task = self.inflight.get(r.execution_id)
        if is_result:
            self.worker.stats.add("results_accepted" if r.accepted else "results_refused")
            with self.lock:
                self.reported.discard(r.execution_id)
                self.acks.pop(r.execution_id, None)
                self.receipts.pop(r.execution_id, None)
        if not r.accepted:
            event(logging.INFO, "report refused", worker_id=self.worker.worker_id,
                  task_id=r.task_id, execution_id=r.execution_id, reason=repr(r.message))
            if task is not None:
                # The attempt was taken back or cancelled: stop working on it.
                task.cancelled.set()

    def run(self, handler: Handler, task: Task) -> None:
        """Runs one handler on a pool thread and reports its result."""
        started = time.monotonic()
        try:
            out = handler(task)
            result = dict(success=pb.TaskSuccess(output=task_pb2.Payload(
                data=out.data, content_type=out.content_type)))
        except HandlerError as err:
            result = dict(failure=pb.TaskFailure(message=err.message, retryable=err.retryable))
        except Exception as err:  # a handler bug must not kill the worker
            log.exception("handler raised")
            result = dict(failure=pb.TaskFailure(
                message=f"handler raised {type(err).__name__}: {err}", retryable=True))
        self.worker.record_cost((time.monotonic() - started) * 1000.0)
        with self.lock:
            self.inflight.pop(task.execution_id, None)
            sent = self._send_locked(complete=pb.TaskComplete(
                task_id=task.task_id, execution_id=task.execution_id, **result))
            if sent:
                self.reported.add(task.execution_id)
            if self.draining and not self.inflight:
                self._close_locked()
        self.worker.slots.release()
        if sent:
            self.worker.stats.add("succeeded" if "success" in result else "failed", task.task_id)
        event(logging.DEBUG, "task done", worker_id=self.worker.worker_id, task_id=task.task_id,
              attempt=task.attempt, execution_id=task.execution_id,
              outcome="success" if "success" in result else "failure", reported=sent)


class Worker:
    """Connects, fails over across servers with jittered backoff, serves
    sessions until stopped."""

    def __init__(self, servers, handlers: Dict[str, Handler], capacity: int, worker_id: str,
                 name: str, labels: Dict[str, str]) -> None:
        self.servers = servers
        self.handlers = handlers
        self.capacity = capacity
        self.worker_id = worker_id
        self.name = name
        self.labels = labels
        self.pool = ThreadPoolExecutor(max_workers=capacity, thread_name_prefix="handler")
        self.slots = threading.BoundedSemaphore(capacity)
        self.stats = Stats()
        self.stopping = threading.Event()
        self.fatal: Optional[str] = None
        self._lock = threading.Lock()
        self._session: Optional[Session] = None
        self._costs = collections.deque(maxlen=100)

    def record_cost(self, ms: float) -> None:
        with self._lock:
            self._costs.append(ms)

    def average_cost_ms(self) -> float:
        with self._lock:
            return sum(self._costs) / len(self._costs) if self._costs else 0.0

    def stop(self, reason: str) -> None:
        """Drains the current session (if any) and makes `run` return."""
        with self._lock:
            self.stopping.set()
            session = self._session
        if session is not None:
            session.start_drain(reason)

    def abort(self) -> None:
        """The drain took too long: cancel running handlers and the stream."""
        with self._lock:
            session = self._session
        if session is not None:
            session.end()
            session._cancel_call()

    def run(self) -> None:
        backoff = RECONNECT_INITIAL
        index = 0
        while not self.stopping.is_set():
            server = self.servers[index % len(self.servers)]
            try:
                self.serve(server)
                backoff = RECONNECT_INITIAL
                continue
            except grpc.FutureTimeoutError:
                event(logging.WARNING, "server not reachable", worker_id=self.worker_id,
                      server=server)
            except grpc.RpcError as err:
                code = err.code() if hasattr(err, "code") else None
                event(logging.WARNING, "stream failed", worker_id=self.worker_id, server=server,
                      code=code, detail=repr(err.details() if hasattr(err, "details") else err))
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    # The server refused our registration: retrying cannot help.
                    self.fatal = f"registration refused: {err.details()}"
                    return
            except ProtocolError as err:
                event(logging.WARNING, "protocol error", worker_id=self.worker_id, server=server,
                      error=repr(str(err)))
            index += 1  # fail over to the next server
            if self.stopping.wait(backoff * random.uniform(0.5, 1.0)):
                break
            backoff = min(backoff * 2, RECONNECT_MAX)

    def serve(self, server: str) -> None:
        """One session against `server`, from connect to the end of the stream."""
        options = [("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 20_000)]
        with grpc.insecure_channel(server, options=options) as channel:
            grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT)
            session = Session(self)
            session.send(register=pb.WorkerRegistration(
                worker_id=self.worker_id, name=self.name, handlers=sorted(self.handlers),
                capacity=self.capacity, labels=self.labels, weight=1))
            call = dispatcher_pb2_grpc.DispatcherStub(channel).Connect(session.requests())
            session.call = call
            try:
                self._open(session, call, server)
                for message in call:
                    session.on_message(message)
            except grpc.RpcError as err:
                # Our own cancel after a drain, or a cut after the close grace,
                # is a clean end, not a failure.
                if not (session.closed and err.code() == grpc.StatusCode.CANCELLED):
                    raise
            finally:
                session.end()
                with self._lock:
                    if self._session is session:
                        self._session = None
            event(logging.INFO, "stream ended", worker_id=self.worker_id, server=server)

    def _open(self, session: Session, call, server: str) -> None:
        timer = threading.Timer(REGISTER_TIMEOUT, call.cancel)
        timer.daemon = True
        timer.start()
        try:
            first = next(call)
        except StopIteration:
            raise ProtocolError("stream ended before registered") from None
        finally:
            timer.cancel()
        if first.WhichOneof("message") != "registered":
            raise ProtocolError(f"expected registered, got {first.WhichOneof('message')}")
        registered = first.registered
        interval = registered.heartbeat_interval.ToTimedelta().total_seconds() or DEFAULT_HEARTBEAT
        self.stats.add("sessions")
        event(logging.INFO, "registered", worker_id=self.worker_id, server=server,
              session_id=registered.session_id, heartbeat_ms=int(interval * 1000))
        threading.Thread(target=session.heartbeats, args=(interval,), name="heartbeat",
                         daemon=True).start()
        with self._lock:
            self._session = session
            stopping = self.stopping.is_set()
        if stopping:  # stop() came while we were connecting
            session.start_drain("stopping")


class ProtocolError(Exception):
    """The server said something out of order."""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=os.environ.get("TASKMESH_SERVER", "127.0.0.1:50051"),
                   help="comma-separated host:port list (http:// is accepted); fails over in order")
    p.add_argument("--handlers", default=",".join(sorted(BUILTIN)),
                   help=f"handlers to serve, from {sorted(BUILTIN)}")
    p.add_argument("--concurrency", type=int, default=8, help="slots: tasks run at once")
    p.add_argument("--worker-id", default=f"py-{socket.gethostname()}-{os.getpid()}")
    p.add_argument("--name", default=socket.gethostname())
    p.add_argument("--label", action="append", default=[], help="key=value, repeatable")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds a drain may take before running handlers are cancelled")
    p.add_argument("--stats-file", help="write the counters as JSON here on exit")
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    args = p.parse_args(argv)
    unknown = [h for h in args.handlers.split(",") if h and h not in BUILTIN]
    if unknown:
        p.error(f"unknown handlers {unknown}; this example serves {sorted(BUILTIN)}")
    if args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    for label in args.label:
        if "=" not in label:
            p.error(f"--label {label!r} is not key=value")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    servers = [s.strip().removeprefix("http://") for s in args.server.split(",") if s.strip()]
    handlers = {h: BUILTIN[h] for h in args.handlers.split(",") if h}
    labels = dict(label.split("=", 1) for label in args.label)
    worker = Worker(servers, handlers, args.concurrency, args.worker_id, args.name, labels)

    main_thread = threading.get_ident()

    def session_loop():
        try:
            worker.run()
        finally:
            signal.pthread_kill(main_thread, signal.SIGUSR1)

    thread = threading.Thread(target=session_loop, name="session", daemon=True)
    thread.start()
    code = 0
    received = signal.sigwait(SIGNALS)
    if received != signal.SIGUSR1:
        event(logging.INFO, "signal received; draining", worker_id=worker.worker_id,
              signal=signal.Signals(received).name)
        worker.stop(signal.Signals(received).name)
        thread.join(args.drain_timeout)
        if thread.is_alive():
            event(logging.WARNING, "drain timed out; cancelling running handlers",
                  worker_id=worker.worker_id)
            worker.abort()
            thread.join(CLOSE_GRACE * 2)
            code = 1
    # After an aborted drain a handler that ignores its cancel flag may still
    # run: do not wait for it (os._exit below skips the pool's exit hook).
    worker.pool.shutdown(wait=code == 0, cancel_futures=True)
    if worker.fatal:
        event(logging.ERROR, "worker stopped", worker_id=worker.worker_id, error=repr(worker.fatal))
        code = 2
    stats = worker.stats.snapshot()
    if args.stats_file:
        with open(args.stats_file, "w") as f:
            json.dump(stats, f, indent=2, sort_keys=True)
    print("py-worker: stopped " + " ".join(f"{k}={v}" for k, v in sorted(stats.items())),
          flush=True)
    if code == 1:
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
