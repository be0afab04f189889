"""Role inputs: every default is mirrored in meta/argument_specs.yml and listed in the
role's README.md, defaults/main.yml holds values and one-line section headers only (the
spec's descriptions say what each means), and a wrong type stops the role before any task
runs, naming the variable."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
ROLES = sorted(p.parent.parent for p in REPO.glob("roles/*/meta/argument_specs.yml"))


def test_every_role_has_argument_specs():
    with_defaults = {p.parent.parent for p in REPO.glob("roles/*/defaults/main.yml")}
    assert with_defaults, "no roles found"
    assert with_defaults <= set(ROLES)


def _readme_variables(role, defaults):
    """The role's variables named in the first column of its README's tables: its own prefix, and
    the shared values roles/vllm_fleet holds under their owning role's name."""
    names = set()
    for line in (role / "README.md").read_text().splitlines():
        if line.startswith("|"):
            cell = line.split("|")[1]
            found = re.findall(r"`(\w+)`", cell)
            names.update(name for name in found if name.startswith(f"{role.name}_") or name in defaults)
    return names


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_defaults_argument_specs_and_readme_agree(role):
    defaults = yaml.safe_load((role / "defaults/main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]
    options = specs["main"]["options"]
    assert set(defaults) == set(options), "defaults/main.yml and meta/argument_specs.yml list different variables"
    for name, value in defaults.items():
        typed = options[name].get("type") in ("bool", "int", "float", "list", "dict")
        if typed and isinstance(value, str) and "{{" in value:
            # A template for a bool, int or list is no value of that type (antsibull-docs refuses it): the spec
            # has no default and its description names what the template follows.
            assert "default" not in options[name], f"{name}: a templated default of type {options[name]['type']}"
            words = set(re.findall(r"\b[a-z][a-z0-9_]+\b", value))
            described = " ".join(options[name]["description"] if isinstance(options[name]["description"], list)
                                 else [options[name]["description"]])
            assert any(word in described for word in words if "_" in word), f"{name}: say what the default follows"
            continue
        assert options[name].get("default") == value, f"{name}: default differs between defaults and argument_specs"
        assert options[name].get("description"), f"{name} has no description"
    # One README table row per default; a row for a variable no entry point takes is stale.
    assert (role / "README.md").is_file(), f"roles/{role.name} has no README.md; fix: write one with a variable table"
    accepted = {name for spec in specs.values() for name in spec.get("options", {})}
    listed = _readme_variables(role, defaults)
    missing, stale = sorted(set(defaults) - listed), sorted(listed - set(defaults) - accepted)
    assert not missing, f"roles/{role.name}/README.md: no table row for {missing}; fix: add one row each"
    assert not stale, f"roles/{role.name}/README.md: {stale} are in no argument spec; fix: remove their rows"


HEADER_MAX_CHARS = 60
HEADERS_PER_FILE = 12
VARIABLE_LINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*:( |$)")


def defaults_comment_problems(text):
    """The comment lines of a defaults/main.yml that are not section headers, as `line N: problem` strings.

    A comment line is a line whose first non-blank character is `#` (a comment after a value, such as a
    `# noqa`, is none). Each must be a section header: at column 0, at most HEADER_MAX_CHARS characters,
    directly after the `---` line or a blank line and directly before a variable line (`name:` at column 0).
    So a header is one line that opens a block of variables: no comment of two lines or more, none inside
    a block or a value, none at the end. A file has at most HEADERS_PER_FILE of them. What a variable means
    is said once, in the option's description in meta/argument_specs.yml.
    """
    lines = text.splitlines()
    problems = []
    comments = [number for number, line in enumerate(lines) if line.lstrip().startswith("#")]
    for number in comments:
        line = lines[number]
        before = lines[number - 1] if number else None
        after = lines[number + 1] if number + 1 < len(lines) else None
        if not line.startswith("#"):
            problems.append(f"line {number + 1}: an indented comment")
        elif len(line) > HEADER_MAX_CHARS:
            problems.append(f"line {number + 1}: {len(line)} characters, more than {HEADER_MAX_CHARS}")
        elif before is None or (before.strip() and before != "---"):
            problems.append(f"line {number + 1}: not after a blank line or the --- line")
        elif after is None or not VARIABLE_LINE.match(after):
            problems.append(f"line {number + 1}: not followed by a variable line")
    if len(comments) > HEADERS_PER_FILE:
        problems.append(f"{len(comments)} comment lines, more than {HEADERS_PER_FILE}")
    return problems


@pytest.mark.parametrize(
    "role", sorted(p.parent.parent for p in REPO.glob("roles/*/defaults/main.yml")), ids=lambda p: p.name
)
def test_defaults_hold_values_and_section_headers_only(role):
    """defaults/main.yml holds values and one-line section headers only (rule: defaults_comment_problems)."""
    problems = defaults_comment_problems((role / "defaults/main.yml").read_text())
    assert not problems, (
        f"roles/{role.name}/defaults/main.yml: comments: {'; '.join(problems)}; fix: keep one header line of at most"
        f" {HEADER_MAX_CHARS} characters per block of variables and say what a variable means in its description in"
        " meta/argument_specs.yml."
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("---\n# Model source\nx_a: 1\nx_b: 2\n\n# Timeouts\nx_c: 3  # noqa: var-naming\n", []),
        (
            "---\n# Model source,\n# and more\nx_a: 1\n",
            ["line 2: not followed by a variable line", "line 3: not after a blank line or the --- line"],
        ),
        ("---\n# Model source\nx_a: 1\n# Why b\nx_b: 2\n", ["line 4: not after a blank line or the --- line"]),
        ("---\nx_a: >-\n  # text\n  more\n", ["line 3: an indented comment"]),
        ("---\n# " + "w" * 60 + "\nx_a: 1\n", ["line 2: 62 characters, more than 60"]),
        ("---\nx_a: 1\n\n# The end\n", ["line 4: not followed by a variable line"]),
        ("---\n" + "".join(f"# H{i}\nx_{i}: 1\n\n" for i in range(13)), ["13 comment lines, more than 12"]),
    ],
)
def test_defaults_comment_rule(text, expected):
    """The header rule itself: a file of headers passes, each kind of explanatory comment is named."""
    assert defaults_comment_problems(text) == expected


def run_role(tmp_path, role, role_vars):
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        textwrap.dedent(
            f"""\
            - hosts: localhost
              connection: local
              gather_facts: false
              roles:
                - role: vllm.cpu_fleet.{role}
                  vars: {role_vars!r}
            """
        )
    )
    # --check: should validation ever let a bad value through, nothing on the controller changes.
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "--check", "-i", "localhost,", str(playbook)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )


