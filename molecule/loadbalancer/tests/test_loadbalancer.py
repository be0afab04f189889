"""Verifies the loadbalancer role: HAProxy proxies to every planned instance of
the backend group over TLS only, forwards only its route allow-list, runs
sandboxed, health checks take a stopped one out, and the drain API
(tasks_from=backend_state) lets in-flight requests finish while new ones go
elsewhere, then puts the servers back."""

import collections
import json
import os
import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from shlex import quote

import pytest
import testinfra
import yaml

testinfra_hosts = ["lb-haproxy"]

SCENARIO = Path(__file__).resolve().parents[1]
LB_URL = "https://127.0.0.1:8080"
CA = "/root/fleet-test-ca.crt"
CURL = f"curl --cacert {CA}"
PROJECT = SCENARIO.parents[1]
CONTROLLER_CA = PROJECT / ".cache/tls/ca.crt"
SOCKET = "/run/haproxy/admin.sock"
BACKENDS = {"lb-backend-1": [8000, 8001], "lb-backend-2": [8000, 8001]}
INSTANCE_NAMES = {8000: "vllm-0", 8001: "vllm-1"}
ALL_SERVED_BY = {f"{host}:{port}" for host, ports in BACKENDS.items() for port in ports}


def inventory():
    return os.environ.get("MOLECULE_INVENTORY_FILE", "")


def backend(name):
    return testinfra.get_host(f"ansible://{name}", ansible_inventory=inventory())


def server_stats(host):
    """{server name: {"status": ..., "scur": int}} from HAProxy's admin socket."""
    out = host.check_output(f"echo 'show stat vllm 4 -1' | socat stdio unix-connect:{SOCKET}")
    header, *rows = [line for line in out.splitlines() if line.strip()]
    fields = header.lstrip("# ").split(",")
    stats = {}
    for row in rows:
        values = dict(zip(fields, row.split(","), strict=False))
        stats[values["svname"]] = {"status": values["status"], "scur": int(values["scur"] or 0)}
    return stats


