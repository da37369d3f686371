"""Push mode: the worker serves the `Worker` service and the dispatcher calls
it, instead of the worker holding a `Dispatcher.Connect` stream. The Rust
SDK's push mode (crates/worker) is the reference.

- `RegisterPushWorker` with our address, to the first server of the list
  that answers, then again every heartbeat interval it asks for (failing
  over to the next server when one stops answering: a new session).
- `Worker.Execute` is an assignment: the answer is the ACK (`accepted`) or a
  refusal (BUSY when every slot is taken or while draining, UNKNOWN_HANDLER).
  The handler runs on the pool after the answer is decided.
- `ReportResult` sends each result to the replica holding our session; its
  `recorded.accepted` says whether it was stored or refused as stale. The
  task's log lines go there with `ReportLogs`: every LOG_FLUSH seconds
  while it runs, and its last ones just before its result.
- `Worker.Cancel` sets the handler's `task.cancelled`; `Worker.Probe`
  answers the server's liveness probe with our load.
- Who may call us: at registration we give the server a random secret it
  presents on every `Worker` call (`authorization: Bearer <secret>`); a call
  without it is UNAUTHENTICATED, so whoever else reaches our port runs
  nothing. Each result carries the assignment's `report_secret`, which only
  the `Execute` call told us: a session id and an execution id alone (which
  the public API shows) forge no result.
- Stopping: `DeregisterPushWorker`, take nothing new, finish what runs.
"""

import hmac
import logging
import random
import secrets
import threading
import time
from typing import Dict, Optional

import grpc

from .handlers import Handler, Output, Task
from .logs import log_messages
from .session import LOG_FLUSH, CpuIdle, event, run_handler
from .stubs import dispatcher_pb2_grpc, logs_pb2, pb, worker_pb2, worker_pb2_grpc
from .worker import DEFAULT_HEARTBEAT, RECONNECT_INITIAL, RECONNECT_MAX, Worker, open_channel

CALL_TIMEOUT = 5.0
REFRESH_TRIES_BEFORE_FAILOVER = 2
REPORT_ATTEMPTS = 5

log = logging.getLogger("py-worker")


