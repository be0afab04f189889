"""The filters that replaced the roles' Jinja loops ({% set _ = out.append(...) %}, issue 45 item 4): each gives
what the loop it replaced gave, for any input (the loops kept here verbatim, rendered by Jinja2 with Ansible's
boolean), and its edge cases by example."""

import jinja2
import pytest
from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.vllm.cpu_fleet.plugins.filter.vllm_loadbalancer import FilterModule as LbFilters
from ansible_collections.vllm.cpu_fleet.plugins.filter.vllm_monitoring import vllm_monitoring_reach_targets
from ansible_collections.vllm.cpu_fleet.plugins.filter.vllm_rollout import FilterModule as RolloutFilters
from ansible_collections.vllm.cpu_fleet.plugins.filter.vllm_service import vllm_service_unit_files
from hypothesis import given
from hypothesis import strategies as st

LB = LbFilters().filters()
ROLLOUT = RolloutFilters().filters()

ENV = jinja2.Environment()
ENV.filters["bool"] = lambda value: boolean(value, strict=False)
ENV.filters["vllm.cpu_fleet.vllm_lb_retired_servers"] = LB["vllm_lb_retired_servers"]

# The loops as the task files had them (b93028e).
OLD_NOT_READY_ON = """
{%- set out = [] -%}
{%- for lb, servers in (loadbalancer_backend_views | default({})).items() -%}
{%- if servers.values() | reject('eq', 'ready') | list -%}{%- set _ = out.append(lb) -%}{%- endif -%}
{%- endfor -%}
{{ out }}"""
OLD_HOSTS_WHERE = """
{%- set out = [] -%}
{%- for host in ansible_play_batch -%}
{%- if hostvars[host]['rollout_drained_change'] | default(false) | bool -%}{%- set _ = out.append(host) -%}{%- endif -%}
{%- endfor -%}
{{ out }}"""
OLD_RETIRED_ON = """
{%- set out = [] -%}
{%- for lb, servers in (loadbalancer_backend_views | default({})).items() -%}
{%- if servers | list | vllm.cpu_fleet.vllm_lb_retired_servers(inventory_hostname, rollout_planned_servers) -%}
{%- set _ = out.append(lb) -%}
{%- endif -%}
{%- endfor -%}
{{ out }}"""
OLD_BUSY = """
{%- set out = [] -%}
{%- for server, count in counts.items() if count > 0 -%}
{%- set _ = out.append(server ~ ' (' ~ count ~ ' in flight)') -%}
{%- endfor -%}
{{ out }}"""
OLD_REACH = """
{%- set out = [] -%}
{%- for h in monitoring_vllm_hosts if hostvars[h].vllm_fleet_converged is defined -%}
{%- for i in hostvars[h].vllm_plan.instances -%}
{%- set _ = out.append({'name': h, 'address': hostvars[h][monitoring_target_address_var] | default(h) | string,
                        'port': i.port | int}) -%}
{%- endfor -%}
{%- endfor -%}
{%- for h in monitoring_exporter_hosts if hostvars[h].vllm_fleet_converged is defined -%}
{%- set _ = out.append({'name': h, 'address': hostvars[h][monitoring_target_address_var] | default(h) | string,
                        'port': monitoring_node_exporter_port | int}) -%}
{%- if h in monitoring_loadbalancers -%}
{%- set _ = out.append({'name': h, 'address': hostvars[h][monitoring_target_address_var] | default(h) | string,
                        'port': monitoring_haproxy_exporter_port | int}) -%}
{%- endif -%}
{%- endfor -%}
{{ out }}"""
OLD_UNIT_FILES = """
{%- set out = [] -%}
{%- for name, unit in vllm_service_container_units | dictsort -%}
{%- for path, text in unit.files | dictsort -%}
{%- if path not in out | map(attribute='path') -%}
{%- set _ = out.append({'path': path, 'text': text, 'instance': '' if path.endswith('/vllm@.service') else name}) -%}
{%- endif -%}
{%- endfor -%}
{%- endfor -%}
{{ out }}"""


def old(template, **context):
    """What the loop rendered: Jinja's text of the list, read back as Python (Ansible's native types do the same)."""
    import ast

    return ast.literal_eval(ENV.from_string(template).render(**context))


HOSTS = st.sampled_from(["h1", "h2", "web-1", "web-2", "a"])
STATES = st.sampled_from(["ready", "drain", "maint"])
SERVER = st.builds(lambda h, i: f"{h}-vllm-{i}", HOSTS, st.integers(0, 2))
VIEWS = st.dictionaries(st.sampled_from(["lb1", "lb2", "lb3"]), st.dictionaries(SERVER, STATES, max_size=5), max_size=3)


@given(VIEWS)
def test_not_ready_on_is_the_loop(views):
    assert LB["vllm_lb_not_ready_on"](views) == old(OLD_NOT_READY_ON, loadbalancer_backend_views=views)


