"""Run vllm_cpu_facts through the real ansible CLI with the project's ansible.cfg."""

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, load_expected_facts

BIN = Path(sys.executable).parent
# Ad-hoc output is "host | STATUS => {json}"; force JSON over ansible.cfg's yaml.
ENV = dict(os.environ, ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")


def run_module(*args, module="vllm.cpu_fleet.vllm_cpu_facts", inside=()):
    """(rc, status, result) of one ad-hoc run on localhost; inside: a command to run it under (ip netns exec NS)."""
    proc = subprocess.run(
        [*inside, str(BIN / "ansible"), "localhost", "-m", module, *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120, check=False,
    )
    status, sep, payload = proc.stdout.partition(" => ")
    assert sep, f"no result in ansible output:\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, status.split("|")[-1].strip(), json.loads(payload)


@pytest.mark.parametrize("name", ["gnr-2s-snc3", "milan-container-cpuset", "graviton3-c7g"])
def test_module_returns_fixture_facts(machine_root, name):
    rc, status, result = run_module("-a", f"root={machine_root(name)}")
    assert (rc, status, result["changed"]) == (0, "SUCCESS", False)
    assert result["ansible_facts"]["vllm_cpu"] == load_expected_facts(name)


def _between(value, first, second):
    return isinstance(value, int) and min(first, second) <= value <= max(first, second)


def test_module_check_mode_on_this_host():
    # This host's facts as its own files give them, read before and after the run; never a recorded machine's,
    # whose model name many VMs share (issue 43).
    before = this_host_facts()
    rc, status, result = run_module("--check")
    after = this_host_facts()
    assert (rc, status) == (0, "SUCCESS"), result
    facts = result["ansible_facts"]["vllm_cpu"]
    # The local connection inherits this process's affinity, which the kernel
    # already keeps within the cgroup cpuset and the online CPUs.
    assert facts["allowed_cpus"] == sorted(os.sched_getaffinity(0))
    if before["arch"] != "x86_64":
        # vendor and model of other architectures are names the module looks up (CPU implementer and part):
        # only the x86 vendor_id and model name lines say them as they are.
        assert facts["vendor"] and facts["model"]
        before, after = ({**read, "vendor": facts["vendor"], "model": facts["model"]} for read in (before, after))
    expected = copy.deepcopy(after if facts == after else before)
    # Memory comes and goes while a VM runs (hot-plug, virtio-mem, balloons, lazily initialised memory, in blocks
    # of 128 MiB and more): a figure between the two reads is one the module saw. Every other fact is exact.
    if _between(facts["memory_mib"], before["memory_mib"], after["memory_mib"]):
        expected["memory_mib"] = facts["memory_mib"]
    nodes = (facts["numa_nodes"], expected["numa_nodes"], before["numa_nodes"], after["numa_nodes"])
    for got, wanted, first, last in zip(*nodes, strict=False):  # a node count that differs fails below
        if _between(got.get("memory_mib"), first["memory_mib"], last["memory_mib"]):
            wanted["memory_mib"] = got["memory_mib"]
    differing = {key: (facts.get(key), value) for key, value in expected.items() if facts.get(key) != value}
    assert facts == expected, f"(module, this host's files) differ: {differing}"


# ---- this host as its own files say, read without module_utils/vllm_cpu_topology.py --------------------------
# Plain readers of the kernel's files, written for these tests: a test of the machine it runs on checks what that
# machine says, never a recording of another (tests/fixtures/machines hold those, for the module's parsing).

PROC = Path("/proc")
SYS_CPU, SYS_NODE = Path("/sys/devices/system/cpu"), Path("/sys/devices/system/node")
CGROUP_FS = "/sys/fs/cgroup"
ISA_FLAGS = {
    "x86_64": ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8"),
    "aarch64": ("asimd", "sve", "bf16", "i8mm"),
    "s390x": ("vxe",),
    "ppc64le": (),
}
# The cpuinfo line that lists a CPU's features, per architecture.
FLAGS_FIELD = {"x86_64": "flags", "aarch64": "Features", "s390x": "features"}
MIB = 1 << 20


def _text(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _optional(path):
    try:
        return _text(path)
    except FileNotFoundError:
        return None


def _ids(text):
    """The kernel's list format ("0-3,8", cpulists, node lists, cpusets) as sorted ids; "" is none."""
    ids = set()
    for part in text.strip().split(","):
        if part:
            low, _sep, high = part.partition("-")
            ids.update(range(int(low), int(high or low) + 1))
    return sorted(ids)


def _cpuinfo_values(field):
    """Every value of ``field`` in /proc/cpuinfo (one per processor on x86 and arm64)."""
    values = []
    for line in _text(PROC / "cpuinfo").splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == field:
            values.append(value.strip())
    return values


def _status_ids(field):
    """Cpus_allowed_list / Mems_allowed_list of /proc/self/status."""
    for line in _text(PROC / "self" / "status").splitlines():
        name, _sep, value = line.partition(":")
        if name == field:
            return _ids(value)
    raise AssertionError(f"/proc/self/status has no {field}")


def _kib(text, key="MemTotal"):
    """The kB of ``key`` in /proc/meminfo or a node's meminfo ("Node 0 MemTotal: ... kB")."""
    for line in text.splitlines():
        name, _sep, value = line.partition(":")
        if name.split()[-1:] == [key]:
            return int(value.split()[0])
    raise AssertionError(f"no {key} line")


def cgroup_mounts():
    """{mount point: (fs type, super options)} of the file systems mounted under /sys/fs/cgroup, from
    /proc/self/mountinfo; a later mount over a point hides the earlier ones there and below."""
    mounts = {}
    for line in _text(PROC / "self" / "mountinfo").splitlines():
        fields = line.split()
        point, rest = fields[4], fields[fields.index("-") + 1 :]
        if point == CGROUP_FS or point.startswith(CGROUP_FS + "/"):
            for hidden in [p for p in mounts if p == point or p.startswith(point + "/")]:
                del mounts[hidden]
            mounts[point] = (rest[0], rest[2].split(","))
    return mounts


def cgroup_v1_hierarchies():
    """The controllers of the cgroup v1 hierarchies this process is in (/proc/self/cgroup "N:ctrl,ctrl:/path")."""
    controllers = set()
    for line in _text(PROC / "self" / "cgroup").splitlines():
        number, _sep, rest = line.partition(":")
        if number != "0":
            controllers.update(rest.split(":", 1)[0].split(","))
    return controllers


def _memory_limit_mib(text):
    value = text.strip()
    if value == "max" or int(value) >= 1 << 60:  # v1 says "unlimited" as LONG_MAX in whole pages
        return None
    return int(value) // MIB


def _cpus_of_quota(quota, period):
    return None if quota in ("max", "-1") else math.ceil(int(quota) / int(period))


def this_host_cgroup():
    """The fact's cgroup dict as the cgroup file system mounted on /sys/fs/cgroup says it (the files at its root:
    a container's own cgroup under its cgroup namespace)."""
    mounts = cgroup_mounts()
    none = {"version": None, "cpus": None, "mems": None, "memory_max_mib": None, "cpu_limit": None}
    if mounts.get(CGROUP_FS, ("",))[0] == "cgroup2":
        base = Path(CGROUP_FS)
        cpu_max = (_optional(base / "cpu.max") or "max 100000").split()
        memory = _optional(base / "memory.max")
        return {
            "version": 2,
            "cpus": _ids(_optional(base / "cpuset.cpus.effective") or "") or None,
            "mems": _ids(_optional(base / "cpuset.mems.effective") or "") or None,
            "memory_max_mib": None if memory is None else _memory_limit_mib(memory),
            "cpu_limit": _cpus_of_quota(*cpu_max),
        }
    # cgroup v1: each controller is a hierarchy of its own, mounted below /sys/fs/cgroup, that this process is in.
    joined = cgroup_v1_hierarchies()
    v1 = {
        controller: Path(point)
        for point, (fstype, options) in mounts.items()
        if fstype == "cgroup" and Path(point).parent == Path(CGROUP_FS)
        for controller in options
        if controller in ("cpuset", "memory", "cpu") and controller in joined
    }
    if not v1:
        return none
    cgroup = dict(none, version=1)
    if "cpuset" in v1:
        files = {"cpus": ("cpuset.effective_cpus", "cpuset.cpus"), "mems": ("cpuset.effective_mems", "cpuset.mems")}
        for key, names in files.items():
            found = [text for text in (_optional(v1["cpuset"] / name) for name in names) if text is not None]
            cgroup[key] = (_ids(found[0]) if found else []) or None
    if "memory" in v1:
        memory = _optional(v1["memory"] / "memory.limit_in_bytes")
        cgroup["memory_max_mib"] = None if memory is None else _memory_limit_mib(memory)
    if "cpu" in v1 and _optional(v1["cpu"] / "cpu.cfs_quota_us") is not None:
        quota = _text(v1["cpu"] / "cpu.cfs_quota_us").strip()
        cgroup["cpu_limit"] = _cpus_of_quota(quota, _text(v1["cpu"] / "cpu.cfs_period_us").strip())
    return cgroup


def _isa_class(arch, has):
    """The build class the module documents (its returned isa_class), strongest first."""
    if arch == "x86_64":
        if has["avx512f"] and has["avx512_vnni"] and has["avx512_bf16"]:
            return "x86_64-amx" if has["amx_bf16"] and has["amx_tile"] else "x86_64-avx512bf16"
        if has["avx512f"]:
            return "x86_64-avx512vnni" if has["avx512_vnni"] else "x86_64-avx512"
        return "x86_64-avx2"
    if arch == "aarch64":
        return "aarch64-bf16" if has["bf16"] else "aarch64-neon"
    if arch == "s390x":
        return "s390x-vxe" if has["vxe"] else "s390x"
    return "ppc64le"


def this_host_facts():
    """The vllm_cpu fact dict of this host (and this process's affinity and cgroup), from its own files."""
    arch = os.uname().machine
    assert arch in ISA_FLAGS, f"vllm_cpu_facts supports no {arch}"
    field = FLAGS_FIELD.get(arch)  # ppc64le lists none the module reads
    flag_lines = [set(line.split()) for line in _cpuinfo_values(field)] if field else []
    has = {flag: bool(flag_lines) and all(flag in line for line in flag_lines) for flag in ISA_FLAGS[arch]}
    isa = {flag: has.get(flag, False) for names in ISA_FLAGS.values() for flag in names}
    # x86 says vendor and model as they are; the other architectures' are names the module looks up.
    vendor, model = None, None
    if arch == "x86_64":
        vendor, model = _cpuinfo_values("vendor_id")[0], _cpuinfo_values("model name")[0]

    # A CPU is online with a topology directory; a core is the CPUs its thread_siblings_list names.
    online = [cpu for cpu in _ids(_text(SYS_CPU / "online")) if (SYS_CPU / f"cpu{cpu}" / "topology").is_dir()]
    possible = _ids(_optional(SYS_CPU / "possible") or "") or online
    topology = {cpu: SYS_CPU / f"cpu{cpu}" / "topology" for cpu in online}
    packages = {_optional(path / "physical_package_id") for path in topology.values()}
    siblings = {
        cpu: tuple(c for c in _ids(_optional(path / "thread_siblings_list") or str(cpu)) if c in topology) or (cpu,)
        for cpu, path in topology.items()
    }
    cores = sorted({tuple(sorted(core)) for core in siblings.values()})

    cgroup = this_host_cgroup()
    allowed = set(online) & os.sched_getaffinity(0) & set(cgroup["cpus"] or online)
    mems = set(_status_ids("Mems_allowed_list")) & set(cgroup["mems"] or _status_ids("Mems_allowed_list"))
    mem_total_mib = _kib(_text(PROC / "meminfo")) // 1024

    def node(node_id, cpus, memory_mib, distance):
        usable = allowed & set(cpus)
        return {
            "id": node_id,
            "cpus": sorted(usable),
            "cores": sorted(kept for kept in ([cpu for cpu in core if cpu in usable] for core in cores) if kept),
            "memory_mib": memory_mib,
            "memory_allowed": node_id in mems,
            "distance": distance,
        }

    if SYS_NODE.is_dir():
        node_dirs = (_ids(_optional(SYS_NODE / "online") or "")
                     or sorted(int(d.name[4:]) for d in SYS_NODE.glob("node*") if d.name[4:].isdigit()))  # fmt: skip
        nodes = [
            node(
                n,
                _ids(_text(SYS_NODE / f"node{n}" / "cpulist")),
                _kib(_text(SYS_NODE / f"node{n}" / "meminfo")) // 1024,
                [int(d) for d in _text(SYS_NODE / f"node{n}" / "distance").split()],
            )
            for n in node_dirs
        ]
    else:  # a kernel without NUMA: one node of everything
        nodes = [node(0, online, mem_total_mib, [10])]
    return {
        "arch": arch,
        "vendor": vendor,
        "model": model,
        "isa": isa,
        "isa_class": _isa_class(arch, has),
        "sockets": len(packages),
        "threads_per_core": max(len(core) for core in cores),
        "memory_mib": min(mem_total_mib, cgroup["memory_max_mib"] or mem_total_mib),
        "online_cpus": online,
        "offline_cpus": sorted(set(possible) - set(online)),
        "allowed_cpus": sorted(allowed),
        "usable_cpus": min(len(allowed), cgroup["cpu_limit"] or len(allowed)),
        "cgroup": cgroup,
        "numa_nodes": nodes,
    }


def test_module_os_facts_are_setups():
    # The roles read these instead of running setup: they must be setup's own values.
    _unused, _unused, ours = run_module()
    _unused, status, theirs = run_module("-a", "gather_subset=!all,!min,distribution,python,platform", module="setup")
    assert status == "SUCCESS"
    os_facts = {key: value for key, value in ours["ansible_facts"].items() if key not in ("vllm_cpu", "vllm_cpu_key")}
    for key in ("distribution", "distribution_major_version", "distribution_version", "os_family", "architecture"):
        assert key in os_facts, key
    assert os_facts["python"]["executable"]
    assert os_facts == {key: theirs["ansible_facts"]["ansible_" + key] for key in os_facts}


def test_module_returns_setups_network_and_systemd_facts_when_asked():
    # Preflight reads them in the facts run instead of a second (setup) run per serving host.
    _unused, _unused, ours = run_module("-a", "gather_subset=network,systemd")
    _unused, status, theirs = run_module("-a", "gather_subset=!all,!min,network,systemd", module="setup")
    assert status == "SUCCESS"
    expected = {key.removeprefix("ansible_"): value for key, value in theirs["ansible_facts"].items()}
    assert "all_ipv4_addresses" in expected
    got = {key: ours["ansible_facts"].get(key) for key in expected}
    # setup lists the interfaces in the order a set of them iterates, which varies between runs.
    got["interfaces"], expected["interfaces"] = sorted(got["interfaces"]), sorted(expected["interfaces"])
    assert got == expected


def test_module_confirms_a_cached_key_without_reading_the_facts_again():
    _unused, _unused, first = run_module()
    key = first["ansible_facts"]["vllm_cpu_key"]
    assert first["cached"] is False
    rc, status, again = run_module("-a", f"cache_key={key}")
    assert (rc, status, again["cached"]) == (0, "SUCCESS", True)
    assert again["ansible_facts"]["vllm_cpu_key"] == key and "vllm_cpu" not in again["ansible_facts"]
    _unused, _unused, other = run_module("-a", "cache_key=stale")
    assert other["cached"] is False and other["ansible_facts"]["vllm_cpu"] == first["ansible_facts"]["vllm_cpu"]


def test_module_failure_names_the_path(tmp_path):
    rc, status, result = run_module("-a", f"root={tmp_path}")
    assert (rc, status) == (2, "FAILED!")
    assert result["path"] == str(tmp_path / "proc" / "cpuinfo")
    assert str(tmp_path / "proc" / "cpuinfo") in result["msg"]


def test_ansible_doc_renders():
    proc = subprocess.run(
        [str(BIN / "ansible-doc"), "vllm.cpu_fleet.vllm_cpu_facts"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "numa_nodes" in proc.stdout and "isa_class" in proc.stdout
