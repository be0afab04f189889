"""module_utils/vllm_host_probe.py: what preflight asks the host, in the facts module's one run, read for real here."""

import getpass
import json
import os
import socket
import sys

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils import vllm_host_probe
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_host_probe import probe


def listening():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def test_service_names_a_foreign_listener_and_what_the_host_has():
    with listening() as listener:
        port = listener.getsockname()[1]
        found = probe({"service": {"user": "no-such-service-user", "listen_address": "localhost"}})["service"]
    (ours,) = [entry for entry in found["listeners"] if entry["port"] == port]
    assert (ours["pid"], ours["unit"]) == (os.getpid(), "other")
    assert "127.0.0.1" in found["listen_ips"] or "::1" in found["listen_ips"]
    assert found["shm_free_mib"] > 0
    assert int(found["cap_eff"], 16) >= 0
    assert found["cgroup2"] == cgroup2_on_sys_fs_cgroup()


def test_service_reads_the_room_for_a_model_version_and_what_it_holds_already(tmp_path):
    version = tmp_path / "models" / ".versions" / "tiny@0123456789abcdef"
    (version / "sub").mkdir(parents=True)
    (version / "config.json").write_bytes(b"x" * 10)
    (version / "sub" / "weights").write_bytes(b"y" * 1000)
    spec = {"user": "nobody", "listen_address": "localhost", "models_dir": str(tmp_path / "models"),
            "model_version": str(version)}  # fmt: skip
    found = probe({"service": spec})["service"]
    stat = os.statvfs(tmp_path)
    assert found["model_staged_bytes"] == 1010 and found["models_dir"] == str(tmp_path / "models")
    assert abs(found["models_free_bytes"] - stat.f_bavail * stat.f_frsize) < 64 * 1024**2
    # A home that does not exist yet: the room of its nearest existing directory; nothing staged.
    spec.update(models_dir=str(tmp_path / "new" / "models"), model_version=str(tmp_path / "new" / "models" / "v"))
    found = probe({"service": spec})["service"]
    assert found["model_staged_bytes"] == 0 and found["models_free_bytes"] > 0
    # No controller model (a hub model): nothing read.
    assert "models_free_bytes" not in probe({"service": {"user": "nobody", "listen_address": "localhost"}})["service"]


def cgroup2_on_sys_fs_cgroup():
    """Whether the file system on /sys/fs/cgroup is cgroup2 (v2 alone), as /proc/self/mountinfo says: the last mount
    there is the one seen; a hybrid host's is a tmpfs of v1 hierarchies (v2 in its unified/)."""
    fstype = None
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            if fields[4] == "/sys/fs/cgroup":
                fstype = fields[fields.index("-") + 1]
    return fstype == "cgroup2"


def test_listeners_over_sock_diag_are_the_ones_proc_net_tcp_lists():
    listeners = [listening()]
    if socket.has_ipv6:
        try:
            v6 = socket.socket(socket.AF_INET6)
            v6.bind(("::1", 0))
            v6.listen()
            listeners.append(v6)
        except OSError:
            pass  # no IPv6 in this sandbox: IPv4 alone
    # A connected socket is no listener: neither reader may list it.
    client = socket.create_connection(listeners[0].getsockname()[:2])
    client_port = client.getsockname()[1]
    try:
        over_diag = vllm_host_probe._listening_inodes_diag()
        from_proc = vllm_host_probe._listening_inodes_proc()
        ports = {sock.getsockname()[1] for sock in listeners}
    finally:
        client.close()
        for sock in listeners:
            sock.close()
    assert over_diag == from_proc
    assert ports <= {port for port, _unused in over_diag.values()}
    assert client_port not in {port for port, _unused in over_diag.values()}
    assert {uid for port, uid in over_diag.values() if port in ports} == {os.getuid()}


def test_listeners_are_read_from_proc_where_sock_diag_is_refused(monkeypatch):
    def refused(*_):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(vllm_host_probe, "ask", refused)
    with listening() as listener:
        port = listener.getsockname()[1]
        found = vllm_host_probe._listening_inodes()
    assert port in {port for port, _unused in found.values()}


