"""roles/vllm_service/files/vllm_liveness.py: a wedged instance (its unit active, its /health silent) is restarted
after the configured failures in a row, and only one that answered in its current activation; against real HTTP
servers (one that answers, one that accepts and never answers) for the probe."""

import importlib.util
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "vllm_liveness.py"
spec = importlib.util.spec_from_file_location("vllm_liveness", SCRIPT)
liveness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(liveness)

CONFIG = {"address": "127.0.0.1", "interval": 5, "timeout": 1, "failures": 3}


class Host:
    """An instance seen through check()'s seams: its unit's activation, its /health, the restarts asked."""

    def __init__(self):
        self.active, self.since, self.answers, self.restarts = "active", "100", True, []

    def run(self, state, restart_ok=True):
        def restart(unit):
            self.restarts.append(unit)
            return (True, "") if restart_ok else (False, "Access denied")

        return liveness.check(
            "vllm-0", 8000, CONFIG, state,
            activation_of=lambda unit: (self.active, self.since),
            health_of=lambda *args: ("", True) if self.answers else ("/health: TimeoutError: timed out", False),
            restart_of=restart,
        )  # fmt: skip


def test_an_instance_that_answered_and_then_stops_is_restarted_after_the_failures_in_a_row():
    host, state = Host(), {}
    state, line = host.run(state)
    assert state == {"activation": "100", "answered": True, "failures": 0} and line == ""
    host.answers = False
    state, line = host.run(state)
    assert state["failures"] == 1 and line == "vllm@vllm-0.service: /health: TimeoutError: timed out (1 of 3 in a row)"
    state, _line = host.run(state)
    assert state["failures"] == 2 and host.restarts == []
    state, line = host.run(state)
    assert host.restarts == ["vllm@vllm-0.service"] and line.endswith("(3 of 3 in a row): restarted it")
    assert state == {}


def test_one_answer_between_failures_starts_the_count_again():
    host, state = Host(), {}
    state, _line = host.run(state)
    for answers in (False, False, True, False, False, True, False, False):
        host.answers = answers
        state, _line = host.run(state)
    assert host.restarts == [] and state["failures"] == 2


def test_an_instance_that_never_answered_in_its_activation_is_starting_and_is_not_counted():
    host, state = Host(), {}
    host.answers = False
    for _run in range(10):
        state, line = host.run(state)
        assert line == ""
    assert host.restarts == [] and state == {"activation": "100", "answered": False, "failures": 0}


def test_a_restart_by_anyone_else_begins_a_new_activation_and_the_count_again():
    host, state = Host(), {}
    state, _line = host.run(state)
    host.answers = False
    state, _line = host.run(state)
    state, _line = host.run(state)
    host.since = "200"  # the rollout (or a person) restarted it: starting again, not yet answered
    state, line = host.run(state)
    assert state == {"activation": "200", "answered": False, "failures": 0} and line == ""
    assert host.restarts == []


@pytest.mark.parametrize("active", ["inactive", "failed", "activating", "deactivating"])
def test_a_unit_that_is_not_active_is_left_to_systemd(active):
    host = Host()
    host.active, host.answers = active, False
    state, line = host.run({"activation": "100", "answered": True, "failures": 2})
    assert (state, line, host.restarts) == ({}, "", [])


def test_a_refused_restart_is_said_and_counted_on():
    host = Host()
    host.answers = False
    state, line = host.run({"activation": "100", "answered": True, "failures": 2}, restart_ok=False)
    assert line.endswith("the restart failed: Access denied") and state["failures"] == 3


class Answers(BaseHTTPRequestHandler):
    def do_GET(self):
        code = 200 if self.path == "/health" else 404
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_probe_against_a_real_server_that_answers_and_one_that_holds_the_port_and_never_answers():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    wedged = socket.socket()
    wedged.bind(("127.0.0.1", 0))
    wedged.listen(8)  # the kernel accepts connections; nobody reads them (a stopped process)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    try:
        assert liveness.health("0.0.0.0", server.server_address[1], 1, None) == ("", True)
        why, ok = liveness.health("127.0.0.1", wedged.getsockname()[1], 1, None)
        assert not ok and "timed out" in why, why
        why, ok = liveness.health("127.0.0.1", closed.getsockname()[1], 1, None)
        assert not ok and "ConnectionRefusedError" in why, why
    finally:
        server.shutdown()
        wedged.close()
        closed.close()


def test_main_keeps_each_instances_state_between_runs_and_reads_nothing_without_instances(tmp_path, monkeypatch):
    config = tmp_path / "liveness.json"
    config.write_text(json.dumps(dict(CONFIG, tls=False, ca="", instances={"vllm-0": 8000, "vllm-1": 8001})))
    monkeypatch.setattr(liveness, "unit_activation", lambda unit: ("active", "7"))
    monkeypatch.setattr(liveness, "health", lambda address, port, *rest: ("", True) if port == 8000 else ("x", False))
    assert liveness.main(str(config), str(tmp_path / "run")) == 0
    kept = json.loads((tmp_path / "run" / "vllm-0.json").read_text())
    assert kept == {"activation": "7", "answered": True, "failures": 0}
    assert json.loads((tmp_path / "run" / "vllm-1.json").read_text())["answered"] is False
    config.write_text(json.dumps(dict(CONFIG, instances={})))
    assert liveness.main(str(config), str(tmp_path / "elsewhere")) == 0 and not (tmp_path / "elsewhere").exists()
