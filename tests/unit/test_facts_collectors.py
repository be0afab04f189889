"""vllm_cpu_facts imports only the fact collectors it runs, and they are the ones setup would run."""

import itertools
import platform
import subprocess
import sys

import pytest
from ansible.module_utils.facts import collector, default_collectors
from ansible_collections.vllm.cpu_fleet.plugins.modules import vllm_cpu_facts
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

SUBSETS = ["network", "systemd"]


@pytest.mark.skipif(platform.system() != "Linux", reason="the short list is Linux's")
@pytest.mark.parametrize("subsets", [list(c) for n in range(3) for c in itertools.permutations(SUBSETS, n)])
def test_setup_would_pick_the_same_collectors_from_its_full_list(subsets):
    def picked(classes):
        return collector.collector_classes_from_gather_subset(
            all_collector_classes=classes,
            minimal_gather_subset=frozenset(),
            gather_subset=["!all", "!min", *subsets],
            gather_timeout=10,
        )

    assert picked(vllm_cpu_facts.collector_classes(subsets)) == picked(default_collectors.collectors)


@pytest.mark.parametrize(
    ("subsets", "wanted", "unwanted"),
    [
        (["network", "systemd"], ["network.linux", "system.systemd"], []),
        (["systemd"], ["system.systemd"], ["network.linux", "network.base", "system.platform"]),
    ],
)
def test_the_module_imports_only_the_collectors_of_its_subsets(subsets, wanted, unwanted):
    # A fresh interpreter, as a module run is: the package's __init__ (and with it default_collectors and
    # every platform's collectors) must stay unimported, and so must a subset's not asked for.
    code = f"""
import sys
from ansible_collections.vllm.cpu_fleet.plugins.modules import vllm_cpu_facts as m
m.collector_classes({subsets!r})
loaded = sorted(name for name in sys.modules if name.startswith("ansible.module_utils.facts"))
print("\\n".join(loaded))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO / "collections", capture_output=True, text=True, check=True
    )
    loaded = done.stdout.split()
    for name in wanted:
        assert f"ansible.module_utils.facts.{name}" in loaded
    for name in ("compat", "default_collectors", "hardware.linux", "network.darwin", "virtual.linux", *unwanted):
        assert f"ansible.module_utils.facts.{name}" not in loaded


def test_the_module_imports_the_probe_only_for_a_run_that_asks_for_one():
    # Python compiles every import of a module run again (AnsiballZ caches no bytecode): the probe and the
    # converged record's reader are imported by main() when a probe is asked for, not with the module.
    code = """
import sys
from ansible_collections.vllm.cpu_fleet.plugins.modules import vllm_cpu_facts
print("\\n".join(sorted(name for name in sys.modules if name.startswith("ansible_collections.vllm"))))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO / "collections", capture_output=True, text=True, check=True
    )
    loaded = done.stdout.split()
    assert "ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_topology" in loaded
    for name in ("vllm_host_probe", "vllm_converged"):
        assert f"ansible_collections.vllm.cpu_fleet.plugins.module_utils.{name}" not in loaded
