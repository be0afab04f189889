"""The serve scenario: real vLLM instances, planned, pinned, hardened, behind HAProxy
(TLS, route allow-list); the instances admit only the load balancer and require the key on
every route but the open paths."""

import json
import math
import os
import re
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import backend_ca, get_host, instance_base

testinfra_hosts = ["ansible://vllm_hosts"]

MODEL = "tiny-llama"
LB_PORT = 8080
PROJECT = Path(__file__).resolve().parents[3]
CA_FILE = PROJECT / ".cache/tls/ca.crt"
# vLLM 0.32 checks the key only under these prefixes (vllm/entrypoints/serve/middleware/authenticate.py);
# the role's middleware (roles/vllm_service/files/vllm_service_auth.py) checks it on every other route.
GUARDED = ("/v1", "/v2", "/inference", "/cohere")
# vllm_service_paths_without_key's default: the only paths an instance answers without the key.
OPEN_PATHS = {"/health", "/metrics"}


def parse_cpulist(text):
    cpus = []
    for part in filter(None, text.strip().split(",")):
        first, _dash, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


@pytest.fixture(scope="module")
def api_key(request):
    """The key the fleet serves with now: the inventory's, or the rotated one after the day-2 steps."""
    secrets = get_host("serve-vllm-1", request).file("/etc/vllm/secrets.env").content_string
    return json.loads(re.search(r"^VLLM_SERVICE_API_KEY=(.*)$", secrets, re.M).group(1))


@pytest.fixture(scope="module")
def plan(host):
    return json.loads(host.file("/etc/vllm/plan.json").content_string)


def main_pid(host, instance):
    return int(host.check_output(f"systemctl show -p MainPID --value vllm@{instance['name']}"))


def vllm_pids(host):
    uid = host.user("vllm").uid
    return [int(p) for p in host.check_output(f"pgrep -u {uid}").split()]


def http(host, url, body=None, key=""):
    """(status, parsed JSON or text) of a request made from inside ``host``."""
    script = (
        "import json, ssl, sys, urllib.request, urllib.error\n"
        "url, body, key, ca = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]\n"
        "context = ssl.create_default_context(cafile=ca) if ca else None\n"
        "headers = {'Content-Type': 'application/json'}\n"
        "req = urllib.request.Request(url, data=body.encode() or None, headers=headers)\n"
        "if key: req.add_header('Authorization', 'Bearer ' + key)\n"
        "try:\n"
        "    with urllib.request.urlopen(req, timeout=120, context=context) as r:\n"
        "        print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e: print(e.code); print(e.read().decode())\n"
    )
    ca = backend_ca(host) if url.startswith("https://") else ""
    result = host.run("python3 -c %s %s %s %s %s", script, url, json.dumps(body) if body else "", key or "", ca)
    assert result.rc == 0, result.stderr
    status, _newline, text = result.stdout.partition("\n")
    try:
        return int(status), json.loads(text)
    except json.JSONDecodeError:
        return int(status), text


def listen_address(host, instance):
    conf = host.file(f"/etc/systemd/system/vllm@{instance['name']}.service.d/instance.conf").content_string
    return re.search(r"--host (\S+)", conf).group(1)


def completion(host, base_url, key):
    request = {"model": MODEL, "prompt": "Hello", "max_tokens": 5, "temperature": 0}
    return http(host, f"{base_url}/v1/completions", request, key)


def test_instances_run_as_the_service_user(host, plan):
    vllm_uid = host.user("vllm").uid
    assert vllm_uid != 0
    for instance in plan["instances"]:
        service = host.service(f"vllm@{instance['name']}")
        assert service.is_running and service.is_enabled
        status = host.file(f"/proc/{main_pid(host, instance)}/status").content_string
        assert re.search(rf"^Uid:\s+{vllm_uid}\s", status, re.M)
        assert host.check_output(f"systemctl show -p NRestarts --value vllm@{instance['name']}") == "0"


def test_environment_is_the_plan(host, plan):
    # The process's own /proc/<pid>/environ is unreadable here (a process with ambient
    # capabilities is not dumpable and the container has no CAP_SYS_PTRACE): compare the
    # file systemd loads with the plan, and vLLM's log of what it used with the plan.
    journal = host.check_output("journalctl --no-pager -u 'vllm@*'")
    for instance in plan["instances"]:
        loaded = host.check_output(f"systemctl show -p EnvironmentFiles --value vllm@{instance['name']}")
        assert f"/etc/vllm/{instance['name']}.env" in loaded
        text = host.file(f"/etc/vllm/{instance['name']}.env").content_string
        lines = [line for line in text.splitlines() if "=" in line and not line.startswith("#")]
        environ = {k: json.loads(v) for k, v in (line.split("=", 1) for line in lines)}
        assert {k: v for k, v in environ.items() if k.startswith("VLLM_CPU_")} == instance["env"]
        preload = environ["LD_PRELOAD"].split(":")
        assert any(p.endswith("libtcmalloc_minimal.so.4") for p in preload)
        assert any(p.endswith("libiomp5.so") for p in preload) == instance["ld_preload_needed"]["iomp"]
        assert f"VLLM_CPU_OMP_THREADS_BIND={instance['omp_threads_bind']!r}" in journal
        assert f"Explicitly set ({float(instance['kvcache_gib'])}/" in journal


