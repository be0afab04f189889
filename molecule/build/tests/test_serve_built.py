"""The builder serves the tiny model from the wheel it built."""

import json

testinfra_hosts = ["build-debian12"]

VENV = "/opt/vllm/0.32.0-x86_64"
API_KEY = "build-scenario-key"


def test_the_active_version_is_the_built_venv(host):
    assert host.check_output("readlink -f /opt/vllm/current") == VENV

    assert host.check_output(f"{VENV}/bin/pip show vllm | sed -n 's/^Version: //p'").startswith("0.32.0+cpu.p")


def test_one_completion(host):
    plan = json.loads(host.file("/etc/vllm/plan.json").content_string)
    instance = plan["instances"][0]
    assert host.service(f"vllm@{instance['name']}").is_running
    script = (
        "import json, sys, urllib.request\n"
        "req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(),\n"
        "    headers={'Content-Type': 'application/json', 'Authorization': 'Bearer ' + sys.argv[3]})\n"
        "print(urllib.request.urlopen(req, timeout=120).read().decode())\n"
    )
    body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 5, "temperature": 0})
    out = host.check_output(
        "python3 -c %s %s %s %s", script, f"http://127.0.0.1:{instance['port']}/v1/completions", body, API_KEY
    )
    answer = json.loads(out)
    assert answer["usage"]["completion_tokens"] == 5, out
