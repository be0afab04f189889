"""Closed by default, as five vantage points see it (issue 32; the instances serve HTTPS, one test CA signs every
certificate): the podman host (an outsider), a load balancer,
the monitoring host, the other vLLM host (a peer) and the vLLM host itself probe the load balancer's routes (path
tricks included), the host's instance ports and every other listener it has, with no key, an empty key, a wrong key
and the right one. The table is printed; each cell is checked against what closed by default allows.

molecule/container/tests/test_probe_table.py runs the same table in container mode with its own SHAPE (no
monitoring host there)."""

import collections
import json
import posixpath
import re
import subprocess
import urllib.parse
from pathlib import Path

import pytest
from conftest import get_host

testinfra_hosts = ["ansible://serve-vllm-1"]
# The scenario's hosts by role: the target (testinfra_hosts), its load balancer, the monitoring host (or None) and a
# peer vLLM host, which is outside the target's firewall.
SHAPE = {"target": "serve-vllm-1", "lb": "serve-lb", "monitoring": "serve-mon", "peer": "serve-vllm-2"}

PROJECT = Path(__file__).resolve().parents[3]
CA_FILE = PROJECT / ".cache/tls/ca.crt"
LB_PORT = 8080
OPEN_PATHS = {"/health", "/metrics"}
# The load balancer forwards these (loadbalancer_allowed_path_prefixes, loadbalancer_allowed_paths).
FORWARDED = ("/v1/",)
ROUTES = [
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/invocations"),
    ("GET", "/server_info"),
    ("POST", "/reset_prefix_cache"),
    ("GET", "/metrics"),
    ("GET", "/health"),
    # Path tricks: each must be judged as the path it names.
    ("POST", "//v1/completions"),
    ("POST", "/v1/../invocations"),
    ("POST", "/v1/%2e%2e/tokenize"),
    ("POST", "/v1%2F..%2Finvocations"),
    ("POST", "/V1/completions"),
]
KEYS = ("none", "empty", "wrong", "right")

PROBE_SCRIPT = r"""
import json, socket, ssl, sys, urllib.error, urllib.request
jobs, cadata = json.loads(sys.argv[1]), sys.argv[2]
context = ssl.create_default_context(cadata=cadata)
bodies = {"completions": {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2},
          "chat": {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2},
          "tokens": {"model": "tiny-llama", "prompt": "Hello", "tokens": [1, 2, 3]}}
out = []
for job in jobs:
    if job["kind"] == "tcp":
        try:
            socket.create_connection((job["address"], job["port"]), timeout=5).close()
            out.append("connected")
        except OSError as err:
            out.append(type(err).__name__)
        continue
    headers = {"Content-Type": "application/json"}
    if job["key"] is not None:
        headers["Authorization"] = "Bearer " + job["key"]
    body = bodies["chat" if "chat" in job["path"] else "tokens" if "detok" in job["path"] else "completions"]
    data = json.dumps(body).encode() if job["method"] == "POST" else None
    request = urllib.request.Request(job["url"], data=data, headers=headers, method=job["method"])
    try:
        with urllib.request.urlopen(request, timeout=60, context=context) as response:
            status, text = response.status, response.read(20000).decode(errors="replace")
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read(300).decode(errors="replace")
    except OSError as err:
        status, text = 0, type(err).__name__
    out.append([status, text])
print(json.dumps(out))
"""


def produced(text):
    """A generation or a tokenization in the body."""
    try:
        body = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return False
    return isinstance(body, dict) and bool({"choices", "tokens", "prompt"} & set(body))


def answer(result):
    if isinstance(result, str):
        return result
    status, text = result
    if produced(text):
        return f"{status} produced"
    if re.search(r"^vllm:", text, re.M):
        return f"{status} metrics"
    return str(status)


def named_path(path):
    """The path a normalising server would route `path` to (slashes merged, %-decoded, dot-segments resolved)."""
    decoded = re.sub("/+", "/", urllib.parse.unquote(path))
    return posixpath.normpath(decoded) + ("/" if decoded.endswith("/") else "")


def read_fleet(host, request, shape):
    own = host.interface("eth0").addresses[0]
    plan = json.loads(host.file("/etc/vllm/plan.json").content_string)
    secrets = host.file("/etc/vllm/secrets.env").content_string
    key = json.loads(re.search(r"^VLLM_SERVICE_API_KEY=(.*)$", secrets, re.M)[1])
    ports = {i["port"] for i in plan["instances"]}
    # The exporters are what the monitoring host scrapes here besides the instances. `ss` cannot name them: without
    # CAP_SYS_PTRACE a container's root does not see another user's sockets' processes.
    exporters = set()
    if shape["monitoring"]:
        scraped = get_host(shape["monitoring"], request).file("/etc/prometheus/prometheus.yml").content_string
        exporters = {int(port) for port in re.findall(rf"['\"]{re.escape(own)}:(\d+)['\"]", scraped)} - ports
    others = set()
    for line in host.check_output("ss -Hltn").splitlines():
        port = int(line.split()[3].rpartition(":")[2])
        if port not in ports | exporters | {22}:
            others.add(port)
    lb_address = get_host(shape["lb"], request).interface("eth0").addresses[0]
    return {"own": own, "ports": sorted(ports), "others": sorted(others), "exporters": sorted(exporters), "key": key,
            "lb": lb_address}  # fmt: skip


