"""Read a host's CPU, NUMA, memory and cgroup facts from procfs/sysfs.

Plain Python, no Ansible imports and no subprocess, so the planner's tests and
the fact module share one implementation. ``parse_*`` functions take file
contents as strings; ``read_cpu_facts`` does all file access, strictly under
``root`` so a recorded machine tree can stand in for ``/``.
"""

import hashlib
import inspect
import json
import math
import os
import re
import sys

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import format_cpulist, parse_cpulist, show

ARCHES = ("x86_64", "aarch64", "s390x", "ppc64le")

# Flags as /proc/cpuinfo spells them, per architecture.
X86_ISA = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")
ARM_ISA = ("asimd", "sve", "bf16", "i8mm")
S390_ISA = ("vxe",)
ISA_KEYS = X86_ISA + ARM_ISA + S390_ISA
# The least each backend's kernels run on: (flag, problem, fix) for read_cpu_facts' refusal.
MIN_ISA = {
    "x86_64": (
        "avx2",
        "not every CPU lists avx2; vLLM's x86 CPU backend needs AVX2 at least",
        "serve from hosts with AVX2 (for a VM, a CPU model that passes avx2 through)",
    ),
    "s390x": (
        "vxe",
        "the features line lacks vxe; vLLM's s390x CPU backend needs the vector enhancements facility (z14 or later)",
        "serve from a z14 or later (for a z/VM or KVM guest, a CPU model that passes vxe through)",
    ),
}

ARM_IMPLEMENTERS = {
    "0x41": "ARM",
    "0x42": "Broadcom",
    "0x43": "Cavium",
    "0x46": "Fujitsu",
    "0x48": "HiSilicon",
    "0x4e": "NVIDIA",
    "0x50": "APM",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0xc0": "Ampere",
}
ARM_PARTS = {
    ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd40"): "Neoverse-V1",
    ("0x41", "0xd49"): "Neoverse-N2",
    ("0x41", "0xd4f"): "Neoverse-V2",
    ("0x41", "0xd84"): "Neoverse-V3",
    ("0x41", "0xd8e"): "Neoverse-N3",
    ("0xc0", "0xac3"): "AmpereOne",
}

# cgroup v1 has no "max": an unlimited memory.limit_in_bytes is LONG_MAX rounded
# down to the page size (9223372036854771712 with 4 KiB pages). No host has 1 EiB.
UNLIMITED_BYTES = 1 << 60
MIB = 1024 * 1024
# 1 EiB in kB: no host has more; a bigger MemTotal is a corrupted file.
MAX_MEMORY_KIB = 1 << 50
# /proc/cpuinfo of 8192 CPUs is about 12 MiB; nothing read here is larger.
MAX_FILE_CHARS = 64 * MIB
# The kernel's MAX_NUMNODES is 1024 at most (NODES_SHIFT 10).
MAX_NODE_ID = 4095
# How to read /sys/devices/system/node: "strict" refuses a view that does not add
# up (see _read_nodes); "single" ignores it and reads the machine as one node.
NUMA_MODES = ("strict", "single")
NUMA_FIX = "set numa: single (role vllm_plan: vllm_plan_numa: single) to plan the machine as one NUMA node"

_NODE_DIR = re.compile(r"node[0-9]+\Z")
_ASCII_UINT = re.compile(r"[0-9]+\Z")
_ASCII_INT = re.compile(r"-?[0-9]+\Z")
# Longest number accepted from a file: 19 digits hold every 64-bit value.
_MAX_DIGITS = 19

DEFAULT_FIX = (
    "check the file (on the host, or in the recorded tree given as root); the kernel writes it in a fixed format"
)


class TopologyError(ValueError):
    """A file under root is missing, unparsable or inconsistent; ``path`` names it.

    The message reads ``<path>: <problem>; fix: <fix>``.
    """

    def __init__(self, path, reason, fix=DEFAULT_FIX):
        super().__init__(f"{path}: {reason}; fix: {fix}")
        self.path = path
        self.reason = reason
        self.fix = fix


class _Refusal(ValueError):
    """A parser's ValueError that carries its own fix."""

    def __init__(self, reason, fix):
        super().__init__(reason)
        self.fix = fix


