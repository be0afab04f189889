"""Serve the same load from the planned vLLM instance and from one started with vLLM's defaults.

Run from the repo root (takes about 10 minutes per round on the shared 2-CPU machine):

    PATH=$PWD/.venv/bin:$PATH python benchmarks/serve_plan_vs_defaults.py [--rounds N] [--write]

Uses the `serve` Molecule scenario's container `serve-vllm` (runs `molecule converge -s serve`
first when it is absent) and, one at a time on that container, with the same venv
(/opt/vllm/current), the same tiny model (tools/make_tiny_model.py) and the same port:

- defaults: the planned unit vllm@<instance> is stopped and `systemd-run` starts
  `python -m vllm.entrypoints.openai.api_server` as the service user with only the model, the
  served model name and the port; the API key comes from /etc/vllm/secrets.env as for the
  planned unit (handed to vLLM's own check as VLLM_API_KEY, since no key middleware runs), and
  HF_HUB_OFFLINE/VLLM_NO_USAGE_STATS/DO_NOT_TRACK keep it off the network.
  No VLLM_CPU_* environment, no LD_PRELOAD, no CPU affinity, no hardening, no --dtype,
  --block-size, --max-model-len, --host. One deviation, on by default: `--kv-cache-memory-bytes`
  = the plan's KV cache, because vLLM 0.32's own default claims 0.92 x the node's memory (about
  21.7 GiB of the shared 24 GiB machine) and either refuses to start or takes every other job's
  memory; `--defaults-kv-cache vllm` leaves it out (only on a machine of your own).
- planned: the converged unit vllm@<instance>, restarted (its env file holds the plan's
  VLLM_CPU_KVCACHE_SPACE, VLLM_CPU_OMP_THREADS_BIND and LD_PRELOAD, its drop-in CPUAffinity
  and the plan's flags). It is left running, as converged; the defaults unit is removed.

For each: wait for /health (start-up time), warm up, then the same fixed load: for each
concurrency level, a fixed number of streaming /v1/completions with distinct fixed prompts,
temperature 0, a fixed max_tokens and ignore_eos (every request must generate exactly
max_tokens; checked). The client runs inside the container (Debian's python3, stdlib only), as
the scenario's tests do. Measured per level: requests/s, output tokens/s, end-to-end latency
p50/p95, time to first token p50/p95, time per output token, and the CPU time the service
user's processes used per output token (from /proc). With --rounds N, each round runs defaults
then planned, and the medians are reported. Also recorded: what each instance logged about its
binding, dtype and KV cache, the allocator/OpenMP libraries its processes mapped, and every
warning in its journal. Prints a Markdown section; --write replaces the
"## Serving: planned instance vs vLLM defaults" section of docs/benchmarks.md.

The tiny model's forward pass costs next to nothing: this measures the serving path (API
server, scheduler, detokenizer, engine IPC), OpenMP threading/binding and the allocator, not a
real model's compute.
"""

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
HEADING = "## Serving: planned instance vs vLLM defaults"
CONTAINER = "serve-vllm"
DEFAULTS_UNIT = "vllm-bench-defaults"
VLLM_DIR = "/opt/vllm/current"
SCENARIO = REPO / "molecule" / "serve" / "molecule.yml"
# The vllm_service role has run: the plan it used and an instance's drop-in are there.
CONVERGED = "test -f /etc/vllm/plan.json && ls /etc/systemd/system/vllm@*.service.d/instance.conf"

# Idle CPU is measured over IDLE_S seconds, IDLE_SETTLE_S seconds after the load.
IDLE_SETTLE_S = 5
IDLE_S = 20

# Fixed prompt text; every request puts a distinct tag in front so no two requests share a
# prefix (repeated prompts would be answered partly from vLLM's prefix cache).
PROMPT = (
    "The quick brown fox jumps over the lazy dog while the model server answers many small "
    "requests from clients that all want a few tokens of text, and the scheduler batches them "
    "together so the threads stay busy. Continue the story about the fox and the dog:"
)

