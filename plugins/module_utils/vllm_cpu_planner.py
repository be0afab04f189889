"""Turn one host's vllm_cpu facts and the inventory's options into a serving plan.

Pure Python, the only place where layout, thread binding, KV cache size, the
build job cap, the wheel class and the VLLM_CPU_* environment are decided.
``check`` returns every problem; ``plan`` raises PlanError carrying them.

Binding policy (docs/vllm-releases.md compares it with vLLM's own ``auto``):
one OpenMP thread per physical core, on the core's lowest-numbered sibling;
the reserved cores for the API server and engine core are the lowest cores of
the instance's first node, where the kernel's housekeeping (CPU 0, unbalanced
IRQs, timers) tends to land, so the OpenMP team, which waits for its slowest
thread at every barrier, never shares a core with it.
"""

import math

from ansible.module_utils.vllm_cpu_cpulist import format_cpulist, parse_cpulist
from ansible.module_utils.vllm_cpu_releases import (
    UnknownReleaseError,
    build_class,
    build_isa_env,
    release_info,
)

DEFAULTS = {
    "vllm_version": None,  # required: a key of vllm_cpu_releases.RELEASES
    "host": "",  # named in every message
    "variable_prefix": "",  # prepended to option names in messages (e.g. "vllm_cpu_")
    "mode": "auto",  # auto: DP (one instance per CPU node) when it fits, else TP
    "tp": None,  # ranks per instance; None lets the mode decide
    "model_size_gib": 1.0,  # weights at the served dtype, whole model
    "reserved_cpus": 1,  # physical cores per instance left to the API server and engine core
    "memory_fraction": 0.8,  # share of a node's memory for weights + KV + runtime
    # vLLM's --gpu-memory-utilization, which on CPU means a share of the node's RAM: when
    # set it replaces memory_fraction (the plan still passes an explicit KV cache size).
    "gpu_memory_utilization": None,
    "runtime_overhead_gib": 2.0,  # per rank: torch, Python, compile caches (~2 GiB measured)
    "min_kvcache_gib": 1,  # smallest KV cache worth serving with
    "kvcache_gib": None,  # explicit KV cache per rank, GiB
    "base_port": 8000,  # instance i listens on base_port + i
    "omp_threads_bind": None,  # explicit list, one vLLM bind string per instance
    "dtype": None,  # explicit --dtype; None picks one from the ISA
    # 3 GiB per compile job: cpu_attn.cpp peaked at 2.98 GB (2.78 GiB) with gcc 12 and
    # 0.32 compiles it once per x86 library, so three such jobs can run together.
    "build_gib_per_job": 3.0,
    "build_reserved_gib": 2.0,  # left to the OS, ninja, pip and the linker during a build
    "max_jobs": None,  # explicit MAX_JOBS (still checked against memory)
}

# vLLM's CPU docs: "the current release does not support tensor-parallel-size=6".
UNSUPPORTED_TP = (6,)
MODES = ("auto", "dp", "tp")
GIB_MIB = 1024


class PlanError(ValueError):
    """The plan cannot be made; ``problems`` holds one message per problem."""

    def __init__(self, problems):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def plan(facts, options):
    """Return the plan dict for one host, or raise PlanError with every problem."""
    result, problems = _plan(facts, options)
    if problems:
        raise PlanError(problems)
    return result


def check(facts, options):
    """Return every problem with these facts and options ([] when plan() succeeds)."""
    return _plan(facts, options)[1]


# --------------------------------------------------------------------- internals


class _Problems(list):
    def __init__(self, host, prefix):
        super().__init__()
        self.host = host or "host"
        self.prefix = prefix

    def add(self, variable, problem, fix, prefixed=True):
        name = f"{self.prefix}{variable}" if prefixed else variable
        self.append(f"{self.host}: {name}: {problem}; fix: {fix}")


def _options(options):
    given = {k: v for k, v in (options or {}).items() if v is not None}
    merged = dict(DEFAULTS, **given)
    merged["reserved_cpus_defaulted"] = "reserved_cpus" not in given
    merged["fraction_variable"] = "memory_fraction"
    if merged["gpu_memory_utilization"] is not None:
        merged["memory_fraction"] = merged["gpu_memory_utilization"]
        merged["fraction_variable"] = "gpu_memory_utilization"
    return merged


