"""tools/loadgen.py against a local HTTP server standing for the load balancer: the long requests it mixes in,
the requests in flight it samples, and the failures it counts: a server that closes without answering, and
answers that come back with HTTP 200 but cut short (vLLM's finish_reason "abort", fewer tokens than asked)."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

SEEN = []
# How the server ends its answers: None for whole ones, else (finish_reason, tokens short of max_tokens).
CUT = {"how": None}


class Completions(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        SEEN.append(dict(body, port=self.server.server_address[1]))
        if body["prompt"] == "close":
            self.close_connection = True
            return
        time.sleep(0.002 * body["max_tokens"])
        reason, short = CUT["how"] or ("length", 0)
        answer = json.dumps(
            {"choices": [{"text": "Paris", "finish_reason": reason}],
             "usage": {"completion_tokens": body["max_tokens"] - short}}
        ).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def start_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


@pytest.fixture
def server():
    SEEN.clear()
    CUT["how"] = None
    httpd = start_server()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def loadgen(tmp_path, url, *extra):
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "loadgen.py"), "--url", url, "--model", "m", "--out", str(out), *extra],
        capture_output=True, text=True, timeout=60, check=False,
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
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert done.returncode == 0 and result["failed"] == result["sent"] > 0, result
    assert "RemoteDisconnected" in result["failures"][0]["error"] or "Connection" in result["failures"][0]["error"]


@pytest.mark.parametrize(
    ("how", "error"),
    [(("abort", 0), "cut short: finish_reason 'abort'"), (("length", 5), "cut short: 195 of 200 tokens")],
)
def test_an_answer_with_http_200_but_cut_short_is_a_failure(tmp_path, server, how, error):
    CUT["how"] = how
    log = tmp_path / "failures.jsonl"
    result, _unused = loadgen(
        tmp_path, server, "--duration", "1", "--long-max-tokens", "200", "--long-every", "1",
        "--failure-log", str(log),
    )  # fmt: skip
    assert result["failed"] == result["sent"] > 0 and result["answered"] == 0, result
    assert result["failures"][0]["error"] == error
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(logged) == result["failed"] and logged[0] == result["failures"][0]


def test_a_short_answer_may_stop_before_max_tokens(tmp_path, server):
    CUT["how"] = ("stop", 3)  # a request without ignore_eos may end at its stop token
    result, _unused = loadgen(tmp_path, server, "--duration", "1")
    assert result["failed"] == 0 and result["answered"] == result["sent"] > 0, result


def test_the_workers_spread_over_every_url(tmp_path, server):
    other = start_server()
    try:
        second = f"http://127.0.0.1:{other.server_address[1]}"
        result, _unused = loadgen(tmp_path, server, "--url", second, "--duration", "1", "--concurrency", "3")
    finally:
        other.shutdown()
    assert result["urls"] == [server, second] and result["failed"] == 0, result
    ports = {body["port"] for body in SEEN}
    assert ports == {int(server.rsplit(":", 1)[1]), other.server_address[1]}, ports
