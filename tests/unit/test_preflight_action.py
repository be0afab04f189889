"""The preflight action's per-host cost: role files read once per process, each variable rendered once."""

import copy

import pytest
from ansible.errors import AnsibleTemplateError, AnsibleUndefinedVariable
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
    # Each role's defaults, vars and argument spec, and each distribution file of the toolchain role.
    assert len(action._distribution_compilers()) == len(list((action.ROLES / "toolchain" / "vars").glob("*-*.yml")))
    assert info.currsize == 3 * len(roles) + len(action._distribution_compilers())
    action._options("vllm_service")
    assert action._role_file.cache_info().hits > info.hits
    assert action._role_file.cache_info().misses == info.misses


def _typed(task_vars):
    # The default controller cache is a lookup, which needs Ansible's plugin loader: these tests give their own.
    merged = action.ActionModule._variables(dict({"vllm_fleet_controller_cache": "/srv/cache"}, **task_vars), [])
    templar = Templar(loader=DataLoader(), variables={}).copy_with_new_env(available_variables=merged)
    values, problems, unreadable = action.ActionModule._typed("h1", action.SHARED_ROLE, merged, templar)
    return merged, templar, values, problems + unreadable


def test_a_rendered_variable_is_not_rendered_again():
    cache = trust_as_template("{{ base }}/cache")
    merged, templar, values, problems = _typed({"vllm_fleet_controller_cache": cache, "base": "/srv"})
    assert problems == []
    assert values["vllm_fleet_controller_cache"] == "/srv/cache"
    # merged (the templar's variables) now holds the value: a template that references it reads it, not renders it.
    merged["base"] = "/elsewhere"
    assert templar.template(trust_as_template("{{ vllm_fleet_controller_cache }}")) == "/srv/cache"


def test_wrong_types_are_still_named():
    _unused, _unused, _unused, problems = _typed({"loadbalancer_port": "eighty"})
    assert len(problems) == 1
    assert problems[0].startswith("h1: ") and "loadbalancer_port" in problems[0]
    assert "roles/vllm_fleet/meta/argument_specs.yml" in problems[0]


def test_a_type_is_named_as_the_user_wrote_it_not_as_ansible_tags_it():
    _unused, _unused, _unused, problems = _typed({"loadbalancer_port": trust_as_template("{{ 'eighty' }}")})
    assert "_Ansible" not in problems[0] and "<class" not in problems[0], problems[0]


def test_a_relative_or_empty_path_is_refused():
    _unused, _unused, _unused, problems = _typed({"vllm_fleet_converged_record": "state/converged.json"})
    assert problems == [
        "h1: vllm_fleet_converged_record: is 'state/converged.json'; fix: give an absolute path."
    ]


@pytest.mark.parametrize("role", [action.SHARED_ROLE, *action.SECTION_ROLES.values()])
def test_validation_leaves_the_cached_argument_spec_alone(role):
    options = action._options(role)
    before = copy.deepcopy(options)
    ArgumentSpecValidator(options).validate({name: "x" for name in options})
    assert options == before


def _renders(variables):
    templar = Templar(loader=DataLoader(), variables={}).copy_with_new_env(available_variables=variables)
    return templar, lambda value: action._render(templar, variables, value)


@pytest.mark.parametrize(
    "value",
    [
        "{{ tp }}",
        "{{tp}}",
        "{{ chain }}",
        "{{ options }}",
        "{{ tp | int + 1 }}",
        "{{ missing | default('none') }}",
        "{{ base }}/cache",
        "{{ base }}/models/{{ chain }}-{{tp}}",
        "{{ base }}/cache\n",
        "{{ n }}/cache",
        "{{ nothing }}/cache",
        "{% if true %}{{ base }}{% endif %}/cache",
        "{{ base }}/{# note #}cache",
        "{{ tp | default(none) }}",
        "{{ n|default(false) }}",
        "{{ nothing | default(true) }}",
        "{{ undefined_inside | default(none) }}",
        "{{ options | default({}) }}",
        "{{ missing | default(none) }}",
        "{{ missing | default(false) }}",
        "{{ missing | default(true) }}",
        "{{ missing | default({}) }}",
        "{{ missing | default([]) }}",
        "{{ missing | default('') }}",
        {"tp": "{{ tp }}", "nested": ["{{ chain }}", 3, None]},
        ["{{ options }}", "plain"],
        "plain",
        7,
        None,
    ],
)
def test_render_gives_what_ansible_renders(value):
    trusted = action._trusted(value)
    variables = action._trusted(
        {
            "tp": "4",
            "n": 4,
            "nothing": None,
            "undefined_inside": "{{ nope }}",
            "base": "/srv",
            "chain": "{{ tp }}",
            "options": {"mode": "{{ chain }}", "n": 2},
        }
    )
    templar, render = _renders(variables)
    assert render(trusted) == templar.template(trusted)
    assert type(render(trusted)) is type(templar.template(trusted))


