"""Read a host's CPU, NUMA, memory and cgroup facts from procfs/sysfs.

Plain Python, no Ansible imports and no subprocess, so the planner's tests and
the fact module share one implementation. ``parse_*`` functions take file
contents as strings; ``read_cpu_facts`` does all file access, strictly under
``root`` so a recorded machine tree can stand in for ``/``.
"""

import os

from ansible.module_utils.vllm_cpu_cpulist import parse_cpulist

ARCHES = ("x86_64", "aarch64", "s390x", "ppc64le")

# Flags as /proc/cpuinfo spells them, per architecture.
X86_ISA = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")
ARM_ISA = ("asimd", "sve", "bf16", "i8mm")
S390_ISA = ("vxe",)
ISA_KEYS = X86_ISA + ARM_ISA + S390_ISA

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


class TopologyError(ValueError):
    """A file under root is missing or unparsable; ``path`` names it."""

    def __init__(self, path, reason):
        super().__init__(f"{path}: {reason}")
        self.path = path


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
    s390x-vxe; ppc64le.
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
        return "s390x-vxe"
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
            if fields and fields[0].isdigit():
                return int(fields[0])
    raise ValueError(f"no {key} line")


def parse_status_cpus(text):
    """Return Cpus_allowed_list of /proc/self/status as a list, or None."""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name == "Cpus_allowed_list":
            return parse_cpulist(value)
    return None


def parse_memory_limit(text):
    """Return a cgroup memory limit in MiB, or None when unlimited.

    v2 memory.max holds "max" or bytes; v1 memory.limit_in_bytes holds bytes,
    near LONG_MAX when unlimited.
    """
    value = text.strip()
    if value == "max":
        return None
    if not value.isdigit():
        raise ValueError(f"not a byte count: {value!r}")
    limit = int(value)
    return None if limit >= UNLIMITED_BYTES else limit // MIB


def parse_distance(text):
    """Return a nodeN/distance line ("10 21") as a list of ints."""
    try:
        return [int(v) for v in text.split()]
    except ValueError:
        raise ValueError(f"not a list of integers: {text.strip()!r}") from None


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


def read_cpu_facts(root="/", arch=None):
    """Return the vllm_cpu fact dict of the machine whose files live under root.

    ``arch`` overrides the architecture inferred from /proc/cpuinfo (needed
    only when the cpuinfo format is not recognised). Raises TopologyError
    naming the file that is missing or cannot be parsed.
    """
    reader = _Reader(root)
    blocks = parse_cpuinfo(reader.text("proc/cpuinfo"))
    if arch is None:
        arch = detect_arch(blocks)
        if arch is None:
            raise TopologyError(reader.path("proc/cpuinfo"), "cannot infer the architecture; pass arch")
    elif arch not in ARCHES:
        raise ValueError("arch must be one of {}, got {!r}".format(", ".join(ARCHES), arch))
    isa = parse_isa(blocks, arch)
    vendor, model = identify_cpu(blocks, arch)

    online = reader.parse("sys/devices/system/cpu/online", parse_cpulist)
    possible = reader.parse("sys/devices/system/cpu/possible", parse_cpulist, optional=True)
    topology = {}
    for cpu in online:
        topo = f"sys/devices/system/cpu/cpu{cpu}/topology"
        # Offline CPUs have no topology directory; a CPU that went offline
        # after "online" was read is skipped the same way.
        if reader.isdir(topo):
            topology[cpu] = (
                reader.parse(topo + "/physical_package_id", int, optional=True),
                reader.parse(topo + "/core_id", int, optional=True),
                reader.parse(topo + "/thread_siblings_list", parse_cpulist, optional=True),
            )
    if not topology:
        raise TopologyError(reader.path("sys/devices/system/cpu"), "no online CPU has a topology directory")
    online = sorted(topology)
    cores = group_cores(topology)

    cgroup = _read_cgroup(reader)
    allowed = set(online)
    status_cpus = reader.parse("proc/self/status", parse_status_cpus, optional=True)
    if status_cpus is not None:
        allowed &= set(status_cpus)
    if cgroup["cpus"] is not None:
        allowed &= set(cgroup["cpus"])

    mem_total_mib = reader.parse("proc/meminfo", parse_meminfo_kib) // 1024
    memory_mib = mem_total_mib
    if cgroup["memory_max_mib"] is not None:
        memory_mib = min(memory_mib, cgroup["memory_max_mib"])

    return {
        "arch": arch,
        "vendor": vendor,
        "model": model,
        "isa": isa,
        "isa_class": isa_class(arch, isa),
        "sockets": len({package for package, _, _ in topology.values()}),
        "threads_per_core": max(len(core) for core in cores),
        "memory_mib": memory_mib,
        "online_cpus": online,
        "offline_cpus": sorted(set(possible or online) - set(online)),
        "allowed_cpus": sorted(allowed),
        "cgroup": cgroup,
        "numa_nodes": _read_nodes(reader, online, allowed, cores, mem_total_mib),
    }