def _plan(facts, options):
    opts = _options(options)
    problems = _Problems(opts["host"], opts["variable_prefix"])
    try:
        release = release_info(opts["vllm_version"])
    except UnknownReleaseError as err:
        # vllm_version is the fleet's own variable, not a planner knob: never prefixed.
        problems.add("vllm_version", str(err), "set it to one of the supported versions", prefixed=False)
        return None, problems
    topo = _Topology(facts)
    if not topo.nodes:
        problems.add(
            "allowed_cpus",
            "no online, allowed CPU belongs to a NUMA node",
            "check the host's cpuset/affinity (facts allowed_cpus)",
        )
        return None, problems
    if opts["mode"] not in MODES:
        problems.add("mode", f"{opts['mode']!r} is not one of {', '.join(MODES)}", "use auto, dp or tp")
        return None, problems
    fraction = opts["memory_fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        problems.add(
            opts["fraction_variable"],
            f"{fraction!r} is not a share of a NUMA node's RAM (on CPU it sizes RAM, not GPU memory)",
            "use a number above 0 and at most 1, e.g. 0.8",
        )
        return None, problems

    if opts["omp_threads_bind"] is not None:
        groups = _groups_from_bind(topo, opts, problems)
    else:
        groups = _groups_from_layout(topo, opts, problems)
    if problems or not groups:
        return None, problems
    _check_node_sharing(groups, opts, problems)

    instances = [_instance(index, group, topo, release, facts, opts, problems) for index, group in enumerate(groups)]
    used = {node for group in groups for node in group["nodes"]}
    result = {
        "host": opts["host"],
        "vllm_version": release["version"],
        "arch": facts["arch"],
        "isa_class": facts["isa_class"],
        "mode": "tp" if any(g["tp"] > 1 for g in groups) else "dp",
        "instances": instances,
        "unused_numa_nodes": [n for n in topo.node_ids if n not in used],
        "build": _build(facts, release, opts, problems),
    }
    return result, problems


class _Topology:
    """The usable CPUs of the facts, grouped by node and physical core."""

    def __init__(self, facts):
        online = set(facts.get("online_cpus") or [])
        allowed = set(facts.get("allowed_cpus") or [])
        self.usable = online & allowed
        self.online, self.allowed = online, allowed
        self.memory_mib = facts.get("memory_mib") or 0
        self.nodes = {}
        self.core_of = {}  # cpu -> tuple of usable siblings
        self.node_of = {}
        self.memory_of = {}
        for node in sorted(facts.get("numa_nodes") or [], key=lambda n: n["id"]):
            self.memory_of[node["id"]] = node.get("memory_mib") or 0
            cores = []
            for core in node.get("cores") or []:
                siblings = tuple(sorted(c for c in core if c in self.usable))
                if siblings:
                    cores.append(siblings)
                    for cpu in siblings:
                        self.core_of[cpu] = siblings
                        self.node_of[cpu] = node["id"]
            if cores:
                self.nodes[node["id"]] = sorted(cores)
        self.node_ids = sorted(self.nodes)
        # A cgroup limit (already folded into memory_mib) is not per node: share it
        # out in proportion to the nodes' own memory.
        node_total = sum(self.memory_of[n] for n in self.node_ids) or 1
        self.cgroup_scale = min(1.0, self.memory_mib / node_total) if self.memory_mib else 1.0

    def usable_gib(self, node, fraction):
        """Memory one rank on ``node`` may use for weights, KV cache and runtime."""
        return self.memory_of[node] * self.cgroup_scale * fraction / GIB_MIB


def _kv_room_gib(topo, nodes, opts, tp):
    """Largest KV cache (GiB, may be <= 0) every rank of an instance on ``nodes`` can hold."""
    shard = float(opts["model_size_gib"]) / tp
    return min(topo.usable_gib(n, opts["memory_fraction"]) - shard - opts["runtime_overhead_gib"] for n in nodes)


def _fits(topo, nodes, opts, tp):
    need = opts["kvcache_gib"] if opts["kvcache_gib"] is not None else opts["min_kvcache_gib"]
    return _kv_room_gib(topo, nodes, opts, tp) >= need


def _chunks(node_ids, tp):
    return [node_ids[i : i + tp] for i in range(0, len(node_ids) - tp + 1, tp)]


