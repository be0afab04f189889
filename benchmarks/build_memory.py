"""Run a command and record the memory of the compiler jobs it starts.

Run from the repo root, e.g. the cold build of the `build` scenario:
  rm -rf .cache/molecule-build/ccache && mkdir -p .cache/molecule-build/ccache
  PATH=$PWD/.venv/bin:$PATH python benchmarks/build_memory.py --out reports/build-cold.json -- \
      molecule test -s build

Samples /proc twice a second (container processes are visible from the host)
and keeps, for every compiler process (cc1plus, cc1, ld): its peak resident
memory (VmHWM, so a peak between two samples is still seen), the file it
compiles (the five largest are named in the result) and, over time,
the largest sum of the compilers' resident memory and the most compilers
running at once. Wall time and the command's exit code are recorded too.
The JSON it writes is what docs/benchmarks.md quotes.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

COMPILERS = {"cc1plus", "cc1", "ld", "ld.bfd", "ld.gold"}
GIB = 1024**3


def read_status(pid):
    """(name, VmRSS bytes, VmHWM bytes) of a process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    name = fields.get("Name", "").strip()

    def kib(key):
        value = fields.get(key, "0 kB").split()[0]
        return int(value) * 1024

    return name, kib("VmRSS"), kib("VmHWM")


def source_file(pid):
    """The file a compiler process compiles (gcc passes it to cc1plus as -dumpbase), or ''."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    for flag, value in itertools.pairwise(argv):
        if flag == b"-dumpbase":
            return value.decode(errors="replace")
    return ""


def sample(peaks, sources):
    """One pass over /proc: update per-process peaks, return (count, rss sum)."""
    count = 0
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        status = read_status(entry.name)
        if status is None or status[0] not in COMPILERS:
            continue
        name, rss, hwm = status
        count += 1
        total += rss
        key = (entry.name, name)
        if key not in peaks:
            sources[key] = source_file(entry.name)
        peaks[key] = max(peaks.get(key, 0), hwm)
    return count, total


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")

    peaks = {}
    sources = {}
    max_jobs = 0
    max_total = 0
    started = time.time()
    first_compiler = None
    last_compiler = None
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        count, total = sample(peaks, sources)
        if count:
            now = time.time()
            first_compiler = first_compiler or now
            last_compiler = now
        max_jobs = max(max_jobs, count)
        max_total = max(max_total, total)
        time.sleep(args.interval)
    wall = time.time() - started

    per_job = sorted(peaks.values(), reverse=True)
    compile_peaks = sorted((v for (_unused, name), v in peaks.items() if name.startswith("cc1")), reverse=True)
    result = {
        "command": " ".join(command),
        "rc": proc.returncode,
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "wall_seconds": round(wall, 1),
        "compiler_window_seconds": round((last_compiler - first_compiler), 1) if first_compiler else 0,
        "compiler_processes_seen": len(peaks),
        "compile_jobs_seen": len(compile_peaks),
        "most_compilers_at_once": max_jobs,
        "peak_sum_rss_gib": round(max_total / GIB, 3),
        "peak_job_gib": round(per_job[0] / GIB, 3) if per_job else 0,
        "job_peak_p50_gib": round(compile_peaks[len(compile_peaks) // 2] / GIB, 3) if compile_peaks else 0,
        "job_peak_p95_gib": round(compile_peaks[len(compile_peaks) // 20] / GIB, 3) if compile_peaks else 0,
        "jobs_over_2_gib": sum(1 for v in compile_peaks if v > 2 * GIB),
        "largest_jobs": [
            {"source": sources.get(key, ""), "peak_gib": round(value / GIB, 3)}
            for key, value in sorted(peaks.items(), key=lambda item: item[1], reverse=True)[:5]
        ],
        "load_average_at_end": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
