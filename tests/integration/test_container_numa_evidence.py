"""The container mode's NUMA syscall table (plugin_utils/vllm_container.py NUMA_SYSCALLS) against vLLM's own source.

The seccomp profile adds to podman's default exactly the syscalls the table says each release's NUMA binding makes;
each row names the lines of csrc/cpu/utils.cpp that call libnuma and the worker line that reaches them. The sdists
come from the package index into the release probe's cache, checked against the release table's sha256, as
test_release_table.py fetches them (a fresh machine downloads them once).
"""

import re
import tarfile

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_container as container
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_cpu_release_probe as probe_lib
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES
from conftest import REPO

CACHE = probe_lib.cache_dir() if probe_lib.cache_dir().is_absolute() else REPO / probe_lib.cache_dir()


def _sdist_file(version, member):
    sdist = probe_lib.fetch_sdist(version, sha256=RELEASES[version]["sdist_sha256"], cache=CACHE)
    with tarfile.open(sdist) as tar:
        return tar.extractfile(f"vllm-{version}/{member}").read().decode().split("\n")


@pytest.mark.parametrize("era", sorted(container.NUMA_SYSCALLS))
def test_the_evidence_lines_make_the_calls_they_name(era):
    row = container.NUMA_SYSCALLS[era]
    lines = _sdist_file(era, "csrc/cpu/utils.cpp")
    for call, where in row["calls"].items():
        number = int(where.rsplit(":", 1)[1])
        assert f"{call}(" in lines[number - 1], (era, call, lines[number - 1])
    # Nothing else of the file asks for a memory policy: every libnuma call is one of the table's or makes none.
    calls = set(re.findall(r"\b(numa_[a-z_]+)\(", "\n".join(lines)))
    silent = {"numa_parse_nodestring", "numa_parse_cpustring_all", "numa_node_of_cpu", "numa_set_strict"}
    assert calls - {"numa_free_nodemask", *silent} == set(row["calls"])
    assert not re.search(r"\b(mbind|move_pages|numa_move_pages|numa_alloc\w*|numa_tonode\w*)\(", "\n".join(lines))
    worker, number = row["entry"].split(" ", 1)[0].rsplit(":", 1)
    assert "init_cpu_" in _sdist_file(era, worker)[int(number) - 1]
