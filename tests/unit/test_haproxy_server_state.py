"""roles/loadbalancer/files/haproxy_server_state.py, the unit's and the rollout's state saver: what a stop keeps when
HAProxy's admin socket cannot answer (a crashed or killed HAProxy; issue 41 item 7, review N4). The real HAProxy runs
it in molecule/loadbalancer (killed during a drain, and a power loss after a re-enable)."""

import importlib.util
import socket
import threading

import pytest
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

HELPER = REPO / "roles" / "loadbalancer" / "files" / "haproxy_server_state.py"
SAMPLE = (REPO / "tests" / "fixtures" / "haproxy" / "show_servers_state_drain_maint.txt").read_text()
CONFIG = """global
    stats socket /run/haproxy/admin.sock mode 660 level admin

backend vllm
    server h1-vllm-0 127.0.0.1:18001 check
    server h1-vllm-1 127.0.0.1:18002 check
    server h2-vllm-0 127.0.0.1:18001 check
"""


@pytest.fixture(scope="module")
def helper():
    spec = importlib.util.spec_from_file_location("haproxy_server_state", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def paths(tmp_path):
    (tmp_path / "haproxy.cfg").write_text(CONFIG)
    return tmp_path


def save(helper, paths, socket_path, on_failure):
    return helper.main(["save", "--on-failure", on_failure, "--socket", str(socket_path), "--config",
                        str(paths / "haproxy.cfg"), "--state", str(paths / "state"), "--timeout", "2"])  # fmt: skip


def answering(path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def serve():
        with server:
            conn, _unused = server.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(SAMPLE.encode())

    threading.Thread(target=serve, daemon=True).start()


def test_a_save_writes_what_the_socket_says_fitted_to_the_configuration(helper, paths, capsys):
    answering(paths / "admin.sock")
    assert save(helper, paths, paths / "admin.sock", "fail") == 0
    rows = helper.parse_state((paths / "state").read_text())[1]
    saved = {row["srv_name"]: row["srv_admin_state"] for row in rows}
    assert saved == {"h1-vllm-0": "0", "h1-vllm-1": "1", "h2-vllm-0": "8"}
    assert "saved 3 servers (1 drained, 1 in maintenance)" in capsys.readouterr().err


@pytest.mark.parametrize("dead", ["stale socket file", "no socket"])
def test_a_stop_whose_dump_fails_keeps_the_last_saved_file(helper, paths, capsys, dead):
    # What the rollout's last save wrote: h2 drained. HAProxy then died: its socket file is left (connect refused)
    # or gone with /run.
    (paths / "state").write_text(SAMPLE)
    if dead == "stale socket file":
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(paths / "admin.sock"))
        stale.close()  # bound, never listening: connect() is refused, as after a SIGKILL
    assert save(helper, paths, paths / "admin.sock", "keep") == 0
    assert (paths / "state").read_text() == SAMPLE
    assert not (paths / "state.stale").exists()
    assert "kept as its last save wrote it" in capsys.readouterr().err


def test_a_reload_whose_dump_fails_is_refused_and_the_file_stays(helper, paths, capsys):
    (paths / "state").write_text(SAMPLE)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(paths / "admin.sock"))
    stale.close()
    assert save(helper, paths, paths / "admin.sock", "fail") == 1
    assert (paths / "state").read_text() == SAMPLE
    assert "the reload is refused" in capsys.readouterr().err


def test_the_old_put_aside_choice_is_gone(helper, paths):
    with pytest.raises(SystemExit):
        save(helper, paths, paths / "admin.sock", "discard")