@pytest.mark.parametrize(
    ("role", "variable", "value"),
    [
        ("toolchain", "toolchain_accept_degraded_isa", "maybe"),
        ("toolchain", "toolchain_install_compiler", {"yes": 1}),
        ("toolchain", "toolchain_extra_packages", {"gcc": 1}),
    ],
)
def test_wrong_type_fails_before_any_task_naming_the_variable(tmp_path, role, variable, value):
    result = run_role(tmp_path, role, {variable: value})
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert variable in output
    assert "Validating arguments against arg spec" in output
    # Argument validation is the only task that ran.
    assert "ok=0" in output and "changed=0" in output


def test_vllm_plan_defaults_are_the_planners():
    """The role's knobs, left at their defaults, give the planner exactly its own defaults."""
    from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_cpu_planner

    defaults = yaml.safe_load((REPO / "roles/vllm_plan/defaults/main.yml").read_text())
    knobs = {name.removeprefix("vllm_plan_"): value for name, value in defaults.items()}
    # Not planner knobs: where the facts are read from, and which setup subsets come with them.
    knobs.pop("facts_root")
    knobs.pop("gather_subset")
    # The install route's options are the fleet's and the toolchain's variables (vllm_plan/vars/main.yml).
    fleet = {"vllm_version", "host", "variable_prefix", *vllm_cpu_planner.FLEET_VARIABLES}
    assert set(knobs) == set(vllm_cpu_planner.DEFAULTS) - fleet
    assert vllm_cpu_planner._options(knobs) == vllm_cpu_planner._options({})


def _tasks_from_calls():
    """(file, role, entry point) of every include_role/import_role with tasks_from in the project."""
    calls = []
    files = [
        REPO / "site.yml",
        *REPO.glob("playbooks/*.yml"),
        *REPO.glob("roles/*/tasks/*.yml"),
        *REPO.glob("molecule/*/*.yml"),
    ]

    def walk(node, path):
        if isinstance(node, dict):
            for key in ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role"):
                call = node.get(key)
                if isinstance(call, dict) and "tasks_from" in call:
                    role = call["name"].removeprefix("vllm.cpu_fleet.")
                    calls.append((path.relative_to(REPO).as_posix(), role, call["tasks_from"]))
            for value in node.values():
                walk(value, path)
        elif isinstance(node, list):
            for value in node:
                walk(value, path)

    for path in files:
        walk(yaml.safe_load(path.read_text()), path)
    return calls


def test_every_tasks_from_has_an_argument_spec():
    """ansible-core validates only the entry point named by tasks_from: one without a spec checks nothing."""
    calls = _tasks_from_calls()
    assert len(calls) > 10, "the scan found too few tasks_from calls to be looking at the project"
    missing = []
    for where, role, entry in calls:
        specs = yaml.safe_load((REPO / "roles" / role / "meta/argument_specs.yml").read_text())["argument_specs"]
        if entry not in specs:
            missing.append(f"{where}: {role} tasks_from {entry}")
    assert not missing, "entry points without an argument spec: " + "; ".join(missing)


def test_entry_point_specs_cover_the_role_defaults():
    """Every entry point validates at least the role's own defaults (they share main's options)."""
    for spec_file in REPO.glob("roles/*/meta/argument_specs.yml"):
        specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
        main = set(specs["main"]["options"])
        for entry, spec in specs.items():
            missing = sorted(main - set(spec.get("options", {})))
            assert not missing, f"{spec_file}: entry point {entry} does not validate {missing}"