def _groups_from_layout(topo, opts, problems):
    node_ids = topo.node_ids
    tp = opts["tp"]
    if tp is None:
        if opts["mode"] == "tp":
            tp = len(node_ids)
        elif opts["mode"] == "dp" or all(_fits(topo, [n], opts, 1) for n in node_ids):
            tp = 1
        else:
            fitting = [
                size
                for size in range(2, len(node_ids) + 1)
                if size not in UNSUPPORTED_TP and all(_fits(topo, c, opts, size) for c in _chunks(node_ids, size))
            ]
            if not fitting:
                explicit_kv = opts["kvcache_gib"] is not None
                kv = opts["kvcache_gib"] if explicit_kv else opts["min_kvcache_gib"]
                problems.add(
                    _memory_variable(opts),
                    f"{opts['model_size_gib']} GiB of weights plus {opts['runtime_overhead_gib']} GiB runtime and "
                    f"a {kv} GiB KV cache fit no NUMA node (DP) and no tensor-parallel "
                    f"split over the {len(node_ids)} CPU node(s) (TP) within {opts['fraction_variable']} "
                    f"{opts['memory_fraction']}",
                    "lower kvcache_gib" if explicit_kv else
                    f"serve a smaller or quantized model, raise {opts['fraction_variable']}, or add memory",
                )
                return []
            tp = fitting[0]
    if not isinstance(tp, int) or tp < 1:
        problems.add("tp", f"{tp!r} is not a positive integer", "set tp to 1, 2, 3, 4, ...")
        return []
    if tp in UNSUPPORTED_TP:
        problems.add(
            "tp",
            f"tensor-parallel size {tp} is not supported by vLLM's CPU backend",
            "set tp to 2 or 3 (several instances) or use mode dp",
        )
        return []
    if tp > len(node_ids):
        problems.add(
            "tp",
            f"tensor-parallel size {tp} needs {tp} NUMA nodes with CPUs but the host has {len(node_ids)}",
            f"set tp to at most {len(node_ids)}",
        )
        return []
    groups = []
    for nodes in _chunks(node_ids, tp):
        if not _fits(topo, nodes, opts, tp):
            room = _kv_room_gib(topo, nodes, opts, tp)
            problems.add(
                _memory_variable(opts),
                f"on NUMA node(s) {format_cpulist(nodes)} each rank has {max(room, 0):.1f} GiB left for the KV "
                f"cache after a {float(opts['model_size_gib']) / tp:.1f} GiB weight shard and "
                f"{opts['runtime_overhead_gib']} GiB runtime, less than the "
                f"{opts['kvcache_gib'] or opts['min_kvcache_gib']} GiB needed",
                f"lower kvcache_gib, raise tp or {opts['fraction_variable']}, or serve a smaller model",
            )
        reserved_cores = _reserved_cores(topo, nodes, opts, problems)
        ranks = [[core[0] for core in topo.nodes[n] if core not in reserved_cores] for n in nodes]
        groups.append({"nodes": nodes, "tp": tp, "ranks": ranks, "reserved": reserved_cores})
    return groups


def _reserved_cores(topo, nodes, opts, problems):
    """Cores left to the API server; ``(core, siblings_only)`` pairs in group["reserved"]."""
    count = opts["reserved_cpus"]
    if not isinstance(count, int) or count < 0:
        problems.add("reserved_cpus", f"{count!r} is not a non-negative integer", "set it to 0, 1 or 2")
        return []
    first = topo.nodes[nodes[0]]
    if count < len(first):
        return first[:count]
    if opts["reserved_cpus_defaulted"] and len(first) == 1:
        # A one-core host (a 2-vCPU VM): the default cannot take a whole core, so the
        # frontend gets the core's other SMT thread, as vLLM's own auto binding does.
        return []
    problems.add(
        "reserved_cpus",
        f"reserving {count} physical core(s) on NUMA node {nodes[0]} leaves none of its {len(first)} "
        "core(s) for inference threads",
        f"set reserved_cpus to at most {len(first) - 1}",
    )
    return []


