"""inventories/example/ is realistic: every knob it sets is a role option, and
each hardware class's tuning plans cleanly on a recorded machine of that class."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, load_expected_facts

ANSIBLE_INVENTORY = str(Path(sys.executable).parent / "ansible-inventory")
CLASS_MACHINES = {"xeon_spr": "spr-2s-amx", "epyc_genoa": "genoa-2s-nps4", "graviton": "graviton3-c7g"}


@pytest.fixture(scope="module")
def inventory():
    listing = subprocess.run(
        [ANSIBLE_INVENTORY, "-i", "inventories/example", "--list"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(listing.stdout)


def role_options():
    options = {}
    for spec in REPO.glob("roles/*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            options.update(entry.get("options", {}))
    return options


def plan_host(inventory, host, machine):
    """The planner's result for ``host``'s inventory knobs on recorded ``machine``."""
    from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import plan

    host_vars = inventory["_meta"]["hostvars"][host]
    prefix = "vllm_plan_"
    options = {name.removeprefix(prefix): value for name, value in host_vars.items() if name.startswith(prefix)}
    planned = plan(load_expected_facts(machine), {"vllm_version": host_vars["vllm_version"], "host": host, **options})
    return options, planned


def test_every_role_knob_in_the_example_exists(inventory):
    known = role_options()
    prefixes = tuple(f"{role.name}_" for role in REPO.glob("roles/*"))
    for host, host_vars in inventory["_meta"]["hostvars"].items():
        for name in host_vars:
            if name.startswith(prefixes):
                assert name in known, f"{host}: {name} is not an option of any role (typo?)"


@pytest.mark.parametrize(("group", "machine"), CLASS_MACHINES.items())
def test_each_class_plans_on_a_machine_of_that_class(inventory, group, machine):
    options, result = plan_host(inventory, inventory[group]["hosts"][0], machine)
    assert result["instances"]
    if "kvcache_gib" in options:
        assert all(i["kvcache_gib"] == options["kvcache_gib"] for i in result["instances"])


def test_host_exception_binds_off_the_monitoring_cores(inventory):
    _unused, result = plan_host(inventory, "spr-07.infer.example.net", "spr-2s-amx")
    assert [i["omp_threads_bind"] for i in result["instances"]] == ["4-55", "57-111"]
