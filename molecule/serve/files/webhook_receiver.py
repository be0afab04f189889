"""A local alert receiver for the serve scenario: appends every body Alertmanager posts to a JSON-lines file."""

import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

PORT, OUT = int(sys.argv[1]), sys.argv[2]


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(OUT, "ab") as out:
            out.write(body.replace(b"\n", b" ") + b"\n")
        self.send_response(200)
        self.end_headers()


HTTPServer(("127.0.0.1", PORT), Receiver).serve_forever()
