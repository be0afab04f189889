#!/usr/bin/env python3
"""Print, as one JSON object, what the build preflight reads on the builder, in one run.

Usage: build_host_probe.py PYTHON DIR...
  python: PYTHON's "major.minor", or "" with python_error when it does not run.
  mem_available_kib: MemAvailable of /proc/meminfo.
  disk_free_kib: the least free space (df -Pk's "Available") under the DIRs, each
    measured at its nearest existing parent (the build creates them later).
One script instead of a task each: every remote run costs the controller more
than what it reads.
"""

import json
import os
import subprocess
import sys


def python_version(python):
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return "", str(exc)
    if done.returncode:
        return "", (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return done.stdout.strip(), ""


def mem_available_kib():
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def free_kib(path):
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize // 1024


def main(args):
    version, error = python_version(args[0])
    print(
        json.dumps(
            {
                "python": version,
                "python_error": error,
                "mem_available_kib": mem_available_kib(),
                "disk_free_kib": min(free_kib(os.path.abspath(d)) for d in args[1:]),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
