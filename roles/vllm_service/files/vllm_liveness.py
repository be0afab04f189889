"""Restart a vLLM instance that stopped answering while its unit stays active (vllm-liveness.timer).

Usage: vllm_liveness.py CONFIG STATE_DIR
CONFIG (written by roles/vllm_service, tasks/liveness.yml): {"address", "tls", "ca", "timeout", "failures",
"instances": {name: port}}. STATE_DIR keeps, per instance, the activation of its unit last seen, whether /health
answered 200 in that activation, and the failures since.

A wedged instance still holds its port and its unit stays active (Restart=always acts only when the process
exits): the load balancers take it out, nothing brings it back. Each run asks every instance's /health once,
within the timeout; an instance whose unit is active, that answered once in this activation and then failed
`failures` runs in a row is restarted (systemctl restart --no-block). An instance that never answered in its
activation is starting (the health gate and the unit's own limits judge that), so nothing is counted before its
first answer: a restart by the rollout, a rollback or a person begins a new activation, and the count again.
Standard library only; runs as root (systemctl restart).
"""

import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request


def unit_activation(unit):
    """(ActiveState, the monotonic time it entered it) of the unit."""
    out = subprocess.run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "ActiveEnterTimestampMonotonic", unit],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return found.get("ActiveState", ""), found.get("ActiveEnterTimestampMonotonic", "")


def health(address, port, timeout, context):
    """('', ok) or (why, not ok) for one request to /health."""
    host = "127.0.0.1" if address in ("0.0.0.0", "", "*", "::") else address
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if context else "http"
    try:
        with urllib.request.urlopen(f"{scheme}://{host}:{port}/health", timeout=timeout, context=context) as answer:
            return ("", True) if answer.status == 200 else (f"/health answered {answer.status}", False)
    except urllib.error.HTTPError as error:
        return f"/health answered {error.code}", False
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return f"/health: {type(reason).__name__}: {reason}", False


def restart(unit):
    done = subprocess.run(["systemctl", "restart", "--no-block", unit], capture_output=True, text=True, check=False)
    return done.returncode == 0, (done.stderr or done.stdout).strip()


def read_state(path):
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(path, state):
    with open(f"{path}.new", "w", encoding="utf-8") as handle:
        json.dump(state, handle)
    os.replace(f"{path}.new", path)


def check(name, port, config, state, activation_of, health_of, restart_of):
    """One instance's run: (its new state, the line to log or ''); the last three are systemctl and /health."""
    unit = f"vllm@{name}.service"
    active, since = activation_of(unit)
    if active != "active" or not since:
        return {}, ""
    if state.get("activation") != since:
        state = {"activation": since, "answered": False, "failures": 0}
    why, ok = health_of(config["address"], port, config["timeout"], config.get("context"))
    if ok:
        return dict(state, answered=True, failures=0), ""
    if not state["answered"]:
        return state, ""
    failures = state["failures"] + 1
    if failures < config["failures"]:
        return dict(state, failures=failures), f"{unit}: {why} ({failures} of {config['failures']} in a row)"
    done, said = restart_of(unit)
    line = f"{unit}: {why} ({failures} of {config['failures']} in a row): "
    if not done:
        return dict(state, failures=failures), line + f"the restart failed: {said}"
    # The restart begins a new activation: the count starts again after its first answer.
    return {}, line + "restarted it"


def main(config_path, state_dir):
    config = read_state(config_path)
    if not config.get("instances"):
        return 0
    if config.get("tls"):
        # The instance's certificate against the fleet's CA; not its name: this host probes itself.
        context = ssl.create_default_context(cafile=config["ca"])
        context.check_hostname = False
        config["context"] = context
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    for name, port in sorted(config["instances"].items()):
        path = os.path.join(state_dir, f"{name}.json")
        state, line = check(name, port, config, read_state(path), unit_activation, health, restart)
        write_state(path, state)
        if line:
            print(f"vllm-liveness: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
