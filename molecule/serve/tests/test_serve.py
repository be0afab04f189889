"""The serve scenario: real vLLM instances, planned, pinned, hardened, behind HAProxy."""

import json
import re

import pytest
from conftest import get_host

testinfra_hosts = ["serve-vllm"]

API_KEY = "serve-scenario-key"
MODEL = "tiny-llama"
LB_PORT = 8080


def parse_cpulist(text):
    cpus = []
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


@pytest.fixture(scope="module")
def plan(host):
    return json.loads(host.file("/etc/vllm/plan.json").content_string)


def main_pid(host, instance):
    return int(host.check_output(f"systemctl show -p MainPID --value vllm@{instance['name']}"))


def vllm_pids(host):
    uid = host.user("vllm").uid
    return [int(p) for p in host.check_output(f"pgrep -u {uid}").split()]


def http(host, url, body=None, key=API_KEY):
    """(status, parsed JSON or text) of a request made from inside ``host``."""
    script = (
        "import json, sys, urllib.request, urllib.error\n"
        "url, body, key = sys.argv[1], sys.argv[2], sys.argv[3]\n"
        "headers = {'Content-Type': 'application/json'}\n"
        "req = urllib.request.Request(url, data=body.encode() or None, headers=headers)\n"
        "if key: req.add_header('Authorization', 'Bearer ' + key)\n"
        "try:\n"
        "    with urllib.request.urlopen(req, timeout=120) as r: print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e: print(e.code); print(e.read().decode())\n"
    )
    result = host.run("python3 -c %s %s %s %s", script, url, json.dumps(body) if body else "", key or "")
    assert result.rc == 0, result.stderr
    status, _, text = result.stdout.partition("\n")
    try:
        return int(status), json.loads(text)
    except json.JSONDecodeError:
        return int(status), text


def completion(host, base_url, key=API_KEY):
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


def test_models_and_completions_direct(host, plan):
    for instance in plan["instances"]:
        base = f"http://127.0.0.1:{instance['port']}"
        status, models = http(host, f"{base}/v1/models")
        assert status == 200 and [m["id"] for m in models["data"]] == [MODEL]
        status, body = completion(host, base)
        assert status == 200 and body["usage"]["completion_tokens"] > 0


def test_api_key_is_enforced(host, plan):
    base = f"http://127.0.0.1:{plan['instances'][0]['port']}"
    assert completion(host, base, key="")[0] == 401
    assert completion(host, base, key="wrong-key")[0] == 401


def test_completions_through_the_load_balancer(host, request):
    lb = get_host("serve-lb", request)
    assert lb.service("haproxy").is_running
    address = lb.interface("eth0").addresses[0]
    for _ in range(3):
        status, body = completion(host, f"http://{address}:{LB_PORT}")
        assert status == 200 and body["choices"][0]["text"] is not None
    assert completion(host, f"http://{address}:{LB_PORT}", key="")[0] == 401


def test_unit_is_hardened(host, plan):
    report = host.check_output(f"systemd-analyze security --no-pager vllm@{plan['instances'][0]['name']}.service")
    exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", report).group(1))
    assert exposure <= 2.5, report
    secrets = host.file("/etc/vllm/secrets.env")
    assert secrets.mode == 0o640 and secrets.user == "root" and secrets.group == "vllm"
    assert API_KEY not in host.check_output("ps -eo args")
