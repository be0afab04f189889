"""One Markdown table row per run of measure.sh: baseline, peak df used, peak - baseline, the files' sizes,
what was left after the stop. Usage: summary.py NAME... (runs under $SHM_MEASURE_DIR/runs, /tmp/shm-measure)."""

import json
import os
import re
import sys

MIB = 1024 * 1024
RUNS = os.path.join(os.environ.get("SHM_MEASURE_DIR", "/tmp/shm-measure"), "runs")
COLUMNS = (
    "run",
    "baseline df used (MiB, max of 10 samples)",
    "peak df used (MiB)",
    "peak - baseline (MiB)",
    "peak sum of file sizes, newer than stamp (MiB, apparent)",
    "peak sum of allocated blocks of those files (MiB)",
    "files left after exit (MiB allocated)",
    "stop",
)


def row(name):
    run = os.path.join(RUNS, name)
    with open(os.path.join(run, "samples.jsonl"), encoding="utf-8") as handle:
        samples = [json.loads(line) for line in handle]
    with open(os.path.join(run, "meta.txt"), encoding="utf-8") as handle:
        meta = handle.read()
    base = max(x["df_used"] for x in samples if x["phase"] == "baseline")
    active = [x for x in samples if x["phase"] in ("starting", "load", "post")]
    peak = max(active, key=lambda x: x["df_used"])
    apparent = max(x["newer_size"] for x in active)
    allocated = max(x["newer_alloc"] for x in active)
    last = samples[-1]
    left = sum(v[1] for v in last["files"].values())
    stop = re.search(r"stopped: (.*?) after", meta).group(1)
    started = re.search(r"ready: (\d)", meta).group(1) == "1"
    cells = (
        name + ("" if started else " (did not start)"),
        f"{base / MIB:.3f}",
        f"{peak['df_used'] / MIB:.3f}",
        f"{(peak['df_used'] - base) / MIB:.3f}",
        f"{apparent / MIB:.3f}",
        f"{allocated / MIB:.3f}",
        f"{len(last['files'])} files, {left / MIB:.3f}",
        stop,
    )
    return "| " + " | ".join(cells) + " |"


def main():
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for name in sys.argv[1:]:
        print(row(name))


if __name__ == "__main__":
    main()