# Runs inside the container: `python3 - MODE JSON` with this text on stdin.
CLIENT = r"""
import http.client, json, queue, resource, sys, threading, time

mode, cfg = sys.argv[1], json.loads(sys.argv[2])
headers = {"Content-Type": "application/json", "Authorization": "Bearer " + cfg["key"]}


def get(path):
    conn = http.client.HTTPConnection("127.0.0.1", cfg["port"], timeout=10)
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read()


def wait_healthy():
    import subprocess
    deadline = time.time() + cfg["timeout"]
    while time.time() < deadline:
        state = subprocess.run(["systemctl", "is-active", cfg["unit"]], capture_output=True, text=True).stdout.strip()
        if state not in ("active", "activating", "reloading"):
            return {"healthy": False, "state": state}
        try:
            if get("/health")[0] == 200:
                return {"healthy": True, "state": state}
        except OSError:
            pass
        time.sleep(1)
    return {"healthy": False, "state": "timeout"}


def one(prompt):
    body = json.dumps({
        "model": cfg["model"], "prompt": prompt, "max_tokens": cfg["max_tokens"], "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    })
    start = time.perf_counter()
    first = None
    tokens = None
    try:
        conn = http.client.HTTPConnection("127.0.0.1", cfg["port"], timeout=600)
        conn.request("POST", "/v1/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}: {resp.read()[:200]!r}"}
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("choices") and first is None:
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
        conn.close()
    except OSError as exc:
        return {"error": repr(exc)}
    end = time.perf_counter()
    return {"start": start, "end": end, "ttft": (first or end) - start, "latency": end - start, "tokens": tokens}


def run(prompts, concurrency):
    todo = queue.Queue()
    for p in prompts:
        todo.put(p)
    results = []
    lock = threading.Lock()

    def worker():
        while True:
            try:
                p = todo.get_nowait()
            except queue.Empty:
                return
            r = one(p)
            with lock:
                results.append(r)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall": time.perf_counter() - start, "requests": results}


if mode == "health":
    print(json.dumps(wait_healthy()))
else:
    result = run(cfg["prompts"], cfg["concurrency"])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu"] = usage.ru_utime + usage.ru_stime
    print(json.dumps(result))
"""


