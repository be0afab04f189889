"""Where a run staged the controller's model, read from ansible-playbook's output.

Usage: model_staging.py OUTPUT_FILE
Prints JSON: {"copied": [hosts whose first "Copy the model from the controller into its version" task reported
changed], "copy_line": its line, "first_drain_line": the line of the first drain task (null: none), "play": the
play that copy ran in}.
"""

import json
import re
import sys

PLAY = re.compile(r"^PLAY \[(?P<name>[^\]]*)\]")
TASK = re.compile(r"^TASK \[(?P<name>[^\]]*)\]")
CHANGED = re.compile(r"^changed: \[(?P<host>[^\]]+)\]")
COPY = "vllm.cpu_fleet.vllm_service : Copy the model from the controller into its version"
DRAIN = re.compile(r"rollout : Drain the host on every load balancer")


def staging(lines):
    found = {"copied": [], "copy_line": None, "first_drain_line": None, "play": None}
    play, task, in_copy = None, None, False
    for number, line in enumerate(lines, 1):
        if match := PLAY.match(line):
            play = match["name"]
        if match := TASK.match(line):
            task = match["name"]
            if in_copy:
                in_copy = False
            if task == COPY and found["copy_line"] is None:
                found.update(copy_line=number, play=play)
                in_copy = True
            if DRAIN.search(task) and found["first_drain_line"] is None:
                found["first_drain_line"] = number
            continue
        if in_copy and (match := CHANGED.match(line)):
            found["copied"].append(match["host"])
    return found


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as handle:
        print(json.dumps(staging(handle.read().splitlines())))
