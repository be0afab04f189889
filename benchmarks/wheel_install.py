"""Time the install of a built vLLM wheel on a fresh host of its build class.

Run from the repo root after a build has stored the wheel in .cache/artifacts/
(`molecule test -s build` or the demo fleet):

    PATH=$PWD/.venv/bin:$PATH python benchmarks/wheel_install.py --out reports/wheel-install.json

Starts a new systemd container `bench-install` from the Debian 12 image the
builder used, makes it a managed host of the class (controller CA, facts, plan,
the toolchain role's runtime libraries, untimed), then times the `vllm_install`
role alone (benchmarks/wheel_install.yml): the wheelhouse copy, the venv, the
wheel and its pinned dependencies, the CPU-build checks. It runs the playbook a
second time to time the no-op re-run and read its `changed` count, asks the new
venv for vLLM's and torch's versions, and removes the container (--keep leaves
it). Writes the JSON that docs/benchmarks.md quotes.
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOST = "bench-install"
IMAGE = "localhost/vllm-fleet/debian:12"


def run_playbook(version, result_file):
    """Run the benchmark playbook, echo its output; return (wall s, changed count, install s)."""
    command = [
        "ansible-playbook",
        "-i",
        f"{HOST},",
        "-c",
        "containers.podman.podman",
        "-e",
        f"vllm_version={version}",
        "-e",
        f"bench_result_file={result_file}",
        str(REPO / "benchmarks" / "wheel_install.yml"),
    ]
    started = time.time()
    output = []
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            print(line, end="", flush=True)
            output.append(line)
    wall = time.time() - started
    if proc.returncode != 0:
        sys.exit(f"the playbook failed (rc {proc.returncode}); the container {HOST} is kept for a look")
    recap = re.search(rf"^{HOST}\s*:.*\bchanged=(\d+)", "".join(output), re.MULTILINE)
    install = json.loads(Path(result_file).read_text())
    return round(wall, 1), int(recap.group(1)), install


def in_host(*argv):
    return subprocess.run(["podman", "exec", HOST, *argv], capture_output=True, text=True, check=True).stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--version", default="0.32.0", help="vLLM version of the stored wheel")
    parser.add_argument("--keep", action="store_true", help="leave the container running")
    args = parser.parse_args()

    pattern = REPO / ".cache" / "artifacts" / "**" / f"vllm-{args.version}[+-]*.whl"
    wheels = sorted(glob.glob(str(pattern), recursive=True))
    if not wheels:
        sys.exit(
            f"no vllm-{args.version} wheel in .cache/artifacts/: build it first "
            "(molecule test -s build, or bash scripts/demo.sh)"
        )

    subprocess.run(["podman", "rm", "-f", HOST], capture_output=True, check=False)
    subprocess.run(
        [
            "podman",
            "run",
            "-d",
            "--name",
            HOST,
            "--hostname",
            HOST,
            "--systemd",
            "always",
            "--shm-size",
            "1g",
            IMAGE,
            "/sbin/init",
        ],
        check=True,
        capture_output=True,
    )
    load_at_start = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        first_wall, first_changed, first = run_playbook(args.version, f"{tmp}/first.json")
        second_wall, second_changed, second = run_playbook(args.version, f"{tmp}/second.json")
    venv = first["venv"]
    versions = json.loads(
        in_host(
            f"{venv}/bin/python",
            "-c",
            "import json, torch, vllm; print(json.dumps([vllm.__version__, torch.__version__]))",
        )
    )
    result = {
        "command": "python benchmarks/wheel_install.py " + " ".join(sys.argv[1:]),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "wheels_in_store": [os.path.relpath(w, REPO) for w in wheels],
        "wheel_mib": round(os.path.getsize(wheels[-1]) / 2**20, 1),
        "venv": venv,
        "venv_size": in_host("du", "-sh", venv).split()[0],
        "vllm_version": versions[0],
        "torch_version": versions[1],
        "install_seconds": first["install_seconds"],
        "first_run_wall_seconds": first_wall,
        "first_run_changed": first_changed,
        "rerun_install_seconds": second["install_seconds"],
        "rerun_wall_seconds": second_wall,
        "rerun_changed": second_changed,
        "load_average_at_start": load_at_start,
        "cpus": os.cpu_count(),
    }
    if not args.keep:
        subprocess.run(["podman", "rm", "-f", HOST], capture_output=True, check=False)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if second_changed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
