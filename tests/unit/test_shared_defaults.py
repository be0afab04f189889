"""Values several roles and plays read have one default, in roles/vllm_fleet/defaults/main.yml:
nothing else restates it, as `<name> | default(...)` or as a default of its own."""

import re

import pytest
import yaml
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

SHARED = yaml.safe_load((REPO / "roles/vllm_fleet/defaults/main.yml").read_text())


def _sources():
    for pattern in ("playbooks/**/*.yml", "playbooks/**/*.j2", "roles/**/*.yml", "roles/**/*.j2"):
        for path in sorted(REPO.glob(pattern)):
            relative = str(path.relative_to(REPO))
            if not relative.startswith("roles/vllm_fleet/"):
                yield relative, path.read_text()


def restated_defaults(relative, text):
    """`<shared> | default(...)` anywhere; `<shared>:` as a role default or argument spec of another role."""
    found = []
    for name in SHARED:
        for match in re.finditer(rf"\b{name}\b\s*\)?\s*\|\s*default\(", text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{relative}:{line}: {name} | default(...)")
        if re.match(r"roles/[^/]+/(defaults/main|meta/argument_specs)\.yml$", relative):
            for match in re.finditer(rf"^\s*{name}:", text, re.M):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{relative}:{line}: {name} defined again")
    return found


def test_the_shared_values_are_there():
    expected = {"vllm_install_source", "loadbalancer_port", "loadbalancer_backend_group", "vllm_install_active_link"}
    assert expected <= set(SHARED)


def test_no_shared_value_is_given_a_default_outside_roles_vllm_fleet():
    found = [problem for relative, text in _sources() for problem in restated_defaults(relative, text)]
    assert not found, "; ".join(found) + "; fix: use the variable: roles/vllm_fleet sets its one default"


def test_no_role_default_restates_a_shared_literal():
    literals = {value for value in SHARED.values() if isinstance(value, str) and "/" in value}
    found = []
    for path in sorted(REPO.glob("roles/*/defaults/main.yml")):
        if path.parent.parent.name == "vllm_fleet":
            continue
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            if isinstance(value, str) and value in literals:
                found.append(f"{path.relative_to(REPO)}: {name}: {value}")
    assert not found, f"{found}; fix: default it to the shared variable (roles/vllm_fleet)"


@pytest.mark.parametrize(
    ("relative", "text"),
    [
        ("playbooks/site.yml", "url: ':{{ loadbalancer_port | default(8080) }}'"),
        ("playbooks/upgrade.yml", "when: vllm_install_source|default('index') == 'wheel'"),
        ("roles/x/tasks/main.yml", "{{ hostvars[h].loadbalancer_backend_group | default('vllm_hosts') }}"),
        ("roles/x/defaults/main.yml", "---\nloadbalancer_tls_dir: /etc/haproxy/tls\n"),
    ],
)
def test_the_check_sees_a_restated_default(relative, text):
    assert restated_defaults(relative, text)


def test_the_check_leaves_other_variables_alone():
    text = "{{ loadbalancer_port_extra | default(1) }} {{ loadbalancer_port }}"
    assert restated_defaults("roles/x/tasks/main.yml", text) == []
