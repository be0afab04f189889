"""Stand-in for one vLLM instance in the loadbalancer scenario.

Usage: fake-vllm HOST PORT. Answers GET /health with an empty 200 (as vLLM
does), GET /v1/models with a model list naming HOST:PORT, and
GET /v1/slow?seconds=N the same after N seconds: a long completion in flight.
/v1/hangup?tag=T (any method) counts the request under T and closes the
connection without answering, as an engine that crashes on a request;
GET /v1/hangups?tag=T answers {"count": n}, what this instance received.
GET /v1/denied answers 401, as vLLM's key middleware does to a wrong key.
Every other path (GET or POST) answers 200 with {"route": path, "served_by"}:
a route the load balancer should not forward shows up as a 200.
With FAKE_VLLM_CERT and FAKE_VLLM_KEY it serves HTTPS with that certificate,
as an instance with --ssl-certfile/--ssl-keyfile does.
"""

import collections
import json
import os
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

HOST, PORT = sys.argv[1], int(sys.argv[2])
SERVED_BY = f"{HOST}:{PORT}"
HANGUPS = collections.Counter()
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def hang_up(self, url):
        with LOCK:
            HANGUPS[parse_qs(url.query).get("tag", [""])[0]] += 1
        self.close_connection = True

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/v1/hangup":
            self.hang_up(url)
            return
        if url.path == "/v1/hangups":
            with LOCK:
                count = HANGUPS[parse_qs(url.query).get("tag", [""])[0]]
            self.reply(200, json.dumps({"count": count}).encode() + b"\n", "application/json")
            return
        if url.path == "/health":
            self.reply(200, b"", "text/plain")
            return
        if url.path == "/v1/denied":
            self.reply(401, b'{"error": "Unauthorized"}\n', "application/json")
            return
        if url.path not in ("/v1/models", "/v1/slow"):
            body = {"route": url.path, "served_by": SERVED_BY}
            self.reply(200, json.dumps(body).encode() + b"\n", "application/json")
            return
        if url.path == "/v1/slow":
            time.sleep(float(parse_qs(url.query).get("seconds", ["5"])[0]))
        models = {
            "object": "list",
            "data": [{"id": "lb-test", "object": "model", "owned_by": SERVED_BY}],
            "served_by": SERVED_BY,
        }
        self.reply(200, json.dumps(models).encode() + b"\n", "application/json")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if urlparse(self.path).path == "/v1/hangup":
            self.hang_up(urlparse(self.path))
            return
        body = {"route": urlparse(self.path).path, "served_by": SERVED_BY}
        self.reply(200, json.dumps(body).encode() + b"\n", "application/json")

    def reply(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


SERVER = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
if os.environ.get("FAKE_VLLM_CERT"):
    CONTEXT = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    CONTEXT.load_cert_chain(os.environ["FAKE_VLLM_CERT"], os.environ["FAKE_VLLM_KEY"])
    SERVER.socket = CONTEXT.wrap_socket(SERVER.socket, server_side=True)
SERVER.serve_forever()