def log(msg):
    print(f"[{datetime.now(UTC):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def podman(*args, check=True, stdin=None):
    result = subprocess.run(["podman", *args], input=stdin, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise SystemExit(f"podman {' '.join(args)}: rc {result.returncode}: {result.stderr.strip()}")
    return result


def sh(command, check=True):
    """Run a shell command inside the container; its stdout."""
    return podman("exec", CONTAINER, "sh", "-c", command, check=check).stdout


def client(mode, cfg):
    out = podman("exec", "-i", CONTAINER, "python3", "-", mode, json.dumps(cfg), stdin=CLIENT).stdout
    return json.loads(out)


def scenario_vars():
    group_vars = yaml.safe_load(SCENARIO.read_text())["provisioner"]["inventory"]["group_vars"]["vllm_hosts"]
    return group_vars["vllm_service_api_key"], group_vars["vllm_service_served_model_name"]


def ensure_converged():
    running = podman("inspect", "-f", "{{.State.Running}}", CONTAINER, check=False)
    if (
        running.stdout.strip() == "true"
        and podman("exec", CONTAINER, "sh", "-c", CONVERGED, check=False).returncode == 0
    ):
        return 0.0
    env = dict(os.environ, PATH=f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    start = time.monotonic()
    if podman("container", "exists", CONTAINER, check=False).returncode != 0:
        # Molecule's state may still say "created" (another checkout's run destroyed the
        # containers, which share the names): reset this scenario's state first. This removes
        # only the serve scenario's containers, and serve-vllm is already gone.
        log("serve-vllm is absent: molecule destroy -s serve (state only), then molecule converge -s serve")
        subprocess.run(["molecule", "destroy", "-s", "serve"], cwd=REPO, env=env, check=True)
    else:
        log("serve-vllm is not converged: molecule converge -s serve")
    converge = subprocess.run(["molecule", "converge", "-s", "serve"], cwd=REPO, env=env, check=False)
    if converge.returncode != 0:
        # Other people edit the roles; what matters here is that the planned instance is
        # configured (its health is checked before it is measured).
        if podman("exec", CONTAINER, "sh", "-c", CONVERGED, check=False).returncode != 0:
            raise SystemExit(f"molecule converge -s serve failed (rc {converge.returncode})")
        log(f"WARNING: molecule converge -s serve failed (rc {converge.returncode}) after configuring the instance")
    return time.monotonic() - start


def read_env_file(path):
    env = {}
    for line in sh(f"cat {shlex.quote(path)}").splitlines():
        if "=" in line and not line.startswith("#"):
            name, value = line.split("=", 1)
            env[name] = json.loads(value) if value.startswith('"') else value
    return env


def planned_setup():
    plan = json.loads(sh("cat /etc/vllm/plan.json"))
    instance = plan["instances"][0]
    unit = f"vllm@{instance['name']}"
    dropin = sh(f"cat /etc/systemd/system/{unit}.service.d/instance.conf")
    exec_start = [line.split("=", 1)[1] for line in dropin.splitlines() if line.startswith("ExecStart=")][-1]
    affinity = [line.split("=", 1)[1] for line in dropin.splitlines() if line.startswith("CPUAffinity=")]
    env = read_env_file(f"/etc/vllm/{instance['name']}.env")
    return plan, instance, unit, shlex.split(exec_start), affinity[0] if affinity else "", env


def defaults_command(planned_argv, kv_bytes):
    """The planned command line reduced to what serving needs: model, served name, port."""
    keep = {"--model", "--served-model-name", "--port"}
    # `python -m vllm.entrypoints.openai.api_server` (then --model), or `vllm serve <model>`
    argv, dropped, i = planned_argv[:3], [], 3
    while i < len(planned_argv):
        flag = planned_argv[i]
        has_value = i + 1 < len(planned_argv) and not planned_argv[i + 1].startswith("--")
        pair = planned_argv[i : i + 2] if has_value else [flag]
        if flag in keep:
            argv.extend(pair)
        else:
            dropped.append(pair)
        i += len(pair)
    if kv_bytes:
        argv += ["--kv-cache-memory-bytes", str(kv_bytes)]
    return argv, dropped


def systemd_run_argv(argv):
    return [
        "systemd-run",
        f"--unit={DEFAULTS_UNIT}",
        "--collect",
        "--property=User=vllm",
        "--property=Group=vllm",
        "--property=WorkingDirectory=/var/lib/vllm",
        # The API key, as for the planned unit; never on a command line. secrets.env names it for the
        # role's key middleware, which plain vLLM does not run: vLLM's own check reads VLLM_API_KEY.
        "--property=EnvironmentFile=/etc/vllm/secrets.env",
        # Not tuning: no hub and no usage reporting from an offline test host.
        "--setenv=HF_HUB_OFFLINE=1",
        "--setenv=VLLM_NO_USAGE_STATS=1",
        "--setenv=DO_NOT_TRACK=1",
        "/bin/sh",
        "-c",
        'VLLM_API_KEY="$VLLM_SERVICE_API_KEY" exec "$@"',
        "sh",
        *argv,
    ]


def journal_cursor():
    out = sh("journalctl -n 0 --show-cursor --no-pager")
    return out.strip().rsplit("cursor: ", 1)[-1]


def journal(unit, cursor):
    return sh(f"journalctl --no-pager -o cat -u {shlex.quote(unit)} --after-cursor={shlex.quote(cursor)}")


def server_cpu_seconds():
    """User+system CPU time of every process of the service user (the client runs as root).

    The container's systemd has no CPU accounting (CPUUsageNSec is unset), so read /proc.
    """
    text = sh("for p in $(pgrep -u vllm); do cat /proc/$p/stat 2>/dev/null; echo; done", check=False)
    ticks = 0
    for line in filter(None, text.splitlines()):
        fields = line.rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def loadavg():
    return Path("/proc/loadavg").read_text().split()[0]


def machine_cpu_seconds():
    """(busy, elapsed) CPU seconds of the whole machine so far, from /proc/stat."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = ticks[3] + ticks[4]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


# Warning lines of a vLLM journal: vLLM's logger, c10/torch C++ and glog-style, Python's warnings.
WARNING_PATTERNS = (
    r"\bWARNING \S+ \S+ (?:\[[^\]]*\] )?(.*)",
    r"^\[W\S+ \S+ [^\]]*\] Warning: (.*?)(?: \(function \w+\))?$",
    r"^W\d{4} [\d:.]+ \d+ \S+\] (.*)",
    r"\b(\w+Warning: .*)",
)


def warnings_of(text):
    """{distinct warning message: count} of a journal, without timestamps and pids."""
    seen = {}
    for line in text.splitlines():
        for pattern in WARNING_PATTERNS:
            match = re.search(pattern, line)
            if match:
                message = match.group(1).strip()
                message = message if len(message) <= 150 else message[:149] + "\u2026"
                seen[message] = seen.get(message, 0) + 1
                break
    return seen


FACTS = (
    ("arguments", r"non-default args: (\{[^\n]*\})"),
    ("OpenMP binding", r"(VLLM_CPU_OMP_THREADS_BIND=[^,\s]+)"),
    ("OpenMP threads on", r"local_rank=\d+, (core ids=\[[^\]]*\])"),
    ("reserved CPUs", r"(reserved_cpus=\[[^\]]*\])"),
    ("torch threads", r"(Reducing Torch threads from \d+ to \d+)"),
    ("dtype", r"dtype=torch\.(\w+)"),
    ("KV cache", r"((?:Explicitly|Auto) set \([^)]*\) GiB for KV cache)"),
    ("KV cache tokens", r"CPU KV cache size: ([\d,]+ tokens)"),
    ("engine init", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+ s)"),
)


def facts_of(text):
    """What vLLM logged about the choices this comparison is about: {name: first match}."""
    facts = {}
    for name, pattern in FACTS:
        found = re.search(pattern, text)
        facts[name] = found.group(1) if found else "not logged"
    return facts


def mapped_libs():
    """Allocator and OpenMP libraries mapped by the service user's processes, or None if unreadable.

    Read as the service user: root in the container has no CAP_SYS_PTRACE for another user's maps.
    """
    script = "for p in $(pgrep -u vllm); do runuser -u vllm -- cat /proc/$p/maps || echo UNREADABLE; done"
    text = podman("exec", CONTAINER, "sh", "-c", script, check=False).stdout
    if "UNREADABLE" in text or not text:
        return None
    return sorted(set(re.findall(r"(/\S*lib(?:tcmalloc|iomp|gomp|omp)\S*\.so\S*)", text)))


def prompts(tag, count):
    return [f"[{tag} {i:03d}] {PROMPT}" for i in range(count)]


def measure(name, unit, key, model, port, args):
    """Health-wait, warm up and load the instance `unit` just started; its results."""
    start = time.monotonic()
    health = client("health", {"port": port, "key": key, "unit": unit, "timeout": args.health_timeout})
    startup = time.monotonic() - start
    if not health["healthy"]:
        raise RuntimeError(f"{name}: {unit} never became healthy (state {health['state']})")
    log(f"{name}: healthy after {startup:.0f} s; warming up")
    libs = mapped_libs()
    base = {"port": port, "key": key, "model": model, "max_tokens": args.max_tokens}
    top = max(args.concurrency)
    client("load", {**base, "prompts": prompts("warm", top * 2), "concurrency": top})
    client("load", {**base, "prompts": prompts("warm1", 2), "concurrency": 1})
    levels = []
    for concurrency in args.concurrency:
        load_before = float(loadavg())
        machine_before = machine_cpu_seconds()
        cpu_before = server_cpu_seconds()
        run = client("load", {**base, "prompts": prompts(f"c{concurrency}", args.requests), "concurrency": concurrency})
        cpu_after = server_cpu_seconds()
        machine_after = machine_cpu_seconds()
        errors = [r["error"] for r in run["requests"] if "error" in r]
        if errors:
            raise RuntimeError(f"{name}: {len(errors)} failed requests at concurrency {concurrency}: {errors[0]}")
        short = [r["tokens"] for r in run["requests"] if r["tokens"] != args.max_tokens]
        if short:
            raise RuntimeError(f"{name}: requests generated {short[:3]} tokens, not {args.max_tokens}")
        level = summarize(run, concurrency)
        level["load_before"], level["load_after"] = load_before, float(loadavg())
        level["cpu_ms_per_token"] = (cpu_after - cpu_before) * 1000 / level["tokens"]
        # Everything else the machine ran meanwhile (other jobs, podman exec), % of all its CPUs.
        busy = machine_after[0] - machine_before[0]
        level["others_pct"] = (
            100 * (busy - (cpu_after - cpu_before) - run["cpu"]) / (machine_after[1] - machine_before[1])
        )
        levels.append(level)
        log(f"{name}: c={concurrency}: {level['tok_s']:.0f} tok/s, p50 {level['lat_p50']:.0f} ms")
    # CPU an idle instance burns (polling loops, spinning OpenMP threads), after the load settled.
    time.sleep(IDLE_SETTLE_S)
    cpu_before = server_cpu_seconds()
    time.sleep(IDLE_S)
    idle = (server_cpu_seconds() - cpu_before) * 100 / IDLE_S
    return {"startup": startup, "levels": levels, "libs": libs, "idle_cpu": idle}


def percentile(values, pct):
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1] if len(values) > 1 else values[0]


def summarize(run, concurrency):
    reqs = run["requests"]
    lat = [r["latency"] * 1000 for r in reqs]
    ttft = [r["ttft"] * 1000 for r in reqs]
    tpot = [(r["latency"] - r["ttft"]) * 1000 / (r["tokens"] - 1) for r in reqs if r["tokens"] > 1]
    tokens = sum(r["tokens"] for r in reqs)
    return {
        "concurrency": concurrency,
        "requests": len(reqs),
        "tokens": tokens,
        "wall": run["wall"],
        "req_s": len(reqs) / run["wall"],
        "tok_s": tokens / run["wall"],
        "lat_p50": percentile(lat, 50),
        "lat_p95": percentile(lat, 95),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p95": percentile(ttft, 95),
        "tpot": statistics.mean(tpot) if tpot else float("nan"),
    }


def stop(unit):
    """Stop a unit; the seconds it took."""
    start = time.monotonic()
    sh(f"systemctl stop {shlex.quote(unit)}", check=False)
    return time.monotonic() - start


def start_planned(unit):
    sh(f"systemctl reset-failed {unit}; systemctl start {unit}", check=False)


def run_defaults(argv, ctx, args):
    ctx["stop_s"]["planned"] = stop(ctx["unit"])
    stop(DEFAULTS_UNIT)
    cursor = journal_cursor()
    log(f"defaults: {shlex.join(systemd_run_argv(argv))}")
    sh(shlex.join(systemd_run_argv(argv)))
    try:
        result = measure("defaults", DEFAULTS_UNIT, ctx["key"], ctx["model"], ctx["port"], args)
    except Exception:
        log("defaults: the journal's last lines:\n" + "\n".join(journal(DEFAULTS_UNIT, cursor).splitlines()[-25:]))
        raise
    finally:
        text = journal(DEFAULTS_UNIT, cursor)
        ctx["stop_s"]["defaults"] = stop(DEFAULTS_UNIT)
    return result, text


def run_planned(ctx, args):
    stop(DEFAULTS_UNIT)
    cursor = journal_cursor()
    log(f"planned: systemctl restart {ctx['unit']}")
    sh(f"systemctl reset-failed {ctx['unit']}; systemctl restart {ctx['unit']}")
    try:
        result = measure("planned", ctx["unit"], ctx["key"], ctx["model"], ctx["port"], args)
    except Exception:
        log("planned: the journal's last lines:\n" + "\n".join(journal(ctx["unit"], cursor).splitlines()[-25:]))
        raise
    finally:
        text = journal(ctx["unit"], cursor)
    return result, text


def median_levels(rounds):
    """Per concurrency level, the median of each metric over the rounds."""
    merged = []
    for i, first in enumerate(rounds[0]["levels"]):
        level = dict(first)
        for key, value in first.items():
            if isinstance(value, float):
                level[key] = statistics.median(r["levels"][i][key] for r in rounds)
        merged.append(level)
    return merged


def build_running():
    return subprocess.run(["pgrep", "-f", "molecule test -s build"], capture_output=True, check=False).returncode == 0


def serve_scenario_runs():
    """Other processes running Molecule on a `serve` scenario (any checkout): they reuse our container names."""
    found = subprocess.run(
        ["pgrep", "-af", r"molecule .*-s serve\b"], capture_output=True, text=True, check=False
    ).stdout
    return "\n".join(line for line in found.splitlines() if not line.startswith(f"{os.getpid()} "))


def other_containers():
    names = podman("ps", "--format", "{{.Names}}").stdout.split()
    return sorted(n for n in names if not n.startswith("serve-"))


def software():
    probe = (
        "import importlib.metadata as m, json\n"
        "def v(*names):\n"
        "    for n in names:\n"
        "        try: return m.version(n)\n"
        "        except m.PackageNotFoundError: pass\n"
        "print(json.dumps({'vllm': v('vllm', 'vllm-cpu'), 'dist': 'vllm' if v('vllm') else 'vllm-cpu',"
        " 'torch': v('torch')}))\n"
    )
    return json.loads(podman("exec", CONTAINER, f"{VLLM_DIR}/bin/python", "-c", probe).stdout)


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def fmt(value, digits=0):
    return "n/a" if value is None else f"{value:.{digits}f}"


def render(ctx, results, args, meta):
    inst, plan = ctx["instance"], ctx["plan"]
    model = json.loads((REPO / ".cache" / "models" / "tiny-llama" / "tiny_model.json").read_text())
    params = model.get("parameters", model)
    facts = {name: facts_of(results[name]["journal"]) for name in ("planned", "defaults")}
    max_pos = params.get("max_position_embeddings")
    flags = {pair[0]: pair[-1] for pair in ctx["dropped"]}
    differing = [
        flag
        for flag, default in (("--block-size", "128"), ("--max-model-len", str(max_pos)))
        if flags.get(flag, default) != default
    ] + (["--dtype"] if facts["planned"]["dtype"] != facts["defaults"]["dtype"] else [])
    same_note = (
        "so the dropped flags change nothing here"
        if not differing
        else "so of the dropped flags only " + ", ".join(f"`{f}`" for f in differing) + " change something"
    )
    planned_env = {k: v for k, v in ctx["env"].items() if k.startswith("VLLM_CPU_") or k == "LD_PRELOAD"}
    kv_note = (
        f"plus `--kv-cache-memory-bytes {ctx['kv_bytes']}` (the plan's {inst['kvcache_gib']} GiB): vLLM"
        " 0.32's own default sizes the KV cache at `--gpu-memory-utilization` 0.92 x the node's memory"
        " minus the worker's RSS, about 21.7 GiB of this shared 24 GiB machine, which either refuses to"
        " start (not enough available) or takes the memory of every other job; both use the same code"
        " path (`VLLM_CPU_KVCACHE_SPACE` is mapped onto `kv_cache_memory_bytes`)"
        if ctx["kv_bytes"]
        else "nothing else (vLLM sizes the KV cache itself: 0.92 x the node's memory)"
    )
    lines = [
        HEADING,
        "",
        f"Measured with `{meta['command']}` from the repo root, {meta['started']} UTC, {meta['duration']}"
        f" in all ({args.rounds} round{'s' if args.rounds > 1 else ''}; each instance's start-up"
        f" included{meta['converge']}). Container `serve-vllm` of the `serve` Molecule scenario (Debian 12,"
        f" `localhost/vllm-fleet/debian:12`) on the shared machine: {os.cpu_count()} CPUs ({cpu_model()}),"
        f" one NUMA node; load average {meta['load_start']} at the start, {meta['load_end']} at the end"
        f" ({meta['others']}). vLLM {meta['sw']['vllm']} (`{meta['sw']['dist']}` wheel from the"
        f" wheelhouse, torch {meta['sw']['torch']}) in `{VLLM_DIR}`. Model: the tiny random-weight Llama"
        f" from `tools/make_tiny_model.py` (hidden {params.get('hidden_size')},"
        f" {params.get('num_hidden_layers')} layers, vocab {params.get('vocab_size')}, BF16, about 1 MB),"
        f" served as `{ctx['model']}`. Plan: instance `{inst['name']}`, TP {inst['tp']}, OpenMP threads on"
        f" CPU(s) {inst['omp_threads_bind']}, CPU(s) {inst['reserved_cpus']} left to the API server, KV cache"
        f" {inst['kvcache_gib']} GiB (vLLM {plan['vllm_version']} plan).",
        "",
        "**What this measures.** The tiny model's forward pass costs next to nothing, so the numbers"
        " measure vLLM's serving path (HTTP and API server, scheduler, detokenizer, engine IPC), OpenMP"
        " threading and CPU binding and the memory allocator, on 2 CPUs shared by server, client and"
        " other jobs; not a real model's compute. A real model's gap can differ in size and sign.",
        "",
        f"**Load**, identical for both: after a warm-up ({max(args.concurrency) * 2} requests at concurrency"
        f" {max(args.concurrency)}, 2 at 1), for each concurrency in {', '.join(map(str, args.concurrency))}:"
        f" {args.requests} streaming `/v1/completions` with distinct fixed prompts (one sentence of"
        f" about {len(PROMPT.split())} words behind a unique tag), `max_tokens` {args.max_tokens},"
        " `temperature` 0, `ignore_eos` (every request generated exactly"
        f" {args.max_tokens} tokens: checked). The client is Debian's python3 inside the same container"
        " (one thread per request in flight), as the scenario's tests reach the instance. Both instances"
        f" listen on port {ctx['port']}, one at a time, so HAProxy (`serve-lb`) health-checks either the"
        " same way. TTFT is the time to the first streamed chunk; ms per output token is"
        " (latency - TTFT) / (tokens - 1), averaged; server CPU is the user+system time of the `vllm`"
        " user's processes during the level (from `/proc/<pid>/stat`) per output token: above the"
        " wall time per token when more than one CPU works for the server, including spinning"
        " OpenMP threads. Others' CPU is what the rest of the machine (other jobs and containers) used"
        " during the level, in % of all its CPUs: `/proc/stat` busy time minus the server's and the"
        " client's.",
        "",
        "| instance | started with |",
        "|---|---|",
        f"| planned | `systemctl restart {ctx['unit']}`: `{shlex.join(ctx['argv'])}`, environment file"
        f" `/etc/vllm/{inst['name']}.env` with "
        + ", ".join(f"`{k}={v}`" for k, v in sorted(planned_env.items()))
        + f", `CPUAffinity={ctx['affinity']}`, the hardened unit |",
        f"| defaults | `{shlex.join(systemd_run_argv(ctx['defaults_argv']))}`: the planned command without"
        f" `{' '.join(x for pair in ctx['dropped'] for x in pair)}`, {kv_note} |",
        "",
        f"Left out, vLLM {meta['sw']['vllm']} picks the model's dtype (logged below), block size 128 on CPU"
        f" (`vllm/platforms/cpu.py:293`) and the model's {max_pos} positions as maximum length, and listens"
        f" on every address, {same_note}; what differs is what the plan puts around the process: OpenMP"
        " binding and runtime, allocator, the unit's hardening (seccomp filter included).",
        "",
        "What each instance logged (its journal, last round), and the allocator/OpenMP libraries its processes mapped:",
        "",
        "| | planned | defaults |",
        "|---|---|---|",
    ]
    for key, _unused in FACTS:
        lines.append(f"| {key} | `{facts['planned'][key]}` | `{facts['defaults'][key]}` |")
    libs = {}
    for name in ("planned", "defaults"):
        mapped = results[name]["libs"]
        libs[name] = (
            ", ".join(f"`{re.sub(r'^/.*/site-packages/', '', lib)}`" for lib in mapped)
            if mapped is not None
            else "not readable"
        )
    libs["planned"] += f"; the unit's `LD_PRELOAD`: `{ctx['env'].get('LD_PRELOAD', '')}`"
    lines.append(f"| libraries mapped | {libs['planned']} | {libs['defaults']} |")
    for key, label in (("startup", "start to `/health`"), ("stop", "`systemctl stop`")):
        lines.append(f"| {label} | {fmt(results['planned'][key])} s | {fmt(results['defaults'][key])} s |")
    lines.append(
        f"| CPU used while idle, % of one CPU ({IDLE_S} s, {IDLE_SETTLE_S} s after the load)"
        f" | {fmt(results['planned']['idle_cpu'], 1)} % | {fmt(results['defaults']['idle_cpu'], 1)} % |"
    )
    lines += [
        "",
        "| concurrency | instance | requests/s | output tok/s | latency p50 ms | latency p95 ms | TTFT p50 ms"
        " | TTFT p95 ms | ms per output token | server CPU ms per token | others' CPU % | load avg before/after |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for i, concurrency in enumerate(args.concurrency):
        for name in ("planned", "defaults"):
            lv = results[name]["levels"][i]
            lines.append(
                f"| {concurrency} | {name} | {lv['req_s']:.2f} | {lv['tok_s']:.0f} | {lv['lat_p50']:.0f} |"
                f" {lv['lat_p95']:.0f} | {lv['ttft_p50']:.0f} | {lv['ttft_p95']:.0f} | {lv['tpot']:.1f} |"
                f" {fmt(lv.get('cpu_ms_per_token'), 2)} | {lv['others_pct']:.0f} |"
                f" {lv['load_before']:.2f}/{lv['load_after']:.2f} |"
            )
    lines += ["", "Planned / defaults: " + "; ".join(ratio_text(results, i, c) for i, c in enumerate(args.concurrency))]
    warned = {name: warnings_of(results[name]["journal"]) for name in ("planned", "defaults")}
    lines += [
        "",
        "Warnings in each instance's journal from its start to the end of the load (count per instance):",
        "",
        "| warning | planned | defaults |",
        "|---|---:|---:|",
    ]
    for message in dict.fromkeys([*warned["planned"], *warned["defaults"]]):
        cells = [str(warned[name].get(message, "-")) for name in ("planned", "defaults")]
        escaped = message.replace("|", "\\|")
        lines.append(f"| {escaped} | {cells[0]} | {cells[1]} |")
    lines.append("")
    if args.rounds > 1:
        lines.append(f"Each figure is the median of {args.rounds} rounds (defaults then planned, per round).")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def ratio_text(results, i, concurrency):
    p, d = results["planned"]["levels"][i], results["defaults"]["levels"][i]
    return (
        f"concurrency {concurrency}: output tok/s x{p['tok_s'] / d['tok_s']:.2f},"
        f" latency p50 x{p['lat_p50'] / d['lat_p50']:.2f}"
    )


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


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated levels")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens every request generates")
    parser.add_argument("--rounds", type=int, default=3, help="defaults+planned rounds; medians reported")
    parser.add_argument("--health-timeout", type=int, default=900, help="seconds an instance may take to start")
    parser.add_argument(
        "--defaults-kv-cache",
        choices=["plan", "vllm"],
        default="plan",
        help="defaults instance's KV cache: the plan's size (default) or vLLM's own sizing (0.92 x node memory)",
    )
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    return args


def main():
    args = parse_args()
    started = datetime.now(UTC)
    t0 = time.monotonic()
    busy = serve_scenario_runs()
    if busy:
        raise SystemExit("another serve scenario run would destroy or reconverge serve-vllm under us:\n" + busy)
    converge_s = ensure_converged()
    if converge_s:
        log(f"converged in {converge_s:.0f} s (not part of the run time below)")
        started = datetime.now(UTC)
        t0 = time.monotonic()
    container_id = podman("inspect", "-f", "{{.Id}}", CONTAINER).stdout.strip()
    meta = {
        "command": "PATH=$PWD/.venv/bin:$PATH python benchmarks/serve_plan_vs_defaults.py"
        + "".join(" " + shlex.quote(a) for a in sys.argv[1:]),
        "started": f"{started:%Y-%m-%d %H:%M}",
        "load_start": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        "build_at_start": build_running(),
        "converge": f"; `molecule converge -s serve` before it took {converge_s:.0f} s" if converge_s else "",
    }
    others = set(other_containers())
    key, model = scenario_vars()
    plan, instance, unit, argv, affinity, env = planned_setup()
    kv_bytes = int(instance["kvcache_gib"] * 2**30) if args.defaults_kv_cache == "plan" else 0
    defaults_argv, dropped = defaults_command(argv, kv_bytes)
    ctx = {
        "plan": plan,
        "instance": instance,
        "unit": unit,
        "argv": argv,
        "affinity": affinity,
        "env": env,
        "key": key,
        "model": model,
        "port": instance["port"],
        "kv_bytes": kv_bytes,
        "defaults_argv": defaults_argv,
        "dropped": dropped,
        "stop_s": {},
    }
    meta["sw"] = software()
    rounds = {"planned": [], "defaults": []}
    journals = {}
    try:
        for n in range(args.rounds):
            log(f"round {n + 1}/{args.rounds}")
            result, journals["defaults"] = run_defaults(defaults_argv, ctx, args)
            rounds["defaults"].append(result)
            result, journals["planned"] = run_planned(ctx, args)
            rounds["planned"].append(result)
            others |= set(other_containers())
    finally:
        same = podman("inspect", "-f", "{{.Id}}", CONTAINER, check=False).stdout.strip() == container_id
        if not same:
            raise SystemExit(f"{CONTAINER} was destroyed or recreated during the run (by another scenario run?)")
        # Leave the container as converged: the planned unit running, no benchmark unit.
        stop(DEFAULTS_UNIT)
        if sh(f"systemctl is-active {unit}", check=False).strip() != "active":
            log(f"restarting {unit}")
            start_planned(unit)
            client("health", {"port": ctx["port"], "key": key, "unit": unit, "timeout": args.health_timeout})
    results = {
        name: {
            "levels": median_levels(rounds[name]),
            "startup": statistics.median(r["startup"] for r in rounds[name]),
            "libs": rounds[name][-1]["libs"],
            "stop": ctx["stop_s"].get(name),
            "idle_cpu": statistics.median(r["idle_cpu"] for r in rounds[name]),
            "journal": journals[name],
        }
        for name in rounds
    }
    elapsed = time.monotonic() - t0
    build_at_end = build_running()
    others = sorted(others | set(other_containers()))
    meta["load_end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    meta["duration"] = f"{elapsed // 60:.0f} min {elapsed % 60:.0f} s"
    meta["others"] = (
        "the `build` scenario's vLLM source build was running"
        if meta["build_at_start"] or build_at_end
        else "no vLLM source build was running"
    ) + (f"; other containers up: {', '.join(others)}" if others else "; no other containers up")
    text = render(ctx, results, args, meta)
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
