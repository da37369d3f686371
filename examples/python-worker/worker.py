#!/usr/bin/env python3
"""A taskmesh worker in Python, built from nothing but proto/.

It holds one `Dispatcher.Connect` stream to a taskmesh server: registers its
handlers, sends a heartbeat every `heartbeat_interval` the server asks for,
ACKs each assignment before running it, runs handlers on a bounded thread pool
(answering BUSY when every slot is taken), reports each result, and on
SIGTERM drains: it takes nothing new, finishes what runs, then closes. The
Rust SDK (crates/worker/src/session.rs) is the reference for every step.

    .venv/bin/python worker.py --server 127.0.0.1:50051 --concurrency 8

With `--push-listen HOST:PORT` it works in push mode instead: it serves the
`Worker` service there, registers that address with `RegisterPushWorker`
(again every heartbeat interval), answers `Worker.Execute` with its ACK or
refusal, and reports results with `ReportResult` (tmworker/push.py).

    .venv/bin/python worker.py --server 127.0.0.1:50051 --push-listen 127.0.0.1:7070
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
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

from tmworker import BUILTIN, Worker  # noqa: E402  (imports grpc and the stubs)
from tmworker.push import PushWorker  # noqa: E402
from tmworker.session import CLOSE_GRACE, event  # noqa: E402


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
    p.add_argument("--push-listen", metavar="HOST:PORT",
                   help="push mode: serve the Worker service here instead of holding a stream")
    p.add_argument("--push-advertise", metavar="URL",
                   help="push mode: the address the server calls (default http://HOST:PORT "
                        "of --push-listen)")
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
    if args.push_advertise and not args.push_listen:
        p.error("--push-advertise needs --push-listen")
    if args.push_listen:
        host, _, port = args.push_listen.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            p.error(f"--push-listen {args.push_listen!r} is not HOST:PORT")
        if not args.push_advertise:
            args.push_advertise = f"http://{args.push_listen}"
        elif not args.push_advertise.startswith(("http://", "https://")):
            p.error(f"--push-advertise {args.push_advertise!r} is not an http(s) URL")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    servers = [s.strip().removeprefix("http://") for s in args.server.split(",") if s.strip()]
    handlers = {h: BUILTIN[h] for h in args.handlers.split(",") if h}
    labels = dict(label.split("=", 1) for label in args.label)
    if args.push_listen:
        worker = PushWorker(servers, handlers, args.concurrency, args.worker_id, args.name,
                            labels, args.push_listen, args.push_advertise)
    else:
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
    counts = {k: v for k, v in sorted(stats.items()) if isinstance(v, int)}
    print("py-worker: stopped " + " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)
    if code == 1:
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
