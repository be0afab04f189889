"""roles/vllm_build/files/follow_build.py: one progress round of the async compile, over real
job files as async_wrapper writes them and a real build.log."""

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_build" / "files" / "follow_build.py"
spec = importlib.util.spec_from_file_location("follow_build", SCRIPT)
follow_build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(follow_build)

RUNNING = {"started": True, "finished": False, "ansible_job_id": "j1"}
DONE = {"rc": 1, "cmd": ["build.sh"], "changed": True}


def work_dir(tmp_path, log, started_ago=125):
    (tmp_path / "build.log").write_text(log)
    (tmp_path / "build.started").write_text(f"{int(time.time()) - started_ago}\n")
    return tmp_path


def run(work, job_file, wait="0"):
    argv = [sys.executable, str(SCRIPT), str(work), str(job_file), wait]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_running_job_reports_ninjas_latest_step_and_the_elapsed_time(tmp_path):
    work = work_dir(tmp_path, "-- Configuring\n[1/493] Building CXX\n  [212/493] Building CXX object x.o\n")
    job = tmp_path / "job"
    job.write_text(json.dumps(RUNNING))
    round_ = run(work, job)
    assert round_["state"] == "running"
    assert round_["step"] == "ninja [212/493]"
    assert 125 <= round_["seconds"] < 135


def test_setup_py_after_ninja_is_the_step(tmp_path):
    work = work_dir(tmp_path, "[493/493] Linking\nrunning install_lib\ncopying x\n")
    job = tmp_path / "job"
    job.write_text(json.dumps(DONE))
    round_ = run(work, job)
    assert (round_["state"], round_["step"]) == ("finished", "setup.py install_lib")


def test_the_async_timeout_result_is_finished_and_a_missing_job_is_gone(tmp_path):
    work = work_dir(tmp_path, "")
    job = tmp_path / "job"
    job.write_text(json.dumps({"msg": "Timeout exceeded", "failed": True, "child_pid": 4}))
    assert run(work, job)["state"] == "finished"
    assert run(work, tmp_path / "no-such-job")["state"] == "gone"
    assert run(work, tmp_path / "no-such-job")["step"] == "starting"


def test_no_build_started_yet_is_zero_seconds(tmp_path):
    job = tmp_path / "job"
    job.write_text(json.dumps(RUNNING))
    assert run(tmp_path, job) == {"state": "running", "step": "starting", "seconds": 0}


def test_the_round_ends_when_the_job_ends_not_at_the_wait(tmp_path):
    work = work_dir(tmp_path, "[3/3] x\n")
    job = tmp_path / "job"
    job.write_text(json.dumps(RUNNING))
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds
        if clock[0] >= 10:
            job.write_text(json.dumps(DONE))

    result = follow_build.follow(str(work), str(job), 60, clock=lambda: clock[0], sleep=sleep)
    assert result["state"] == "finished"
    assert clock[0] == 10


def test_a_job_still_running_waits_the_whole_round_then_says_running(tmp_path):
    job = tmp_path / "job"
    job.write_text(json.dumps(RUNNING))
    clock = [0.0]

    def sleep(seconds):
        assert 0 < seconds <= 5
        clock[0] += seconds

    assert follow_build.follow(str(tmp_path), str(job), 12, clock=lambda: clock[0], sleep=sleep)["state"] == "running"
    assert clock[0] == 12


def test_a_half_written_job_file_counts_as_running(tmp_path):
    job = tmp_path / "job"
    job.write_text('{"started": tr')
    assert follow_build.job_state(str(job)) == "running"


def test_wrong_arguments_are_refused():
    result = subprocess.run([sys.executable, str(SCRIPT), "only-one"], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "usage" in result.stderr
