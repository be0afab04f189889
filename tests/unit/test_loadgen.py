"""tools/loadgen.py against a local HTTP server standing for the load balancer: the long requests it mixes in,
the requests in flight it samples, and the failures it counts: a server that closes without answering, and
answers that come back with HTTP 200 but cut short (vLLM's finish_reason "abort", fewer tokens than asked).
Then answers broken below HTTP (a body shorter than its Content-Length, a garbage status line, a TCP reset, a
chunked stream that stops): each a failure of its type, no worker dies, sent == answered + failed; a worker
that dies anyway and a falling send rate fail the run; and the load balancer samples (--lb-sample-cmd)."""

import importlib.util
import json
import shlex
import socket
import struct
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


# ---- answers broken below HTTP: every exception is a counted failure, and no worker dies of one ----------------
# Each server cuts every third request it gets, the way a backend dying mid-answer does through HAProxy (headers
# forwarded, then the connection gone), and counts what it got and what it cut: the load generator's counts must
# be exactly those.
ANSWER = json.dumps(
    {"choices": [{"text": "Paris", "finish_reason": "length"}], "usage": {"completion_tokens": 8}}
).encode()


class Cutting(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # for the chunked answers

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.seen += 1
            cut = self.server.seen % 3 == 0
            self.server.cut += cut
        self.close_connection = True
        getattr(self, "answer_" + self.server.mode.replace("-", "_"))(cut)

    def whole(self, status=200):
        self.send_response(status)
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def answer_body(self, cut):
        """Content-Length says 200 bytes; 20 come, then the connection closes."""
        if not cut:
            return self.whole()
        self.send_response(200)
        self.send_header("Content-Length", "200")
        self.end_headers()
        self.wfile.write(ANSWER[:20])

    def answer_status(self, cut):
        """A status line that is not HTTP's."""
        if not cut:
            return self.whole()
        self.wfile.write(b"garbage, not a status line\r\n\r\n")

    def answer_reset(self, cut):
        """The headers and a part of the body, then a TCP reset (SO_LINGER 0: RST, not FIN)."""
        if not cut:
            return self.whole()
        self.send_response(200)
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER[:20])
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()

    def answer_503_body(self, cut):
        """An error whose body is cut short too: the status is what the failure is."""
        if not cut:
            return self.whole()
        self.send_response(503)
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b"no server is availa")

    def stream(self, cut, mid_chunk):
        """A chunked (streamed) answer: two chunks and the last one, or the stream stops between two chunks or
        inside one (its size line promises more than comes)."""
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        first, rest = ANSWER[:30], ANSWER[30:]
        self.wfile.write(b"%x\r\n%s\r\n" % (len(first), first))
        self.wfile.flush()
        time.sleep(0.01)
        if not cut:
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))
        elif mid_chunk:
            self.wfile.write(b"%x\r\n%s" % (len(rest), rest[:5]))

    def answer_stream_between_chunks(self, cut):
        self.stream(cut, mid_chunk=False)

    def answer_stream_mid_chunk(self, cut):
        self.stream(cut, mid_chunk=True)

    def log_message(self, *args):
        pass


@pytest.fixture
def cutting_server():
    servers = []

    def start(mode):
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Cutting)
        httpd.mode, httpd.seen, httpd.cut, httpd.lock = mode, 0, 0, threading.Lock()
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def run_loadgen(tmp_path, url, *extra, script=None):
    """The process, its JSON (None if it wrote none) and its summary, whatever its exit status."""
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(script or REPO / "tools" / "loadgen.py"), "--url", url, "--model", "m", "--out", str(out),
         *extra],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done, json.loads(out.read_text()) if out.exists() else None


