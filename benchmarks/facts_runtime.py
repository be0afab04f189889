"""Time vllm_cpu_facts against ansible's own setup module.

Run from the repo root:  .venv/bin/python benchmarks/facts_runtime.py [--runs N] [--write]

Measures read_cpu_facts() in-process (this host and the largest recorded
machine) and full `ansible localhost -m ...` runs, which include ansible's
start-up and module shipping. Runs are sequential; medians are reported.
--write replaces the "## Fact module run time" section of docs/benchmarks.md.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ansible

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))  # the collection, through the checkout's link
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "machines"))
import expand  # noqa: E402
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_topology import read_cpu_facts  # noqa: E402

LARGEST = "gnr-2s-snc3"
HEADING = "## Fact module run time"
ANSIBLE = str(Path(sys.executable).parent / "ansible")


def median_ms(func, runs):
    samples = []
    for _n in range(runs):
        start = time.perf_counter()
        func()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def adhoc(module, args):
    def run():
        subprocess.run(
            [ANSIBLE, "localhost", "-m", module, "-a", args],
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    return run


def measure(runs):
    with tempfile.TemporaryDirectory() as tmp:
        big = str(expand.expand(LARGEST, Path(tmp) / LARGEST))
        cpus = len(read_cpu_facts(big)["online_cpus"])
        rows = [
            ("read_cpu_facts('/') in-process", "python", median_ms(lambda: read_cpu_facts("/"), runs * 20)),
            (
                f"read_cpu_facts({LARGEST}, {cpus} CPUs) in-process",
                "python",
                median_ms(lambda: read_cpu_facts(big), runs * 4),
            ),
            (
                "vllm_cpu_facts, this host",
                "ansible localhost -m vllm_cpu_facts",
                median_ms(adhoc("vllm_cpu_facts", "root=/"), runs),
            ),
            (
                f"vllm_cpu_facts, {LARGEST}",
                f"ansible localhost -m vllm_cpu_facts -a root=<expanded {LARGEST}>",
                median_ms(adhoc("vllm_cpu_facts", "root=" + big), runs),
            ),
            (
                "setup gather_subset=hardware",
                "ansible localhost -m setup -a gather_subset=hardware",
                median_ms(adhoc("setup", "gather_subset=hardware"), runs),
            ),
            (
                "setup gather_subset=all",
                "ansible localhost -m setup -a gather_subset=all",
                median_ms(adhoc("setup", "gather_subset=all"), runs),
            ),
        ]
    return rows


def render(rows, runs):
    lines = [
        HEADING,
        "",
        f"Measured with `.venv/bin/python benchmarks/facts_runtime.py --runs {runs} --write` from the repo"
        f" root (ansible-core {ansible.__version__}, Python {platform.python_version()}, {os.cpu_count()}"
        f" CPUs: {read_cpu_facts('/')['model']}). Medians; ansible rows are whole `ansible localhost`"
        f" invocations (start-up included) run {runs} times each, in-process rows run {runs * 20}/{runs * 4}"
        " times.",
        "",
        "| what | command | median ms |",
        "|---|---|---:|",
    ]
    lines += [f"| {what} | `{cmd}` | {ms:.1f} |" for what, cmd, ms in rows]
    return "\n".join(lines) + "\n"


def write_section(text):
    # Replace only this section: other sections of the file belong to others.
    path = REPO / "docs" / "benchmarks.md"
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    start = old.find(HEADING)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + len(HEADING))
        new = old[:start] + text + (old[end:] if end >= 0 else "")
    path.write_text(new, encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    text = render(measure(args.runs), args.runs)
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
