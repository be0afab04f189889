"""tools/loadgen.py against a local HTTP server standing for the load balancer: the long requests it mixes in,
the requests in flight it samples, and a failure it counts (a server that closes without answering)."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

SEEN = []


class Completions(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        SEEN.append(body)
        if body["prompt"] == "close":
            self.close_connection = True
            return
        time.sleep(0.002 * body["max_tokens"])
        answer = json.dumps({"choices": [{"text": "Paris"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    SEEN.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def loadgen(tmp_path, url, *extra):
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "loadgen.py"), "--url", url, "--model", "m", "--out", str(out), *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text()), done.stdout


def test_long_requests_and_the_requests_in_flight(tmp_path, server):
    result, line = loadgen(
        tmp_path, server, "--duration", "2", "--concurrency", "3", "--long-max-tokens", "200", "--long-every", "2",
        "--expect-in-flight", "2",
    )  # fmt: skip
    assert result["failed"] == 0 and result["sent"] == result["answered"] > 6, result
    tokens = [body["max_tokens"] for body in SEEN]
    assert 200 in tokens and 8 in tokens
    assert all(body.get("ignore_eos") for body in SEEN if body["max_tokens"] == 200)
    # Three workers, mostly waiting on 0.4 s answers: about three in flight, never more.
    assert 1.5 < result["in_flight_mean"] <= 3, result
    assert 0 <= result["share_below_expected"] < 0.5, result
    assert f"in flight: mean {result['in_flight_mean']}" in line


def test_an_answer_cut_short_is_a_failure(tmp_path, server):
    out = tmp_path / "out.json"
    script = REPO / "tools" / "loadgen.py"
    # The prompt is fixed; point the load at a server that closes every connection by rewriting it on the way.
    patched = tmp_path / "loadgen.py"
    patched.write_text(script.read_text().replace('"The capital of France is"', '"close"'))
    done = subprocess.run(
        [sys.executable, str(patched), "--url", server, "--model", "m", "--out", str(out), "--duration", "1",
         "--pause", "0.1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert done.returncode == 0 and result["failed"] == result["sent"] > 0, result
    assert "RemoteDisconnected" in result["failures"][0]["error"] or "Connection" in result["failures"][0]["error"]
