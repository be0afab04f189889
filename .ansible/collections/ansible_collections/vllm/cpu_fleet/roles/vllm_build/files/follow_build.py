#!/usr/bin/env python3
"""follow_build.py WORK JOB_FILE WAIT: one progress round of the async compile.

Waits up to WAIT seconds for the async job (JOB_FILE, the results_file Ansible
returned when it started build.sh) to end, then prints one JSON line:
{"state": "running" | "finished" | "gone", "step": ..., "seconds": ...}, where
step is the latest of ninja's [N/M] and setup.py's "running <command>" lines in
WORK/build.log and seconds the time since WORK/build.started.

The job file is what ansible.builtin.async_status reads: it keeps "started"
until the job ends and is replaced by the job's result (or async's timeout
result) then. A missing file is a job that no longer exists ("gone").
Standard library only: it runs on the builder's python3.
"""

import json
import os
import re
import sys
import time

# After the last ninja step, setup.py installs and packages for minutes.
PROGRESS = re.compile(rb"^\s*(\[[0-9]+/[0-9]+\]|running [a-z_]+)", re.MULTILINE)


def job_state(job_file):
    try:
        with open(job_file, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return "gone"
    except ValueError:
        # As async_status: a job file that does not parse yet is a job still starting.
        return "running"
    return "finished" if "started" not in data or data.get("finished") else "running"


def progress(work):
    try:
        with open(os.path.join(work, "build.log"), "rb") as handle:
            matches = PROGRESS.findall(handle.read())
    except FileNotFoundError:
        matches = []
    line = matches[-1].decode() if matches else ""
    if line.startswith("["):
        step = f"ninja {line}"
    elif line:
        step = f"setup.py {line.removeprefix('running ')}"
    else:
        step = "starting"
    try:
        with open(os.path.join(work, "build.started"), encoding="utf-8") as handle:
            seconds = max(0, int(time.time()) - int(handle.read().strip()))
    except (FileNotFoundError, ValueError):
        seconds = 0
    return step, seconds


def follow(work, job_file, wait, clock=time.monotonic, sleep=time.sleep):
    deadline = clock() + wait
    state = job_state(job_file)
    while state == "running" and clock() < deadline:
        sleep(max(0, min(5, deadline - clock())))
        state = job_state(job_file)
    step, seconds = progress(work)
    return {"state": state, "step": step, "seconds": seconds}


def main(argv):
    if len(argv) != 4:
        print("usage: follow_build.py WORK JOB_FILE WAIT", file=sys.stderr)
        return 2
    print(json.dumps(follow(argv[1], argv[2], float(argv[3]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
