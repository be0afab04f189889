"""A host whose server a load balancer holds out of the pool (drain, maint) is not converged (issue 41 item 7; review
day2-fleet-shape N5): its witnesses are on the host and all hold, but a run lost during its drain, an HAProxy that
restored an older state file, or a person left the server drained, and a re-run that skipped it would leave it
there. Through the real preflight action on controller-local hosts (test_preflight's fleet): the load balancer's
preflight reads `show servers state` from its admin socket, here a unix socket this test serves with HAProxy
2.6.12's answer format (the columns of tests/fixtures/haproxy/)."""

import socket
import threading

import pytest
from test_converged_monitoring import RECORD, decisions
from test_preflight import controller_inputs, run_preflight  # noqa: F401  # pylint: disable=unused-import

HEADER = (
    "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight"
    " srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state"
    " bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr"
    " srv_agent_addr srv_agent_port"
)


def answer(admin_states):
    """`show servers state vllm` with each server UP and the given srv_admin_state (0 ready, 1 maint, 8 drain)."""
    rows = [
        f"3 vllm {i} {name} 127.0.0.1 2 {admin} 1 1 10 6 3 2 6 0 0 0 - {18001 + i} - 0 0 - - 0"
        for i, (name, admin) in enumerate(sorted(admin_states.items()), start=1)
    ]
    return "\n".join(["1", HEADER, *rows]) + "\n\n"


class AdminSocket:
    """A unix socket that answers every connection with the current `show servers state` answer."""

    def __init__(self, path, states):
        self.states, self.asked = dict(states), []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _unused = self.server.accept()
            except OSError:
                return
            with conn:
                self.asked.append(conn.recv(4096).decode())
                conn.sendall(answer(self.states).encode())


@pytest.fixture
def fleet(tmp_path_factory):
    records = tmp_path_factory.mktemp("records")
    record = {"vllm_fleet_converged_record": str(records) + "/{{ inventory_hostname }}.json"}
    sock_dir = tmp_path_factory.mktemp("lb")
    lb_socket = AdminSocket(sock_dir / "admin.sock", {"good-1-vllm-0": 0, "good-2-vllm-0": 0})
    hosts = {"good-1": dict(record), "good-2": dict(record)}
    # Not under /run/haproxy, which only a hardened unit requires.
    lb = dict(record, loadbalancer_admin_socket=str(sock_dir / "admin.sock"), loadbalancer_systemd_hardening=False)
    loadbalancers = {"lb-1": lb}
    yield hosts, loadbalancers, lb_socket
    lb_socket.server.close()


def test_a_host_held_out_of_the_pool_on_a_load_balancer_takes_the_full_run(
    tmp_path, machine_root, controller_inputs, fleet  # noqa: F811 (the fixture imported above)
):
    hosts, loadbalancers, lb_socket = fleet
    playbook = tmp_path.parent / f"{tmp_path.name}-record.yml"
    playbook.write_text(RECORD.replace("hosts: vllm_hosts:monitoring", "hosts: vllm_hosts:loadbalancers:monitoring"))

    def preflight(**extra):
        done = run_preflight(tmp_path, machine_root, controller_inputs, hosts, loadbalancers=loadbalancers, **extra)
        assert done.returncode == 0, done.stdout[-3000:]
        return decisions(done.stdout)

    assert set(preflight(playbook=playbook).values()) == {"converging: no converged record"}
    assert lb_socket.asked and set(lb_socket.asked) == {"show servers state vllm\n"}

    # Every server ready (the negative control of the next step): every host is skipped.
    unchanged = "skipped, unchanged since the last run"
    assert preflight() == dict.fromkeys(["good-1", "good-2", "lb-1"], unchanged)

    # good-1's server drained on lb-1 (a lost run's), then in maintenance: good-1 alone takes the full run.
    for admin, said in ((8, "drain"), (1, "maint")):
        lb_socket.states["good-1-vllm-0"] = admin
        assert preflight() == {
            "good-1": f"converging: not in service on every load balancer: good-1-vllm-0 is in {said} on lb-1",
            "good-2": unchanged,
            "lb-1": unchanged,
        }

    # Put back by its run: skipped again.
    lb_socket.states["good-1-vllm-0"] = 0
    assert preflight() == dict.fromkeys(["good-1", "good-2", "lb-1"], unchanged)
