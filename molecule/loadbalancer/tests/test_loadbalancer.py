"""Verifies the loadbalancer role: HAProxy proxies to every planned instance of
the backend group, health checks take a stopped one out, and the drain API
(tasks_from=backend_state) lets in-flight requests finish while new ones go
elsewhere, then puts the servers back."""

import collections
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import testinfra

testinfra_hosts = ["lb-haproxy"]

SCENARIO = Path(__file__).resolve().parents[1]
LB_URL = "http://127.0.0.1:8080"
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
    script = f"for i in $(seq {requests}); do curl -sS --fail --max-time 10 {LB_URL}/v1/models; done"
    out = host.check_output(script)
    return collections.Counter(json.loads(line)["served_by"] for line in out.splitlines() if line.strip())


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
        f"curl -sS --max-time 60 '{LB_URL}/slow?seconds={slow_seconds}'; done"
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
    again, _ = backend_state("lb-backend-2", "drain")
    assert "changed=0" in again, again

    output, _ = backend_state("lb-backend-2", "ready")
    assert "changed=1" in output, output
    assert all_up(lb), server_stats(lb)
    assert set(served_by(lb, requests=40)) == ALL_SERVED_BY
    again, _ = backend_state("lb-backend-2", "ready")
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
