#!/usr/bin/env python3
"""Wait until a vLLM instance answers /health, or give up early when its unit is failing.

Usage: wait_healthy.py PORT UNIT TIMEOUT_SECONDS [MAX_RESTARTS]
Prints one JSON object: {"healthy": bool, "seconds": n, "reason": str, "journal": [lines]}
and exits 0 only when /health answered 200. It stops waiting as soon as the
unit is in the failed state or systemd restarted it MAX_RESTARTS times (default 2)
during the wait, so a broken release is reported in seconds, not at the timeout.
"""

import json
import subprocess
import sys
import time
import urllib.request


def unit_state(unit):
    out = subprocess.run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "NRestarts", "-p", "Result", unit],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(unit, since):
    out = subprocess.run(
        ["journalctl", "-u", unit, "--since", f"@{int(since)}", "-n", "25", "--no-pager", "-o", "cat"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return out.splitlines()[-25:]


def healthy(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def main(port, unit, timeout, max_restarts=2):
    started = time.time()
    first = int(unit_state(unit).get("NRestarts", "0") or 0)
    reason = f"no answer on /health within {timeout} s"
    while time.time() - started < timeout:
        if healthy(port):
            took = round(time.time() - started, 1)
            print(json.dumps({"healthy": True, "seconds": took, "reason": "", "journal": []}))
            return 0
        state = unit_state(unit)
        restarts = int(state.get("NRestarts", "0") or 0) - first
        if state.get("ActiveState") == "failed":
            reason = f"{unit} failed ({state.get('Result', '?')})"
            break
        if restarts >= max_restarts:
            reason = f"{unit} restarted {restarts} times while starting"
            break
        time.sleep(3)
    print(
        json.dumps(
            {
                "healthy": False,
                "seconds": round(time.time() - started, 1),
                "reason": reason,
                "journal": journal(unit, started - 60),
            }
        )
    )
    return 1


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(int(args[0]), args[1], int(args[2]), *(int(a) for a in args[3:4])))