def assert_every_request_counted(result, concurrency):
    assert result["sent"] == result["answered"] + result["failed"], result
    assert result.get("workers_alive_at_stop") == concurrency and result.get("worker_deaths") == [], result
    assert result.get("in_flight_at_end") == 0 and result.get("unfinished") == 0, result
    assert sum(result.get("failures_by_type", {}).values()) == result["failed"], result


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        ("body", "IncompleteRead"),
        ("status", "BadStatusLine"),
        ("reset", "ConnectionResetError"),
        ("stream-between-chunks", "IncompleteRead"),
        ("stream-mid-chunk", "IncompleteRead"),
        ("503-body", "HTTP 503"),
    ],
)
def test_an_answer_cut_below_http_is_a_failure_of_its_type_and_the_workers_go_on(tmp_path, cutting_server, mode, kind):
    httpd, url = cutting_server(mode)
    done, result = run_loadgen(
        tmp_path, url, "--concurrency", "3", "--pause", "0.05", "--duration", "2.5",
        "--failure-log", str(tmp_path / "failures.jsonl"),
    )  # fmt: skip
    # Exactly what the server got and cut: nothing lost, nothing counted twice.
    counts = f"{result['sent']} sent, {result['answered']} answered, {result['failed']} failed"
    assert (result["sent"], result["failed"]) == (httpd.seen, httpd.cut), (
        f"{counts}; server: {httpd.seen} got, {httpd.cut} cut"
    )
    assert result["answered"] == httpd.seen - httpd.cut and httpd.cut >= 3, result
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert_every_request_counted(result, 3)
    assert result["failures_by_type"] == {kind: httpd.cut}, result
    assert {failure["type"] for failure in result["failures"]} == {kind}, result["failures"]
    logged = [json.loads(line) for line in (tmp_path / "failures.jsonl").read_text().splitlines()]
    assert len(logged) == httpd.cut and {failure["type"] for failure in logged} == {kind}
    # The workers kept sending to the end: the last third of the run at half the first third's rate or more.
    assert result["send_rate_last_third_per_s"] >= result["send_rate_first_third_per_s"] / 2 > 0, result
    assert f"failures by type: {kind} {httpd.cut}" in done.stdout, done.stdout
    assert "3 of 3 workers alive at the stop" in done.stdout, done.stdout


def test_a_refused_connection_is_counted_by_its_cause(tmp_path):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # closed again before the load starts: nothing listens there
    done, result = run_loadgen(tmp_path, f"http://127.0.0.1:{port}", "--duration", "1", "--pause", "0.1")
    assert done.returncode == 0, done.stderr
    assert result["failed"] == result["sent"] > 0 and result["answered"] == 0, result
    assert result["failures_by_type"] == {"ConnectionRefusedError": result["sent"]}, result
    assert_every_request_counted(result, 2)


def test_a_worker_that_dies_fails_the_run_and_its_request_is_counted(tmp_path, server):
    # Nothing a request raises kills a worker now; a BaseException still can (here SystemExit, raised where each
    # answer is judged). The run must say so and fail, and the request it died in is a failure.
    patched = tmp_path / "loadgen.py"
    source = (REPO / "tools" / "loadgen.py").read_text()
    marker = "def judge(payload, asked):\n"
    assert marker in source
    patched.write_text(source.replace(marker, marker + '    raise SystemExit("injected")\n'))
    done, result = run_loadgen(tmp_path, server, "--duration", "1", "--concurrency", "3", script=patched)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert result["workers_alive_at_stop"] == 0 and len(result["worker_deaths"]) == 3, result
    assert {death["error"] for death in result["worker_deaths"]} == {"SystemExit: injected"}, result
    assert result["sent"] == result["failed"] == 3 and result["failures_by_type"] == {"SystemExit": 3}, result
    assert result["in_flight_at_end"] == 0, result
    assert "loadgen: FAILED: worker 0 (to http" in done.stderr and "died before the stop" in done.stderr
    assert "0 of 3 workers alive at the stop" in done.stdout, done.stdout


