"""Which hosts restarted vLLM in each batch of a rollout, read from ansible-playbook's output.

Usage: rollout_batches.py OUTPUT_FILE
Prints a JSON list, one entry per batch of the rollout play ("Roll the change
out to the serving hosts, one batch at a time"): the hosts for which the
restart task reported changed.
"""

import json
import re
import sys

PLAY = re.compile(r"^PLAY \[Roll the change out to the serving hosts, one batch at a time\]")
ANY_PLAY = re.compile(r"^PLAY \[")
TASK = re.compile(r"^TASK \[(?P<name>[^\]]*)\]")
CHANGED = re.compile(r"^changed: \[(?P<host>[^\]]+)\]")


def batches(lines):
    result, current, task = [], None, ""
    for line in lines:
        if PLAY.match(line):
            current = set()
            result.append(current)
            continue
        if ANY_PLAY.match(line):
            current = None
            continue
        match = TASK.match(line)
        if match:
            task = match.group("name")
            continue
        match = CHANGED.match(line)
        if current is not None and match and task.endswith("Restart the instances whose inputs changed"):
            current.add(match.group("host"))
    return [sorted(batch) for batch in result]


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as handle:
        print(json.dumps(batches(handle.read().splitlines())))