def _read_cgroup(reader):
    # The cgroup namespace makes /sys/fs/cgroup the container's own cgroup, so
    # the files at the mount root are the limits that apply to this process.
    v2 = ("sys/fs/cgroup/cgroup.controllers", "sys/fs/cgroup/cpuset.cpus.effective", "sys/fs/cgroup/memory.max")
    if any(reader.exists(p) for p in v2):
        version, cpus_files, memory_file = 2, v2[1:2], v2[2]
    elif reader.isdir("sys/fs/cgroup/cpuset") or reader.isdir("sys/fs/cgroup/memory"):
        version = 1
        cpus_files = ("sys/fs/cgroup/cpuset/cpuset.effective_cpus", "sys/fs/cgroup/cpuset/cpuset.cpus")
        memory_file = "sys/fs/cgroup/memory/memory.limit_in_bytes"
    else:
        return {"version": None, "cpus": None, "memory_max_mib": None}
    cpus = None
    for path in cpus_files:
        cpus = reader.parse(path, parse_cpulist, optional=True)
        if cpus is not None:
            break
    return {
        "version": version,
        # An empty cpuset file means the controller is not enabled here, not
        # "no CPUs": the process is running, so it has at least one.
        "cpus": cpus or None,
        "memory_max_mib": reader.parse(memory_file, parse_memory_limit, optional=True),
    }


def _read_nodes(reader, online, allowed, cores, mem_total_mib):
    base = "sys/devices/system/node"
    if not reader.isdir(base):
        # Kernel without CONFIG_NUMA: one node holding everything.
        return [_node(0, online, allowed, cores, mem_total_mib, [10])]
    ids = reader.parse(base + "/online", parse_cpulist, optional=True)
    if ids is None:
        ids = sorted(int(d[4:]) for d in reader.listdir(base) if d.startswith("node") and d[4:].isdigit())
    nodes = []
    for node in ids:
        path = f"{base}/node{node}"
        nodes.append(
            _node(
                node,
                reader.parse(path + "/cpulist", parse_cpulist),
                allowed,
                cores,
                reader.parse(path + "/meminfo", parse_meminfo_kib) // 1024,
                reader.parse(path + "/distance", parse_distance),
            )
        )
    return nodes


def _node(node, node_cpus, allowed, cores, memory_mib, distance):
    usable = allowed.intersection(node_cpus)
    node_cores = [[c for c in core if c in usable] for core in cores]
    return {
        "id": node,
        "cpus": sorted(usable),
        "cores": sorted(core for core in node_cores if core),
        "memory_mib": memory_mib,
        "distance": distance,
    }


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

    def listdir(self, rel):
        return os.listdir(self.path(rel))

    def text(self, rel, optional=False):
        path = self.path(rel)
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            if optional:
                return None
            raise TopologyError(path, "missing") from None
        except OSError as exc:
            raise TopologyError(path, f"cannot read: {exc.strerror}") from None

    def parse(self, rel, parser, optional=False):
        """Return parser(file text); None if optional and absent."""
        text = self.text(rel, optional)
        if text is None:
            return None
        try:
            return parser(text)
        except ValueError as exc:
            raise TopologyError(self.path(rel), f"cannot parse: {exc}") from None
