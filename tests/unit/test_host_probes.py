"""The preflight probe scripts (one remote run each): roles/vllm_service/files/service_probe.py and
roles/vllm_build/files/build_host_probe.py, run as Ansible's script module runs them."""

import getpass
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROLES = Path(__file__).resolve().parents[2] / "roles"
SERVICE_PROBE = ROLES / "vllm_service" / "files" / "service_probe.py"
BUILD_PROBE = ROLES / "vllm_build" / "files" / "build_host_probe.py"


def run(script, *args):
    out = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_service_probe_names_a_foreign_listener_and_what_the_host_has():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        found = run(SERVICE_PROBE, "no-such-service-user", "localhost", port, port + 1)
    (ours,) = found["listeners"]
    assert (ours["port"], ours["pid"], ours["unit"]) == (port, os.getpid(), "other")
    assert "127.0.0.1" in found["listen_ips"] or "::1" in found["listen_ips"]
    assert found["shm_free_mib"] > 0
    assert int(found["cap_eff"], 16) >= 0
    assert found["cgroup2"] == os.path.exists("/sys/fs/cgroup/cgroup.controllers")


def test_service_probe_judges_a_readable_process_by_its_cgroup_and_an_unknown_name_resolves_to_nothing():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        found = run(SERVICE_PROBE, getpass.getuser(), "no-such-host.invalid", port)
    # Our own process is readable, so its cgroup decides, not its user (the service user here): not a vllm@ unit.
    assert [entry["unit"] for entry in found["listeners"]] == ["other"]
    assert found["listen_ips"] == []


def test_build_probe_reads_python_memory_and_the_least_free_disk(tmp_path):
    found = run(BUILD_PROBE, sys.executable, tmp_path / "not" / "yet" / "there", tmp_path)
    assert found["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}" and found["python_error"] == ""
    assert found["mem_available_kib"] > 0
    stat = os.statvfs(tmp_path)
    assert 0 < found["disk_free_kib"] <= stat.f_blocks * stat.f_frsize // 1024


def test_build_probe_names_an_interpreter_that_does_not_run(tmp_path):
    found = run(BUILD_PROBE, tmp_path / "no-python", tmp_path)
    assert found["python"] == "" and "no-python" in found["python_error"]
