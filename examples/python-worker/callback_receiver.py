#!/usr/bin/env python3
"""A taskmesh callback receiver, standard library only.

Verifies each delivery as the Standard Webhooks scheme says
(https://www.standardwebhooks.com): the `webhook-signature` header holds
one or more `v1,<base64 HMAC-SHA256>` signatures of
`webhook-id + "." + webhook-timestamp + "." + body`; one must match a key
this receiver knows, and the timestamp must be within `--tolerance`
seconds of this machine's clock (so a captured request cannot be replayed
later). It answers 204 to a verified delivery, 401 otherwise, and
de-duplicates on the delivery id (retries carry the same one).

    TASKMESH_CALLBACK_SECRET=whsec_... python3 callback_receiver.py --port 9000

The secret is read from the environment (the same value as the server's
TASKMESH_CALLBACK_SECRET; several, separated by spaces, during a rotation).
With --log FILE, every request is appended there as one JSON line (the
verdict, the headers and the body), which the polyglot test reads.
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def signing_key(secret: str) -> bytes:
    """The key of a secret: `whsec_` + base64 is decoded, other text used as is."""
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[len("whsec_"):], validate=True)
    return secret.encode()


def verify(keys, headers, body: bytes, tolerance: float, now: float):
    """Returns None when the delivery verifies, else why not."""
    msg_id = headers.get("webhook-id")
    stamp = headers.get("webhook-timestamp")
    given = headers.get("webhook-signature")
    if not msg_id or not stamp or not given:
        return "missing webhook-id, webhook-timestamp or webhook-signature"
    try:
        seconds = int(stamp)
    except ValueError:
        return "webhook-timestamp is not a number"
    if abs(now - seconds) > tolerance:
        return f"timestamp {seconds} is more than {tolerance:g} s from now ({int(now)})"
    signed = msg_id.encode() + b"." + stamp.encode() + b"." + body
    for key in keys:
        want = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        if any(hmac.compare_digest(want, sig) for sig in given.split(" ")):
            return None
    return "no signature matches"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tolerance", type=float, default=300.0,
                        help="largest accepted distance of webhook-timestamp from now, seconds (default 300)")
    parser.add_argument("--log", help="append every request to this file as a JSON line")
    args = parser.parse_args()
    secrets = os.environ.get("TASKMESH_CALLBACK_SECRET", "").split()
    if not secrets:
        print("callback_receiver: TASKMESH_CALLBACK_SECRET is not set", file=sys.stderr)
        return 2
    keys = [signing_key(s) for s in secrets]
    seen = set()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            why = verify(keys, headers, body, args.tolerance, time.time())
            with lock:
                duplicate = why is None and headers["webhook-id"] in seen
                if why is None:
                    seen.add(headers["webhook-id"])
                if args.log:
                    with open(args.log, "a") as log:
                        log.write(json.dumps({
                            "verified": why is None, "why": why, "duplicate": duplicate,
                            "headers": headers, "body": body.decode("utf-8", "replace"),
                        }) + "\n")
            self.send_response(204 if why is None else 401)
            self.end_headers()

        def log_message(self, fmt, *a):
            print("callback_receiver:", fmt % a, file=sys.stderr)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"callback_receiver: listening on http://{args.host}:{args.port}/", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
