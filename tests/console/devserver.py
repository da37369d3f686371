#!/usr/bin/env python3
"""Serves the console as the binary will (crates/gateway/console/ at /ui/) and
proxies /api/* (SSE streams included, unbuffered) to a taskmesh HTTP port, so
the browser sees one origin. Standard library only; for development and the
browser tests, never for production.

    python3 tests/console/devserver.py --port 8790 --api http://127.0.0.1:8791
"""

import argparse
import http.client
import http.server
import mimetypes
import os
import sys
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "crates", "gateway", "console"))
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
       "proxy-authorization", "proxy-authenticate", "content-length", "host"}
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}


class Handler(http.server.BaseHTTPRequestHandler):
    # HTTP/1.0 answers end with the connection, so streamed bodies need no
    # length and no chunking of our own.
    protocol_version = "HTTP/1.0"
    upstream = None  # urllib.parse.SplitResult of --api
    root = ROOT

    def log_message(self, fmt, *args):  # quiet unless asked
        if os.environ.get("DEVSERVER_LOG"):
            sys.stderr.write("devserver: " + fmt % args + "\n")

    def do_GET(self):
        self.route()

    def do_POST(self):
        self.route()

    def do_PUT(self):
        self.route()

    def do_DELETE(self):
        self.route()

    def do_PATCH(self):
        self.route()

    def route(self):
        path = urllib.parse.urlsplit(self.path).path
        if path.startswith("/api/") or path in ("/openapi.json", "/healthz", "/readyz"):
            self.proxy()
        elif path in ("/", "/ui"):
            self.send_response(302)
            self.send_header("location", "/ui/")
            self.end_headers()
        elif path.startswith("/ui/") and self.command == "GET":
            self.static(path[len("/ui/"):] or "index.html")
        else:
            self.send_error(404)

    def static(self, name):
        # Flat directory, as the binary embeds it: no subpaths, no dotfiles.
        if "/" in name or name.startswith("."):
            return self.send_error(404)
        file = os.path.join(self.root, name)
        if not os.path.isfile(file):
            return self.send_error(404)
        with open(file, "rb") as f:
            body = f.read()
        ext = os.path.splitext(name)[1]
        self.send_response(200)
        self.send_header("content-type", TYPES.get(ext) or mimetypes.guess_type(name)[0] or "application/octet-stream")
        self.send_header("content-length", str(len(body)))
        self.send_header("cache-control", "no-store")
        self.send_header("x-content-type-options", "nosniff")
        self.send_header("content-security-policy",
                         "default-src 'self'; img-src 'self' blob: data:; object-src 'none'; "
                         "base-uri 'none'; frame-ancestors 'none'")
        self.end_headers()
        self.wfile.write(body)

    def proxy(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else None
        up = self.upstream
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=None)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            res = conn.getresponse()
        except OSError as e:
            conn.close()
            return self.send_error(502, f"taskmesh did not answer: {e}")
        try:
            self.send_response(res.status, res.reason)
            for k, v in res.getheaders():
                if k.lower() not in HOP:
                    self.send_header(k, v)
            streaming = "text/event-stream" in (res.getheader("content-type") or "")
            if not streaming and res.getheader("content-length"):
                self.send_header("content-length", res.getheader("content-length"))
            self.end_headers()
            while True:
                chunk = res.read1(65536) if streaming else res.read(65536)
                if not chunk:
                    break
                self.wfile.write(chunk)
                if streaming:
                    self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away (a view closed its stream)
        finally:
            conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--api", required=True, help="taskmesh HTTP base URL, e.g. http://127.0.0.1:8791")
    ap.add_argument("--root", default=ROOT, help="the console's files")
    args = ap.parse_args()
    Handler.upstream = urllib.parse.urlsplit(args.api)
    Handler.root = args.root
    server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    # The tests wait for this line.
    print(f"devserver listening on http://{host}:{port}/ui/ (api {args.api})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