def wait_for(predicate, timeout=30, interval=0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def all_up(host):
    return wait_for(lambda: all(s["status"] == "UP" for s in server_stats(host).values()))


def served_by(host, requests=24):
    """Counter of host:port that answered `requests` sequential requests through the LB."""
    script = f"for i in $(seq {requests}); do {CURL} -sS --fail --max-time 10 {LB_URL}/v1/models; done"
    out = host.check_output(script)
    return collections.Counter(json.loads(line)["served_by"] for line in out.splitlines() if line.strip())


def status_of(host, path, *curl_args):
    """HTTP status of GET `path` through the load balancer, from inside the LB host."""
    args = " ".join(curl_args)
    return int(host.check_output(f"{CURL} -s -o /dev/null -w '%{{http_code}}' --max-time 10 {args} '{LB_URL}{path}'"))


def run_playbook(playbook, *extra):
    return subprocess.run(
        ["ansible-playbook", "-i", inventory(), str(playbook), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def backend_state(host_name, state):
    """The drain API, as a rolling upgrade calls it (see backend_state.yml)."""
    started = time.monotonic()
    result = subprocess.run(
        [
            "ansible-playbook",
            "-i",
            inventory(),
            str(SCENARIO / "backend_state.yml"),
            "-e",
            f"lb_test_backend_host={host_name}",
            "-e",
            f"lb_test_state={state}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, time.monotonic() - started


@pytest.fixture()
def lb(host):
    assert all_up(host), server_stats(host)
    return host


def test_haproxy_is_running_and_enabled(host):
    service = host.service("haproxy")
    assert service.is_running
    assert service.is_enabled


def test_configuration_is_valid(host):
    result = host.run("haproxy -c -f /etc/haproxy/haproxy.cfg")
    assert result.rc == 0, result.stdout + result.stderr


def test_configuration_lists_every_planned_instance(host):
    config = host.file("/etc/haproxy/haproxy.cfg").content_string
    for name, ports in BACKENDS.items():
        for port in ports:
            assert f"server {name}-{INSTANCE_NAMES[port]} " in config
    assert "balance leastconn" in config
    assert "option httpchk GET /health" in config


def test_workers_run_chrooted_as_haproxy(host):
    # The worker is not dumpable after dropping privileges, so its /proc/<pid>/root
    # cannot be read here: check what it runs as and that the chroot is configured.
    assert host.check_output("ps -o user= -C haproxy").split().count("haproxy") >= 1
    assert "chroot /var/lib/haproxy" in host.file("/etc/haproxy/haproxy.cfg").content_string
    assert host.file("/var/lib/haproxy").is_directory


def test_admin_socket_answers(host):
    assert set(server_stats(host)) == {
        f"{name}-{INSTANCE_NAMES[port]}" for name, ports in BACKENDS.items() for port in ports
    }


def test_requests_reach_every_instance_on_every_host(lb):
    answers = served_by(lb, requests=40)
    assert sum(answers.values()) == 40
    assert set(answers) == ALL_SERVED_BY, answers


def test_stopped_instance_is_marked_down_and_avoided(lb):
    victim = backend("lb-backend-2")
    try:
        victim.check_output("systemctl stop fake-vllm@8001.service")
        assert wait_for(lambda: server_stats(lb)["lb-backend-2-vllm-1"]["status"].startswith("DOWN"), timeout=20), (
            server_stats(lb)
        )
        answers = served_by(lb, requests=30)
        assert sum(answers.values()) == 30
        assert set(answers) == ALL_SERVED_BY - {"lb-backend-2:8001"}, answers
    finally:
        victim.check_output("systemctl start fake-vllm@8001.service")
    assert all_up(lb), server_stats(lb)
    assert set(served_by(lb, requests=40)) == ALL_SERVED_BY


def test_drain_waits_for_in_flight_requests_and_ready_restores(lb):
    slow_seconds = 15
    lb.run("rm -f /tmp/slow-*.json")
    # Four long requests at once: leastconn gives one to each of the 4 servers.
    lb.check_output(
        "for i in 0 1 2 3; do "
        "systemd-run --quiet --collect --unit=lb-test-slow-$i -p StandardOutput=file:/tmp/slow-$i.json "
        f"{CURL} -sS --max-time 60 '{LB_URL}/v1/slow?seconds={slow_seconds}'; done"
    )
    in_flight = wait_for(lambda: sum(s["scur"] for s in server_stats(lb).values()) >= 4, timeout=10)
    assert in_flight, server_stats(lb)
    stats = server_stats(lb)
    assert stats["lb-backend-2-vllm-0"]["scur"] + stats["lb-backend-2-vllm-1"]["scur"] >= 1, stats

    output, took = backend_state("lb-backend-2", "drain")
    # The API returned only once lb-backend-2's requests had finished...
    stats = server_stats(lb)
    assert {stats[f"lb-backend-2-vllm-{i}"]["scur"] for i in (0, 1)} == {0}, stats
    assert {stats[f"lb-backend-2-vllm-{i}"]["status"] for i in (0, 1)} == {"DRAIN"}, stats
    assert took >= 2, f"drain returned after {took:.1f}s, before the in-flight requests could finish"
    # ...and they finished normally: every slow request got its answer.
    wait_for(lambda: lb.run("systemctl is-active --quiet 'lb-test-slow-*'").rc != 0, timeout=30)
    slow_answers = [json.loads(lb.file(f"/tmp/slow-{i}.json").content_string)["served_by"] for i in range(4)]
    assert set(slow_answers) == ALL_SERVED_BY, slow_answers
    # New requests avoid the drained host.
    answers = served_by(lb, requests=30)
    assert sum(answers.values()) == 30
    assert set(answers) == {"lb-backend-1:8000", "lb-backend-1:8001"}, answers
    # Draining again changes nothing.
    again, _unused = backend_state("lb-backend-2", "drain")
    assert "changed=0" in again, again

    output, _unused = backend_state("lb-backend-2", "ready")
    # The state set, and saved to HAProxy's state file.
    assert "changed=2" in output, output
    assert all_up(lb), server_stats(lb)
    assert set(served_by(lb, requests=40)) == ALL_SERVED_BY
    again, _unused = backend_state("lb-backend-2", "ready")
    assert "changed=0" in again, again


def test_maint_stops_traffic_at_once_and_ready_restores(lb):
    backend_state("lb-backend-1", "maint")
    try:
        stats = server_stats(lb)
        assert {stats[f"lb-backend-1-vllm-{i}"]["status"] for i in (0, 1)} == {"MAINT"}, stats
        assert set(served_by(lb, requests=20)) == {"lb-backend-2:8000", "lb-backend-2:8001"}
    finally:
        backend_state("lb-backend-1", "ready")
    assert all_up(lb), server_stats(lb)


def test_plain_http_is_refused(host):
    # Nothing listens for plain HTTP: a plain request to the TLS port gets no HTTP answer.
    result = host.run("curl -sS -o /dev/null -w '%{http_code}' --max-time 10 http://127.0.0.1:8080/v1/models")
    assert result.rc != 0 or result.stdout.strip() in ("000", "400"), result.stdout + result.stderr
    assert "HTTP/1" not in host.run("curl -sS -i --max-time 10 http://127.0.0.1:8080/health").stdout


def test_tls_with_the_test_ca_from_another_host(host):
    # From the controller, to the LB's address: the certificate names it (IP SAN) and chains to the test CA.
    address = host.interface("eth0").addresses[0]
    context = ssl.create_default_context(cafile=str(CONTROLLER_CA))
    with urllib.request.urlopen(f"https://{address}:8080/v1/models", context=context, timeout=10) as response:
        assert response.status == 200
        assert json.loads(response.read())["served_by"] in ALL_SERVED_BY
        assert response.headers["Strict-Transport-Security"]
    with pytest.raises(urllib.error.URLError):  # an unknown CA is refused
        urllib.request.urlopen(f"https://{address}:8080/v1/models", context=ssl.create_default_context(), timeout=10)


@pytest.mark.parametrize(
    ("option", "accepted"),
    [
        ("-tls1_1", False),
        ("-tls1_2 -cipher AES128-GCM-SHA256", False),  # no forward secrecy
        ("-tls1_2 -cipher ECDHE-ECDSA-AES128-SHA256", False),  # CBC
        ("-tls1_2 -cipher ECDHE-ECDSA-AES128-GCM-SHA256", True),
        ("-tls1_3", True),
    ],
)
def test_only_modern_tls_is_accepted(host, option, accepted):
    result = host.run(
        f"openssl s_client -connect 127.0.0.1:8080 -CAfile {CA} -verify_return_error {option} -brief </dev/null"
    )
    assert (result.rc == 0) == accepted, result.stdout + result.stderr


def test_tls_key_is_protected(host):
    # Only root reads it: HAProxy's master (root, no CAP_DAC_OVERRIDE under the hardening) loads the certificate
    # and key before its workers drop to user haproxy, and again on every reload.
    key = host.file("/etc/haproxy/tls/server.pem.key")
    assert key.user == "root" and key.group == "root" and key.mode == 0o600
    assert "PRIVATE KEY" not in host.run("journalctl --no-pager -u haproxy").stdout
    processes = [line.split() for line in host.check_output("ps -o user=,ppid= -C haproxy").splitlines()]
    assert [user for user, ppid in processes if ppid == "1"] == ["root"], processes  # the master
    assert {user for user, ppid in processes if ppid != "1"} == {"haproxy"}, processes  # its workers


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v1/models", 200),
        ("/health", 200),
        ("/invocations", 404),
        ("/tokenize", 404),
        ("/detokenize", 404),
        ("/docs", 404),
        ("/openapi.json", 404),
        ("/version", 404),
        ("/abort_requests", 404),
        ("//v1/models", 404),
        ("/V1/models", 404),
        ("/v1", 404),
        ("/v1x/models", 404),
        ("/metrics", 403),
    ],
)
def test_only_allowed_routes_are_forwarded(host, path, status):
    # The stand-in backend answers 200 on every path: 404/403 here come from HAProxy.
    assert status_of(host, path) == status


def test_post_to_unlisted_routes_is_refused(host):
    for path in ("/invocations", "/tokenize", "/pooling"):
        out = host.check_output(
            f"{CURL} -s -o /dev/null -w '%{{http_code}}' -X POST -H 'Content-Type: application/json' "
            f"-d '{{\"prompt\": \"Hello\"}}' --max-time 10 '{LB_URL}{path}'"
        )
        assert out == "404", path


def test_a_client_that_draws_too_many_401s_gets_429_until_its_rate_falls(host):
    """loadbalancer_auth_failures_per_minute (30 here, the default): the 31st 401 from one address within a
    minute turns every request from it into 429, the right key's too; another address is not affected."""
    guesser, other = "--interface 127.0.0.3", "--interface 127.0.0.4"
    try:
        answers = [status_of(host, "/v1/denied", guesser) for _attempt in range(31)]
        assert answers == [401] * 31, answers
        assert status_of(host, "/v1/denied", guesser) == 429
        assert status_of(host, "/v1/models", guesser) == 429
        assert status_of(host, "/v1/models", other) == 200
    finally:
        host.run(f"echo 'clear table vllm_api' | socat stdio unix-connect:{SOCKET}")
    assert status_of(host, "/v1/models", guesser) == 200


def test_metrics_only_from_monitoring_addresses(host):
    assert status_of(host, "/metrics") == 403
    assert status_of(host, "/metrics", "--interface 127.0.0.2") == 200


def test_haproxy_unit_is_hardened(host):
    report = host.check_output("systemd-analyze security --no-pager haproxy.service")
    exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", report).group(1))
    assert exposure <= 3.0, report
    bounding = host.check_output("systemctl show -p CapabilityBoundingSet --value haproxy")
    assert set(bounding.split()) == {"cap_net_bind_service", "cap_setuid", "cap_setgid", "cap_sys_chroot", "cap_kill"}
    assert host.check_output("systemctl show -p ProtectSystem --value haproxy") == "strict"
    assert host.check_output("systemctl show -p PrivateTmp --value haproxy") == "yes"


def test_reload_works_under_the_hardening(host):
    host.check_output("systemctl reload haproxy")
    assert wait_for(lambda: host.service("haproxy").is_running, timeout=10)
    assert status_of(host, "/v1/models") == 200


def test_preflight_refuses_a_load_balancer_without_a_certificate():
    result = run_playbook(
        SCENARIO / "preflight.yml", "-e", "loadbalancer_tls_certificate=", "-e", "loadbalancer_tls_key="
    )
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert "lb-haproxy: loadbalancer_tls_certificate:" in output, output
    assert "fix:" in output
    plain = run_playbook(
        SCENARIO / "preflight.yml",
        "-e",
        "loadbalancer_tls_certificate=",
        "-e",
        "loadbalancer_tls_key=",
        "-e",
        '{"loadbalancer_plain_http": true}',
    )
    assert plain.returncode == 0, plain.stdout + plain.stderr


def without_host(node, name):
    """A copy of an inventory's YAML without host `name` in any group (as an AWX job slice leaves it out)."""
    if isinstance(node, dict):
        return {key: without_host(value, name) for key, value in node.items() if key != name}
    return node


def test_preflight_stops_an_inventory_that_holds_part_of_the_fleet():
    # As an AWX job slice sees the fleet: lb-backend-2 is not in the inventory, so nothing planned its servers; only
    # the configuration HAProxy runs now still names them. The cut inventory sits beside Molecule's so that its
    # group_vars and host_vars apply.
    original = Path(inventory())
    cut = original.parent / "zz-slice-test.yml"
    cut.write_text(yaml.safe_dump(without_host(yaml.safe_load(original.read_text()), "lb-backend-2")))

    def preflight(*extra):
        return subprocess.run(
            ["ansible-playbook", "-i", str(cut), str(SCENARIO / "preflight.yml"), *extra],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    try:
        result, meant = preflight(), preflight("-e", "loadbalancer_max_removed_servers_percent=100")
    finally:
        cut.unlink()
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, output
    assert (
        "lb-haproxy: loadbalancer_backend_group: this run would take 2 of the 4 servers HAProxy forwards to now out "
        "of backend 'vllm' (lb-backend-2-vllm-0, lb-backend-2-vllm-1)"
    ) in output, output
    assert meant.returncode == 0, meant.stdout + meant.stderr


# ---- HAProxy's limits and retries (issue 32 items 6 and 7) ----

LB_ADDRESS = "10.88.250.41"
MAXCONN = 5000  # loadbalancer_maxconn in molecule.yml


def haproxy_info(host):
    out = host.check_output(f"echo 'show info' | socat stdio unix-connect:{SOCKET}")
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def test_maxconn_and_open_files_are_sized(host):
    config = host.file("/etc/haproxy/haproxy.cfg").content_string
    assert f"maxconn {MAXCONN + 64}" in config and f"maxconn {MAXCONN}" in config
    info = haproxy_info(host)
    assert int(info["Maxconn"]) == MAXCONN + 64, info
    master = host.check_output("systemctl show -p MainPID --value haproxy")
    limits = host.check_output(f"grep 'Max open files' /proc/{master}/limits").split()
    assert int(limits[3]) >= 2 * (MAXCONN + 64), limits
    # systemd set it before the sandbox's filter, which still blocks setrlimit (~@resources).
    assert host.check_output("systemctl show -p LimitNOFILE --value haproxy") == limits[3]


def test_2000_idle_connections_leave_room_for_clients(lb):
    # Before: 1024 files (the sandbox blocked raising them, no LimitNOFILE), about 490 connections; the 500th
    # client waited in the kernel's backlog. From the controller: idle TCP, no TLS handshake, no request.
    import resource
    import socket

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    idle = []
    try:
        for _attempt in range(2000):
            idle.append(socket.create_connection((LB_ADDRESS, 8080), timeout=5))
        # HAProxy holds them (not only the kernel's backlog)...
        assert wait_for(lambda: int(haproxy_info(lb)["CurrConns"]) >= 2000, timeout=20), haproxy_info(lb)
        # ...and a new client still gets its answer at once.
        started = time.monotonic()
        assert status_of(lb, "/v1/models") == 200
        assert time.monotonic() - started < 5
    finally:
        for conn in idle:
            conn.close()


def hangups(tag):
    """How many times the four stand-in instances received /v1/hangup?tag=<tag> (asked directly)."""
    total = 0
    for name, ports in BACKENDS.items():
        address = backend(name).interface("eth0").addresses[0]
        for port in ports:
            with urllib.request.urlopen(f"http://{address}:{port}/v1/hangups?tag={tag}", timeout=10) as response:
                total += json.loads(response.read())["count"]
    return total


def test_a_completion_is_never_sent_twice(lb):
    # Every instance closes the connection without answering, as an engine that crashes on a request would.
    # Before: retry-on empty-response replayed the POST on three more instances (4 in all).
    tag = f"post-{time.monotonic_ns()}"
    out = lb.check_output(
        f"{CURL} -s -o /dev/null -w '%{{http_code}}' -X POST -H 'Content-Type: application/json' "
        f"-d '{{\"prompt\": \"Hello\"}}' --max-time 30 '{LB_URL}/v1/hangup?tag={tag}'"
    )
    assert out == "502"
    assert hangups(tag) == 1
    # A GET (safe to send again) is still tried on other servers: 1 + loadbalancer_retries (3).
    tag = f"get-{time.monotonic_ns()}"
    assert status_of(lb, f"/v1/hangup?tag={tag}") == 502
    assert hangups(tag) == 4


def test_preflight_checks_loadbalancer_maxconn():
    result = run_playbook(SCENARIO / "preflight.yml", "-e", "loadbalancer_maxconn=0")
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert "lb-haproxy: loadbalancer_maxconn: is 0, outside its range; fix: set it from 1 to 500000" in output, output
    # More than this container's 16384 files allow: lowered to what fits, with a warning naming the fix.
    big = run_playbook(SCENARIO / "preflight.yml", "-e", "loadbalancer_maxconn=100000")
    output = " ".join((big.stdout + big.stderr).split())
    assert big.returncode == 0, output
    assert "WARNING lb-haproxy: loadbalancer_maxconn: 100000 connections need 202176 open files" in output, output
    assert "gets maxconn 7998" in output, output


# ---- The servers' states survive reloads, restarts and reboots (issue 31 item 4) ----

STATE_FILE = "/var/lib/haproxy-state/server-state"
DRAIN, MAINT = 0x08, 0x01


def admin_states(host):
    """{server: (srv_admin_state, srv_op_state, srv_port)} from `show servers state` (read by its header)."""
    out = host.check_output(f"echo 'show servers state vllm' | socat stdio unix-connect:{SOCKET}")
    lines = [line for line in out.splitlines() if line.strip()]
    header = lines[1].lstrip("# ").split()
    rows = [dict(zip(header, line.split(), strict=True)) for line in lines[2:]]
    return {r["srv_name"]: (int(r["srv_admin_state"]), int(r["srv_op_state"]), int(r["srv_port"])) for r in rows}


def admin(host):
    return {name: state[0] for name, state in admin_states(host).items()}


def haproxy_answers(host):
    return host.run(f"echo 'show info' | socat stdio unix-connect:{SOCKET}").rc == 0


def restart_haproxy(host, verb):
    host.check_output(f"systemctl {verb} haproxy")
    assert wait_for(lambda: haproxy_answers(host), timeout=20)


EXPECTED = {
    "lb-backend-1-vllm-0": 0,
    "lb-backend-1-vllm-1": MAINT,
    "lb-backend-2-vllm-0": DRAIN,
    "lb-backend-2-vllm-1": DRAIN,
}


def test_drained_and_maintenance_servers_stay_so_across_reload_restart_and_converge(lb):
    backend_state("lb-backend-2", "drain")
    lb.check_output(f"echo 'set server vllm/lb-backend-1-vllm-1 state maint' | socat stdio unix-connect:{SOCKET}")
    try:
        assert admin(lb) == EXPECTED
        for verb in ("reload", "restart"):
            restart_haproxy(lb, verb)
            assert admin(lb) == EXPECTED, verb
            assert set(served_by(lb, requests=12)) == {"lb-backend-1:8000"}, verb
        state = lb.file(STATE_FILE)
        assert state.user == "root" and state.mode == 0o600
        assert state.content_string.startswith("1\n# be_id be_name srv_id srv_name")
        # The role's own reload (a changed configuration, as site.yml does before a rollout), then back.
        for extra in (["-e", "loadbalancer_timeout_queue=59s"], []):
            result = run_playbook(SCENARIO / "converge.yml", *extra)
            assert result.returncode == 0, result.stdout + result.stderr
            assert admin(lb) == EXPECTED, extra
        assert "timeout queue 1m" in lb.file("/etc/haproxy/haproxy.cfg").content_string
        # What a person set ready by hand stays ready: the file holds what was live before each restart.
        lb.check_output(f"echo 'set server vllm/lb-backend-1-vllm-1 state ready' | socat stdio unix-connect:{SOCKET}")
        restart_haproxy(lb, "restart")
        assert admin(lb) == dict(EXPECTED, **{"lb-backend-1-vllm-1": 0})
    finally:
        backend_state("lb-backend-1", "ready")
        backend_state("lb-backend-2", "ready")
    assert all_up(lb), server_stats(lb)


def reachable_and_active(host):
    try:
        return host.run("systemctl is-active haproxy").stdout.strip() == "active"
    except Exception:  # the container is still booting (SSH refused)
        return False


def saved_admin(host, prefix):
    """The srv_admin_state values the state file holds for the servers whose names start with prefix."""
    return [int(v) for v in host.run(f"awk '$4 ~ /^{prefix}/ {{print $7}}' {STATE_FILE}").stdout.split()]


def test_a_drained_server_stays_drained_across_a_reboot_of_the_load_balancer(lb):
    # A reload first saves every server ready; the drain the rollout sets is saved at once (backend_state.yml),
    # and the stop saves it again.
    lb.check_output("systemctl reload haproxy")
    assert wait_for(lambda: haproxy_answers(lb), timeout=30)
    backend_state("lb-backend-2", "drain")
    try:
        saved = saved_admin(lb, "lb-backend-2-")
        assert len(saved) == 2 and all(admin_state & DRAIN for admin_state in saved), saved
        # podman stops the container as a shutdown (systemd stops haproxy: ExecStop saves the states). The
        # container's journal lives in /run and does not survive the restart: the start's line says what was read.
        subprocess.run(["podman", "restart", "--time", "60", "lb-haproxy"], check=True, timeout=180)
        assert wait_for(lambda: reachable_and_active(lb), timeout=120, interval=2)
        assert wait_for(lambda: haproxy_answers(lb), timeout=30)
        states = admin(lb)
        assert states["lb-backend-2-vllm-0"] == DRAIN and states["lb-backend-2-vllm-1"] == DRAIN, states
        journal = lb.check_output("journalctl -u haproxy --no-pager -b")
        assert f"{STATE_FILE}: restoring 4 servers (2 drained, 0 in maintenance)" in journal, journal
    finally:
        backend_state("lb-backend-2", "ready")
    assert all_up(lb), server_stats(lb)


def test_a_drain_survives_an_haproxy_that_is_killed_during_it(lb):
    # A crash or an OOM kill while a host is drained: systemd restarts HAProxy (Restart=always) from the state file.
    # A reload first saves every server ready, so the file holds the drain only if the drain saved it (before, the
    # drain lived at runtime only, and the host came back ready, before any check, mid-change).
    lb.check_output("systemctl reload haproxy")
    assert wait_for(lambda: haproxy_answers(lb), timeout=30)
    assert saved_admin(lb, "lb-backend-2-") == [0, 0]
    backend_state("lb-backend-2", "drain")
    try:
        before = worker_pid(lb)
        lb.check_output("systemctl kill --signal=SIGKILL haproxy")
        # systemd restarts it once the unit's processes are gone. Once (2026-12-07) it had not after 62 s, its last
        # line "Killing process <worker> with signal SIGKILL": the wait covers systemd's stop timeout (90 s) too.
        returned = wait_for(lambda: haproxy_answers(lb) and worker_pid(lb) != before, timeout=150)
        assert returned, "HAProxy did not return"
        states = admin(lb)
        assert states["lb-backend-2-vllm-0"] == DRAIN and states["lb-backend-2-vllm-1"] == DRAIN, states
        assert states["lb-backend-1-vllm-0"] == 0 and states["lb-backend-1-vllm-1"] == 0, states
        served = set(served_by(lb, requests=12))
        assert served and all(name.startswith("lb-backend-1:") for name in served), served
        journal = lb.check_output("journalctl -u haproxy --no-pager -n 300")
        assert "restoring 4 servers (2 drained, 0 in maintenance)" in journal, journal
    finally:
        backend_state("lb-backend-2", "ready")
    assert all_up(lb), server_stats(lb)


def test_a_power_loss_after_a_re_enable_does_not_bring_back_the_drain(lb):
    # A reload inside a host's drained window (a TLS switch does one) saves the drain; the re-enable after the
    # gate is saved too, so a power loss (no ExecStop at all: the container is killed) restores the re-enable.
    # Before, the file still held the drain of the reload, and the host stayed out after the next start.
    backend_state("lb-backend-2", "drain")
    try:
        lb.check_output("systemctl reload haproxy")
        assert all(admin_state & DRAIN for admin_state in saved_admin(lb, "lb-backend-2-"))
    finally:
        backend_state("lb-backend-2", "ready")
    assert saved_admin(lb, "lb-backend-2-") == [0, 0]
    subprocess.run(["podman", "kill", "lb-haproxy"], check=True, timeout=60)
    subprocess.run(["podman", "start", "lb-haproxy"], check=True, timeout=120)
    assert wait_for(lambda: reachable_and_active(lb), timeout=120, interval=2)
    assert wait_for(lambda: haproxy_answers(lb), timeout=30)
    assert set(admin(lb).values()) == {0}, admin(lb)
    assert wait_for(lambda: all_up(lb), timeout=30), server_stats(lb)


def worker_pid(host):
    info = host.check_output(f"echo 'show info' | socat stdio unix-connect:{SOCKET}")
    return int(re.search(r"^Pid: (\d+)", info, re.M)[1])


def test_a_reload_returns_once_the_new_worker_alone_answers(lb):
    # HAProxy's reload is asynchronous: without the drop-in's wait the old worker answers the first
    # commands after `systemctl reload`, and a drain sent to it is lost when it leaves.
    old = worker_pid(lb)
    lb.check_output("systemctl reload haproxy")
    answers = [worker_pid(lb) for _attempt in range(20)]
    assert old not in answers and len(set(answers)) == 1, (old, answers)


def test_a_changed_port_is_applied_and_a_new_server_starts_down(lb):
    # HAProxy 2.6 and 3.0 take a server's port from the state file over the configuration's; the drop-in's helper
    # fits the file first. A moved server keeps its drain and starts DOWN, as does one the configuration adds.
    config = "/etc/haproxy/haproxy.cfg"
    original = lb.file(config).content_string
    address = re.search(r"server lb-backend-2-vllm-1 ([0-9.]+):8001", original).group(1)
    moved = original.replace(
        f"server lb-backend-2-vllm-1 {address}:8001",
        f"server lb-backend-2-vllm-1 {address}:8002\n    server lb-backend-2-extra {address}:8002",
    )
    other = backend("lb-backend-2")
    backend_state("lb-backend-2", "drain")
    other.check_output("systemctl start fake-vllm@8002.service")
    since = lb.check_output("date '+%Y-%m-%d %H:%M:%S'")
    try:
        lb.check_output(f"cp {config} /root/haproxy.cfg.orig && printf '%s' {quote(moved)} > {config}")
        restart_haproxy(lb, "reload")
        states = admin_states(lb)
        assert states["lb-backend-2-vllm-1"][0] == DRAIN and states["lb-backend-2-vllm-1"][2] == 8002, states
        assert "lb-backend-2-extra" in states
        journal = lb.check_output(f"journalctl -u haproxy --no-pager --since '{since}'")
        assert "address, port or TLS changed, DOWN until checked: vllm/lb-backend-2-vllm-1" in journal, journal
        assert "new, DOWN until checked: vllm/lb-backend-2-extra" in journal, journal
        assert "Server vllm/lb-backend-2-extra is DOWN, changed from server-state" in journal, journal
        assert wait_for(lambda: admin_states(lb)["lb-backend-2-extra"][1] == 2, timeout=20), admin_states(lb)
    finally:
        lb.check_output(f"cp /root/haproxy.cfg.orig {config}")
        restart_haproxy(lb, "reload")
        backend_state("lb-backend-2", "ready")
        other.check_output("systemctl stop fake-vllm@8002.service")
    assert admin_states(lb)["lb-backend-2-vllm-1"][2] == 8001
    assert all_up(lb), server_stats(lb)


def retire(host_name, instances):
    play = SCENARIO / "backend_retire.yml"
    result = run_playbook(play, "-e", f"lb_test_backend_host={host_name}", "-e", f"lb_test_instances={instances}")
    assert result.returncode == 0, result.stdout + result.stderr
    recap = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    return re.search(rf"^{host_name}\s*:.*changed=(\d+)", recap, re.M)[1]


def test_a_server_the_plan_drops_leaves_the_configuration_and_the_live_process(lb):
    # The rollout's step after a host's gate when its plan has one instance fewer: the dropped server
    # was drained with the host and its instance stopped.
    config = "/etc/haproxy/haproxy.cfg"
    backend_state("lb-backend-2", "drain")
    try:
        assert retire("lb-backend-2", 1) != "0"
        assert "server lb-backend-2-vllm-1 " not in lb.file(config).content_string
        assert "server lb-backend-2-vllm-0 " in lb.file(config).content_string
        assert lb.run(f"haproxy -c -f {config}").rc == 0
        states = admin(lb)
        assert "lb-backend-2-vllm-1" not in states, states
        assert states["lb-backend-2-vllm-0"] == DRAIN and states["lb-backend-1-vllm-0"] == 0, states
        # Nothing brings it back: a reload loads the configuration and the saved states without it.
        restart_haproxy(lb, "reload")
        assert "lb-backend-2-vllm-1" not in admin(lb), admin(lb)
        assert set(served_by(lb, requests=12)) == {"lb-backend-1:8000", "lb-backend-1:8001"}
        assert retire("lb-backend-2", 1) == "0"
    finally:
        # The converge with both instances planned puts the server back; it starts DOWN until checked.
        result = run_playbook(SCENARIO / "converge.yml")
        assert result.returncode == 0, result.stdout + result.stderr
        backend_state("lb-backend-2", "ready")
    assert "lb-backend-2-vllm-1" in admin(lb)
    assert all_up(lb), server_stats(lb)


def move_endpoints(host_name, extra=None):
    args = ["-e", f"lb_test_backend_host={host_name}"] + (["-e", json.dumps(extra)] if extra else [])
    result = run_playbook(SCENARIO / "backend_endpoints.yml", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    recap = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    return re.search(rf"^{host_name}\s*:.*changed=(\d+)", recap, re.M)[1]


def restart_fakes(host, unit, cert=None):
    """The host's window: its two stand-ins restart as `unit` (fake-vllm or fake-vllm-tls), with certificate `cert`."""
    env = f"FAKE_VLLM_CERT=/etc/fake-vllm/{cert}.crt\nFAKE_VLLM_KEY=/etc/fake-vllm/{cert}.key\n" if cert else ""
    host.check_output(
        f"printf '{env}' > /etc/fake-vllm/cert && systemctl stop fake-vllm@8000 fake-vllm@8001 "
        f"fake-vllm-tls@8000 fake-vllm-tls@8001 && systemctl start {unit}@8000 {unit}@8001"
    )


def test_tls_to_a_host_is_switched_in_its_window_and_verified(lb):
    # What the rollout does when a host gets a certificate: drained, its instances restart serving HTTPS, its
    # servers move to `ssl verify required` (a reload, which keeps the drain), then ready and UP over TLS.
    config = "/etc/haproxy/haproxy.cfg"
    tls_dir = PROJECT / ".cache/tls"
    tls = {
        "vllm_service_tls_certificate": (tls_dir / "lb-backend-2.crt").read_text(),
        "vllm_fleet_backend_tls_ca_certificate": (tls_dir / "ca.crt").read_text(),
    }
    other = backend("lb-backend-2")
    address = re.search(r"server lb-backend-2-vllm-0 ([0-9.]+):8000", lb.file(config).content_string)[1]
    backend_state("lb-backend-2", "drain")
    since = lb.check_output("date '+%Y-%m-%d %H:%M:%S'")
    try:
        restart_fakes(other, "fake-vllm-tls", "tls")
        assert move_endpoints("lb-backend-2", tls) != "0"
        # The reload's saved state would otherwise hand HAProxy the old srv_use_ssl (plain) and the old UP.
        journal = lb.check_output(f"journalctl -u haproxy --no-pager --since '{since}'")
        assert "TLS changed, DOWN until checked: vllm/lb-backend-2-vllm-0, vllm/lb-backend-2-vllm-1" in journal, journal
        text = lb.file(config).content_string
        for port in (8000, 8001):
            line = f"server lb-backend-2-vllm-{port - 8000} {address}:{port} ssl verify required ca-file"
            assert f"{line} /etc/haproxy/vllm-backend-ca.crt verifyhost lb-backend-2\n" in text, text
        assert (
            "server lb-backend-1-vllm-0 " in text
            and " ssl " not in text.split("server lb-backend-1-vllm-0 ")[1].split("\n")[0]
        )
        assert (
            lb.file("/etc/haproxy/vllm-backend-ca.crt").content_string.strip()
            == tls["vllm_fleet_backend_tls_ca_certificate"].strip()
        )
        assert {admin(lb)[f"lb-backend-2-vllm-{i}"] for i in (0, 1)} == {DRAIN}, admin(lb)
        assert move_endpoints("lb-backend-2", tls) == "0"  # a second run moves nothing
        backend_state("lb-backend-2", "ready")
        assert all_up(lb), server_stats(lb)
        assert {"lb-backend-2:8000", "lb-backend-2:8001"} <= set(served_by(lb, requests=24))
        # Another host's certificate from the same CA: HAProxy checks the name, the servers go DOWN.
        restart_fakes(other, "fake-vllm-tls", "other")
        assert wait_for(lambda: server_stats(lb)["lb-backend-2-vllm-0"]["status"].startswith("DOWN"), timeout=30), (
            server_stats(lb)
        )
        assert set(served_by(lb, requests=12)) <= {"lb-backend-1:8000", "lb-backend-1:8001"}
    finally:
        # The way back (a rollback): plain stand-ins, plain server lines.
        backend_state("lb-backend-2", "drain")
        restart_fakes(other, "fake-vllm")
        move_endpoints("lb-backend-2")
        backend_state("lb-backend-2", "ready")
    servers = [line for line in lb.file(config).content_string.splitlines() if line.strip().startswith("server ")]
    assert servers and not [line for line in servers if " ssl " in line], servers
    assert all_up(lb), server_stats(lb)


def test_a_failed_dump_refuses_a_reload_but_never_blocks_a_stop(lb):
    backend_state("lb-backend-2", "drain")
    try:
        # An admin socket that does not answer (a plain file where HAProxy's socket was).
        lb.check_output(f"mv {SOCKET} {SOCKET}.hidden && touch {SOCKET}")
        refused = lb.run("systemctl reload haproxy")
        assert refused.rc != 0
        assert lb.service("haproxy").is_running and status_of(lb, "/v1/models") == 200
        assert "the reload is refused" in lb.check_output("journalctl -u haproxy --no-pager -n 300")
        restart_haproxy(lb, "restart")
        # The file is kept as the drain's own save wrote it: the drained host stays out after the restart.
        assert not lb.file(f"{STATE_FILE}.stale").exists
        states = admin(lb)
        assert states["lb-backend-2-vllm-0"] == DRAIN and states["lb-backend-2-vllm-1"] == DRAIN, states
        assert "is kept as its last save wrote it" in lb.check_output("journalctl -u haproxy --no-pager -n 300")
    finally:
        lb.run(f"rm -f {SOCKET}.hidden")
        backend_state("lb-backend-2", "ready")
    assert all_up(lb), server_stats(lb)
    restart_haproxy(lb, "reload")  # a good dump clears the put-aside file
    assert not lb.file(f"{STATE_FILE}.stale").exists
