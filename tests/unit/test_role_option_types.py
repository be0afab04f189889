"""Values given with -e arrive as strings ("false", "300"), and extra vars beat the typed copy preflight
checks: every Jinja expression in the roles and plays reads a bool option (by the roles' argument specs)
through `| bool`, and computes or compares with a number option only after `| int` or `| float`."""

import jinja2
import pytest
import yaml
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

# Values under these keys are whole expressions, written without braces.
CONDITION_KEYS = {"when", "that", "changed_when", "failed_when", "until"}
# "300" / 2 fails and "300" > 2 is refused, but "0" == 0 is silently false: equality counts too.
NUMBER_OPERATORS = {"+", "-", "*", "/", "//", "**", "<", "<=", ">", ">=", "==", "!="}
PIPE = ("operator", "|")


def _option_types():
    types = {}
    for path in sorted(REPO.glob("roles/*/meta/argument_specs.yml")):
        for entry_point in yaml.safe_load(path.read_text())["argument_specs"].values():
            for name, spec in (entry_point.get("options") or {}).items():
                types[name] = spec.get("type", "str")
    return types


TYPES = _option_types()
BOOLS = {name for name, kind in TYPES.items() if kind == "bool"}
NUMBERS = {name for name, kind in TYPES.items() if kind in ("int", "float")}


def segments(template):
    """Each {{ }} and {% %} segment of a template: its text, and its tokens without whitespace."""
    text, tokens = None, []
    for _unused, kind, value in jinja2.Environment().lex(template):
        if kind in ("variable_begin", "block_begin"):
            text, tokens = "", []
        if text is None:
            continue
        text += value
        if kind != "whitespace":
            tokens.append((kind, value))
        if kind in ("variable_end", "block_end"):
            yield " ".join(text.split()), tokens
            text = None


def expressions(node):
    """The segments of a parsed YAML file: conditions whole, other strings' {{ }} and {% %} parts."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in CONDITION_KEYS:
                for condition in value if isinstance(value, list) else [value]:
                    if isinstance(condition, str):
                        for _unused, tokens in segments("{{ " + condition + " }}"):
                            yield " ".join(condition.split()), tokens
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)
    elif isinstance(node, str):
        yield from segments(node)


def _past_defaults(tokens, index):
    """The index after any `| default(...)` filters starting at index."""
    while tokens[index] == PIPE and tokens[index + 1] == ("name", "default"):
        index += 2
        if tokens[index] == ("operator", "("):
            depth, index = 1, index + 1
            while depth:
                depth += {("operator", "("): 1, ("operator", ")"): -1}.get(tokens[index], 0)
                index += 1
    return index


def unconverted_reads(tokens):
    """The options a segment reads without the conversion their type needs."""
    found = []
    for index, (kind, name) in enumerate(tokens):
        # tokens[0] is the segment's opening brace; a name after "." is an attribute, not the option.
        if kind != "name" or tokens[index - 1] == ("operator", "."):
            continue
        after = _past_defaults(tokens, index + 1)
        conversion = tokens[after + 1][1] if tokens[after] == PIPE else None
        beside = {token[1] for token in (tokens[index - 1], tokens[after]) if token[0] == "operator"}
        if (name in BOOLS and conversion != "bool") or (
            name in NUMBERS and conversion not in ("int", "float") and beside & NUMBER_OPERATORS
        ):
            found.append(name)
    return found


def problems(relative, text):
    """`file: expression [options]` for each expression reading an option without the conversion it needs."""
    parts = segments(text) if relative.endswith(".j2") else expressions(yaml.safe_load(text))
    return [
        f"{relative}: {expression} [{', '.join(names)}]"
        for expression, tokens in parts
        if (names := unconverted_reads(tokens))
    ]


def _sources():
    for pattern in ("roles/*/tasks/**/*", "roles/*/handlers/**/*", "roles/*/vars/**/*", "roles/*/templates/**/*"):
        yield from sorted(path for path in REPO.glob(pattern) if path.is_file())
    yield from sorted(REPO.glob("playbooks/*.yml"))


def test_the_specs_type_the_options_the_check_knows():
    assert {"toolchain_install_compiler", "loadbalancer_plain_http", "vllm_build_force"} <= BOOLS
    assert {"loadbalancer_drain_timeout", "vllm_plan_model_size_gib"} <= NUMBERS


def test_every_typed_option_is_converted_where_its_type_matters():
    found = [problem for path in _sources() for problem in problems(str(path.relative_to(REPO)), path.read_text())]
    assert not found, (
        "\n".join(found) + "\nfix: `<bool option> | bool`, `<number option> | int` (or `| float`) before arithmetic"
        " or a comparison: -e gives strings"
    )


@pytest.mark.parametrize(
    ("relative", "text"),
    [
        ("roles/x/tasks/main.yml", "- when: toolchain_install_compiler and not ansible_check_mode\n"),
        ("roles/x/tasks/main.yml", "- assert:\n    that: [a, not loadbalancer_systemd_hardening]\n"),
        ("roles/x/tasks/main.yml", "- set_fact:\n    x: \"{{ toolchain_install_compiler | ternary(1, 2) }}\"\n"),
        ("roles/x/tasks/main.yml", "- set_fact:\n    x: \"{{ vllm_build_force | default(false) }}\"\n"),
        ("roles/x/tasks/main.yml", "- retries: \"{{ (loadbalancer_drain_timeout / 2) | int }}\"\n"),
        ("roles/x/tasks/main.yml", "- when: 0 < loadbalancer_ready_timeout\n"),
        ("roles/x/templates/a.sh.j2", "X={{ '1' if vllm_build_rust_frontend else '0' }}\n"),
        ("roles/x/templates/a.j2", "{% if loadbalancer_plain_http %}http{% endif %}\n"),
    ],
)
def test_the_check_sees_an_unconverted_read(relative, text):
    assert problems(relative, text)


@pytest.mark.parametrize(
    ("relative", "text"),
    [
        ("roles/x/tasks/main.yml", "- when: toolchain_install_compiler | bool and not ansible_check_mode\n"),
        ("roles/x/tasks/main.yml", "- when: not vllm_build_force | default(false) | bool\n"),
        ("roles/x/tasks/main.yml", "- retries: \"{{ (loadbalancer_drain_timeout | int / 2) | int }}\"\n"),
        ("roles/x/tasks/main.yml", "- debug:\n    msg: set vllm_build_force, or wait loadbalancer_drain_timeout / 2\n"),
        ("roles/x/tasks/main.yml", "- debug:\n    msg: \"{{ 'vllm_build_force' ~ hostvars[h].vllm_build_force }}\"\n"),
        ("roles/x/tasks/main.yml", "- debug:\n    msg: \"{{ vllm_build_force_extra }} {{ loadbalancer_port }}\"\n"),
        ("roles/x/templates/a.j2", "{{ vllm_plan_model_size_gib | default(1.0) | float + 1 }}\n"),
    ],
)
def test_the_check_leaves_converted_reads_and_prose_alone(relative, text):
    assert problems(relative, text) == []
