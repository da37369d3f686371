"""The worker: a bounded handler pool and one session at a time, failing
over across servers with jittered exponential backoff."""

import collections
import logging
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

import grpc

from .handlers import Handler, HandlerError
from .session import ProtocolError, Session, Stats, event
from .stubs import dispatcher_pb2_grpc, pb, task_api_pb2, task_api_pb2_grpc, task_pb2

CONNECT_TIMEOUT = 5.0
REGISTER_TIMEOUT = 10.0
DEFAULT_HEARTBEAT = 5.0
RECONNECT_INITIAL = 0.1
RECONNECT_MAX = 5.0


def open_channel(server: str, options=None) -> grpc.Channel:
    """A channel to `server` (host:port, or an http:// or https:// URL).
    An https:// URL, or a CA file in $TASKMESH_TLS_CA, means TLS trusting
    that CA (without one, the system's roots)."""
    ca_file = os.environ.get("TASKMESH_TLS_CA", "")
    target = server.removeprefix("http://").removeprefix("https://")
    if server.startswith("https://") or ca_file:
        ca = None
        if ca_file:
            with open(ca_file, "rb") as f:
                ca = f.read()
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
        return grpc.secure_channel(target, creds, options=options)
    return grpc.insecure_channel(target, options=options)


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
        # A worker token of the server (`taskmesh token create --role worker`),
        # from the environment only: never a flag, which `ps` would show.
        self.token = os.environ.get("TASKMESH_TOKEN", "")

    def metadata(self):
        """The call metadata presenting our token, if we have one."""
        return [("authorization", f"Bearer {self.token}")] if self.token else []

    def submit_children(self, children: List[dict]) -> List[str]:
        """SubmitTasks of `children` (SubmitTaskRequest fields as a dict,
        `payload` as bytes) to the first server, with our worker token
        (which may submit children only of the tasks it runs); their ids, in
        order. A refused entry raises a retryable HandlerError with the
        server's message: children carry idempotency keys, so the handler's
        next attempt submits only what is missing."""
        requests = []
        for c in children:
            c = dict(c)
            payload = task_pb2.Payload(data=c.pop("payload", b"{}"),
                                       content_type=c.pop("content_type", "application/json"))
            requests.append(task_api_pb2.SubmitTaskRequest(payload=payload, **c))
        with open_channel(self.servers[0]) as channel:
            reply = task_api_pb2_grpc.TaskApiStub(channel).SubmitTasks(
                task_api_pb2.SubmitTasksRequest(tasks=requests), metadata=self.metadata(),
                timeout=30)
        ids = []
        for r in reply.results:
            if not r.HasField("accepted"):
                raise HandlerError(f"a child was refused: {r.error_message}", retryable=True)
            ids.append(r.accepted.task_id)
        return ids

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
            if session.call is not None:
                session.call.cancel()
            session.end()

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
        with open_channel(server, options=options) as channel:
            grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT)
            session = Session(self)
            session.send(register=pb.WorkerRegistration(
                worker_id=self.worker_id, name=self.name, handlers=sorted(self.handlers),
                capacity=self.capacity, labels=self.labels, weight=1,
                # We read `batch` (Session.on_message); we send none.
                accepts_batches=True))
            call = dispatcher_pb2_grpc.DispatcherStub(channel).Connect(
                session.requests(), metadata=self.metadata())
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
        threading.Thread(target=session.log_flusher, name="log-flusher", daemon=True).start()
        with self._lock:
            self._session = session
            stopping = self.stopping.is_set()
        if stopping:  # stop() came while we were connecting
            session.start_drain("stopping")
