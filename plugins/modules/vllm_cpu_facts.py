#!/usr/bin/python

DOCUMENTATION = r"""
---
module: vllm_cpu_facts
short_description: Gather the CPU, NUMA, memory and cgroup facts vLLM CPU serving is planned from
description:
  - Reads C(/proc) and C(/sys) (no subprocess, no package needed on the host) and returns
    C(ansible_facts.vllm_cpu) - architecture, ISA flags and build class, sockets, physical cores
    per NUMA node, online and allowed CPUs, memory and cgroup limits.
  - Allowed CPUs are the online CPUs that both the process affinity (C(Cpus_allowed_list)) and the
    cgroup cpuset permit; O(root) lets a recorded machine tree stand in for C(/).
  - All parsing lives in C(module_utils/vllm_cpu_topology.py); this module only wraps it.
  - Also returns the operating system facts the roles read, with the values C(setup) gives (its own
    collectors for the C(distribution) and C(python) subsets, and C(architecture)), so plays that need
    no other fact run without C(gather_facts), one module run per host.
version_added: "1.0.0"
options:
  root:
    description:
      - Directory under which C(proc/) and C(sys/) are read.
      - Point it at a recorded or expanded machine tree to test plans without the hardware.
    type: path
    default: /
  arch:
    description:
      - Architecture to assume when C(/proc/cpuinfo) does not reveal it.
      - Leave unset to infer it.
    type: str
    choices: [x86_64, aarch64, s390x, ppc64le]
  numa:
    description:
      - How to read C(/sys/devices/system/node).
      - V(strict) refuses a NUMA view that does not add up, naming the file - node lists that
        overlap, online CPUs in no node's C(cpulist), a node directory that cannot be read (a
        dangling or looping symlink), or no node directory on a machine with more than one
        socket (C(physical_package_id)). A one-socket machine without it (a kernel built
        without NUMA) is one node, as before.
      - V(single) ignores the node CPU lists and reads the machine as one node (id 0) holding
        every allowed CPU and C(MemTotal) less the memory of nodes without CPUs (C(has_cpu); CXL, HBM)
        and of nodes the process may not allocate on; use it only for a machine whose node tree is
        broken and which you accept to plan as one node (ranks may then span sockets).
    type: str
    choices: [strict, single]
    default: strict
  gather_subset:
    description:
      - Subsets of C(setup) to return as well, collected by setup's own collectors in this module run (what
        C(setup) with C(gather_subset=!all,!min,<these>) returns, without the C(ansible_) prefix), so a host
        that needs them costs no second module run.
      - V(addresses) is the part of V(network) the roles read - C(default_ipv4), C(default_ipv6),
        C(all_ipv4_addresses) and C(all_ipv6_addresses), with setup's values - read over rtnetlink in this
        process (C(module_utils/vllm_host_addresses.py)) instead of setup's two C(ip) runs per interface and
        C(ethtool) runs; where rtnetlink cannot be asked, setup's V(network) collector gives them. With
        V(network) it is left out.
      - Always collected afresh, also when O(cache_key) matches.
    type: list
    elements: str
    choices: [addresses, network, systemd]
    default: []
  cache_key:
    description:
      - The C(vllm_cpu_key) fact of an earlier run, from Ansible's fact cache.
      - When the host's key (RV(ansible_facts.vllm_cpu_key)) still equals it, the module returns the key and the
        operating system facts but no C(vllm_cpu), and the cached C(vllm_cpu) stays in use; otherwise it reads
        and returns every fact.
      - The key is a digest of the boot id, the online, possible and NUMA-node CPU lists, C(MemTotal), the process
        affinity (C(Cpus_allowed_list), C(Mems_allowed_list)), the cgroup cpuset, memory and CPU limits, O(root),
        O(arch), O(numa) and this module's parser code. Hardware, firmware (SNC, NPS) and kernel changes take a
        reboot and so a new boot id; CPU hotplug, cpuset and limit changes show in the files themselves.
    type: str
  probe:
    description:
      - What preflight must also read on the host, answered in this same module run (every remote run costs a
        large fleet's controller more than what it reads) and returned as RV(vllm_host_probe), never as a fact.
      - A dict of optional sections - C(install) ({python, root, version, host_wheelhouse, active_link, snapshot_dirs}),
        C(build) ({python, dirs}), C(service) ({user, listen_address}), C(converged) ({path}) - the converged
        record and whether its witnesses hold, C(container) ({podman, seccomp, dirs, tools}) - podman's version, its
        default seccomp profile, free space, tools, C(loadbalancer) ({socket, backend}) - HAProxy's server states
        from its admin socket; C(module_utils/vllm_host_probe.py) says what each answers.
      - The action plugin C(vllm.cpu_fleet.vllm_preflight) fills it; read-only, also in check mode.
    type: dict
notes:
  - Supports check mode; the module never changes the host.
  - The operating system facts always describe the host the module runs on, also with O(root).
  - Node memory is the node's C(MemTotal); only the host-wide RV(ansible_facts.vllm_cpu.memory_mib)
    is capped by the cgroup memory limit.
  - >-
    Bad input is refused before anything uses it, as C(<file>: <problem>; fix: <fix>) with the file
    under C(/proc) or C(/sys) - numbers that are not plain ASCII decimals (Python's int() would take
    Unicode digits), CPU ids above 65535, C(MemTotal) or a memory limit under 1 MiB (0 is not
    "unlimited"), a cgroup CPU quota that is not C(QUOTA PERIOD), CPUs in C(online) that are not
    C(possible), a cpuset or affinity that leaves no online CPU, an x86_64 or aarch64
    C(/proc/cpuinfo) without a flags (Features) line on every processor, an x86_64 CPU without
    AVX2, an s390x one without VXE (before z14), C(Mems_allowed_list) and cgroup C(cpuset.mems) with no node in
    common, files larger than 64 MiB; and, with O(numa=strict), an inconsistent NUMA view (a physical
    core on two nodes included).
author:
  - vllm-cpu-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the hardware facts vLLM is planned from
  vllm_cpu_facts:

- name: Plan against a recorded machine instead of this host
  vllm_cpu_facts:
    root: /tmp/machines/spr-2s-amx

- name: Show the ISA build class
  ansible.builtin.debug:
    var: ansible_facts.vllm_cpu.isa_class
"""