def _groups_from_bind(topo, opts, problems):
    binds = opts["omp_threads_bind"]
    if isinstance(binds, str):
        binds = [binds]
    groups, owner = [], {}
    for index, text in enumerate(binds):
        variable = f"omp_threads_bind[{index}]"
        ranks = []
        for rank, part in enumerate(str(text).split("|")):
            try:
                cpus = parse_cpulist(part)
            except ValueError as err:
                problems.add(variable, str(err), "write CPU lists like 0-27|56-83")
                continue
            if not cpus:
                problems.add(variable, f"rank {rank} binds no CPU", "give every rank at least one CPU")
                continue
            _check_bound_cpus(topo, variable, rank, cpus, owner, (index, rank), problems)
            ranks.append(cpus)
        if len(ranks) in UNSUPPORTED_TP:
            problems.add(
                variable, f"{len(ranks)} ranks (tensor-parallel size 6) are not supported", "bind 2 or 3 ranks"
            )
        if opts["tp"] is not None and len(ranks) != opts["tp"]:
            problems.add(variable, f"has {len(ranks)} rank(s) but tp is {opts['tp']}", "make them agree")
        nodes = [topo.node_of[r[0]] for r in ranks if r and r[0] in topo.node_of]
        if len(nodes) == len(ranks) and ranks:
            groups.append({"nodes": nodes, "tp": len(ranks), "ranks": ranks, "reserved": None})
    if problems:
        return []
    bound_cores = {topo.core_of[cpu] for cpu in owner}
    for group in groups:
        # Without layout reservations, the group's reserved CPUs are the unbound cores of its nodes.
        group["reserved"] = [c for n in group["nodes"] for c in topo.nodes[n] if c not in bound_cores]
    for group in groups:
        _check_memory_fit(topo, group, opts, problems)
    return groups


def _check_bound_cpus(topo, variable, rank, cpus, owner, who, problems):
    for cpu in cpus:
        if cpu not in topo.online:
            problems.add(variable, f"rank {rank} binds CPU {cpu}, which does not exist or is offline", "drop it")
        elif cpu not in topo.allowed:
            problems.add(
                variable, f"rank {rank} binds CPU {cpu}, outside the host's allowed CPUs (cpuset)", "drop it"
            )
        elif cpu not in topo.core_of:
            problems.add(variable, f"rank {rank} binds CPU {cpu}, which belongs to no NUMA node", "drop it")
    known = [cpu for cpu in cpus if cpu in topo.core_of]
    clashes = [(cpu, s) for cpu in known for s in topo.core_of[cpu] if s in owner and owner[s] != who]
    if clashes:
        cpu, sibling = clashes[0]
        problems.add(
            variable,
            f"rank {rank} binds CPU {cpu}, on the same physical core as CPU {sibling} bound by "
            f"instance {owner[sibling][0]} rank {owner[sibling][1]}",
            "give every rank and instance its own physical cores",
        )
    per_core = {}
    for cpu in known:
        per_core.setdefault(topo.core_of[cpu], []).append(cpu)
    for on_core in per_core.values():
        if len(on_core) > 1:
            problems.add(
                variable,
                f"rank {rank} binds SMT siblings {format_cpulist(on_core)} of one physical core",
                "bind one CPU per physical core",
            )
    nodes = sorted({topo.node_of[cpu] for cpu in known})
    if len(nodes) > 1:
        problems.add(
            variable,
            f"rank {rank} spans NUMA nodes {format_cpulist(nodes)}; vLLM binds a rank's memory to the node of "
            "its first CPU, so the other threads read remote memory",
            "keep each rank inside one NUMA node (one rank per node)",
        )
    for cpu in known:
        owner[cpu] = who


def _check_memory_fit(topo, group, opts, problems):
    if not _fits(topo, group["nodes"], opts, group["tp"]):
        room = _kv_room_gib(topo, group["nodes"], opts, group["tp"])
        problems.add(
            _memory_variable(opts),
            f"NUMA node(s) {format_cpulist(group['nodes'])} leave {max(room, 0):.1f} GiB per rank for the KV cache "
            f"with {opts['fraction_variable']}={opts['memory_fraction']} of the node's RAM",
            f"lower kvcache_gib, raise {opts['fraction_variable']}, spread the model over more ranks, "
            "or serve a smaller model",
        )


def _memory_variable(opts):
    """The knob a memory shortfall is blamed on: the one the inventory set, else the model size."""
    if opts["kvcache_gib"] is not None:
        return "kvcache_gib"
    if opts["fraction_variable"] == "gpu_memory_utilization":
        return "gpu_memory_utilization"
    return "model_size_gib"


def _check_node_sharing(groups, opts, problems):
    """Ranks on one node each take memory_fraction of its RAM: together at most all of it."""
    ranks_on = {}
    for group in groups:
        for node in group["nodes"]:
            ranks_on[node] = ranks_on.get(node, 0) + 1
    for node, count in sorted(ranks_on.items()):
        if count * opts["memory_fraction"] > 1:
            problems.add(
                opts["fraction_variable"],
                f"{count} ranks on NUMA node {node} would each take {opts['memory_fraction']} of its RAM "
                f"({count * opts['memory_fraction']:.2f} of it in total)",
                f"set it to at most {math.floor(100 / count) / 100} or give each rank its own node",
            )