def test_service_judges_a_readable_process_by_its_cgroup_and_an_unknown_name_resolves_to_nothing():
    with listening() as listener:
        port = listener.getsockname()[1]
        found = probe({"service": {"user": getpass.getuser(), "listen_address": "no-such-host.invalid"}})["service"]
    # Our own process is readable, so its cgroup decides, not its user (the service user here): not a vllm@ unit.
    assert [entry["unit"] for entry in found["listeners"] if entry["port"] == port] == ["other"]
    assert found["listen_ips"] == []


def test_build_reads_python_memory_and_the_least_free_disk(tmp_path):
    found = probe(
        {"build": {"python": sys.executable, "dirs": [str(tmp_path / "not" / "yet" / "there"), str(tmp_path)]}}
    )
    build = found["build"]
    assert build["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}" and build["python_error"] == ""
    assert build["mem_available_kib"] > 0
    stat = os.statvfs(tmp_path)
    assert 0 < build["disk_free_kib"] <= stat.f_blocks * stat.f_frsize // 1024


def test_build_names_an_interpreter_that_does_not_run(tmp_path):
    build = probe({"build": {"python": str(tmp_path / "no-python"), "dirs": [str(tmp_path)]}})["build"]
    assert build["python"] == "" and "no-python" in build["python_error"]


def install_spec(tmp_path, python=sys.executable):
    return {
        "install": {
            "python": python,
            "root": str(tmp_path / "opt-vllm"),
            "version": "0.32.0",
            "host_wheelhouse": str(tmp_path / "wheelhouse"),
            "active_link": str(tmp_path / "opt-vllm" / "current"),
        }
    }


def test_install_reads_the_python_the_records_of_this_version_and_the_active_link(tmp_path):
    root = tmp_path / "opt-vllm"
    for name, record in {
        "0.32.0-x86_64": {"wanted": {"version": "0.32.0"}},
        "0.32.0-x86_64-r0123abcd": {"wanted": {"version": "0.32.0", "torch": "other"}},
        "0.31.0-x86_64": {"wanted": {"version": "0.31.0"}},
    }.items():
        (root / name).mkdir(parents=True)
        (root / name / "vllm-install.json").write_text(json.dumps(record))
    (root / "0.32.0-x86_64-r-broken").mkdir()
    (root / "0.32.0-x86_64-r-broken" / "vllm-install.json").write_text("{half a record")
    (root / "current").symlink_to(root / "0.32.0-x86_64")
    found = probe(install_spec(tmp_path))["install"]
    assert found["python_version"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert found["python_tag"] == f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert found["python_ok"] and found["python_error"] == ""
    # Only this version's directories, a broken record read as empty.
    assert found["records"] == {
        str(root / "0.32.0-x86_64"): {"wanted": {"version": "0.32.0"}},
        str(root / "0.32.0-x86_64-r-broken"): {},
        str(root / "0.32.0-x86_64-r0123abcd"): {"wanted": {"version": "0.32.0", "torch": "other"}},
    }
    assert found["active"] == str(root / "0.32.0-x86_64")
    assert found["same_fs"] and found["root_mount"] == found["wheelhouse_mount"]
    assert found["root_free_bytes"] > 0 and found["glibc"].count(".") == 1


def test_install_names_the_directories_a_rollout_snapshot_or_record_names(tmp_path):
    root, real = tmp_path / "opt-vllm", tmp_path / "data" / "opt-vllm"
    for name in ("0.32.0-x86_64", "0.32.0-x86_64-r0123abcd", "0.32.0-x86_64-r4567cdef"):
        (real / name).mkdir(parents=True)
        (real / name / "vllm-install.json").write_text("{}")
    root.symlink_to(real)  # the install root behind a symlink: compared resolved
    snapshots = tmp_path / "rollout"
    (snapshots / "r1").mkdir(parents=True)
    (snapshots / "r1" / "active").write_text(str(root / "0.32.0-x86_64") + "\n")
    (snapshots / "state.json").write_text(json.dumps({"from": str(real / "0.32.0-x86_64-r0123abcd")}))
    spec = install_spec(tmp_path)
    spec["install"]["snapshot_dirs"] = [str(snapshots), str(tmp_path / "none")]
    found = probe(spec)["install"]
    assert found["in_snapshots"] == [str(root / "0.32.0-x86_64"), str(root / "0.32.0-x86_64-r0123abcd")]


def test_install_on_a_new_host_and_a_python_that_does_not_run(tmp_path):
    found = probe(install_spec(tmp_path, python=str(tmp_path / "no-python")))["install"]
    assert (found["python_version"], found["python_ok"], found["records"], found["active"]) == ("", False, {}, "")
    assert "no-python" in found["python_error"]


def test_install_says_when_venv_is_missing(tmp_path):
    # A Python whose venv module cannot be imported: the version is still told, python_ok is not.
    shim = tmp_path / "python-without-venv"
    shim.write_text(f"#!{sys.executable}\nimport sys\nsys.modules['venv'] = None\nexec(sys.argv[2])\n")
    shim.chmod(0o755)
    found = probe(install_spec(tmp_path, python=str(shim)))["install"]
    assert found["python_version"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert not found["python_ok"] and "venv" in found["python_error"]


def test_an_unknown_section_is_refused():
    with pytest.raises(ValueError, match="unknown section"):
        probe({"gpu": {}})


def test_this_interpreter_is_asked_in_process_with_the_answers_a_new_one_gives(tmp_path):
    # A wrapper is another file, so it is started; the module's own interpreter is asked in its process.
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    started = probe(install_spec(tmp_path, python=str(wrapper)))["install"]
    in_process = probe(install_spec(tmp_path))["install"]
    keys = ("python_version", "python_tag", "python_ok", "python_error")
    assert [started[k] for k in keys] == [in_process[k] for k in keys]
    build = probe({"build": {"python": str(wrapper), "dirs": [str(tmp_path)]}})["build"]
    assert build["python"] == in_process["python_version"]


def haproxy_socket(path, answer):
    """A unix socket at path that answers one command with answer, as HAProxy's admin socket does (then closes);
    returns (the thread, the commands it got)."""
    import threading

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    asked = []

    def serve():
        with server:
            conn, _unused = server.accept()
            with conn:
                asked.append(conn.recv(4096).decode())
                conn.sendall(answer.encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, asked


def test_a_load_balancers_server_states_are_read_from_its_admin_socket(tmp_path):
    from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

    answer = (REPO / "tests" / "fixtures" / "haproxy" / "show_servers_state_drain_maint.txt").read_text()
    thread, asked = haproxy_socket(tmp_path / "admin.sock", answer)
    found = probe({"loadbalancer": {"socket": str(tmp_path / "admin.sock"), "backend": "vllm"}})["loadbalancer"]
    thread.join(5)
    assert asked == ["show servers state vllm\n"]
    assert found == {"servers_state": answer, "error": ""}


def test_a_load_balancer_without_an_answering_socket_says_why(tmp_path):
    missing = probe({"loadbalancer": {"socket": str(tmp_path / "none.sock"), "backend": "vllm"}})["loadbalancer"]
    assert missing == {"servers_state": None, "error": f"no admin socket at {tmp_path / 'none.sock'}"}
    (tmp_path / "file.sock").write_text("")  # a path that is no socket (a socket file left by a killed HAProxy)
    refused = probe({"loadbalancer": {"socket": str(tmp_path / "file.sock"), "backend": "vllm"}})["loadbalancer"]
    assert refused["servers_state"] is None and "did not answer" in refused["error"]


def test_the_storage_probe_reads_the_size_of_the_file_system_of_a_path_not_made_yet(tmp_path):
    found = probe({"storage": {"path": str(tmp_path / "not" / "yet" / "metrics2")}})["storage"]
    stat = os.statvfs(tmp_path)
    assert found["size_bytes"] == stat.f_blocks * stat.f_frsize > 0
    assert os.path.ismount(found["mount"]) and str(tmp_path).startswith(found["mount"])