def test_openmp_threads_are_pinned_to_the_planned_cpus(host, plan):
    # vLLM pins each OpenMP thread of a rank to one CPU of its bind list; every other
    # thread of the instance keeps a wider affinity (the unit's CPUAffinity).
    single_cpu_threads = {}
    for pid in vllm_pids(host):
        for status in host.run(f"cat /proc/{pid}/task/*/status").stdout.split("Name:")[1:]:
            allowed = parse_cpulist(re.search(r"^Cpus_allowed_list:\s+(\S+)", status, re.M).group(1))
            if len(allowed) == 1:
                single_cpu_threads[allowed[0]] = single_cpu_threads.get(allowed[0], 0) + 1
    planned = {
        cpu for i in plan["instances"] for rank in i["omp_threads_bind"].split("|") for cpu in parse_cpulist(rank)
    }
    assert set(single_cpu_threads) == planned
    reserved = {cpu for i in plan["instances"] for cpu in parse_cpulist(i["reserved_cpus"])}
    assert not reserved & set(single_cpu_threads)
    journal = host.check_output("journalctl --no-pager -u 'vllm@*'")
    for instance in plan["instances"]:
        for rank, cpus in enumerate(instance["omp_threads_bind"].split("|")):
            assert f"local_rank={rank}, core ids={parse_cpulist(cpus)}" in journal


def test_no_missing_preload_warning(host):
    journal = host.check_output("journalctl --no-pager -u 'vllm@*'")
    assert "OpenMP thread binding info" in journal  # the journal really is vLLM's
    assert "not found in LD_PRELOAD" not in journal


def test_models_and_completions_direct(host, plan, api_key):
    for instance in plan["instances"]:
        base = instance_base(host, instance["name"])
        assert base.startswith("https://"), base
        status, models = http(host, f"{base}/v1/models", key=api_key)
        assert status == 200 and [m["id"] for m in models["data"]] == [MODEL]
        status, body = completion(host, base, api_key)
        assert status == 200 and body["usage"]["completion_tokens"] > 0


def test_api_key_is_enforced(host, plan, api_key):
    base = instance_base(host, plan["instances"][0]["name"])
    assert completion(host, base, key="")[0] == 401
    assert completion(host, base, key="wrong-key")[0] == 401
    # The routes vLLM leaves open need the key too, even from the host itself.
    assert http(host, f"{base}/tokenize", {"model": MODEL, "prompt": "Hello"}, key="")[0] == 401
    assert http(host, f"{base}/tokenize", {"model": MODEL, "prompt": "Hello"}, key=api_key)[0] == 200


