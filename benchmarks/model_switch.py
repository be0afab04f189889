"""What a model change costs inside a host's drained window, before and after models became versions.

Run from the repo root (local connection, a temporary home; nothing of a fleet is needed):
  .venv/bin/python benchmarks/model_switch.py [--gib 2] [--runs 3]

It writes a controller model of --gib GiB (random bytes, so no file system shortcut applies) and a second one
that differs in every file, then times, through ansible-playbook, what roles/vllm_service runs for the switch
from the first to the second:
  - stage: tasks_from model_path (the copy into the new version; site.yml and upgrade.yml run it before any
    drain, while the host serves);
  - switch: tasks_from model_link (the rename of the link; the only model step left in the drained window);
  - in place: the copy module as roles/vllm_service ran it before versions (tasks/model_path.yml at 366a5f2:
    the copy into the served directory, inside the window).
Prints one line per run and the medians.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
CHUNK = 64 * 1024**2


def write_model(path, gib, seed):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(f'{{"seed": {seed}}}\n')
    left = int(gib * 1024**3)
    with open(path / "model.safetensors", "wb") as handle:
        while left > 0:
            block = os.urandom(min(CHUNK, left))
            handle.write(block)
            left -= len(block)


def play(tmp, tasks, model):
    variables = {
        "vllm_service_model_source": "path",
        "vllm_service_model_path": str(model),
        "vllm_service_home": str(tmp / "home"),
        "vllm_service_config_dir": str(tmp / "etc"),
        "vllm_service_user": "root",
        "vllm_service_group": "root",
    }
    inventory = {"all": {"hosts": {"h": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "vars.yml").write_text(yaml.safe_dump(variables))
    (tmp / "play.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    started = time.monotonic()
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp / "inventory.yml"), "-e", f"@{tmp / 'vars.yml'}", str(tmp / "play.yml")],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - started
    if done.returncode:
        sys.exit(done.stdout[-3000:] + done.stderr[-2000:])
    return seconds


def entry(name):
    return {"name": name, "ansible.builtin.include_role": {"name": "vllm.cpu_fleet.vllm_service", "tasks_from": name}}


def in_place(home):
    """The copy as the role made it before versions: into the served directory."""
    return {"name": "Copy the model in place", "ansible.builtin.copy": {
        "src": "{{ vllm_service_model_path }}/", "dest": f"{home}/models/tiny/", "mode": "u=rwX,g=rX,o="}}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    found = {"stage": [], "switch": [], "in place": []}
    with tempfile.TemporaryDirectory(dir=REPO / ".cache") as work:
        work = Path(work)
        first, second = work / "a" / "tiny", work / "b" / "tiny"
        write_model(first, args.gib, 1)
        write_model(second, args.gib, 2)
        for run in range(args.runs):
            tmp = work / f"run{run}"
            tmp.mkdir()
            (tmp / "etc").mkdir()
            play(tmp, [entry("model_path"), entry("model_link")], first)  # the host serves the first model
            stage = play(tmp, [entry("model_path")], second)
            switch = play(tmp, [entry("model_link")], second)
            old = work / f"old{run}"
            (old / "etc").mkdir(parents=True)
            play(old, [in_place(old / "home")], first)
            copy = play(old, [in_place(old / "home")], second)
            shutil.rmtree(tmp)
            shutil.rmtree(old)
            found["stage"].append(stage)
            found["switch"].append(switch)
            found["in place"].append(copy)
            print(f"run {run + 1}: stage {stage:.1f} s (before the drain), switch {switch:.1f} s (in the window); "
                  f"before versions: copy in place {copy:.1f} s (in the window)", flush=True)  # fmt: skip
    medians = {name: statistics.median(values) for name, values in found.items()}
    print(f"median of {args.runs}, {args.gib:g} GiB: stage {medians['stage']:.1f} s, switch {medians['switch']:.1f} s,"
          f" copy in place {medians['in place']:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
