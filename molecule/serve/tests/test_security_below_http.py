"""Closed below HTTP on each vLLM host (issue 32): the instance firewall cannot vanish unnoticed (a
flush is drift in the converged record; a restart of Debian's nftables.service loads it again; the
instances require it), vLLM's internal sockets answer no other host, the load balancer included, and an
instance with no key does not start, and refuses every route but the open paths if it did."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import backend_ca, get_host

testinfra_hosts = ["ansible://vllm_hosts"]

PROJECT = Path(__file__).resolve().parents[3]
TABLE = "inet vllm_fleet"
EXPORTERS_TABLE = "inet vllm_fleet_exporters"
OPEN_PATHS = {"/health", "/metrics"}


@pytest.fixture(scope="module")
def plan(host):
    return json.loads(host.file("/etc/vllm/plan.json").content_string)


def own_address(host):
    return host.interface("eth0").addresses[0]


def main_pids(host, plan):
    return {
        i["name"]: host.check_output(f"systemctl show -p MainPID --value vllm@{i['name']}") for i in plan["instances"]
    }


def table(host, name=TABLE):
    """The live table without counters and handles, or None."""
    listed = host.run(f"nft -s list table {name}")
    return listed.stdout if listed.rc == 0 else None


# ---- the firewall cannot vanish unnoticed ----


def test_the_instances_require_the_firewall_and_the_secrets_file(host, plan):
    for instance in plan["instances"]:
        unit = f"vllm@{instance['name']}"
        requires = host.check_output(f"systemctl show -p Requires --value {unit}").split()
        after = host.check_output(f"systemctl show -p After --value {unit}").split()
        assert "vllm-firewall.service" in requires and "vllm-firewall.service" in after, (requires, after)
        # No `-`: a missing secrets.env fails the start (systemd shows an optional file as "(ignore_errors=yes)").
        files = host.check_output(f"systemctl show -p EnvironmentFiles --value {unit}")
        assert re.search(r"/etc/vllm/secrets\.env \(ignore_errors=no\)", files), files
    after = host.check_output("systemctl show -p After --value vllm-firewall.service").split()
    assert {"nftables.service", "firewalld.service"} <= set(after), after


def test_a_restart_of_debians_nftables_service_leaves_the_table_and_the_instances(host, plan, request):
    # /etc/nftables.conf begins with `flush ruleset`, its ExecStop is `nft flush ruleset`: the drop-in loads
    # the table again after each, without restarting any instance (a PartOf= would restart them).
    ruleset = host.check_output("nft list ruleset")  # the exporters' table too, to put back afterwards
    loaded, pids = table(host), main_pids(host, plan)
    exporters = table(host, EXPORTERS_TABLE)  # the monitoring role's own table, its own drop-in
    assert loaded and exporters, "no tables to begin with"
    lb = get_host("serve-lb", request)
    try:
        for verb in ("restart", "reload", "stop", "start"):
            host.check_output(f"systemctl {verb} nftables.service")
            assert table(host) == loaded, f"after systemctl {verb} nftables.service"
            assert table(host, EXPORTERS_TABLE) == exporters, f"the exporters' table after systemctl {verb}"
        url = f"https://{own_address(host)}:{plan['instances'][0]['port']}/health"
        script = (
            "import ssl, sys, urllib.request;"
            " urllib.request.urlopen(sys.argv[1], timeout=10, context=ssl.create_default_context(cafile=sys.argv[2]))"
        )
        answered = lb.run("python3 -c %s %s %s", script, url, backend_ca(lb))
        assert answered.rc == 0, answered.stderr
        assert main_pids(host, plan) == pids
        assert host.service("vllm-firewall").is_running
    finally:
        host.run("systemctl stop nftables.service")
        restore = host.run("printf '%%s\\n' %s | nft -f -", "flush ruleset\n" + ruleset)
        assert restore.rc == 0, restore.stderr
    assert table(host) == loaded and table(host, EXPORTERS_TABLE) == exporters


def test_a_flushed_table_is_drift_the_next_run_converges(request):
    """The unit still says active after the table went; the converged record witnesses the table itself. One host
    is enough (a preflight run takes a minute)."""
    host = get_host("serve-vllm-2", request)
    assert table(host) and host.service("vllm-firewall").is_running
    try:
        host.check_output(f"nft delete table {TABLE}")
        assert host.service("vllm-firewall").is_running  # what a unit witness saw: nothing
        result = subprocess.run(
            ["ansible-playbook", "-i", request.config.option.ansible_inventory, "playbooks/preflight.yml"],
            cwd=PROJECT, env=os.environ, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        output = " ".join(result.stdout.split())
        assert result.returncode == 0, output[-4000:] + result.stderr[-2000:]
        assert "serve-vllm-2: converging: changed on the host since the last run:" in output, output[-4000:]
        assert f"the nftables table {TABLE} is gone" in output, output[-4000:]
    finally:
        host.run("systemctl reload vllm-firewall.service")
    assert table(host)


# ---- vLLM's internal sockets ----

CONNECT_SCRIPT = """
import json, socket, sys
address, ports = sys.argv[1], json.loads(sys.argv[2])
out = {}
for port in ports:
    try:
        socket.create_connection((address, port), timeout=5).close()
        out[port] = "connected"
    except OSError as err:
        out[port] = type(err).__name__
