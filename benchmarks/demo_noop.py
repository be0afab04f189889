"""The demo fleet's no-op site.yml re-run, side by side with an empty play and a ping play over the same hosts.

Run from the repo root after `bash scripts/demo.sh` converged the fleet (pass the same -e as the demo got):
  .venv/bin/python benchmarks/demo_noop.py [--runs 2] [--write] [-- -e vllm_install_source=index]

Each round runs, one after the other: an empty play, a `ping` play, `site.yml` (hosts whose converged record
holds are skipped) and `site.yml -e vllm_fleet_full_converge=true` (every role on every host) over
inventories/demo, and records each run's wall time and the recap's changed count
(a re-run that changes anything is not a no-op and is reported as such). --write replaces the
"## Demo fleet: no-op re-run" section of docs/benchmarks.md.
"""

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ansible

REPO = Path(__file__).resolve().parents[1]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
VAULT = ["--vault-id", "demo@inventories/demo.vault-password"]
HEADING = "## Demo fleet: no-op re-run"
HOSTS = "vllm_hosts:builders:loadbalancers"


def plays(work):
    empty = work / "empty.yml"
    empty.write_text(f"- name: Empty play\n  hosts: {HOSTS}\n  gather_facts: false\n  tasks: []\n")
    ping = work / "ping.yml"
    ping.write_text(
        f"- name: Ping play\n  hosts: {HOSTS}\n  gather_facts: false\n"
        "  tasks:\n    - name: Ping\n      ansible.builtin.ping:\n"
    )
    site = REPO / "site.yml"
    return [
        ("empty play", empty, []),
        ("ping play", ping, []),
        ("site.yml re-run", site, []),
        ("site.yml re-run, every role (`full_converge`)", site, ["-e", "vllm_fleet_full_converge=true"]),
    ]


def run(playbook, extra):
    started = time.monotonic()
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, *VAULT, str(playbook), *extra], cwd=REPO, capture_output=True, text=True, check=False
    )
    seconds = time.monotonic() - started
    recap = re.findall(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout, re.M)
    if proc.returncode != 0:
        sys.exit(f"{playbook.name} failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    return seconds, sum(int(r[2]) for r in recap), sum(int(r[1]) for r in recap), len(recap)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="rounds (each: empty, ping, site.yml)")
    parser.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    parser.add_argument("extra", nargs="*", help="arguments for every ansible-playbook run, after --")
    args = parser.parse_args()
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.UTC)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _n in range(args.runs):
            for name, playbook, own in plays(Path(tmp)):
                rows.setdefault(name, []).append(run(playbook, args.extra + own))
    load_after = os.getloadavg()

    ping = min(seconds for seconds, *_unused in rows["ping play"])
    command = "python benchmarks/demo_noop.py " + " ".join(sys.argv[1:])
    lines = [
        HEADING,
        "",
        f"`{command}`, {started:%Y-%m-%d %H:%M} UTC, ansible-core {ansible.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs; load average (1, 5, 15 min) before "
        f"{', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}. "
        "The demo fleet (inventories/demo: builder, two vLLM hosts, load balancer; `podman` connection), "
        "converged before. Best of the rounds; the ratio is to the best `ping` play. The `full_converge` row "
        "(`-e vllm_fleet_full_converge=true`) runs every role on every host.",
        "",
        "| play | hosts | tasks run (ok) | changed | wall s, each round | best wall s | x ping |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for name, results in rows.items():
        best = min(seconds for seconds, *_unused in results)
        _unused, changed, ok, hosts = results[-1]
        rounds = ", ".join(f"{seconds:.1f}" for seconds, *_unused in results)
        lines.append(f"| {name} | {hosts} | {ok} | {changed} | {rounds} | {best:.1f} | {best / ping:.2f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if any(changed for results in rows.values() for _unused, changed, *_unused in results):
        print("NOTE: a run changed something: not a no-op re-run", file=sys.stderr)
    if args.write:
        doc = REPO / "docs" / "benchmarks.md"
        text = doc.read_text()
        start = text.find(HEADING)
        if start < 0:
            text = text.rstrip("\n") + "\n\n" + table
        else:
            end = text.find("\n## ", start + len(HEADING))
            text = text[:start] + table + ("" if end < 0 else text[end:])
        doc.write_text(text)


if __name__ == "__main__":
    main()
