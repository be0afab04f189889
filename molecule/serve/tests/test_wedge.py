"""A wedged vLLM instance (its API server stopped with SIGSTOP: the port stays open and the unit active, /health
never answers) is restarted by vllm-liveness.timer, and by nothing else: with the timer stopped it stays wedged
(the negative control); with the timer running it is restarted and serves again. Last of serve's tests: it takes
an instance away for a few minutes."""

import json
import time

import pytest
from conftest import instance_base

testinfra_hosts = ["ansible://serve-vllm-2"]

HEALTH = (
    "import ssl, sys, urllib.request;"
    " urllib.request.urlopen(sys.argv[1], timeout=5, context=ssl.create_default_context(cafile=sys.argv[2]))"
)


def wait_for(what, check, timeout, every=3):
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    pytest.fail(f"{what}: not within {timeout} s (last: {last!r})")


def main_pid(host, unit):
    return int(host.check_output(f"systemctl show -p MainPID --value {unit}"))


def test_a_wedged_instance_is_restarted_by_its_liveness_check_and_by_nothing_else(host):
    plan = json.loads(host.file("/etc/vllm/plan.json").content_string)
    instance = plan["instances"][0]
    unit = f"vllm@{instance['name']}.service"
    config = json.loads(host.check_output("cat /etc/vllm/liveness.json"))
    assert config["instances"] == {i["name"]: i["port"] for i in plan["instances"]}
    health = f"{instance_base(host, instance['name'])}/health"

    def answers():
        return host.run("python3 -c %s %s %s", HEALTH, health, "/etc/vllm/tls-ca.crt").rc == 0

    assert host.service("vllm-liveness.timer").is_enabled and host.service("vllm-liveness.timer").is_running
    assert answers(), "the instance does not answer before the test"
    # One check has seen it answer in this activation (the timer runs every few seconds in this scenario).
    time.sleep(config["interval"] + config["timeout"] + 2)
    wedged = main_pid(host, unit)
    # Each check of a wedged instance waits its timeout, the next starts an interval after it ended.
    detection = config["failures"] * (config["timeout"] + config["interval"]) + 10
    try:
        host.check_output("systemctl stop vllm-liveness.timer")
        host.check_output(f"kill -STOP {wedged}")
        # Negative control: without the check nothing brings it back (Restart=always waits for an exit).
        time.sleep(detection)
        assert main_pid(host, unit) == wedged and host.service(unit).is_running and not answers()
        host.check_output("systemctl start vllm-liveness.timer")
        restarted = wait_for(f"{unit} restarted by the liveness check", lambda: main_pid(host, unit) != wedged,
                             timeout=detection + 60)  # fmt: skip
        assert restarted
    finally:
        host.run(f"kill -CONT {wedged}")
        host.run("systemctl start vllm-liveness.timer")
    said = host.check_output("journalctl --no-pager -o cat -u vllm-liveness.service")
    assert f"vllm-liveness: {unit}: /health: " in said and "in a row): restarted it" in said, said[-2000:]
    wait_for(f"{unit} serving again", answers, timeout=600)