@given(VIEWS, HOSTS, st.lists(SERVER, max_size=4))
def test_retired_on_is_the_loop(views, host, planned):
    context = {"loadbalancer_backend_views": views, "inventory_hostname": host, "rollout_planned_servers": planned}
    assert LB["vllm_lb_retired_on"](views, host, planned) == old(OLD_RETIRED_ON, **context)


@given(st.dictionaries(SERVER, st.integers(-1, 5), max_size=6))
def test_busy_is_the_loop(counts):
    assert LB["vllm_lb_busy"](counts) == old(OLD_BUSY, counts=counts)


FLAG = st.one_of(st.booleans(), st.sampled_from(["yes", "no", "True", "false", "1", "0", 1, 0]))


@given(st.lists(HOSTS, unique=True, max_size=5), st.dictionaries(HOSTS, FLAG))
def test_hosts_where_is_the_loop(batch, flags):
    hostvars = {host: ({"rollout_drained_change": flags[host]} if host in flags else {}) for host in batch}
    new = ROLLOUT["vllm_rollout_hosts_where"](batch, hostvars, "rollout_drained_change")
    assert new == old(OLD_HOSTS_WHERE, ansible_play_batch=batch, hostvars=hostvars)


@given(
    st.lists(HOSTS, unique=True, max_size=4),
    st.lists(HOSTS, unique=True, max_size=4),
    st.lists(HOSTS, unique=True, max_size=3),
    st.sets(HOSTS),
    st.sets(HOSTS),
    st.lists(st.integers(8000, 8003), max_size=3),
)
def test_reach_targets_are_the_loop(vllm_hosts, exporters, lbs, decided, with_address, ports):
    hostvars = {}
    for host in set(vllm_hosts + exporters + lbs):
        hostvars[host] = {"vllm_plan": {"instances": [{"port": port} for port in ports]}}
        if host in decided:
            hostvars[host]["vllm_fleet_converged"] = False
        if host in with_address:
            hostvars[host]["ansible_host"] = f"10.0.0.{len(host)}"
    context = {
        "monitoring_vllm_hosts": vllm_hosts,
        "monitoring_exporter_hosts": exporters,
        "monitoring_loadbalancers": lbs,
        "hostvars": hostvars,
        "monitoring_target_address_var": "ansible_host",
        "monitoring_node_exporter_port": "9100",
        "monitoring_haproxy_exporter_port": 8405,
    }
    new = vllm_monitoring_reach_targets(vllm_hosts, hostvars, exporters, lbs, "ansible_host", "9100", 8405)
    assert new == old(OLD_REACH, **context)


UNIT_PATHS = st.sampled_from(
    [
        "/etc/systemd/system/vllm@.service",
        "/etc/containers/systemd/vllm@{name}.container",
        "/etc/systemd/system/vllm@{name}.service.d/instance.conf",
    ]
)


@given(st.dictionaries(st.sampled_from(["vllm-0", "vllm-1", "vllm-2"]), st.lists(UNIT_PATHS, max_size=3), max_size=3))
def test_unit_files_are_the_loop(layout):
    units = {
        name: {"files": {path.format(name=name): f"text of {path.format(name=name)} for {name}\n" for path in paths}}
        for name, paths in layout.items()
    }
    assert vllm_service_unit_files(units) == old(OLD_UNIT_FILES, vllm_service_container_units=units)


def test_the_shared_template_is_written_once_for_no_instance():
    template = "/etc/systemd/system/vllm@.service"
    units = {
        "vllm-1": {"files": {template: "T\n", "/etc/systemd/system/vllm@vllm-1.service.d/instance.conf": "1\n"}},
        "vllm-0": {"files": {template: "T\n", "/etc/systemd/system/vllm@vllm-0.service.d/instance.conf": "0\n"}},
    }
    files = vllm_service_unit_files(units)
    assert [f["path"] for f in files] == [
        template,
        "/etc/systemd/system/vllm@vllm-0.service.d/instance.conf",
        "/etc/systemd/system/vllm@vllm-1.service.d/instance.conf",
    ]
    assert [f["instance"] for f in files] == ["", "vllm-0", "vllm-1"]


def test_unit_files_refuse_what_is_not_a_mapping():
    with pytest.raises(AnsibleFilterError, match="vllm_service_unit_files: expects"):
        vllm_service_unit_files(["vllm-0"])


def test_examples():
    views = {"lb1": {"h1-vllm-0": "ready", "h1-vllm-1": "drain"}, "lb2": {"h1-vllm-0": "ready"}}
    assert LB["vllm_lb_not_ready_on"](views) == ["lb1"]
    assert LB["vllm_lb_retired_on"](views, "h1", ["h1-vllm-0"]) == ["lb1"]
    assert LB["vllm_lb_retired_on"](None, "h1", []) == []
    assert LB["vllm_lb_busy"]({"h1-vllm-0": 0, "h1-vllm-1": 2}) == ["h1-vllm-1 (2 in flight)"]
    hostvars = {"h1": {"rollout_drained_change": "yes"}, "h2": {"rollout_drained_change": False}, "h3": {}}
    assert ROLLOUT["vllm_rollout_hosts_where"](["h1", "h2", "h3"], hostvars, "rollout_drained_change") == ["h1"]
