"""How long a rollout batch takes, split into its drain, its restart and health gate, and everything else.

Run from the repo root after `bash scripts/demo.sh` converged the fleet (pass the same -e as the demo got):
  .venv/bin/python benchmarks/rollout_speed.py [--write] [-- -e vllm_install_source=index]

Two rollouts of the demo fleet over its own connection (containers.podman.podman: no SSH; an SSH fleet
adds its round trips to every task of "else"): the first sets vllm_service_max_num_seqs to 16 (every
instance restarts), the second takes it back to the inventory's value, so the fleet ends as it began.
benchmarks/callback/phase_clock.py records when every task started (its clock files are kept under
reports/rollout-speed/, and --clock reads them again); a batch is one run of the play "Roll the change
out to the serving hosts, one batch at a time", and its parts are cut at the rollout's own tasks:
  drain         "Drain the host on every load balancer" to "Record the rollout (phase switch)"
  restart+gate  "Restart the changed instances and pass the health gate" to the load balancer switch, and
                "Put the host back in every load balancer and wait until each sees it UP" to "phase gated"
  else          the rest of the batch (recovery check, check-mode pass, snapshot, configuration, commit)
Then a 1,000-host rollout at the default batches (1, then 10%) is estimated from the measured figures:
each batch takes its drain and restart+gate once (hosts of a batch run them side by side) and its "else"
once per wave of `forks` hosts (ansible.cfg: 20) — a model, stated as such, not a measurement.
--write replaces the "## Rollout speed" section of docs/benchmarks.md.
"""

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins" / "plugin_utils"))
from vllm_rollout_serial import DEFAULT_SERIAL, batch_sizes  # noqa: E402

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
VAULT = ["--vault-id", "demo@inventories/demo.vault-password"]
HEADING = "## Rollout speed"
BATCH_PLAY = "Roll the change out to the serving hosts, one batch at a time"
SEGMENTS = {
    "drain": [("Drain the host on every load balancer", "Record the rollout (phase switch)")],
    "restart+gate": [
        ("Restart the changed instances and pass the health gate", "Move this host's servers on every load balancer"),
        ("Put the host back in every load balancer and wait until each sees it UP", "Record the rollout (phase gated)"),
    ],
}
# Two pieces of "else", reported apart: the service role's configuration, once in check mode to decide
# what restarts and once for real.
PASSES = {
    "check-mode pass": ("Find out which instances the new configuration restarts", "Decide how this host changes"),
    "configure pass": ("Write the new configuration", "Restart the changed instances and pass the health gate"),
}
FORKS = 20
# The systemctl restart inside restart+gate: in these containers a stop lasts the whole
# vllm_service_stop_timeout (systemd never hears the unit's cgroup emptied; docs/test-environment.md).
RESTART_TASK = "Restart the instances whose inputs changed"


