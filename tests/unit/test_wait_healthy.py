"""roles/vllm_service/files/wait_healthy.py: the health gate waits while the start makes
progress and gives up on a failed unit, on restarts, on a stall, and at the ceiling."""

import importlib.util
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "wait_healthy.py"
spec = importlib.util.spec_from_file_location("wait_healthy", SCRIPT)
wait_healthy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wait_healthy)


class FakeUnit:
    """A unit seen through the seams of wait(): a clock, its journal, its state, its /health."""

    def __init__(self, healthy_at=None, journal_every=None, cpu_every=None, failed_at=None, restart_every=None):
        self.now = 0.0
        self.healthy_at, self.journal_every, self.cpu_every = healthy_at, journal_every, cpu_every
        self.failed_at, self.restart_every = failed_at, restart_every

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds

    def state(self, _unit):
        restarts = int(self.now // self.restart_every) if self.restart_every else 0
        cpu = int(self.now // self.cpu_every) * 2 * 10**9 if self.cpu_every else 5 * 10**9
        active = "failed" if self.failed_at is not None and self.now >= self.failed_at else "activating"
        return {"ActiveState": active, "NRestarts": str(restarts), "Result": "exit-code", "CPUUsageNSec": str(cpu)}

    def cursor(self, _unit):
        return f"c{int(self.now // self.journal_every)}" if self.journal_every else "c0"

    def health(self, _address, _port):
        return self.healthy_at is not None and self.now >= self.healthy_at

    def wait(self, ceiling=3600, max_restarts=2, stall=600):
        return wait_healthy.wait(
            "127.0.0.1", 8000, "vllm@vllm-0.service", ceiling, max_restarts, stall,
            clock=self.clock, sleep=self.sleep, state_of=self.state, cursor_of=self.cursor, health_of=self.health,
        )


def test_a_slow_start_that_logs_is_waited_for_beyond_the_old_fixed_600_s():
    unit = FakeUnit(healthy_at=1500, journal_every=60)
    assert unit.wait() == (True, "")
    assert unit.now >= 1500


def test_cpu_use_counts_as_progress_when_the_journal_is_quiet():
    unit = FakeUnit(healthy_at=1200, cpu_every=30)
    assert unit.wait(stall=300) == (True, "")


def test_a_silent_idle_start_gives_up_after_the_stall_limit():
    unit = FakeUnit(healthy_at=None)
    ok, reason = unit.wait(stall=120)
    assert not ok and "no progress" in reason and "120 s" in reason
    assert 120 <= unit.now < 130


def test_the_ceiling_holds_however_busy_the_start():
    unit = FakeUnit(healthy_at=None, journal_every=5)
    ok, reason = unit.wait(ceiling=900, stall=600)
    assert not ok and "ceiling of 900 s" in reason
    assert 900 <= unit.now < 910


def test_a_failed_unit_is_reported_at_once():
    unit = FakeUnit(failed_at=10, journal_every=1)
    ok, reason = unit.wait()
    assert not ok and "failed (exit-code)" in reason
    assert unit.now < 15


def test_restarts_stop_the_wait():
    unit = FakeUnit(restart_every=20, journal_every=1)
    ok, reason = unit.wait(max_restarts=2)
    assert not ok and "restarted 2 times" in reason
    assert unit.now < 45


# ---- the real script: /health over a local HTTP server, systemctl and journalctl stand-ins on PATH ----


@pytest.fixture
def health_server():
    """/health answers 503 for the first `busy` requests, then 200."""
    state = {"busy": 0, "seen": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            state["seen"] += 1
            ok = self.path == "/health" and state["seen"] > state["busy"]
            self.send_response(200 if ok else 503)
            self.end_headers()

        def log_message(self, *_):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1], state
    httpd.shutdown()


def test_healthy_reads_the_status_of_a_real_health_endpoint(health_server):
    port, state = health_server
    state["busy"] = 1
    assert wait_healthy.healthy("127.0.0.1", port) is False  # 503 while starting
    # A wildcard listen address is asked on 127.0.0.1 ("" and "*" reach nothing themselves;
    # 0.0.0.0 does on Linux, so it cannot show the mapping).
    assert wait_healthy.healthy("", port) is True
    assert wait_healthy.healthy("*", port) is True
    assert state["seen"] == 3


def test_healthy_is_false_when_nothing_listens():
    assert wait_healthy.healthy("127.0.0.1", 1) is False


def stand_ins(tmp_path, active_state, result="exit-code"):
    """systemctl and journalctl on PATH that answer for one unit the way systemd's do."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(
        f"#!/bin/sh\nprintf 'ActiveState={active_state}\\nNRestarts=0\\nResult={result}\\nCPUUsageNSec=5000000000\\n'\n"
    )
    (bin_dir / "journalctl").write_text(
        "#!/bin/sh\n"
        'case "$*" in *json*) echo \'{"__CURSOR": "s=1"}\' ;; *) echo "ValueError: no model"; echo "exited" ;; esac\n'
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run_script(port, env, ceiling=30):
    argv = [sys.executable, str(SCRIPT), "127.0.0.1", str(port), "vllm@vllm-0.service", str(ceiling), "2", "600"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_the_script_waits_for_a_starting_instance_and_exits_0(tmp_path, health_server):
    port, state = health_server
    state["busy"] = 1
    result = run_script(port, stand_ins(tmp_path, "activating"))
    answer = json.loads(result.stdout)
    assert result.returncode == 0, result.stderr
    assert answer["healthy"] is True and answer["reason"] == "" and answer["journal"] == []
    assert answer["seconds"] >= wait_healthy.POLL_SECONDS  # it waited one round for the 503
    assert f"127.0.0.1:{port}" in answer["waited_for"]


def test_the_script_gives_up_on_a_failed_unit_with_its_journal(tmp_path, health_server):
    port, state = health_server
    state["busy"] = 10**6
    result = run_script(port, stand_ins(tmp_path, "failed"))
    answer = json.loads(result.stdout)
    assert result.returncode == 1
    assert answer["healthy"] is False
    assert answer["reason"] == "vllm@vllm-0.service failed (exit-code)"
    assert answer["journal"] == ["ValueError: no model", "exited"]