@pytest.fixture(scope="module")
def fleet(host, request):
    return read_fleet(host, request, SHAPE)


def jobs_for(fleet):
    keys = {"none": None, "empty": "", "wrong": "wrong-" + fleet["key"][::-1], "right": fleet["key"]}
    jobs = []
    for target, base in [("lb", f"https://{fleet['lb']}:{LB_PORT}")] + [
        (f"instance:{port}", f"https://{fleet['own']}:{port}") for port in fleet["ports"]
    ]:
        for label in KEYS:
            for method, path in ROUTES:
                jobs.append(
                    {"kind": "http", "target": target, "keylabel": label, "key": keys[label], "method": method,
                     "path": path, "url": base + path}
                )  # fmt: skip
    for target in ("others", "exporters"):
        for port in fleet[target]:
            jobs.append({"kind": "tcp", "target": target, "keylabel": "-", "address": fleet["own"], "port": port})
    return jobs


def run_probe(vantage, jobs, request, host):
    cadata = CA_FILE.read_text()
    if vantage == "outsider":
        result = subprocess.run(
            ["python3", "-c", PROBE_SCRIPT, json.dumps(jobs), cadata],
            capture_output=True, text=True, timeout=1800, check=True,
        )  # fmt: skip
        return json.loads(result.stdout)
    where = host if vantage == "self" else get_host(vantage, request)
    return json.loads(where.check_output("python3 -c %s %s %s", PROBE_SCRIPT, json.dumps(jobs), cadata))


def problems(vantage, job, result, shape=None):
    """What closed by default forbids in this cell (an empty list: allowed)."""
    shape = shape or SHAPE
    said = answer(result)
    status = said.split()[0]
    found = []
    if job["kind"] == "tcp":
        # vLLM's internal listeners (ZMQ, gloo) answer the host itself; the exporters also the monitoring host.
        admitted = ("self", shape["monitoring"]) if job["target"] == "exporters" else ("self",)
        if vantage not in admitted and said == "connected":
            found.append(f"a listener ({job['target']}) answers a host it should not")
        return found
    right = job["keylabel"] == "right"
    if "produced" in said and not right:
        found.append("produced without the key")
    if job["target"] == "lb":
        if "produced" in said and not named_path(job["path"]).startswith(FORWARDED):
            found.append("the load balancer forwarded a route outside its allow-list")
        if "metrics" in said:
            found.append("metrics through the load balancer to a client outside loadbalancer_metrics_allow")
        if status == "0":
            found.append("the load balancer did not answer")
        return found
    # An instance port: only the load balancers and the monitoring host get through the firewall.
    if vantage in ("outsider", shape["peer"]):
        if status != "0":
            found.append("an instance port answers a host outside the firewall's sources")
        return found
    if status == "0":
        found.append("an instance port refuses an admitted host")
    if not right and status == "200" and job["path"] not in OPEN_PATHS:
        found.append("a route other than the open paths answers without the key")
    return found


def probe_table(host, fleet, request, capsys, shape):
    """Every vantage point's answers; fails naming each forbidden cell, after the positive controls' cells."""
    jobs = jobs_for(fleet)
    table = collections.defaultdict(collections.Counter)
    found = []
    vantages = ["outsider", shape["lb"], *([shape["monitoring"]] if shape["monitoring"] else []), shape["peer"], "self"]
    for vantage in vantages:
        results = run_probe(vantage, jobs, request, host)
        assert len(results) == len(jobs), vantage
        for job, result in zip(jobs, results, strict=True):
            table[(vantage, job["target"], job["keylabel"])][answer(result)] += 1
            found += [f"{vantage} -> {job['target']} key {job['keylabel']}: {job.get('method', 'tcp')} "
                      f"{job.get('path', job.get('port'))}: {answer(result)}: {problem}"
                      for problem in problems(vantage, job, result, shape)]  # fmt: skip
    lines = [f"{'vantage':<17} {'target':<14} {'key':<6} answers (count)"]
    for (vantage, target, label), counts in table.items():
        lines.append(
            f"{vantage:<17} {target:<14} {label:<6} " + ", ".join(f"{a} x{n}" for a, n in sorted(counts.items()))
        )
    with capsys.disabled():
        print(f"\nProbe table ({shape['target']} as the target host):\n" + "\n".join(lines))
    assert not found, "\n".join(found) + "\n\n" + "\n".join(lines)
    # The positive controls: the right key generates through the load balancer from outside, and on an instance
    # port from the load balancer's host.
    cells = {key: set(counts) for key, counts in table.items()}
    assert "200 produced" in cells[("outsider", "lb", "right")], lines
    assert "200 produced" in cells[(shape["lb"], f"instance:{fleet['ports'][0]}", "right")], lines
    return cells, lines


def test_every_vantage_point_gets_what_closed_by_default_allows_and_no_more(host, fleet, request, capsys):
    cells, lines = probe_table(host, fleet, request, capsys, SHAPE)
    # The open paths answer the admitted hosts without a key; the exporters the monitoring host.
    assert "200 metrics" in cells[("serve-mon", f"instance:{fleet['ports'][0]}", "none")], lines
    assert fleet["others"] and fleet["exporters"], f"nothing to probe besides the instance ports: {fleet}"
    assert cells[("serve-mon", "exporters", "-")] == {"connected"}, lines