def rollout(extra, clock):
    env = dict(
        os.environ,
        ANSIBLE_CALLBACK_PLUGINS=str(REPO / "benchmarks" / "callback"),
        ANSIBLE_CALLBACKS_ENABLED="phase_clock",
        PHASE_CLOCK_FILE=str(clock),
    )
    started = time.monotonic()
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, *VAULT, "site.yml", *extra], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        failed = f"site.yml {' '.join(extra)} failed (rc {proc.returncode})"
        sys.exit(f"{failed}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    return time.monotonic() - started, [json.loads(line) for line in clock.read_text().splitlines()]


def batches(events):
    """Each batch's wall time and parts, in seconds, from the clock's events."""
    out, current = [], None
    for event in [*events, {"event": "play", "name": "", "t": events[-1]["t"]}]:
        if event["event"] == "play":
            if current is not None:
                current["end"] = event["t"]
                out.append(current)
            current = {"start": event["t"], "tasks": []} if event["name"] == BATCH_PLAY else None
        elif current is not None and event["event"] == "task":
            current["tasks"].append(event)
    result = []
    for batch in out:
        # A role's task is named "<role> : <task>"; each task lasts until the next one starts.
        names = [task["name"].split(" : ", 1)[-1] for task in batch["tasks"]]
        times = [task["t"] for task in batch["tasks"]] + [batch["end"]]
        took = [(name, times[i + 1] - times[i], times[i]) for i, name in enumerate(names)]
        parts, inside = {}, []
        for part, spans in SEGMENTS.items():
            total = 0.0
            for begin, end in spans:
                t0 = next((t for name, _unused, t in took if name.startswith(begin)), None)
                t1 = next((t for name, _unused, t in took if name.startswith(end) and t0 is not None and t >= t0), None)
                if t0 is None or t1 is None:
                    sys.exit(f"a batch has no task '{begin}' followed by '{end}': did the rollout restart anything?")
                total += t1 - t0
                inside.append((t0, t1))
            parts[part] = total
        wall = batch["end"] - batch["start"]
        parts["else"] = wall - sum(parts.values())
        outside = [(name, seconds) for name, seconds, t in took if not any(a <= t < b for a, b in inside)]
        restart = sum(seconds for name, seconds, _unused in took if name.startswith(RESTART_TASK))
        passes = {}
        for label, (begin, end) in PASSES.items():
            t0 = next(t for name, _unused, t in took if name.startswith(begin))
            passes[label] = next(t for name, _unused, t in took if name.startswith(end) and t >= t0) - t0
        result.append(
            {"wall": wall, "tasks": len(names), "restart": restart, "outside": outside, "passes": passes, **parts}
        )
    return result


def estimate(measured, hosts=1000):
    """Seconds for `hosts` at the default batches, from the measured mean parts (the model in the docstring)."""
    mean = {key: sum(b[key] for b in measured) / len(measured) for key in ("drain", "restart+gate", "else")}
    sizes = batch_sizes(list(DEFAULT_SERIAL), hosts)
    seconds = sum(mean["drain"] + mean["restart+gate"] + mean["else"] * math.ceil(size / FORKS) for size in sizes)
    return sizes, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    parser.add_argument(
        "--clock", nargs="+", metavar="FILE", help="read these clock files (of an earlier run) instead of running"
    )
    parser.add_argument("extra", nargs="*", help="arguments for ansible-playbook after --")
    args = parser.parse_args()
    measured, runs = [], []
    if args.clock:
        for path in args.clock:
            events = [json.loads(line) for line in Path(path).read_text().splitlines()]
            runs.append((Path(path).stem, events[-1]["t"] - events[0]["t"], batches(events)))
    else:
        # Kept, so that a run's figures can be read again (--clock) and checked.
        keep = REPO / "reports" / "rollout-speed"
        keep.mkdir(parents=True, exist_ok=True)
        for label, knob in (("max_num_seqs-16", ["-e", "vllm_service_max_num_seqs=16"]), ("back", [])):
            clock = keep / f"{label}.jsonl"
            clock.unlink(missing_ok=True)
            seconds, events = rollout([*args.extra, *knob], clock)
            runs.append((label, seconds, batches(events)))
    for _unused, _unused, found in runs:
        measured += found
    sizes, seconds = estimate(measured)
    lines = [
        HEADING,
        "",
        f"`benchmarks/rollout_speed.py` on {datetime.date.today().isoformat()}, {platform.machine()}, "
        f"{os.cpu_count()} cores, the demo fleet (inventories/demo: 2 vLLM hosts, 1 load balancer, the podman "
        "connection, default batches: one host each). Seconds per batch:",
        "",
        "| rollout | batch | tasks | drain | restart+gate (of it: systemctl restart) | else | wall "
        "| else / restart+gate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, _unused, found in runs:
        for number, batch in enumerate(found, 1):
            ratio = batch["else"] / batch["restart+gate"] if batch["restart+gate"] else float("nan")
            lines.append(
                f"| {label} | {number} | {batch['tasks']} | {batch['drain']:.1f} | "
                f"{batch['restart+gate']:.1f} ({batch['restart']:.1f}) | "
                f"{batch['else']:.1f} | {batch['wall']:.1f} | {ratio:.2f} |"
            )
    slowest = {}
    for batch in measured:
        for name, spent in batch["outside"]:
            slowest[name] = slowest.get(name, 0.0) + spent / len(measured)
    top = sorted(slowest.items(), key=lambda item: -item[1])[:6]
    lines += [
        "",
        "Where 'else' goes (mean seconds per batch, the slowest tasks; every other task is about 0.4 to 1 s of "
        "connection and module start): " + "; ".join(f"{name} {spent:.1f}" for name, spent in top) + ".",
    ]
    mean = {key: sum(b[key] for b in measured) / len(measured) for key in ("else", "restart+gate", "restart")}
    passes = {label: sum(b["passes"][label] for b in measured) / len(measured) for label in PASSES}
    # A host's systemctl restart returns about a second after vLLM's SIGTERM (docs/test-environment.md).
    real = mean["restart+gate"] - mean["restart"] + 1
    lines += [
        "",
        f"Of 'else', {' and '.join(f'the {label} {seconds:.1f} s' for label, seconds in passes.items())}. "
        f"The systemctl restart's {mean['restart']:.0f} s are the containers' stop wait: counted as the second a "
        f"host takes, restart+gate is about {real:.0f} s and else / restart+gate about {mean['else'] / real:.1f} "
        "(target: 0.5 or less).",
    ]
    lines += [
        "",
        "Whole runs (site.yml, preflight to report): "
        + ", ".join(f"{label} {seconds:.0f} s" for label, seconds, _unused in runs)
        + ".",
        "",
        f"Estimate, 1,000 hosts at the default batches ({len(sizes)} batches: {sizes[0]}, then {sizes[1]} each), "
        f"forks {FORKS}: about {seconds / 60:.0f} min of batches (drain and restart+gate once per batch, "
        f"'else' once per wave of {FORKS} hosts). A model from these figures, not a measurement.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        path = REPO / "docs" / "benchmarks.md"
        doc = path.read_text()
        if HEADING not in doc:
            doc = doc.rstrip("\n") + "\n\n" + HEADING + "\n"
        head, rest = doc.split(HEADING, 1)
        after = rest.find("\n## ")
        path.write_text(head + text + (rest[after:] if after >= 0 else ""))


if __name__ == "__main__":
    main()