RETURN = r"""
vllm_host_probe:
  description: The answers to O(probe), one key per section asked.
  returned: when O(probe) is given
  type: dict
  sample: {build: {python: "3.11", python_error: "", mem_available_kib: 20000000, disk_free_kib: 50000000}}
cached:
  description: True when O(cache_key) matched and C(vllm_cpu) was not read again.
  returned: always
  type: bool
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    vllm_cpu_key:
      description: The digest O(cache_key) is compared with; Ansible's fact cache keeps it beside C(vllm_cpu).
      type: str
    all_ipv4_addresses:
      description: >-
        With O(gather_subset=network), every fact of setup's C(network) subset (C(default_ipv4), C(interfaces), ...,
        and the C(platform) facts it depends on); with O(gather_subset=addresses), C(default_ipv4), C(default_ipv6),
        C(all_ipv4_addresses) and C(all_ipv6_addresses) only; with O(gather_subset=systemd), C(systemd). As C(setup)
        reports them.
      returned: when O(gather_subset) names network or addresses
      type: list
    distribution:
      description: >-
        The distribution, as C(setup) reports it; with it every other fact of setup's C(distribution)
        subset (C(distribution_version), C(distribution_major_version), C(distribution_release),
        C(os_family), ...).
      type: str
      sample: Debian
    architecture:
      description: The machine's architecture, as C(setup) reports it.
      type: str
      sample: x86_64
    python:
      description: The module's Python (version, executable), as C(setup) reports it.
      type: dict
    vllm_cpu:
      description: Hardware facts of the host.
      returned: always
      type: dict
      contains:
        arch:
          description: CPU architecture.
          type: str
          sample: x86_64
        vendor:
          description: CPU vendor (C(vendor_id), or the ARM implementer's name).
          type: str
          sample: GenuineIntel
        model:
          description: CPU model name (ARM core name such as C(Neoverse-V1), s390x machine type).
          type: str
          sample: Intel(R) Xeon(R) Platinum 8480+
        isa:
          description: >-
            Booleans avx2, avx512f, avx512_bf16, avx512_vnni, amx_bf16, amx_tile, amx_int8 (x86),
            asimd, sve, bf16, i8mm (aarch64), vxe (s390x); true only if every CPU lists the flag.
          type: dict
          sample: {avx2: true, avx512f: true, avx512_bf16: true, avx512_vnni: true, amx_bf16: true,
                   amx_tile: true, amx_int8: true, asimd: false, sve: false, bf16: false, i8mm: false, vxe: false}
        isa_class:
          description: >-
            Build variant the host needs; hosts with the same class can share one wheel.
            One of x86_64-amx, x86_64-avx512bf16, x86_64-avx512vnni, x86_64-avx512, x86_64-avx2,
            aarch64-bf16, aarch64-neon, s390x-vxe, ppc64le (an s390x host without VXE is refused).
          type: str
          sample: x86_64-amx
        sockets:
          description: Number of distinct physical packages among online CPUs.
          type: int
          sample: 2
        threads_per_core:
          description: Largest number of online hardware threads sharing one physical core.
          type: int
          sample: 2
        memory_mib:
          description: MemTotal in MiB, lowered to the cgroup memory limit when that is smaller.
          type: int
          sample: 1031798
        online_cpus:
          description: Online CPU ids.
          type: list
          elements: int
          sample: [0, 1, 2, 3]
        offline_cpus:
          description: Possible but offline CPU ids.
          type: list
          elements: int
          sample: []
        allowed_cpus:
          description: Online CPUs allowed by the process affinity and the cgroup cpuset.
          type: list
          elements: int
          sample: [0, 1, 2, 3]
        cgroup:
          description: >-
            C(version) (1, 2 or null), C(cpus) (cpuset CPU ids or null when unrestricted), C(mems)
            (cpuset memory node ids, v2 C(cpuset.mems.effective) or v1 C(cpuset.effective_mems), null when
            unrestricted),
            C(memory_max_mib) (null when unlimited), C(cpu_limit) (the CPU quota as whole CPUs,
            ceil(quota / period) of v2 C(cpu.max) or v1 C(cpu.cfs_quota_us) / C(cpu.cfs_period_us),
            null when unlimited; rounded up, as the JVM and .NET read it, so 1.5 CPUs of time
            give 2 threads and a quota under one CPU still gets one).
          type: dict
          sample: {version: 2, cpus: [8, 9, 136, 137], mems: null, memory_max_mib: 32768, cpu_limit: 2}
        usable_cpus:
          description: >-
            How many CPUs' worth of work the host's processes can run at once - the number of
            allowed CPUs, lowered to C(cgroup.cpu_limit) under a CPU quota. The planner sizes
            OpenMP threads, instances and MAX_JOBS to it.
          type: int
          sample: 4
        numa_nodes:
          description: >-
            Nodes sorted by id, each with C(id), C(cpus) (allowed online CPUs), C(cores) (lists of
            allowed sibling CPUs of one physical core, sorted by first CPU), C(memory_mib), C(memory_allowed)
            (false when C(Mems_allowed_list) or the cgroup's C(cpuset.mems) leave the node out: the planner gives
            it no rank, as a node with C(memory_mib) 0) and C(distance). Memory-only (CXL) nodes have empty
            C(cpus) and C(cores).
          type: list
          elements: dict
          sample: [{id: 0, cpus: [0, 1, 2, 3], cores: [[0, 2], [1, 3]], memory_mib: 515519, memory_allowed: true,
                    distance: [10, 21]}]
"""

