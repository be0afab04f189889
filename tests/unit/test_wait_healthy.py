"""roles/vllm_service/files/wait_healthy.py: the health gate waits while the start makes
progress and gives up on a failed unit, on restarts, on a stall, and at the ceiling."""

import importlib.util
from pathlib import Path

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