def test_render_leaves_an_untrusted_reference_alone_as_ansible_does():
    templar, render = _renders({"tp": "4"})
    assert render("{{ tp }}") == templar.template("{{ tp }}") == "{{ tp }}"


def test_render_compiles_no_template_for_a_reference(monkeypatch):
    templar, render = _renders(action._trusted({"tp": "{{ chain }}", "chain": "4"}))
    monkeypatch.setattr(
        templar, "template", lambda value: pytest.fail(f"compiled {value!r}") if "{{" in value else value
    )
    assert render(trust_as_template("{{ tp }}")) == "4"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{{ base }}/cache/{{ tp }}", "/srv/cache/4"),
        ("{{ tp | default(none) }}", "4"),
        ("{{ missing | default(none) }}", None),
        ("{{ missing | default({}) }}", {}),
    ],
)
def test_render_compiles_no_template_for_a_default_or_references_in_text(monkeypatch, value, expected):
    templar, render = _renders(action._trusted({"tp": "{{ chain }}", "chain": "4", "base": "/srv"}))
    monkeypatch.setattr(
        templar, "template", lambda value: pytest.fail(f"compiled {value!r}") if "{{" in value else value
    )
    assert render(trust_as_template(value)) == expected


def test_render_leaves_an_undefined_reference_in_text_to_ansible_which_names_it():
    _unused, render = _renders(action._trusted({"base": "/srv"}))
    with pytest.raises(AnsibleUndefinedVariable, match="'missing' is undefined"):
        render(trust_as_template("{{ base }}/{{ missing }}"))


def test_render_hands_a_reference_loop_to_ansible_which_names_it():
    variables = action._trusted({"a": "{{ b }}", "b": "{{ a }}"})
    _unused, render = _renders(variables)
    with pytest.raises(AnsibleTemplateError, match=r"^Recursive loop detected in template"):
        render(trust_as_template("{{ a }}"))


def _sections(host, groups, **task_vars):
    merged = action.ActionModule._variables(dict(task_vars, groups=groups), [])
    templar = Templar(loader=DataLoader(), variables={}).copy_with_new_env(available_variables=merged)
    return action.ActionModule._sections(None, host, dict(task_vars, groups=groups), merged, templar)


FLEET = {"vllm_hosts": ["v1"], "loadbalancers": ["lb1"], "builders": []}


def test_a_fleet_without_monitoring_hosts_has_no_monitoring_section():
    for groups in (FLEET, dict(FLEET, monitoring=[])):
        assert "monitoring" not in _sections("v1", groups)
        assert _sections("lb1", groups) == ["loadbalancer"]


def test_the_monitoring_hosts_and_every_host_the_exporters_run_on_get_the_monitoring_section():
    groups = dict(FLEET, monitoring=["mon1"])
    assert _sections("mon1", groups) == ["monitoring"]
    assert _sections("lb1", groups) == ["loadbalancer", "monitoring"]
    assert "monitoring" in _sections("v1", groups)
    # The group the inventory names in monitoring_group.
    groups = dict(FLEET, watchers=["mon1"])
    assert _sections("mon1", groups, monitoring_group="watchers") == ["monitoring"]
    assert "monitoring" in _sections("v1", groups, monitoring_group="watchers")
    assert "monitoring" not in _sections("v1", groups)


def test_the_monitoring_hosts_are_peers_of_every_vllm_host_and_load_balancer():
    """The instance firewall and HAProxy's exporter admit the monitoring hosts: a converged vLLM host or load
    balancer is converged again when a monitoring host joins or leaves. A monitoring host's peers are the hosts it
    watches (its scrape targets), itself left out."""
    groups = {"vllm_hosts": ["v1"], "loadbalancers": ["lb1"], "builders": [], "monitoring": ["m1"]}
    v = {
        "vllm_service_loadbalancer_group": "loadbalancers",
        "vllm_install_source": "index",
        "loadbalancer_backend_group": "vllm_hosts",
        "monitoring_group": "monitoring",
    }
    peers = action.ActionModule._peers
    assert peers("v1", ["plan", "service"], v, groups) == ["lb1", "m1"]
    assert peers("lb1", ["loadbalancer"], v, groups) == ["m1", "v1"]
    assert peers("m1", ["monitoring"], v, groups) == ["lb1", "v1"]
    assert peers("m1", ["monitoring"], v, dict(groups, monitoring=["m1", "m2"])) == ["lb1", "m2", "v1"]
    assert peers("v1", ["plan", "service"], v, dict(groups, monitoring=[])) == ["lb1"]


def test_a_host_path_is_checked_for_the_files_it_reaches():
    _unused, _unused, _unused, problems = _typed({"vllm_fleet_converged_record": "/var/lib/vllm fleet/converged.json"})
    assert problems == [
        "h1: vllm_fleet_converged_record: is '/var/lib/vllm fleet/converged.json', has 'vllm fleet', with characters"
        " the unit files, scripts and haproxy.cfg the roles write it into read otherwise (blanks, quotes, backslashes,"
        " $ % # and control characters among them); fix: letters, digits and . _ + @ - in each component."
    ]
