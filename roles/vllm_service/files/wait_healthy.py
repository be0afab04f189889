#!/usr/bin/env python3
"""Wait until a vLLM instance answers /health while it makes progress; give up early when it does not.

Usage: wait_healthy.py ADDRESS PORT UNIT CEILING_SECONDS MAX_RESTARTS STALL_SECONDS
HTTPS when the unit serves it (--ssl-certfile), checked against the fleet CA (VLLM_PROBE_CA_FILE).
Prints one JSON object: {"healthy": bool, "seconds": n, "reason": str, "waited_for": str, "journal": [lines]}
and exits 0 only when /health answered 200.

It keeps waiting while the unit is active and starting makes progress: the
unit's journal advances or its processes use CPU. It stops waiting when
  - the unit is in the failed state, or systemd restarted it MAX_RESTARTS
    times during the wait (a release that cannot start is reported in seconds);
  - nothing moved for STALL_SECONDS (a hung start);
  - CEILING_SECONDS passed in all (the hard limit, however busy the start).
"""

import functools
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request

POLL_SECONDS = 3


def unit_state(unit):
    out = subprocess.run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "NRestarts", "-p", "Result", "-p", "CPUUsageNSec", unit],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal_cursor(unit):
    """The cursor of the unit's newest journal entry ('' when there is none)."""
    out = subprocess.run(
        ["journalctl", "-u", unit, "-n", "1", "-o", "json", "--no-pager"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    try:
        return json.loads(out.splitlines()[-1]).get("__CURSOR", "") if out else ""
    except ValueError:
        return out


def journal(unit, since):
    out = subprocess.run(
        ["journalctl", "-u", unit, "--since", f"@{int(since)}", "-n", "25", "--no-pager", "-o", "cat"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return out.splitlines()[-25:]


def serving_tls(unit):
    """Whether the unit's command serves HTTPS (--ssl-certfile): what the unit runs, also after a rollback."""
    out = subprocess.run(
        ["systemctl", "show", "-p", "ExecStart", unit], capture_output=True, text=True, check=False
    ).stdout
    return "--ssl-certfile" in out


def tls_context(ca_file):
    """The instance's certificate checked against the fleet's CA; not its name: this host probes itself."""
    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = False
    return context


def healthy(address, port, context=None):
    host = "127.0.0.1" if address in ("0.0.0.0", "", "*") else address
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if context else "http"
    try:
        with urllib.request.urlopen(f"{scheme}://{host}:{port}/health", timeout=5, context=context) as response:
            return response.status == 200
    except OSError:
        return False


def cpu_ns(state):
    value = state.get("CPUUsageNSec", "")
    return int(value) if value.isascii() and value.isdigit() else None


def wait(
    address,
    port,
    unit,
    ceiling,
    max_restarts,
    stall,
    clock=time.time,
    sleep=time.sleep,
    state_of=unit_state,
    cursor_of=journal_cursor,
    health_of=healthy,
):
    """Returns (healthy, reason); the arguments after stall are seams for the unit tests."""
    started = clock()
    first = int(state_of(unit).get("NRestarts", "0") or 0)
    last_progress = started
    last_cursor = cursor_of(unit)
    last_cpu = cpu_ns(state_of(unit))
    while True:
        if health_of(address, port):
            return True, ""
        now = clock()
        state = state_of(unit)
        restarts = int(state.get("NRestarts", "0") or 0) - first
        if state.get("ActiveState") == "failed":
            return False, f"{unit} failed ({state.get('Result', '?')})"
        if restarts >= max_restarts:
            return False, f"{unit} restarted {restarts} times while starting"
        cursor, cpu = cursor_of(unit), cpu_ns(state)
        if cursor != last_cursor or (cpu is not None and last_cpu is not None and cpu - last_cpu > 10**9):
            last_progress = now
        last_cursor, last_cpu = cursor, cpu
        if now - last_progress >= stall:
            return False, f"no answer on /health and no progress (journal, CPU) for {stall} s"
        if now - started >= ceiling:
            return False, f"no answer on /health within the ceiling of {ceiling} s, though it was making progress"
        sleep(POLL_SECONDS)


def main(address, port, unit, ceiling, max_restarts, stall):
    started = time.time()
    context = None
    if serving_tls(unit):
        ca_file = os.environ.get("VLLM_PROBE_CA_FILE", "/etc/vllm/tls-ca.crt")
        try:
            context = tls_context(ca_file)
        except OSError as err:
            print(
                json.dumps(
                    {
                        "healthy": False,
                        "seconds": 0,
                        "reason": f"{unit} serves HTTPS, and the CA file"
                        f" {ca_file} to check it with cannot be read ({err})",
                        "waited_for": "",
                        "journal": [],
                    }
                )
            )
            return 1
    ok, reason = wait(
        address, port, unit, ceiling, max_restarts, stall, health_of=functools.partial(healthy, context=context)
    )
    result = {
        "healthy": ok,
        "seconds": round(time.time() - started, 1),
        "reason": reason,
        "waited_for": (
            f"/health of {unit} on {'https' if context else 'http'}://{address}:{port}, while it made progress "
            f"(stall limit {stall} s, ceiling {ceiling} s, at most {max_restarts} restarts)"
        ),
        "journal": [] if ok else journal(unit, started - 60),
    }
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(main(a[0], int(a[1]), a[2], int(a[3]), int(a[4]), int(a[5])))