class PushWorker(Worker, worker_pb2_grpc.WorkerServicer):
    """A `Worker` whose tasks arrive as `Worker.Execute` calls."""

    def __init__(self, servers, handlers: Dict[str, Handler], capacity: int, worker_id: str,
                 name: str, labels: Dict[str, str], listen: str, advertise: str) -> None:
        super().__init__(servers, handlers, capacity, worker_id, name, labels)
        self.listen = listen
        self.advertise = advertise
        self.inflight: Dict[str, Task] = {}  # by execution id
        self.draining = False
        self.session_id: Optional[str] = None
        self.granted_by: Dict[str, str] = {}  # session id -> the server that granted it
        self.cpu = CpuIdle()
        self.server_index = 0
        self.server: Optional[grpc.Server] = None
        self.idle = threading.Condition(self._lock)
        self.server_secret = secrets.token_hex(32)
        self.report_secrets: Dict[str, str] = {}  # by execution id
        self.session_of: Dict[str, Optional[str]] = {}  # by execution id
        # One sender of log lines at a time, so an attempt's lines reach
        # the server in the order they were logged.
        self._log_send = threading.Lock()

    def _from_our_server(self, context) -> bool:
        """Whether the call presents the secret we registered with."""
        presented = dict(context.invocation_metadata()).get("authorization", "")
        return hmac.compare_digest(presented.encode(), f"Bearer {self.server_secret}".encode())

    def _refuse_stranger(self, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      "this worker takes calls only from the servers it registered with")

    # The Worker service -------------------------------------------------

    def Execute(self, request, context):
        if not self._from_our_server(context):
            self._refuse_stranger(context)
        a = request.assignment
        fields = dict(worker_id=self.worker_id, task_id=a.task_id, attempt=a.attempt,
                      execution_id=a.execution_id)
        self.stats.add("assigned")
        with self._lock:
            if self.draining:
                return self._refuse(pb.REJECT_REASON_BUSY, "worker is draining")
            if a.execution_id in self.inflight:
                event(logging.DEBUG, "duplicate assignment; accepting again", **fields)
                return worker_pb2.ExecuteResponse(accepted=True)
            handler = self.handlers.get(a.handler)
            if handler is None:
                return self._refuse(pb.REJECT_REASON_UNKNOWN_HANDLER,
                                    f"handler {a.handler!r} is not served by this worker")
            if not self.slots.acquire(blocking=False):
                return self._refuse(pb.REJECT_REASON_BUSY, f"all {self.capacity} slots are taken")
            task = Task(a.task_id, a.attempt, a.execution_id, a.handler, a.payload.data,
                        a.payload.content_type, dict(a.labels), a.workflow_step,
                        {step: Output(p.data, p.content_type)
                         for step, p in a.parent_outputs.items()},
                        parent_errors=dict(a.parent_errors),
                        shard_index=a.shard_index, shard_total=a.shard_total,
                        _submit=self.submit_children)
            self.inflight[a.execution_id] = task
            self.report_secrets[a.execution_id] = a.report_secret
            session_id = request.session_id or self.session_id
            self.session_of[a.execution_id] = session_id
        event(logging.DEBUG, "task accepted", handler=a.handler, **fields)
        self.pool.submit(self.run_task, handler, task, session_id)
        return worker_pb2.ExecuteResponse(accepted=True)

    def _refuse(self, reason: int, message: str):
        self.stats.add("rejected")
        return worker_pb2.ExecuteResponse(accepted=False, reject_reason=reason, message=message)

    def Cancel(self, request, context):
        if not self._from_our_server(context):
            self._refuse_stranger(context)
        with self._lock:
            task = self.inflight.get(request.execution_id)
        if task is None:
            return worker_pb2.CancelResponse(found=False)
        event(logging.INFO, "cancelling task", worker_id=self.worker_id, task_id=request.task_id,
              execution_id=request.execution_id, reason=request.reason)
        task.cancelled.set()
        return worker_pb2.CancelResponse(found=True)

    def Probe(self, request, context):
        if not self._from_our_server(context):
            self._refuse_stranger(context)
        with self._lock:
            active, draining = len(self.inflight), self.draining
        return worker_pb2.ProbeResponse(
            worker_id=self.worker_id, active=active, capacity=self.capacity, draining=draining,
            cpu_idle_percent=self.cpu.sample(), avg_cost_ms=self.average_cost_ms())

    # Running and reporting ----------------------------------------------

    def run_task(self, handler: Handler, task: Task, session_id: Optional[str]) -> None:
        result = run_handler(self, handler, task)
        complete = pb.TaskComplete(task_id=task.task_id, execution_id=task.execution_id, **result)
        accepted = self.report(task, complete, session_id)
        with self._lock:
            self.inflight.pop(task.execution_id, None)
            self.report_secrets.pop(task.execution_id, None)
            self.session_of.pop(task.execution_id, None)
            self.idle.notify_all()
        if accepted is None:
            return
        self.stats.add("results_accepted" if accepted else "results_refused")
        if accepted:
            self.stats.add("succeeded" if "success" in result else "failed", task.task_id)
        else:
            event(logging.INFO, "report refused", worker_id=self.worker_id, task_id=task.task_id,
                  execution_id=task.execution_id)

    def send_logs(self, task: Task, server: str, session_id: Optional[str],
                  report_secret: str) -> None:
        """The task's lines, best effort: a refusal only loses lines."""
        with self._log_send:
            self._send_logs_locked(task, server, session_id, report_secret)

    def _send_logs_locked(self, task: Task, server: str, session_id: Optional[str],
                          report_secret: str) -> None:
        messages = log_messages(task)
        if not messages:
            return
        try:
            with open_channel(server) as channel:
                stub = dispatcher_pb2_grpc.DispatcherStub(channel)
                for m in messages:
                    stub.ReportLogs(logs_pb2.ReportLogsRequest(
                        session_id=session_id or "", logs=m, report_secret=report_secret),
                        metadata=self.metadata(), timeout=CALL_TIMEOUT)
        except grpc.RpcError as err:
            event(logging.INFO, "log lines not delivered", worker_id=self.worker_id,
                  task_id=task.task_id, code=err.code())

    def log_flusher(self) -> None:
        """Sends running tasks' lines every LOG_FLUSH seconds until stopped."""
        while not self.stopping.wait(LOG_FLUSH):
            with self._lock:
                running = [(t, self.session_of.get(e), self.report_secrets.get(e, ""))
                           for e, t in self.inflight.items()]
                fallback = self.servers[self.server_index % len(self.servers)]
                servers = {s: self.granted_by.get(s or "", fallback) for _, s, _ in running}
            for task, session_id, secret in running:
                self.send_logs(task, servers[session_id], session_id, secret)

    def report(self, task: Task, complete, session_id: Optional[str]) -> Optional[bool]:
        """Sends one result to the server that granted the session it ran
        under; retries while that server is unreachable. None: never delivered
        (the server takes the attempt back when it sees us gone)."""
        with self._lock:
            server = self.granted_by.get(session_id or "",
                                         self.servers[self.server_index % len(self.servers)])
            report_secret = self.report_secrets.get(complete.execution_id, "")
        self.send_logs(task, server, session_id, report_secret)
        for attempt in range(REPORT_ATTEMPTS):
            try:
                with open_channel(server) as channel:
                    stub = dispatcher_pb2_grpc.DispatcherStub(channel)
                    reply = stub.ReportResult(pb.ReportResultRequest(
                        session_id=session_id or "", complete=complete,
                        report_secret=report_secret),
                        metadata=self.metadata(), timeout=CALL_TIMEOUT)
                return reply.recorded.accepted
            except grpc.RpcError as err:
                code = err.code()
                event(logging.WARNING, "report failed", worker_id=self.worker_id,
                      task_id=complete.task_id, server=server, code=code, attempt=attempt + 1)
                if code == grpc.StatusCode.NOT_FOUND:
                    return False  # the session is gone: the result is stale
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return False
                time.sleep(min(RECONNECT_MAX, RECONNECT_INITIAL * 2 ** attempt))
        return None

    # Registration -------------------------------------------------------

    def run(self) -> None:
        """Serves `Worker` and keeps the registration fresh until stopped,
        then drains."""
        self.server = grpc.server(self.pool_for_rpcs(), options=[("grpc.so_reuseport", 0)])
        worker_pb2_grpc.add_WorkerServicer_to_server(self, self.server)
        if self.server.add_insecure_port(self.listen) == 0:
            self.fatal = f"cannot listen on {self.listen}"
            return
        self.server.start()
        event(logging.INFO, "serving Worker", worker_id=self.worker_id, listen=self.listen,
              advertise=self.advertise)
        threading.Thread(target=self.log_flusher, name="log-flusher", daemon=True).start()
        backoff = RECONNECT_INITIAL
        interval = DEFAULT_HEARTBEAT
        failed_here = 0  # refreshes failed in a row at the current server
        while not self.stopping.is_set():
            server = self.servers[self.server_index % len(self.servers)]
            try:
                interval = self.register(server)
                backoff = RECONNECT_INITIAL
                failed_here = 0
                wait = interval
            except grpc.RpcError as err:
                code = err.code()
                event(logging.WARNING, "registration failed", worker_id=self.worker_id,
                      server=server, code=code, detail=repr(err.details()))
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    self.fatal = f"registration refused: {err.details()}"
                    break
                with self._lock:
                    failed_here += 1
                    holds = self.granted_by.get(self.session_id or "") == server
                    # A refresh of our session is tried once more before
                    # moving on (the server keeps it for three intervals);
                    # a first registration moves at once.
                    if not holds or failed_here >= REFRESH_TRIES_BEFORE_FAILOVER:
                        self.server_index += 1  # fail over to the next server
                        self.session_id = None
                        failed_here = 0
                wait = backoff * random.uniform(0.5, 1.0)
                backoff = min(backoff * 2, RECONNECT_MAX)
            if self.stopping.wait(wait):
                break
        self.drain()

    def pool_for_rpcs(self):
        from concurrent.futures import ThreadPoolExecutor

        # Execute/Probe/Cancel are quick; handlers run on self.pool.
        return ThreadPoolExecutor(max_workers=8, thread_name_prefix="rpc")

    def register(self, server: str) -> float:
        """Registers, or refreshes the session this server granted us (an
        empty session id asks for a new one, replacing any earlier session of
        ours at this address)."""
        with self._lock:
            current = self.session_id if self.granted_by.get(self.session_id or "") == server \
                else None
        with open_channel(server) as channel:
            reply = dispatcher_pb2_grpc.DispatcherStub(channel).RegisterPushWorker(
                pb.RegisterPushWorkerRequest(
                    registration=pb.WorkerRegistration(
                        worker_id=self.worker_id, name=self.name, handlers=sorted(self.handlers),
                        capacity=self.capacity, labels=self.labels, weight=1),
                    address=self.advertise, session_id=current or "",
                    server_secret=self.server_secret),
                metadata=self.metadata(), timeout=CALL_TIMEOUT)
        registered = reply.registered
        with self._lock:
            fresh = registered.session_id != self.session_id
            self.session_id = registered.session_id
            self.granted_by[registered.session_id] = server
        if fresh:
            self.stats.add("sessions")
            event(logging.INFO, "registered", worker_id=self.worker_id, server=server,
                  session_id=registered.session_id)
        return registered.heartbeat_interval.ToTimedelta().total_seconds() or DEFAULT_HEARTBEAT

    def drain(self) -> None:
        """Deregisters, takes nothing new, waits for running handlers."""
        with self._lock:
            self.draining = True
            session_id = self.session_id
            running = len(self.inflight)
            server = self.granted_by.get(session_id or "")
        event(logging.INFO, "draining", worker_id=self.worker_id, running=running)
        if session_id and server:
            try:
                with open_channel(server) as channel:
                    dispatcher_pb2_grpc.DispatcherStub(channel).DeregisterPushWorker(
                        pb.DeregisterPushWorkerRequest(session_id=session_id, reason="stopping"),
                        metadata=self.metadata(), timeout=CALL_TIMEOUT)
            except grpc.RpcError as err:
                event(logging.WARNING, "deregistration failed", worker_id=self.worker_id,
                      code=err.code())
        with self._lock:
            while self.inflight and not self.aborted:
                self.idle.wait(0.5)
        if self.server is not None:
            self.server.stop(grace=1.0).wait()

    aborted = False

    def stop(self, reason: str) -> None:
        event(logging.INFO, "stopping", worker_id=self.worker_id, reason=reason)
        self.stopping.set()

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            for task in self.inflight.values():
                task.cancelled.set()
            self.idle.notify_all()