def _dtype(facts, opts):
    if opts["dtype"]:
        return opts["dtype"]
    isa = facts.get("isa") or {}
    # x86 kernels carry bf16 paths for AVX2 and AVX512 too (cpu_types_x86.hpp) and vLLM's
    # docs recommend bfloat16 over float16; Arm needs the bf16 extension for them.
    if facts["arch"] == "x86_64" or isa.get("bf16"):
        return "bfloat16"
    return "float32"


def _instance(index, group, topo, release, facts, opts, problems):
    tp = group["tp"]
    bind = "|".join(format_cpulist(rank) for rank in group["ranks"])
    reserved = sorted(cpu for core in group["reserved"] for cpu in core)
    if not reserved and opts["reserved_cpus_defaulted"] and opts["omp_threads_bind"] is None:
        first = topo.nodes[group["nodes"][0]]
        if len(first) == 1:
            reserved = list(first[0][1:])
    all_cpus = sorted(cpu for n in group["nodes"] for core in topo.nodes[n] for cpu in core)
    if opts["kvcache_gib"] is not None:
        kvcache_gib = int(opts["kvcache_gib"])
    else:
        kvcache_gib = max(1, math.floor(_kv_room_gib(topo, group["nodes"], opts, tp)))
    dtype = _dtype(facts, opts)
    isa = facts.get("isa") or {}
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(kvcache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": bind,
    }
    # VLLM_CPU_NUM_OF_RESERVED_CPU is only read by auto binding, so an explicit bind omits it.
    if release["has_sgl_kernel"] and isa.get("amx_bf16") and isa.get("avx512_bf16") and dtype == "bfloat16":
        env["VLLM_CPU_SGL_KERNEL"] = "1"
    return {
        "name": f"vllm-{index}",
        "port": int(opts["base_port"]) + index,
        "tp": tp,
        "numa_nodes": list(group["nodes"]),
        "omp_threads_bind": bind,
        "reserved_cpus": format_cpulist(reserved),
        "cpus": format_cpulist(all_cpus),
        "mem_nodes": format_cpulist(group["nodes"]),
        "threads_per_rank": [len(rank) for rank in group["ranks"]],
        "kvcache_gib": kvcache_gib,
        "dtype": dtype,
        "ld_preload_needed": {
            # Always: a release that preloads tcmalloc itself does so only from a copy bundled into
            # its wheel at build time, which prebuilt wheels (vllm-cpu 0.32.0) do not carry.
            "tcmalloc": True,
            "iomp": facts["arch"] == "x86_64",
        },
        "env": env,
    }


def _build(facts, release, opts, problems):
    memory_gib = (facts.get("memory_mib") or 0) / GIB_MIB
    for_build = memory_gib - float(opts["build_reserved_gib"])
    per_job = float(opts["build_gib_per_job"])
    cpus = len(facts.get("allowed_cpus") or []) or 1
    memory_cap = math.floor(for_build / per_job) if per_job > 0 else cpus
    max_jobs = max(1, min(cpus, memory_cap))
    if opts["max_jobs"] is not None:
        max_jobs = opts["max_jobs"]
        if not isinstance(max_jobs, int) or max_jobs < 1 or max_jobs > max(1, memory_cap):
            problems.add(
                "max_jobs",
                f"{max_jobs!r} compile jobs at {per_job} GiB each do not fit the {for_build:.1f} GiB left for "
                "a build",
                f"set max_jobs between 1 and {max(1, memory_cap)}, or leave it unset",
            )
    wheel_class = build_class(release["version"], facts)
    env = {
        "VLLM_TARGET_DEVICE": "cpu",
        "CMAKE_DISABLE_FIND_PACKAGE_CUDA": "ON",
        "MAX_JOBS": str(max_jobs),
    }
    env.update(build_isa_env(release["version"], wheel_class))
    # Not a problem for a host that never builds (wheels come from the builder group);
    # the build role refuses to build where even one job does not fit.
    fits_memory = max_jobs * per_job <= for_build
    return {"max_jobs": max_jobs, "build_class": wheel_class, "fits_memory": fits_memory, "env": env}