def lb_request(lb_address, path, body, key, method=None):
    """(status, parsed JSON or text) of a request from the controller to the LB over TLS, verified with the test CA."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"https://{lb_address}:{LB_PORT}{path}", data=data, headers=headers, method=method)
    context = ssl.create_default_context(cafile=str(CA_FILE))
    try:
        with urllib.request.urlopen(request, context=context, timeout=120) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


@pytest.fixture(scope="module")
def lb_address(request):
    lb = get_host("serve-lb", request)
    assert lb.service("haproxy").is_running
    return lb.interface("eth0").addresses[0]


def test_completions_through_the_load_balancer_over_tls(lb_address, api_key):
    request = {"model": MODEL, "prompt": "Hello", "max_tokens": 5, "temperature": 0}
    for _attempt in range(3):
        status, body = lb_request(lb_address, "/v1/completions", request, api_key)
        assert status == 200 and body["choices"][0]["text"] is not None
    assert lb_request(lb_address, "/v1/completions", request, key="")[0] == 401
    with pytest.raises(OSError):  # plain HTTP gets no HTTP answer (the TLS listener closes the connection)
        urllib.request.urlopen(f"http://{lb_address}:{LB_PORT}/v1/models", timeout=10)


def test_a_new_hosts_servers_entered_each_load_balancer_only_after_its_gate(host, plan, request):
    # Issue 41 item 11: at the converge both hosts served nothing yet; the load balancer play had added their
    # servers, which /health alone would have put in the pool while the hosts' completion gates still ran. The
    # rollout's first play holds them in maintenance until the gate passed: on every load balancer, each server's
    # first line in HAProxy's journal that puts it UP comes after one that put it in maintenance (before, the
    # health checks put it UP with no maintenance before it).
    for lb_name in ("serve-lb", "serve-lb2"):
        journal = get_host(lb_name, request).check_output("journalctl -u haproxy -b --no-pager -o cat")
        for instance in plan["instances"]:
            server = f"Server vllm/{host.backend.get_hostname()}-{instance['name']} "
            lines = [line for line in journal.splitlines() if server in line]
            up = next((i for i, line in enumerate(lines) if " is UP" in line), None)
            maint = next((i for i, line in enumerate(lines) if "maintenance" in line), None)
            assert up is not None, f"{lb_name}: {server}never UP:\n" + "\n".join(lines[:20])
            assert maint is not None and maint < up, f"{lb_name}: {server}UP before maintenance:\n" + "\n".join(
                lines[: up + 3]
            )


def test_instances_listen_on_the_load_balancers_address_only(host, plan):
    own = host.interface("eth0").addresses[0]
    for instance in plan["instances"]:
        assert listen_address(host, instance) == own
        listeners = host.check_output(f"ss -ltnH 'sport = :{instance['port']}'").splitlines()
        assert [line.split()[3] for line in listeners] == [f"{own}:{instance['port']}"], listeners


def test_firewall_admits_the_load_balancer_and_refuses_other_hosts(host, plan, request):
    lb = get_host("serve-lb", request)
    own = host.interface("eth0").addresses[0]
    ruleset = host.check_output("nft list table inet vllm_fleet")
    assert lb.interface("eth0").addresses[0] in ruleset
    assert host.service("vllm-firewall").is_enabled
    for instance in plan["instances"]:
        url = f"https://{own}:{instance['port']}/health"
        # The load balancer's host is admitted ...
        assert http(lb, url, key="")[0] == 200
        # ... this machine (the podman host, outside the allow-list) is not.
        with pytest.raises(OSError) as refused:
            urllib.request.urlopen(url, timeout=10)
        reason = getattr(refused.value, "reason", refused.value)
        assert isinstance(reason, ConnectionRefusedError | ConnectionResetError), reason
    assert re.search(r"counter packets [1-9]", host.check_output("nft list table inet vllm_fleet"))


def test_no_port_vllm_listens_on_answers_other_hosts(host):
    # vLLM 0.32 also binds internal sockets on ephemeral ports of the listen address: every one of them
    # is closed to this machine (outside the allow-list), and the load balancer's host still gets in.
    own = host.interface("eth0").addresses[0]
    ports = [int(line.split()[3].rpartition(":")[2]) for line in host.check_output("ss -ltnH").splitlines()]
    ports = [p for p in ports if p != 22]
    assert len(ports) > 1, ports
    for port in ports:
        with pytest.raises(OSError) as refused:
            socket.create_connection((own, port), timeout=5).close()
        assert isinstance(refused.value, ConnectionRefusedError | ConnectionResetError), (port, refused.value)


ROUTES_SCRIPT = """
import json, sys, warnings
warnings.simplefilter("ignore")
from vllm.entrypoints.openai.api_server import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", sys.argv[1], "--api-key", "unused"])
app = build_app(args, supported_tasks=("generate",))
print(json.dumps([{"path": r.path, "methods": sorted(getattr(r, "methods", None) or ["GET"])}
                  for r in app.routes if getattr(r, "path", None)]))
"""

PROBE_SCRIPT = """
import json, ssl, sys, urllib.error, urllib.request
base, ca, key, routes = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
context = ssl.create_default_context(cafile=ca) if ca else None
bodies = [
    {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2},
    {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2},
    {"model": "tiny-llama", "tokens": [1, 2, 3]},
]
out = []
for method, path in routes:
    for body in (bodies if method in ("POST", "PUT", "PATCH") else [None]):
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = "Bearer " + key
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60, context=context) as response:
                status, text = response.status, response.read(4000).decode(errors="replace")
        except urllib.error.HTTPError as err:
            status, text = err.code, err.read(300).decode(errors="replace")
        except OSError as err:
            status, text = 0, type(err).__name__ + ": " + str(err)
        out.append([method, path, status, text])
print(json.dumps(out))
"""


def produced(text):
    """True when a response body is a generation or a tokenization."""
    try:
        body = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return False
    return isinstance(body, dict) and bool({"choices", "tokens", "token_ids", "prompt", "output"} & set(body))


@pytest.fixture(scope="module")
def routes(host):
    """(method, path) of every route the installed vLLM's app registers, from its route table."""
    result = host.run(
        "HF_HUB_OFFLINE=1 /opt/vllm/current/bin/python -c %s %s", ROUTES_SCRIPT, "/var/lib/vllm/models/tiny-llama"
    )
    assert result.rc == 0, result.stderr[-3000:]
    table = json.loads(result.stdout.strip().splitlines()[-1])
    pairs = sorted(
        {(m, re.sub(r"\{[^}]*\}", "x", r["path"])) for r in table for m in r["methods"] if m not in ("HEAD", "OPTIONS")}
    )
    paths = {p for _link, p in pairs}
    assert {"/v1/completions", "/v1/chat/completions", "/invocations", "/tokenize", "/health"} <= paths, paths
    return pairs