# Ansible modules keep their imports below the documentation strings.
import importlib.util  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_topology import (  # noqa: E402
    NUMA_MODES,
    TopologyError,
    facts_key,
    read_cpu_facts,
)
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_host_addresses import (  # noqa: E402
    ADDRESS_FACTS,
    NetlinkError,
    address_facts,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "default": "/"},
            "arch": {"type": "str", "choices": ["x86_64", "aarch64", "s390x", "ppc64le"]},
            "numa": {"type": "str", "choices": list(NUMA_MODES), "default": "strict"},
            "gather_subset": {
                "type": "list",
                "elements": "str",
                "choices": ["addresses", "network", "systemd"],
                "default": [],
            },
            "cache_key": {"type": "str", "no_log": False},
            "probe": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    params = module.params
    # The key is taken before the facts: a change while they are read leaves an
    # older key with them, so the next run reads again (never the reverse).
    key = facts_key(params["root"], arch=params["arch"], numa=params["numa"])
    live = dict(os_facts(module), **setup_facts(module, params["gather_subset"]))
    extra = {}
    if params["probe"]:
        # Imported here: Python compiles the probe and the converged record's reader on every run (AnsiballZ
        # caches no bytecode), about 6 ms; only preflight asks for a probe.
        from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_host_probe import probe

        try:
            extra["vllm_host_probe"] = probe(params["probe"])
        except (KeyError, TypeError, ValueError, OSError) as exc:
            module.fail_json(msg=f"probe: {type(exc).__name__}: {exc}")
    if params["cache_key"] == key:
        module.exit_json(changed=False, cached=True, ansible_facts=dict(live, vllm_cpu_key=key), **extra)
    try:
        facts = read_cpu_facts(params["root"], arch=params["arch"], numa=params["numa"])
    except TopologyError as exc:
        module.fail_json(msg=f"cannot read CPU facts: {exc}", path=exc.path)
    except (OSError, ValueError, MemoryError, RecursionError) as exc:
        # Not expected (TopologyError covers every file): still a message, not a traceback.
        module.fail_json(msg=f"cannot read CPU facts under {params['root']}: {type(exc).__name__}: {str(exc)[:300]}")
    facts = dict(live, vllm_cpu=facts, vllm_cpu_key=key)
    module.exit_json(changed=False, cached=False, ansible_facts=facts, **extra)


