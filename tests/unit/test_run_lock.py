"""module_utils/vllm_run_lock.py: who may take a host's run lock, and the file under a flock."""

import json
from pathlib import Path

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_run_lock import (
    LockError,
    acquire,
    decide,
    new_holder,
    release,
)

NOW = 1_800_000_000
IDENTITY = {"machine_id": "m1", "pid_ns": "pid:[1]", "boot_id": "b1"}


def holder(run_id, lease=3600, now=NOW):
    return new_holder(run_id, "ops@ctl", "ctl", IDENTITY, 10, "99", "site.yml", now - 60, now, lease)


ME, OTHER = holder("run-me"), holder("run-other")


@pytest.mark.parametrize("current", [{}, ME, holder("run-me", lease=5)], ids=["free", "ours", "ours-renewed"])
def test_a_free_or_own_lock_is_taken(current):
    assert decide(current, ME, NOW) == ("take", "")


def test_a_live_run_on_this_controller_is_refused_with_who_and_the_fix():
    verdict, message = decide(OTHER, ME, NOW, holder_alive=True)
    assert verdict == "refuse"
    assert "held by run run-other (ops@ctl, ansible-playbook pid 10 on ctl, site.yml)" in message
    assert "still running on this controller" in message
    assert message.endswith("-e vllm_fleet_break_lock=run-other")


def test_a_run_whose_process_ended_is_taken_over():
    verdict, message = decide(OTHER, ME, NOW, holder_alive=False)
    assert verdict == "take_over" and "process has ended" in message


@pytest.mark.parametrize(
    ("lease", "said"), [(3600, "its lease runs until"), (-60, "its lease ended at")], ids=["lease", "ended"]
)
def test_another_controllers_run_is_refused_even_when_its_lease_ended(lease, said):
    verdict, message = decide(holder("run-other", lease=lease), ME, NOW, holder_alive=None)
    assert verdict == "refuse" and said in message and "another controller" in message


def test_the_break_flag_takes_over_only_the_run_it_names():
    assert decide(OTHER, ME, NOW, "run-else", None)[0] == "refuse"
    assert decide(OTHER, ME, NOW, "run-other", None)[0] == "take_over"


def test_acquire_and_release_on_disk(tmp_path):
    path = str(tmp_path / "sub" / "run.lock")
    assert acquire(path, OTHER)["acquired"]
    assert json.loads(Path(path).read_text())["run_id"] == "run-other"
    taken = acquire(path, ME)
    assert not taken["acquired"] and taken["holder"]["run_id"] == "run-other"
    # A compare and swap: a lock replaced meanwhile is not taken over.
    assert not acquire(path, ME, replace="run-gone")["acquired"]
    assert release(path, "run-me") == {"released": False, "changed": False, "holder": OTHER}
    over = acquire(path, ME, replace="run-other")
    assert over["acquired"] and over["replaced"]["run_id"] == "run-other"
    assert release(path, "run-me")["released"]
    assert Path(path).read_text() == ""
    assert acquire(path, OTHER)["acquired"]


def test_check_mode_writes_nothing(tmp_path):
    path = tmp_path / "run.lock"
    assert acquire(str(path), ME, check_mode=True)["acquired"] and not path.exists()
    path.write_text(json.dumps(ME))
    assert release(str(path), "run-me", check_mode=True)["released"]
    assert json.loads(path.read_text()) == ME


@pytest.mark.parametrize("text", ["not json", "[]", '{"owner": "x"}'])
def test_a_file_that_is_not_a_lock_is_named(tmp_path, text):
    path = tmp_path / "run.lock"
    path.write_text(text)
    with pytest.raises(LockError, match=f"{path}: not a run lock .*; fix: remove it if no run is changing this host"):
        acquire(str(path), ME)
