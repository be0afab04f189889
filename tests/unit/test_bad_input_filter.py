"""The vllm_cpu_plan filters pass any options, even of the wrong kind, to the planner,
which answers in the project's words (no TypeError or AttributeError from the filter)."""

import importlib.util

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO
from ansible_collections.vllm.cpu_fleet.tests.unit.topologies import make_facts


@pytest.fixture(scope="module")
def filters():
    spec = importlib.util.spec_from_file_location("vllm_cpu_filter", REPO / "plugins/filter/vllm_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("options", [["tp", 2], "tp=2", 5])
def test_options_of_the_wrong_kind(filters, options):
    problems = filters.vllm_cpu_plan_check(make_facts([4]), options)
    assert problems and problems[0].startswith("host: options: is ") and "; fix: " in problems[0]
    with pytest.raises(AnsibleFilterError, match="host: options: is "):
        filters.vllm_cpu_plan(make_facts([4]), options)


def test_strings_from_the_command_line_plan_through_the_filter(filters):
    options = {"vllm_version": "0.32.0", "host": "h", "tp": "2", "max_jobs": "4", "release_overrides": {}}
    result = filters.vllm_cpu_plan(make_facts([4, 4]), options)
    assert result["instances"][0]["tp"] == 2 and result["build"]["max_jobs"] == 4


def test_bad_compiler_verdict_input_is_a_filter_error_in_the_projects_words(filters):
    message = r"^accept_workaround: 'maybe' is not a boolean; fix: pass true or false$"
    with pytest.raises(AnsibleFilterError, match=message):
        filters.vllm_compiler_verdict("12.2.0", "0.32.0", {}, "x86_64", False, "h", {}, "maybe")
    with pytest.raises(AnsibleFilterError, match=r"vLLM version '0\.9\.0' is not supported"):
        filters.vllm_compiler_verdict("12.2.0", "0.9.0", {}, "x86_64")


def test_inventory_booleans_are_booleans_to_the_verdict(filters):
    # vllm_build_gcc122_workaround: "yes" passes the role's argument spec, so the verdict takes it too.
    verdict = filters.vllm_compiler_verdict("12.2.0", "0.32.0", {}, "x86_64", "no", "h", {}, "yes")
    assert verdict["ok"] and verdict["severity"] == "patched"
    assert not filters.vllm_compiler_verdict("12.2.0", "0.32.0", {}, "x86_64", "no", "h", {}, "false")["ok"]