class Slowing(BaseHTTPRequestHandler):
    """Fast answers for a second from the first request on, then 0.5 s each: the send rate falls, as it does when
    workers are stuck."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.started = self.server.started or time.time()
        if time.time() - self.server.started > 1:
            time.sleep(0.5)
        self.send_response(200)
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args):
        pass


def test_a_falling_send_rate_is_reported_and_fails_only_when_asked(tmp_path):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Slowing)
    httpd.started, httpd.lock = None, threading.Lock()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        reported, result = run_loadgen(tmp_path, url, "--duration", "3", "--pause", "0.02", "--rate-window", "0.5")
        httpd.started = None
        failed, strict = run_loadgen(
            tmp_path, url, "--duration", "3", "--pause", "0.02", "--rate-window", "0.5", "--min-rate-share", "0.5"
        )  # fmt: skip
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert reported.returncode == 0 and result["failed"] == 0, (reported.stderr, result)
    assert len(result["send_rate_per_s"]) == 6, result
    assert result["send_rate_min_share"] < 0.5 and result["send_rate_last_third_per_s"] < result[
        "send_rate_first_third_per_s"] / 2, result  # fmt: skip
    assert failed.returncode == 1 and strict["problems"], (failed.stderr, strict)
    assert "loadgen: FAILED: the send rate fell" in failed.stderr, failed.stderr


# ---- the load balancers sampled during the load: never a moment without a server UP and ready ---------------
HAPROXY = REPO / "tests" / "fixtures" / "haproxy"  # HAProxy 2.6.12's answers (see test_lb_admin_socket.py)


def load_tool():
    spec = importlib.util.spec_from_file_location("loadgen_under_test", REPO / "tools" / "loadgen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("sample", "backend", "up"),
    [
        # h1-vllm-0 UP and ready, h1-vllm-1 DOWN in maint, h2-vllm-0 UP but drained.
        ("show_servers_state_drain_maint.txt", None, 1),
        ("show_servers_state_drain_maint.txt", "vllm", 1),
        ("show_servers_state_drain_maint.txt", "other", 0),
        # h1-vllm-0 DOWN in maint, the other two drained: none.
        ("show_servers_state_busy.txt", None, 0),
        ("show_stat_drain_maint.csv", None, 1),
        ("show_stat_drain_maint.csv", "vllm", 1),
        ("show_stat_busy.csv", None, 0),
    ],
)
def test_servers_up_and_ready_in_haproxys_answers(sample, backend, up):
    assert load_tool().up_and_ready((HAPROXY / sample).read_text(), backend) == up


def test_servers_up_and_ready_details():
    tool = load_tool()
    state = (HAPROXY / "show_servers_state_drain_maint.txt").read_text()
    ready_rows = state.replace(" 2 8 1 1 6 ", " 2 0 1 1 6 ")  # h2-vllm-0 back to ready
    assert tool.up_and_ready(ready_rows) == 2
    assert tool.up_and_ready(ready_rows.replace(" 2 0 1 1 6 ", " 2 0 0 1 6 ")) == 1  # weight 0 takes no request
    stat = (HAPROXY / "show_stat_drain_maint.csv").read_text()
    lines = stat.splitlines()
    going_down = lines[1].replace(",UP,", ",UP 1/3,")
    frontend = "vllm,FRONTEND," + ",".join(lines[1].split(",")[2:])
    assert tool.up_and_ready("\n".join([lines[0], going_down, frontend, lines[2], lines[3]])) == 1
    assert tool.up_and_ready("2\n") == 2 and tool.up_and_ready("0") == 0
    for garbage in ["", "Unknown command.\n", "# be_id be_name srv_id srv_name\n3 vllm 1 h1\n", "1\n# a b c\nx y z\n"]:
        with pytest.raises(ValueError):
            tool.up_and_ready(garbage)
    with pytest.raises(ValueError, match="srv_admin_state"):
        tool.up_and_ready("1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n3 vllm 1 h1 a 2\n")


def lb_states(path, steps):
    """Rewrite `path`, the answer an LB sample command prints, to each (seconds from the load's first request,
    text) in turn."""

    def run():
        waited = time.time() + 30
        while not SEEN and time.time() < waited:
            time.sleep(0.01)
        started = time.time()
        for at, text in steps:
            time.sleep(max(0.0, started + at - time.time()))
            path.with_suffix(".tmp").write_text(text)
            path.with_suffix(".tmp").replace(path)

    SEEN.clear()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_load_balancer_sampled_during_the_load(tmp_path, server):
    both = (HAPROXY / "show_servers_state_drain_maint.txt").read_text().replace(" 2 8 1 1 6 ", " 2 0 1 1 6 ")
    one = (HAPROXY / "show_servers_state_drain_maint.txt").read_text()
    none = (HAPROXY / "show_servers_state_busy.txt").read_text()
    lb1, lb2 = tmp_path / "lb1.txt", tmp_path / "lb2.csv"
    lb1.write_text(both)
    lb2.write_text((HAPROXY / "show_stat_drain_maint.csv").read_text())
    # One host drained from 1 s to 2.5 s: at least one server UP and ready on each LB at every sample.
    changes = lb_states(lb1, [(1, one), (2.5, both)])
    done, result = run_loadgen(
        tmp_path, server, "--duration", "4", "--pause", "0.1", "--lb-sample-cmd", f"cat {shlex.quote(str(lb1))}",
        "--lb-sample-cmd", f"cat {shlex.quote(str(lb2))}", "--lb-backend", "vllm",
    )  # fmt: skip
    changes.join()
    assert done.returncode == 0, done.stderr
    assert result["lb_up_min_by_cmd"] == [1, 1] and result["lb_up_min"] == 1, result
    assert 6 <= result["lb_samples"] <= 12 and result["lb_sample_errors"] == 0, result  # about 4 s at 1 Hz, twice
    assert result["lb_zero_up_at"] == [] and result["problems"] == [], result
    assert "servers UP and ready, least seen 1" in done.stdout, done.stdout

    # Both hosts out from 1 s to 2.6 s: a 1 Hz sample sees it, and the run fails (the requests themselves did not).
    lb1.write_text(both)
    changes = lb_states(lb1, [(1, none), (2.6, both)])
    done, result = run_loadgen(
        tmp_path, server, "--duration", "4", "--pause", "0.1", "--lb-sample-cmd", f"cat {shlex.quote(str(lb1))}",
    )  # fmt: skip
    changes.join()
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert result["failed"] == 0 and result["lb_up_min"] == 0, result
    assert result["lb_zero_up_at"] and all(0.5 <= at <= 3.5 for at in result["lb_zero_up_at"]), result
    assert "loadgen: FAILED: no server UP and ready at" in done.stderr, done.stderr


def test_a_load_balancer_sample_that_cannot_be_read(tmp_path, server):
    done, result = run_loadgen(
        tmp_path, server, "--duration", "2", "--lb-sample-cmd", "echo 'Unknown command.'",
        "--lb-sample-cmd", "exit 3", "--lb-sample-cmd", "echo 2",
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert result["lb_up_min_by_cmd"] == [None, None, 2] and result["lb_up_min"] == 2, result
    assert result["lb_sample_errors"] >= 4 and result["failed"] == 0, result
    assert "no sample of 'exit 3' could be read" in done.stderr and "exit status 3" in done.stderr, done.stderr


def test_without_the_new_options_the_output_keeps_its_fields(tmp_path, server):
    result, line = loadgen(tmp_path, server, "--duration", "1")
    for field in ("urls", "started_at", "seconds", "concurrency", "pause_s", "sent", "answered", "failed",
                  "latency_p50_s", "latency_p95_s", "long_max_tokens", "in_flight_mean", "in_flight_min",
                  "share_below_expected", "failures"):  # fmt: skip
        assert field in result, field
    assert result["lb_samples"] == 0 and result["lb_up_min"] is None and result["problems"] == [], result
    assert line.startswith(f"loadgen: {result['sent']} sent, {result['answered']} answered, 0 failed in "), line
