"""Build vllm_cpu fact dicts for synthetic machines (planner tests)."""


def make_facts(
    nodes_cores,
    smt=2,
    adjacent_siblings=False,
    node_memory_mib=65536,
    memory_only_nodes=0,
    memory_denied=(),
    offline=(),
    disallowed=(),
    isa_class="x86_64-avx512",
    arch="x86_64",
    memory_mib=None,
):
    """Facts for nodes with ``nodes_cores[i]`` physical cores each, SMT ``smt``.

    Siblings are numbered adjacently (0,1 | 2,3) or offset by the core count
    (0,N | 1,N+1), the two numberings real machines use. Nodes in ``memory_denied`` are
    outside the process's allowed memory nodes (memory_allowed false).
    """
    total_cores = sum(nodes_cores)
    numa_nodes, core_index = [], 0
    all_cpus = []
    for node_id, cores in enumerate(nodes_cores):
        node_cores = []
        for _n in range(cores):
            if adjacent_siblings:
                siblings = [core_index * smt + t for t in range(smt)]
            else:
                siblings = [core_index + t * total_cores for t in range(smt)]
            node_cores.append(siblings)
            core_index += 1
        all_cpus += [c for core in node_cores for c in core]
        numa_nodes.append({"id": node_id, "cores": node_cores, "memory_mib": node_memory_mib})
    for extra in range(memory_only_nodes):
        numa_nodes.append({"id": len(nodes_cores) + extra, "cores": [], "memory_mib": node_memory_mib})
    online = sorted(set(all_cpus) - set(offline))
    allowed = sorted(set(online) - set(disallowed))
    usable = set(allowed)
    for node in numa_nodes:
        node["cores"] = sorted(s for s in ([c for c in core if c in usable] for core in node["cores"]) if s)
        node["cpus"] = sorted(c for core in node["cores"] for c in core)
        node["distance"] = [10 if n == node["id"] else 20 for n in range(len(numa_nodes))]
        node["memory_allowed"] = node["id"] not in memory_denied
    isa = dict.fromkeys(("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8",
                         "asimd", "sve", "bf16", "i8mm", "vxe"), False)  # fmt: skip
    isa.update(avx2=True, avx512f=True)
    return {
        "arch": arch,
        "vendor": "GenuineIntel",
        "model": "synthetic",
        "isa": isa,
        "isa_class": isa_class,
        "sockets": 1,
        "threads_per_core": smt,
        "memory_mib": memory_mib or node_memory_mib * (len(nodes_cores) + memory_only_nodes),
        "online_cpus": online,
        "offline_cpus": sorted(set(offline)),
        "allowed_cpus": allowed,
        "cgroup": {"version": 2, "cpus": None, "memory_max_mib": None},
        "numa_nodes": numa_nodes,
    }