def ascii_int(text, signed=False):
    """int() of an ASCII decimal (kernel files); ValueError for anything else.

    int() alone accepts Unicode digits ("\\u0663", fullwidth "\\uff13"), "+3" and "3_0".
    """
    token = text.strip() if isinstance(text, str) else text
    pattern = _ASCII_INT if signed else _ASCII_UINT
    if not isinstance(token, str) or not pattern.match(token) or len(token.lstrip("-")) > _MAX_DIGITS:
        raise ValueError(f"{show(token)} is not an integer (ASCII digits)")
    return int(token)


# ---------------------------------------------------------------- parsers


def parse_cpuinfo(text):
    """Split /proc/cpuinfo into blocks (one per processor) of {key: value}.

    Blocks are separated by blank lines; keys and values are stripped, so the
    tab alignment of every architecture's format parses the same way.
    """
    blocks, block = [], {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not line.strip():
            if block:
                blocks.append(block)
            block = {}
        elif sep:
            block.setdefault(key.strip(), value.strip())
    if block:
        blocks.append(block)
    return blocks


def detect_arch(blocks):
    """Return the architecture the cpuinfo blocks were printed by, or None."""
    keys = set().union(*blocks) if blocks else set()
    first = _first_value(blocks, "vendor_id")
    if "CPU implementer" in keys or "Features" in keys:
        return "aarch64"
    if first.startswith("IBM/S390"):
        return "s390x"
    if _first_value(blocks, "cpu").upper().startswith("POWER"):
        return "ppc64le"
    if first and "flags" in keys:
        return "x86_64"
    return None


def parse_isa(blocks, arch):
    """Return {flag: bool} for every ISA_KEYS entry.

    A flag counts only if every processor block lists it: threads must be able
    to run on any allowed CPU, and hybrid or mismatched CPUs do exist.
    """
    field = {"x86_64": "flags", "aarch64": "Features", "s390x": "features"}.get(arch)
    wanted = {"x86_64": X86_ISA, "aarch64": ARM_ISA, "s390x": S390_ISA}.get(arch, ())
    # Identical lines (the usual case) are split once: 512 CPUs print 512 copies.
    sets = [set(line.split()) for line in {b[field] for b in blocks if field and field in b}]
    common = set.intersection(*sets) if sets else set()
    return {key: key in wanted and key in common for key in ISA_KEYS}


def isa_class(arch, isa):
    """Name the vLLM build variant a host needs: one wheel per class.

    Old vLLM releases compile for the build host's ISA, so hosts share a wheel
    only when they support the same instruction-set level. Classes, strongest
    first: x86_64-amx (AMX bf16+tile with AVX512 bf16/vnni), x86_64-avx512bf16,
    x86_64-avx512vnni, x86_64-avx512, x86_64-avx2; aarch64-bf16, aarch64-neon;
    s390x-vxe (s390x without VXE, which vLLM cannot serve, is plain s390x); ppc64le.
    """
    if arch == "x86_64":
        avx512 = isa["avx512f"]
        if avx512 and isa["avx512_vnni"] and isa["avx512_bf16"]:
            if isa["amx_bf16"] and isa["amx_tile"]:
                return "x86_64-amx"
            return "x86_64-avx512bf16"
        if avx512 and isa["avx512_vnni"]:
            return "x86_64-avx512vnni"
        if avx512:
            return "x86_64-avx512"
        return "x86_64-avx2"
    if arch == "aarch64":
        return "aarch64-bf16" if isa["bf16"] else "aarch64-neon"
    if arch == "s390x":
        return "s390x-vxe" if isa["vxe"] else "s390x"
    return "ppc64le"


def identify_cpu(blocks, arch):
    """Return (vendor, model) strings for the cpuinfo blocks."""
    if arch == "aarch64":
        implementer = _first_value(blocks, "CPU implementer").lower()
        part = _first_value(blocks, "CPU part").lower()
        vendor = ARM_IMPLEMENTERS.get(implementer, f"implementer {implementer}")
        return vendor, ARM_PARTS.get((implementer, part), f"{vendor} part {part}")
    if arch == "s390x":
        return "IBM", _s390_machine(blocks)
    if arch == "ppc64le":
        # "POWER9 (raw), altivec supported" -> "POWER9"
        return "IBM", _first_value(blocks, "cpu").split(" ")[0].rstrip(",")
    return _first_value(blocks, "vendor_id"), _first_value(blocks, "model name")


def _s390_machine(blocks):
    machine = _first_value(blocks, "machine")
    if machine:
        return machine
    # Older kernels only print "processor 0: version = FF,  identification = ..., machine = 8561".
    for block in blocks:
        for key, value in block.items():
            if key.startswith("processor ") and "machine =" in value:
                return value.rsplit("machine =", 1)[1].strip()
    return ""


def _first_value(blocks, key):
    for block in blocks:
        if key in block:
            return block[key]
    return ""


def parse_meminfo_kib(text, key="MemTotal"):
    """Return the kB value of ``key`` in /proc/meminfo or nodeN/meminfo.

    Node files prefix each line with "Node N ", which is skipped.
    """
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.split()[-1:] == [key]:
            fields = value.split()
            if not fields or not _ASCII_UINT.match(fields[0]) or len(fields[0]) > _MAX_DIGITS:
                raise ValueError(f"{key} value {show(value.strip())} is not a number of kB (ASCII digits)")
            kib = int(fields[0])
            if kib > MAX_MEMORY_KIB:
                raise ValueError(f"{key} of {kib} kB is more than 1 EiB")
            return kib
    raise ValueError(f"no {key} line")


def parse_status_cpus(text):
    """Return Cpus_allowed_list of /proc/self/status as a list, or None."""
    value = _status_field(text, "Cpus_allowed_list")
    return None if value is None else parse_cpulist(value)


def parse_status_mems(text):
    """Return Mems_allowed_list of /proc/self/status (the nodes the process may allocate on), or None."""
    value = _status_field(text, "Mems_allowed_list")
    return None if value is None else parse_nodelist(value)


def _status_field(text, field):
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name == field:
            return value
    return None


def parse_nodelist(text):
    """A node list ("0-1,3", the cpulist format) as sorted node ids."""
    return parse_cpulist(text, MAX_NODE_ID)


def parse_memory_limit(text):
    """Return a cgroup memory limit in MiB, or None when unlimited.

    v2 memory.max holds "max" or bytes; v1 memory.limit_in_bytes holds bytes,
    near LONG_MAX when unlimited.
    """
    value = text.strip()
    if value == "max":
        return None
    if not _ASCII_UINT.match(value):
        raise ValueError(f"not a byte count: {show(value)}")
    if len(value) > _MAX_DIGITS:
        return None
    limit = int(value)
    if limit < MIB:
        # 0 is a real setting (nothing may be charged), never "unlimited".
        raise _Refusal(
            f"a memory limit of {limit} bytes leaves no memory to serve with",
            "raise the cgroup's memory limit (memory.max / memory.limit_in_bytes) or run outside that cgroup",
        )
    return None if limit >= UNLIMITED_BYTES else limit // MIB


def parse_cpu_max(text):
    """Return the CPUs a cgroup v2 ``cpu.max`` ("QUOTA PERIOD", "max PERIOD") allows, or None.

    The quota is rounded up: 1.5 CPUs of time count as 2 CPUs, as the JVM and .NET read
    it, so a fractional quota still gets a thread for its fraction (which runs throttled
    part of each period) and a quota under one CPU still gets one.
    """
    fields = text.split()
    if fields == ["max"]:
        return None
    if len(fields) != 2:
        raise ValueError(f'not "QUOTA PERIOD" or "max PERIOD": {show(text.strip())}')
    quota, period = fields
    return cpu_limit(None if quota == "max" else quota, period)


def _positive_us(name, text):
    try:
        value = ascii_int(text)
    except ValueError:
        raise ValueError(f"{name} {show(text)} is not a number of microseconds") from None
    if value < 1:
        raise ValueError(f"{name} {value} is not a positive number of microseconds")
    return value


def cpu_limit(quota, period):
    """ceil(quota / period) from the two numbers' texts (quota None: unlimited)."""
    period_us = _positive_us("period", period)
    if quota is None:
        return None
    return math.ceil(_positive_us("quota", quota) / period_us)


def parse_cfs_quota(text):
    """cgroup v1 cpu.cfs_quota_us: the quota's text, or None when -1 (unlimited)."""
    value = text.strip()
    if value == "-1":
        return None
    if not _ASCII_UINT.match(value):
        raise ValueError(f"{show(value)} is not a number of microseconds (or -1)")
    return value


def parse_distance(text):
    """Return a nodeN/distance line ("10 21") as a list of ints."""
    try:
        return [ascii_int(v) for v in text.split()]
    except ValueError:
        raise ValueError(f"not a list of integers: {show(text.strip())}") from None


def group_cores(topology):
    """Group CPUs into physical cores: a sorted list of sorted CPU lists.

    ``topology`` maps cpu -> (physical_package_id, core_id, siblings), any of
    which may be None when the file is absent. core_id is unique only within a
    package, so the key is (package, core_id); the thread_siblings_list also
    goes into the key so two CPUs share a core only when both the ids and the
    kernel's sibling mask agree, and it stands in when core_id is unknown.
    """
    cores = {}
    for cpu, (package, core, siblings) in topology.items():
        if core is None and siblings is None:
            key = ("cpu", cpu)
        else:
            online_siblings = tuple(s for s in siblings if s in topology) if siblings else None
            key = (package, core, online_siblings)
        cores.setdefault(key, []).append(cpu)
    return sorted(sorted(cpus) for cpus in cores.values())


# ---------------------------------------------------------------- reading


def read_cpu_facts(root="/", arch=None, numa="strict"):
    """Return the vllm_cpu fact dict of the machine whose files live under root.

    ``arch`` overrides the architecture inferred from /proc/cpuinfo (needed
    only when the cpuinfo format is not recognised). ``numa`` says how to read
    /sys/devices/system/node (NUMA_MODES). Raises TopologyError naming the file
    that is missing, cannot be parsed or contradicts the others.
    """
    if numa not in NUMA_MODES:
        raise ValueError("numa must be one of {}, got {}".format(", ".join(NUMA_MODES), show(numa)))
    reader = _Reader(root)
    cpuinfo = reader.path("proc/cpuinfo")
    blocks = parse_cpuinfo(reader.text("proc/cpuinfo"))
    if arch is None:
        arch = detect_arch(blocks)
        if arch is None:
            raise TopologyError(
                cpuinfo, "cannot infer the architecture", "pass arch (module option) if the format is unusual"
            )
    elif arch not in ARCHES:
        raise ValueError("arch must be one of {}, got {}".format(", ".join(ARCHES), show(arch)))
    _check_isa_lines(blocks, arch, cpuinfo)
    isa = parse_isa(blocks, arch)
    if arch in MIN_ISA and not isa[MIN_ISA[arch][0]]:
        raise TopologyError(cpuinfo, *MIN_ISA[arch][1:])
    vendor, model = identify_cpu(blocks, arch)

    possible = reader.parse("sys/devices/system/cpu/possible", parse_cpulist, optional=True)
    online = reader.parse("sys/devices/system/cpu/online", parse_cpulist)
    if possible is not None and not set(online) <= set(possible):
        raise TopologyError(
            reader.path("sys/devices/system/cpu/online"),
            f"CPUs {format_cpulist(sorted(set(online) - set(possible)))} are not in sys/devices/system/cpu/possible "
            f"({format_cpulist(possible)})",
        )
    topology = {}
    for cpu in online:
        topo = f"sys/devices/system/cpu/cpu{cpu}/topology"
        # Offline CPUs have no topology directory; a CPU that went offline
        # after "online" was read is skipped the same way.
        if reader.isdir(topo):
            topology[cpu] = (
                reader.parse(topo + "/physical_package_id", _signed_int, optional=True),
                reader.parse(topo + "/core_id", _signed_int, optional=True),
                reader.parse(topo + "/thread_siblings_list", parse_cpulist, optional=True),
            )
    if not topology:
        raise TopologyError(reader.path("sys/devices/system/cpu"), "no online CPU has a topology directory")
    online = sorted(topology)
    cores = group_cores(topology)

    cgroup, cgroup_files = _read_cgroup(reader)
    allowed = set(online)
    status_cpus = reader.parse("proc/self/status", parse_status_cpus, optional=True)
    if status_cpus is not None:
        allowed &= set(status_cpus)
        if not allowed:
            raise TopologyError(
                reader.path("proc/self/status"),
                "Cpus_allowed_list names no online CPU",
                "run the module with an affinity that includes online CPUs",
            )
    if cgroup["cpus"] is not None:
        allowed &= set(cgroup["cpus"])
        if not allowed:
            raise TopologyError(
                cgroup_files["cpus"],
                f"the cgroup cpuset ({format_cpulist(cgroup['cpus'])}) names no online CPU the process may use",
                "give the cgroup online CPUs (cpuset.cpus)",
            )

    allowed_mems = _allowed_mems(reader, cgroup, cgroup_files)

    mem_total_kib = reader.parse("proc/meminfo", parse_meminfo_kib)
    if mem_total_kib < 1024:
        raise TopologyError(
            reader.path("proc/meminfo"),
            f"MemTotal is {mem_total_kib} kB, no memory to plan with",
            "check the file (a recorded tree may be truncated); a real kernel never reports it",
        )
    mem_total_mib = mem_total_kib // 1024
    memory_mib = mem_total_mib
    if cgroup["memory_max_mib"] is not None:
        memory_mib = min(memory_mib, cgroup["memory_max_mib"])
    sockets = len({package for package, _unused, _unused in topology.values()})

    return {
        "arch": arch,
        "vendor": vendor,
        "model": model,
        "isa": isa,
        "isa_class": isa_class(arch, isa),
        "sockets": sockets,
        "threads_per_core": max(len(core) for core in cores),
        "memory_mib": memory_mib,
        "online_cpus": online,
        "offline_cpus": sorted(set(possible or online) - set(online)),
        "allowed_cpus": sorted(allowed),
        # CPUs' worth of time the processes may use at once: the allowed CPUs, fewer
        # under a cgroup CPU quota (cgroup.cpu_limit, rounded up).
        "usable_cpus": min(len(allowed), cgroup["cpu_limit"] or len(allowed)),
        "cgroup": cgroup,
        "numa_nodes": _read_nodes(reader, online, allowed, allowed_mems, cores, mem_total_mib, sockets, numa),
    }


def _signed_int(text):
    # physical_package_id is -1 where firmware gives none.
    return ascii_int(text, signed=True)


def _check_isa_lines(blocks, arch, path):
    """Refuse a cpuinfo whose ISA cannot be known: no flag line, or one missing on some CPU."""
    field = {"x86_64": "flags", "aarch64": "Features", "s390x": "features"}.get(arch)
    if field is None:
        return
    processors = [b for b in blocks if "processor" in b] or blocks
    # s390x prints one features line, in the header block, for every CPU.
    per_processor = arch != "s390x"
    fix = "read a complete /proc/cpuinfo (the kernel prints a {} line{})".format(
        field, " for every processor" if per_processor else ""
    )
    if not any(field in b for b in processors):
        raise TopologyError(
            path, f"no {field} line on {arch}: the instruction sets, and so the build class, are unknown", fix
        )
    if not per_processor:
        return
    for block in processors:
        if field not in block:
            raise TopologyError(path, f"processor {show(block.get('processor', '?'))[1:-1]} has no {field} line", fix)


def _read_cgroup(reader):
    # The cgroup namespace makes /sys/fs/cgroup the container's own cgroup, so
    # the files at the mount root are the limits that apply to this process.
    v2 = (
        "sys/fs/cgroup/cgroup.controllers",
        "sys/fs/cgroup/cpuset.cpus.effective",
        "sys/fs/cgroup/cpuset.mems.effective",
        "sys/fs/cgroup/memory.max",
    )
    v1_cpu_dirs = ("sys/fs/cgroup/cpu,cpuacct", "sys/fs/cgroup/cpu")
    if any(reader.exists(p) for p in (*v2, "sys/fs/cgroup/cpu.max")):
        version, cpus_files, mems_files, memory_file = 2, v2[1:2], v2[2:3], v2[3]
    elif any(reader.isdir(d) for d in ("sys/fs/cgroup/cpuset", "sys/fs/cgroup/memory", *v1_cpu_dirs)):
        version = 1
        cpus_files = ("sys/fs/cgroup/cpuset/cpuset.effective_cpus", "sys/fs/cgroup/cpuset/cpuset.cpus")
        mems_files = ("sys/fs/cgroup/cpuset/cpuset.effective_mems", "sys/fs/cgroup/cpuset/cpuset.mems")
        memory_file = "sys/fs/cgroup/memory/memory.limit_in_bytes"
    else:
        return {"version": None, "cpus": None, "mems": None, "memory_max_mib": None, "cpu_limit": None}, {}
    cpus, cpus_path = _first_present(reader, cpus_files, parse_cpulist)
    mems, mems_path = _first_present(reader, mems_files, parse_nodelist)
    if version == 2:
        limit = reader.parse("sys/fs/cgroup/cpu.max", parse_cpu_max, optional=True)
    else:
        limit = None
        for cpu_dir in v1_cpu_dirs:
            quota = reader.parse(cpu_dir + "/cpu.cfs_quota_us", parse_cfs_quota, optional=True)
            if quota is not None:
                period_file = cpu_dir + "/cpu.cfs_period_us"
                limit = reader.parse(period_file, lambda text, quota=quota: cpu_limit(quota, text.strip()))
                break
    cgroup = {
        "version": version,
        # An empty cpuset file means the controller is not enabled here, not
        # "no CPUs" or "no memory": the process is running, so it has both.
        "cpus": cpus or None,
        "mems": mems or None,
        "memory_max_mib": reader.parse(memory_file, parse_memory_limit, optional=True),
        # ceil(quota / period) of cpu.max (v2) or cpu.cfs_quota_us / cpu.cfs_period_us (v1).
        "cpu_limit": limit,
    }
    return cgroup, {"cpus": cpus_path, "mems": mems_path}


def _first_present(reader, files, parser):
    """(parsed value, path) of the first of ``files`` that exists, else (None, None)."""
    for rel in files:
        value = reader.parse(rel, parser, optional=True)
        if value is not None:
            return value, reader.path(rel)
    return None, None


def _allowed_mems(reader, cgroup, cgroup_files):
    """The node ids this process may allocate memory on, or None when nothing restricts them.

    Mems_allowed_list is the process's own view (its cpuset), like Cpus_allowed_list; the
    cgroup's cpuset.mems narrows it where present, as cpuset.cpus narrows the CPUs.
    """
    status_mems = reader.parse("proc/self/status", parse_status_mems, optional=True)
    allowed = None if status_mems is None else set(status_mems)
    if cgroup["mems"] is not None:
        allowed = set(cgroup["mems"]) if allowed is None else allowed & set(cgroup["mems"])
    if allowed is not None and not allowed:
        raise TopologyError(
            cgroup_files["mems"] if cgroup["mems"] is not None else reader.path("proc/self/status"),
            "Mems_allowed_list and the cgroup cpuset.mems leave the process no memory node to allocate on",
            "allow the process a memory node (cgroup cpuset.mems, a container's --cpuset-mems, numactl --membind)",
        )
    return allowed


def _read_nodes(reader, online, allowed, allowed_mems, cores, mem_total_mib, sockets, numa):
    base = "sys/devices/system/node"

    def memory_allowed(node):
        return allowed_mems is None or node in allowed_mems

    if numa == "single":
        memory_mib = _single_node_memory_mib(reader, base, mem_total_mib, allowed_mems)
        return [_node(0, online, allowed, cores, memory_mib, [10], True)]
    if not reader.isdir(base):
        if reader.lexists(base):
            # A dangling or looping symlink, or a file: isdir() says no, listing says why.
            reader.listdir(base)
            raise TopologyError(reader.path(base), "cannot read: not a directory", NUMA_FIX)
        if sockets > 1:
            raise TopologyError(
                reader.path(base),
                f"missing on a machine with {sockets} sockets (physical_package_id); one node spanning them "
                "would bind ranks across sockets",
                f"mount sysfs completely (a kernel without NUMA has one socket), or {NUMA_FIX}",
            )
        # Kernel without CONFIG_NUMA: one node holding everything.
        return [_node(0, online, allowed, cores, mem_total_mib, [10], memory_allowed(0))]
    nodes, owner = [], {}
    for node in _node_ids(reader, base):
        path = f"{base}/node{node}"
        node_cpus = reader.parse(path + "/cpulist", parse_cpulist)
        taken = sorted(cpu for cpu in node_cpus if cpu in owner)
        if taken:
            raise TopologyError(
                reader.path(path + "/cpulist"),
                f"CPU(s) {format_cpulist(taken)} also listed by node {owner[taken[0]]}: the nodes overlap",
                NUMA_FIX,
            )
        owner.update(dict.fromkeys(node_cpus, node))
        nodes.append(
            _node(
                node,
                node_cpus,
                allowed,
                cores,
                reader.parse(path + "/meminfo", parse_meminfo_kib) // 1024,
                reader.parse(path + "/distance", parse_distance),
                memory_allowed(node),
            )
        )
    homeless = sorted(set(online) - set(owner))
    if homeless:
        raise TopologyError(
            reader.path(base),
            f"online CPUs {format_cpulist(homeless)} are in no node's cpulist",
            NUMA_FIX,
        )
    for core in cores:
        split = sorted({owner[cpu] for cpu in core})
        if len(split) > 1:
            # Left alone, the core's threads would count as a core on each node.
            strays = [cpu for cpu in core if owner[cpu] == split[-1]]
            raise TopologyError(
                reader.path(f"{base}/node{split[-1]}/cpulist"),
                f"CPU(s) {format_cpulist(strays)} share a physical core (thread_siblings_list, core_id) with "
                f"CPU(s) {format_cpulist(set(core) - set(strays))} of node(s) {format_cpulist(split[:-1])}: "
                "a core cannot span NUMA nodes",
                f"give the machine (a VM's vCPU topology) nodes of whole cores, or {NUMA_FIX}",
            )
    return nodes


def _node_ids(reader, base):
    ids = reader.parse(base + "/online", parse_nodelist, optional=True)
    if ids is None:
        names = reader.listdir(base)
        ids = sorted(int(d[4:]) for d in names if d.startswith("node") and _ASCII_UINT.match(d[4:]) and len(d) < 9)
    return ids


def _single_node_memory_mib(reader, base, mem_total_mib, allowed_mems):
    """MemTotal less the memory vLLM's binding never uses, as far as the node directory tells.

    vLLM binds a rank's memory to nodes of its bound CPUs: never to a memory-only (CXL,
    HBM) node, nor to one this process may not allocate on. numa single distrusts the
    node cpulists, so the kernel's has_cpu names the nodes with CPUs.
    """
    if not reader.isdir(base):
        return mem_total_mib
    with_cpus = reader.parse(base + "/has_cpu", parse_nodelist, optional=True)
    unusable = [
        node
        for node in _node_ids(reader, base)
        if (with_cpus is not None and node not in with_cpus) or (allowed_mems is not None and node not in allowed_mems)
    ]
    unusable_mib = sum(reader.parse(f"{base}/node{node}/meminfo", parse_meminfo_kib) // 1024 for node in unusable)
    return max(0, mem_total_mib - unusable_mib)


def _node(node, node_cpus, allowed, cores, memory_mib, distance, memory_allowed):
    usable = allowed.intersection(node_cpus)
    node_cores = [[c for c in core if c in usable] for core in cores]
    return {
        "id": node,
        "cpus": sorted(usable),
        "cores": sorted(core for core in node_cores if core),
        "memory_mib": memory_mib,
        # False when the process may not allocate on the node (Mems_allowed_list, cgroup cpuset.mems).
        "memory_allowed": memory_allowed,
        "distance": distance,
    }


# What read_cpu_facts' result depends on that can change without a reboot, read
# whole (small files) or by the one line holding a word (files that change every
# second); facts_key adds each NUMA node's MemTotal line. Every
# other file it reads (cpuinfo, per-CPU topology, node distances) only changes
# with the hardware, the firmware's NUMA setting or the kernel, which all take
# a reboot, and so a new boot_id.
KEY_FILES = (
    ("proc/sys/kernel/random/boot_id", None),
    ("sys/devices/system/cpu/possible", None),
    ("sys/devices/system/cpu/online", None),
    ("sys/devices/system/node/online", None),
    ("sys/devices/system/node/has_memory", None),
    ("sys/devices/system/node/has_cpu", None),
    ("proc/meminfo", "MemTotal:"),
    ("proc/self/status", "Cpus_allowed_list:"),
    ("proc/self/status", "Mems_allowed_list:"),
    ("sys/fs/cgroup/cgroup.controllers", None),
    ("sys/fs/cgroup/cpuset.cpus.effective", None),
    ("sys/fs/cgroup/cpuset.mems.effective", None),
    ("sys/fs/cgroup/memory.max", None),
    ("sys/fs/cgroup/cpu.max", None),
    ("sys/fs/cgroup/cpuset/cpuset.effective_cpus", None),
    ("sys/fs/cgroup/cpuset/cpuset.cpus", None),
    ("sys/fs/cgroup/cpuset/cpuset.effective_mems", None),
    ("sys/fs/cgroup/cpuset/cpuset.mems", None),
    ("sys/fs/cgroup/memory/memory.limit_in_bytes", None),
    ("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", None),
    ("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", None),
    ("sys/fs/cgroup/cpu/cpu.cfs_quota_us", None),
    ("sys/fs/cgroup/cpu/cpu.cfs_period_us", None),
)


def _source_digest():
    """The parser's source (this file and the cpulist helpers): a changed parser must not reuse old facts."""
    digest = hashlib.sha256()
    for name in (__name__, parse_cpulist.__module__):
        try:
            digest.update(inspect.getsource(sys.modules[name]).encode("utf-8"))
        except (OSError, TypeError):
            digest.update(b"unknown")  # no source to read: the key still changes with every input above
    return digest.hexdigest()


_SOURCE_DIGEST = _source_digest()


def facts_key(root="/", arch=None, numa="strict"):
    """A digest that changes whenever read_cpu_facts(root, arch, numa) could return something else.

    Reads a few small files (KEY_FILES) instead of the ~1,500 of a large machine, so a
    host whose facts are cached can be checked in the same module run that would read them.
    Unreadable or missing files count as such: they never raise.
    """
    try:
        nodes = sorted(n for n in os.listdir(os.path.join(root, "sys/devices/system/node")) if _NODE_DIR.match(n))
    except OSError:
        nodes = []
    # A node's memory can change by hotplug (a VM's virtio-mem) without a reboot.
    node_files = tuple((f"sys/devices/system/node/{n}/meminfo", "MemTotal:") for n in nodes)
    parts = [_SOURCE_DIGEST, os.path.normpath(str(root)), arch, numa]
    for rel, line_word in KEY_FILES + node_files:
        try:
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as handle:
                text = handle.read(MAX_FILE_CHARS)
        except OSError as exc:
            parts.append(f"{rel}: {type(exc).__name__}")
            continue
        if line_word is not None:
            text = next((line for line in text.splitlines() if line_word in line), "")
        parts.append(f"{rel}: {text.strip()}")
    return hashlib.sha256(json.dumps(parts).encode("utf-8")).hexdigest()


def read_text(path, limit):
    """The first ``limit`` characters of a file as ``open(path, encoding="utf-8", errors="replace")`` reads them.

    Bytes read raw and decoded once, with text mode's universal newlines: a large machine's tree is about 1,500
    small files, and text mode's buffers and decoder cost several times the read itself. At most 4 bytes per
    character are read. Exact for a file of fewer than ``limit`` characters; a longer one gives ``limit`` of them.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks, size, cap = [], 0, 4 * limit
        while size < cap:
            chunk = os.read(fd, min(cap - size, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", "replace")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text[:limit]


class _Reader:
    """File access confined to root, turning every failure into TopologyError."""

    def __init__(self, root):
        self.root = root

    def path(self, rel):
        return os.path.join(self.root, rel)

    def exists(self, rel):
        return os.path.exists(self.path(rel))

    def isdir(self, rel):
        return os.path.isdir(self.path(rel))

    def lexists(self, rel):
        return os.path.lexists(self.path(rel))

    def listdir(self, rel):
        try:
            return os.listdir(self.path(rel))
        except OSError as exc:
            raise TopologyError(self.path(rel), f"cannot read: {exc.strerror}", NUMA_FIX) from None

    def text(self, rel, optional=False):
        path = self.path(rel)
        try:
            text = read_text(path, MAX_FILE_CHARS + 1)
        except FileNotFoundError:
            if optional:
                return None
            raise TopologyError(path, "missing") from None
        except OSError as exc:
            raise TopologyError(path, f"cannot read: {exc.strerror}") from None
        if len(text) > MAX_FILE_CHARS:
            raise TopologyError(path, f"larger than {MAX_FILE_CHARS // MIB} MiB, no kernel file is")
        return text

    def parse(self, rel, parser, optional=False):
        """Return parser(file text); None if optional and absent."""
        text = self.text(rel, optional)
        if text is None:
            return None
        try:
            return parser(text)
        except _Refusal as exc:
            raise TopologyError(self.path(rel), str(exc), exc.fix) from None
        except ValueError as exc:
            raise TopologyError(self.path(rel), f"cannot parse: {exc}") from None