print(json.dumps(out))
"""


def test_the_load_balancer_reaches_only_the_instance_ports(host, plan, request):
    # vLLM binds about a dozen internal listeners (ZMQ, torch.distributed/gloo; no key) on ephemeral ports of the
    # listen address. The load balancer's host may connect to the instance ports and to nothing else vLLM opened.
    lb = get_host("serve-lb", request)
    instance_ports = {i["port"] for i in plan["instances"]}
    listeners = {}
    for line in host.check_output("ss -Hltnp").splitlines():
        fields = line.split()
        listeners.setdefault(int(fields[3].rpartition(":")[2]), line)
    low, high = map(int, host.file("/proc/sys/net/ipv4/ip_local_port_range").content_string.split())
    internal = sorted(p for p in listeners if low <= p <= high and p not in instance_ports)
    assert internal, f"no listener in the ephemeral range {low}-{high}: nothing to check ({listeners})"
    others = sorted(p for p in listeners if p not in instance_ports and p != 22)
    answers = json.loads(lb.check_output("python3 -c %s %s %s", CONNECT_SCRIPT, own_address(host), json.dumps(others)))
    opened = {port: listeners[int(port)] for port, answer in answers.items() if answer == "connected"}
    assert not opened, opened
    assert set(answers.values()) <= {"ConnectionRefusedError", "ConnectionResetError"}, answers
    # ... and the instance ports still answer it.
    answers = json.loads(
        lb.check_output("python3 -c %s %s %s", CONNECT_SCRIPT, own_address(host), json.dumps(sorted(instance_ports)))
    )
    assert set(answers.values()) == {"connected"}, answers


# ---- no key, no service ----


def test_an_instance_without_the_key_does_not_start(host, plan):
    """A throwaway instance of the real template unit (its ExecStartPre), serving nothing: without VLLM_SERVICE_API_KEY
    it fails before its command runs; with one it starts."""
    name, env = "fx-nokey", f"/etc/vllm/{plan['instances'][0]['name']}.env"
    dropin = f"/etc/systemd/system/vllm@{name}.service.d"
    files = (
        f"mkdir -p {dropin} /run/fx-nokey && printf '# no key\\n' > /run/fx-nokey/secrets.env && "
        f"printf 'VLLM_SERVICE_API_KEY=\"k\"\\n' > /run/fx-nokey/with-key.env && "
        f"printf '[Service]\\nEnvironmentFile=\\nEnvironmentFile={env}\\nEnvironmentFile=/run/fx-nokey/%%s\\n"
        f"Restart=no\\nExecStart=\\nExecStart=/bin/sleep 300\\n' %s > {dropin}/test.conf && systemctl daemon-reload"
    )
    try:
        host.check_output(files % "secrets.env")
        assert host.run(f"systemctl start vllm@{name}").rc != 0
        assert not host.service(f"vllm@{name}").is_running
        journal = host.check_output(f"journalctl --no-pager -u vllm@{name}")
        assert "no VLLM_SERVICE_API_KEY in /etc/vllm/secrets.env: not serving without the API key" in journal, journal
        host.check_output(files % "with-key.env")
        host.run(f"systemctl reset-failed vllm@{name}")
        assert host.run(f"systemctl start vllm@{name}").rc == 0
        assert host.service(f"vllm@{name}").is_running
    finally:
        host.run(f"systemctl stop vllm@{name}; systemctl reset-failed vllm@{name}")
        host.run(f"rm -rf {dropin} /run/fx-nokey && systemctl daemon-reload")


NO_KEY_SCRIPT = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
for name in ("VLLM_SERVICE_API_KEY", "VLLM_API_KEY", "VLLM_SERVICE_PREVIOUS_API_KEY",
             "VLLM_SERVICE_ALLOW_UNAUTHENTICATED"):
    os.environ.pop(name, None)
os.environ["VLLM_SERVICE_OPEN_PATHS"] = "/health /metrics"
sys.path.insert(0, "/usr/local/lib/vllm-service")
from fastapi.testclient import TestClient
from vllm.entrypoints.openai.api_server import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(
    ["--model", sys.argv[1], "--middleware", "vllm_service_auth.RequireApiKey"])
app = build_app(args, supported_tasks=("generate",))
client = TestClient(app, raise_server_exceptions=False)
out = []
for route in app.routes:
    path = getattr(route, "path", None)
    if not path or "{" in path:
        continue
    for method in sorted(set(getattr(route, "methods", None) or ["GET"]) - {"HEAD", "OPTIONS"}):
        status = client.request(method, path, json={"model": "tiny-llama", "prompt": "Hello"}).status_code
        out.append([method, path, status])
print(json.dumps(out))
"""


def test_the_middleware_refuses_every_route_but_the_open_paths_when_no_key_reaches_it(host):
    # vLLM's own app with the installed middleware, as `--middleware` adds it, and no key in the environment
    # (a lost secrets.env): vLLM checks nothing then; the middleware answers 401 before any handler runs.
    result = host.run(
        "HF_HUB_OFFLINE=1 /opt/vllm/current/bin/python -c %s %s", NO_KEY_SCRIPT, "/var/lib/vllm/models/tiny-llama"
    )
    assert result.rc == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"/invocations", "/tokenize", "/v1/completions"} <= {a[1] for a in answers}, answers
    passed = [a for a in answers if a[2] != 401]
    assert {a[1] for a in passed} <= OPEN_PATHS, passed