def _facts_package():
    """Make ansible.module_utils.facts importable without running its __init__.

    That __init__ imports every collector of every platform (its old ansible_facts API): some 120 files,
    which Python compiles on every run from AnsiballZ's zip (it caches no bytecode there), a large part
    of this module's cost. Registering the package's module unexecuted lets only the collectors used
    here be imported. A process that already imported the package (setup's, a test's) keeps it.
    """
    name = "ansible.module_utils.facts"
    if name not in sys.modules:
        sys.modules[name] = importlib.util.module_from_spec(importlib.util.find_spec(name))


def os_facts(module):
    """The facts of setup's distribution and python subsets, and its architecture (its rule on Linux)."""
    _facts_package()
    from ansible.module_utils.facts.system.distribution import DistributionFactCollector
    from ansible.module_utils.facts.system.python import PythonFactCollector

    facts = DistributionFactCollector().collect(module=module)
    facts.update(PythonFactCollector().collect(module=module))
    machine = platform.machine()
    facts["architecture"] = "i386" if re.search(r"i([3456]86|86pc)", machine) else machine
    return facts


def setup_facts(module, subsets):
    """What setup returns for gather_subset=!all,!min,<subsets>, unprefixed; {} for none.

    The subset addresses (ours, the four address facts of network) is read over rtnetlink, or taken from
    setup's network collector where rtnetlink cannot be asked; network holds it.
    """
    subsets = list(subsets)
    facts = {}
    if "addresses" in subsets:
        subsets.remove("addresses")
        if "network" not in subsets:
            try:
                facts = address_facts()
            except (OSError, NetlinkError):
                wanted = setup_facts(module, ["network"])
                facts = {name: wanted[name] for name in ADDRESS_FACTS if name in wanted}
    if not subsets:
        return facts
    _facts_package()
    from ansible.module_utils.facts import ansible_collector

    collector = ansible_collector.get_ansible_collector(
        all_collector_classes=collector_classes(subsets),
        gather_subset=["!all", "!min", *subsets],
        gather_timeout=10,
        minimal_gather_subset=frozenset(),
    )
    return dict(facts, **collector.collect(module=module))


def collector_classes(subsets):
    """The collectors setup chooses from for these subsets of gather_subset (and the ones they require).

    On Linux, where the module runs (it reads /proc and /sys), only these: setup picks the same ones from its
    full list (tests/unit/test_facts_collectors.py compares), without importing every platform's or the other
    subset's (the network collectors cost a run that asks for systemd alone a tenth of its imports).
    """
    _facts_package()
    if platform.system() != "Linux":
        from ansible.module_utils.facts import default_collectors

        return default_collectors.collectors
    classes = []
    if "network" in subsets:
        from ansible.module_utils.facts.network.linux import LinuxNetworkCollector
        from ansible.module_utils.facts.system.distribution import DistributionFactCollector
        from ansible.module_utils.facts.system.platform import PlatformFactCollector

        classes += [PlatformFactCollector, DistributionFactCollector, LinuxNetworkCollector]
    if "systemd" in subsets:
        from ansible.module_utils.facts.system.systemd import SystemdFactCollector

        classes.append(SystemdFactCollector)
    return classes


if __name__ == "__main__":
    main()
