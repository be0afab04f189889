"""The preflight action's per-host cost: role files read once per process, each variable rendered once."""

import copy

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.vllm.cpu_fleet.plugins.action import vllm_preflight as action


def test_every_role_file_is_parsed_at_import():
    # Ansible forks a worker per host from the process that imported the plugin: they inherit the parsed files.
    roles = (action.SHARED_ROLE, *action.SECTION_ROLES.values())
    for role in roles:
        for name in ("defaults/main.yml", "vars/main.yml"):
            assert action._role_vars(role, name) is action._role_vars(role, name)
    info = action._role_file.cache_info()
    assert info.currsize == 3 * len(roles)
    action._options("vllm_service")
    assert action._role_file.cache_info().hits > info.hits
    assert action._role_file.cache_info().misses == info.misses


def _typed(task_vars):
    # The default controller cache is a lookup, which needs Ansible's plugin loader: these tests give their own.
    merged = action.ActionModule._variables(dict({"vllm_fleet_controller_cache": "/srv/cache"}, **task_vars), [])
    templar = Templar(loader=DataLoader(), variables={}).copy_with_new_env(available_variables=merged)
    values, problems = action.ActionModule._typed("h1", action.SHARED_ROLE, merged, templar)
    return merged, templar, values, problems


def test_a_rendered_variable_is_not_rendered_again():
    cache = trust_as_template("{{ base }}/cache")
    merged, templar, values, problems = _typed({"vllm_fleet_controller_cache": cache, "base": "/srv"})
    assert problems == []
    assert values["vllm_fleet_controller_cache"] == "/srv/cache"
    # merged (the templar's variables) now holds the value: a template that references it reads it, not renders it.
    merged["base"] = "/elsewhere"
    assert templar.template(trust_as_template("{{ vllm_fleet_controller_cache }}")) == "/srv/cache"


def test_wrong_types_are_still_named():
    _, _, _, problems = _typed({"loadbalancer_port": "eighty"})
    assert len(problems) == 1
    assert problems[0].startswith("h1: ") and "loadbalancer_port" in problems[0]
    assert "roles/vllm_fleet/meta/argument_specs.yml" in problems[0]


@pytest.mark.parametrize("role", [action.SHARED_ROLE, *action.SECTION_ROLES.values()])
def test_validation_leaves_the_cached_argument_spec_alone(role):
    options = action._options(role)
    before = copy.deepcopy(options)
    ArgumentSpecValidator(options).validate({name: "x" for name in options})
    assert options == before
