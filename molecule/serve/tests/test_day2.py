"""After the day-2 steps (side_effect.yml): both hosts serve the last step's install with the rotated key
only, closed to everything but the load balancer, and no step lost a request. Serving, the
plan, the firewall and the hardening of each host are test_serve.py's."""

import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path

from conftest import backend_ca, get_host

testinfra_hosts = ["serve-vllm-1", "serve-vllm-2"]

API_KEY = "serve-key-b-rotated"
OLD_API_KEY = "serve-key-a"
LB_URL = "https://10.88.250.50:8080"
CA_FILE = Path(__file__).resolve().parents[3] / ".cache/tls/ca.crt"
# Step 2 moved the instances from 8000 to 8100.
PORT = 8100
# Steps 5a-6b (the rollout's mechanics) run with SERVE_MECHANICS=1 only (side_effect.yml).
MECHANICS = os.environ.get("SERVE_MECHANICS", "0").lower() in {"1", "true", "yes", "on"}
EXPECTED_STEPS = [
    # Step 2 last: the planned step that passes and leaves every host recorded.
    "1-key-rotation",
    "3-drain-fails",
    "4-gate-fails",
    "2-rotation-end-and-knobs",
    *(["5a-reinstall-host-lost", "5b-recovery", "6a-noop", "6b-drift"] if MECHANICS else []),
]


def lb_status(path, key, body=None):
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(LB_URL + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(CA_FILE)), timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def direct_status(where, url, key, body):
    script = (
        "import json, ssl, sys, urllib.request, urllib.error\n"
        "headers = {'Content-Type': 'application/json'}\n"
        "req = urllib.request.Request(sys.argv[1], data=sys.argv[3].encode(), headers=headers)\n"
        "if sys.argv[2]: req.add_header('Authorization', 'Bearer ' + sys.argv[2])\n"
        "context = ssl.create_default_context(cafile=sys.argv[4]) if sys.argv[4] else None\n"
        "try:\n"
        "    print(urllib.request.urlopen(req, timeout=60, context=context).status)\n"
        "except urllib.error.HTTPError as e: print(e.code)\n"
    )
    ca = backend_ca(where) if url.startswith("https://") else ""
    return int(where.check_output("python3 -c %s %s %s %s %s", script, url, key, json.dumps(body), ca))


def test_no_step_lost_a_request():
    results = json.loads((Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "day2" / "results.json").read_text())
    control = json.loads((Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "day2" / "control.json").read_text())
    print(
        f"0-control (an undrained restart): {control['sent']} sent, {control['answered']} answered, "
        f"{control['failed']} failed in {control['seconds']} s; in flight: mean {control['in_flight_mean']}"
    )
    for step in results:
        print(
            f"{step['step']}: rc {step['rc']}, {step['sent']} sent, {step['answered']} answered, "
            f"{step['failed']} failed in {step['seconds']} s; in flight: mean {step['in_flight_mean']}, "
            f"below 2 {step['share_below_expected']:.0%} of the time"
        )
    # The same load loses requests when a restart is not drained: the zeros below can fail.
    assert control["failed"] >= 1, control
    assert [s["step"] for s in results] == EXPECTED_STEPS
    assert all(s["sent"] >= 10 and s["failed"] == 0 and s["answered"] == s["sent"] for s in results), results
    assert all(s["in_flight_mean"] >= 1 for s in results), results


def test_only_the_rotated_key_works_through_the_load_balancer():
    body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2}
    assert lb_status("/v1/completions", API_KEY, body) == 200
    assert lb_status("/v1/completions", OLD_API_KEY, body) == 401


def test_every_host_serves_what_the_last_step_installed_and_keeps_no_snapshot(host):
    active = host.file("/opt/vllm/current").linked_to
    assert active.startswith("/opt/vllm/0.32.0-"), active
    # Step 5's reinstall (a changed install record) names its directory with a -r<digest> suffix.
    assert ("-r" in Path(active).name) == MECHANICS, active
    assert host.service("vllm@vllm-0").is_running
    assert not host.file("/etc/vllm/api-keys.yaml").exists
    assert host.run("find /var/lib/vllm-rollout -type f").stdout.strip() == ""


def test_the_load_balancer_host_needs_the_key_on_every_route(host, request):
    lb = get_host("serve-lb", request)
    own = host.interface("eth0").addresses[0]
    body = {"model": "tiny-llama", "prompt": "Hello"}
    for path in ("/tokenize", "/invocations", "/v1/completions"):
        assert direct_status(lb, f"https://{own}:{PORT}{path}", "", body) == 401, path
        assert direct_status(lb, f"https://{own}:{PORT}{path}", OLD_API_KEY, body) == 401, path
    assert direct_status(lb, f"https://{own}:{PORT}/tokenize", API_KEY, body) == 200