def probe(base, pairs, ca="", key="", where=None):
    if where is None:
        result = subprocess.run(
            ["python3", "-c", PROBE_SCRIPT, base, ca, key, json.dumps(pairs)],
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
        )
        return json.loads(result.stdout)
    return json.loads(where.check_output("python3 -c %s %s %s %s %s", PROBE_SCRIPT, base, ca, key, json.dumps(pairs)))


def test_no_route_generates_or_tokenizes_without_the_key_through_the_load_balancer(routes, lb_address, api_key):
    answers = probe(f"https://{lb_address}:{LB_PORT}", routes, ca=str(CA_FILE))
    assert not [a[:3] for a in answers if produced(a[3])]
    # Only /health passes without the key; the rest: 401 from vLLM (/v1/...), 403/404 from HAProxy.
    assert {a[1] for a in answers if a[2] == 200} <= {"/health"}, [a[:3] for a in answers if a[2] == 200]
    assert {a[2] for a in answers if a[1] != "/health"} <= {401, 403, 404, 405}, answers
    forwarded_unguarded = {a[1] for a in answers if a[2] not in (403, 404) and not a[1].startswith(GUARDED)}
    assert forwarded_unguarded <= {"/health"}, forwarded_unguarded
    # With the key, the unguarded tokenize and invocation routes are still not forwarded.
    with_key = probe(
        f"https://{lb_address}:{LB_PORT}",
        [p for p in routes if not p[1].startswith(GUARDED)],
        ca=str(CA_FILE),
        key=api_key,
    )
    assert not [a[:3] for a in with_key if produced(a[3])]


def test_no_route_answers_other_hosts_directly(host, plan, routes):
    own = host.interface("eth0").addresses[0]
    answers = probe(f"https://{own}:{plan['instances'][0]['port']}", routes, ca=str(CA_FILE))
    assert {a[2] for a in answers} == {0}, [a[:3] for a in answers if a[2]]


def test_from_the_load_balancer_host_only_the_open_paths_answer_without_the_key(host, plan, routes, request):
    # Every route, state-changing ones included: the key is checked before any handler runs.
    lb = get_host("serve-lb", request)
    own = host.interface("eth0").addresses[0]
    answers = probe(f"https://{own}:{plan['instances'][0]['port']}", routes, ca=backend_ca(lb), where=lb)
    assert not [a[:3] for a in answers if produced(a[3])]
    assert {a[1] for a in answers if a[2] != 401} == OPEN_PATHS, [a[:3] for a in answers if a[2] != 401]
    assert {a[2] for a in answers if a[1] in OPEN_PATHS} == {200}


def test_preflight_refuses_an_empty_api_key(request):
    inventory = request.config.option.ansible_inventory
    result = subprocess.run(
        ["ansible-playbook", "-i", inventory, "playbooks/preflight.yml", "-e", "vllm_service_api_key="],
        cwd=PROJECT,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert "serve-vllm-1: vllm_service_api_key: is empty" in output, output[-5000:]
    assert "fix: set vllm_service_api_key" in output and "vllm_service_allow_unauthenticated: true" in output


def test_memory_limits_and_restart_policy_come_from_the_plan(host, plan):
    need = max(i["tp"] * (i["kvcache_gib"] + 2.0) + 0.01 for i in plan["instances"])
    name = f"vllm@{plan['instances'][0]['name']}"
    high = int(host.check_output(f"systemctl show -p MemoryHigh --value {name}"))
    limit = int(host.check_output(f"systemctl show -p MemoryMax --value {name}"))
    assert (high, limit) == (math.ceil(need * 1.25 * 1024) * 2**20, math.ceil(need * 1.5 * 1024) * 2**20)
    assert host.check_output(f"systemctl show -p Restart --value {name}") == "always"
    assert host.check_output(f"systemctl show -p StartLimitIntervalUSec --value {name}") in ("0", "infinity")


def test_unit_is_hardened(host, plan, api_key):
    report = host.check_output(f"systemd-analyze security --no-pager vllm@{plan['instances'][0]['name']}.service")
    exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", report).group(1))
    assert exposure <= 2.0, report
    secrets = host.file("/etc/vllm/secrets.env")
    assert secrets.mode == 0o640 and secrets.user == "root" and secrets.group == "vllm"
    assert api_key not in host.check_output("ps -eo args")
