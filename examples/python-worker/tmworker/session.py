"""One `Dispatcher.Connect` stream, with the Rust SDK
(crates/worker/src/session.rs) as the reference for every step: the first
message registers; heartbeats every interval the server asked for; each
assignment is ACKed before it runs (or rejected: BUSY when every slot is
taken or while draining, UNKNOWN_HANDLER); results are reported in order;
a drain takes nothing new, finishes what runs, then closes our half.
We register with `accepts_batches`, so the server may send what it had
queued as one `batch`; each message in it is handled as if it came alone.
We send every message alone.

Threads: gRPC reads the outbound queue through `requests()`; the stream's
reader thread calls `on_message`; handlers run on the worker's pool; one
heartbeat thread; one thread sending running tasks' log lines every
LOG_FLUSH seconds (a task's last lines go just before its result).
Everything shared is guarded by `Session.lock`.
"""

import collections
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Dict, Optional

from .handlers import Handler, HandlerError, Output, Task
from .logs import log_messages
from .stubs import pb, task_pb2

if TYPE_CHECKING:
    from .worker import Worker

# How long a closing worker waits for the server to end its half of the stream.
CLOSE_GRACE = 2.0
# How often running tasks' log lines are sent.
LOG_FLUSH = 0.25

log = logging.getLogger("py-worker")


def event(level: int, message: str, **fields) -> None:
    """Logs a lowercase message with structured key=value fields."""
    if log.isEnabledFor(level):
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        log.log(level, "%s %s", message, text)


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
                "results_refused", "sessions", "batches")}
            out["succeeded_task_ids"] = sorted(self.succeeded_tasks)
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

    def log_flusher(self) -> None:
        while not self.ended.wait(LOG_FLUSH):
            with self.lock:
                for task in list(self.inflight.values()):
                    self._send_logs_locked(task)

    def _send_logs_locked(self, task: Task) -> None:
        for m in log_messages(task):
            self._send_locked(logs=m)

    def on_message(self, message: pb.ConnectResponse, in_batch: bool = False) -> None:
        kind = message.WhichOneof("message")
        if kind == "batch":
            # Several messages the server had queued, each as if alone.
            if in_batch:
                event(logging.WARNING, "ignoring a batch inside a batch",
                      worker_id=self.worker.worker_id)
                return
            self.worker.stats.add("batches")
            for inner in message.batch.messages:
                self.on_message(inner, in_batch=True)
        elif kind == "assign":
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
                        a.payload.content_type, dict(a.labels), a.workflow_step,
                        {step: Output(p.data, p.content_type)
                         for step, p in a.parent_outputs.items()},
                        parent_errors=dict(a.parent_errors),
                        shard_index=a.shard_index, shard_total=a.shard_total,
                        _submit=w.submit_children)
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
        result = run_handler(self.worker, handler, task)
        with self.lock:
            self.inflight.pop(task.execution_id, None)
            # Its last lines go before its result, on the same ordered stream.
            self._send_logs_locked(task)
            sent = self._send_locked(complete=pb.TaskComplete(
                task_id=task.task_id, execution_id=task.execution_id, **result))
            if sent:
                self.reported.add(task.execution_id)
            if self.draining and not self.inflight:
                self._close_locked()
        if sent:
            self.worker.stats.add("succeeded" if "success" in result else "failed", task.task_id)
        event(logging.DEBUG, "task done", worker_id=self.worker.worker_id, task_id=task.task_id,
              attempt=task.attempt, execution_id=task.execution_id,
              outcome="success" if "success" in result else "failure", reported=sent)


def run_handler(worker: "Worker", handler: Handler, task: Task) -> dict:
    """Runs one handler and returns its result as `TaskComplete` fields
    (`success` or `failure`); records its cost and frees its slot, before
    the caller reports: the server may push the next task as soon as it has
    the result, and must not find us still full. Shared by stream and push
    mode."""
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
    worker.record_cost((time.monotonic() - started) * 1000.0)
    worker.slots.release()
    return result


class ProtocolError(Exception):
    """The server said something out of order."""
