"""tools/role_docs.py (issue 34): the role READMEs' variable sections are generated from meta/argument_specs.yml,
and the checkout's are current; the renderer escapes, joins and reports what it should."""

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_cpu_planner
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight import common

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "role_docs.py"


def _load_tool():
    """tools/role_docs.py as a module (tools/ is no package)."""
    spec = importlib.util.spec_from_file_location("role_docs_under_test", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


role_docs = _load_tool()

MAIN_OPTIONS = {
    "demo_name": {"type": "str", "default": "x", "description": "The name."},
    "demo_mode": {"type": "str", "choices": ["a", "b"], "description": "Pick C(a) | C(b); never a|b together."},
    "demo_list": {
        "type": "list",
        "elements": "str",
        "description": ["First line\nstill the first item.", "Second item."],
    },
}
SPEC = {
    "argument_specs": {
        "other": {
            "short_description": "Takes main's options and one more.",
            "options": {
                **MAIN_OPTIONS,
                "demo_only_here": {"type": "int", "required": True, "description": "Only the other entry point's."},
            },
        },
        "partial": {
            "short_description": "Takes one of main's options.",
            "options": {"demo_name": MAIN_OPTIONS["demo_name"]},
        },
        "main": {"short_description": "A small role for the tests.", "options": MAIN_OPTIONS},
    }
}
DEFAULTS = {"demo_name": "x", "demo_mode": "a", "demo_list": [f"item-{number}" for number in range(20)]}
README = "# demo\n\nWhat it does.\n\n" + role_docs.BEGIN + "\n" + role_docs.END + "\n\n## Example\n\nKept.\n"


def _role(tmp_path, spec=None, defaults=None, readme=README):
    """A role `demo` under tmp_path/roles with the given spec, defaults and README; returns the roles directory."""
    role = tmp_path / "roles" / "demo"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(yaml.safe_dump(SPEC if spec is None else spec, sort_keys=False))
    (role / "defaults" / "main.yml").write_text(yaml.safe_dump(DEFAULTS if defaults is None else defaults))
    (role / "README.md").write_text(readme)
    return tmp_path / "roles"


def _row(block, name):
    """The table row of option `name` in a rendered block."""
    rows = [line for line in block.splitlines() if line.startswith(f"| `{name}` |")]
    assert rows, f"no row for {name} in:\n{block}"
    return rows[0]


def test_the_checkout_role_readmes_are_current():
    """The committed READMEs are what the specs give: a changed spec needs `python tools/role_docs.py`."""
    result = subprocess.run(
        [sys.executable, str(TOOL), "--check"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_role_with_a_spec_has_a_generated_block():
    """Each role README holds one pair of markers, so no hand-written table can come back unnoticed."""
    for spec in sorted(REPO.glob("roles/*/meta/argument_specs.yml")):
        text = (spec.parent.parent / "README.md").read_text(encoding="utf-8")
        assert text.count(role_docs.BEGIN) == 1, spec.parent.parent.name
        assert text.count(role_docs.END) == 1, spec.parent.parent.name


def test_a_pipe_in_a_description_is_escaped():
    """A `|` in a description, inside a code span or not, cannot split the table row."""
    block = role_docs.render(SPEC["argument_specs"], DEFAULTS)
    row = _row(block, "demo_mode")
    assert r"`a` \| `b`; never a\|b together." in row
    assert row.count("|") - row.count(r"\|") == 7, "six cells, so seven unescaped pipes"


def test_a_multi_line_description_becomes_one_paragraph():
    """A list of items, and a line break inside one, read as one paragraph in one cell."""
    block = role_docs.render(SPEC["argument_specs"], DEFAULTS)
    assert "First line still the first item. Second item. |" in _row(block, "demo_list")


def test_cells_come_from_the_spec_and_defaults():
    """Type with elements, choices, required; a default the spec lacks from defaults/main.yml, cut with an ellipsis."""
    block = role_docs.render(SPEC["argument_specs"], DEFAULTS)
    assert _row(block, "demo_name").startswith("| `demo_name` | str | `x` | no |  | The name. |")
    assert "| `a`, `b` |" in _row(block, "demo_mode")
    default = _row(block, "demo_list").split(" | ")[2]
    assert default.startswith("`[item-0, item-1,") and default.endswith("\N{HORIZONTAL ELLIPSIS}`")
    assert len(default) <= role_docs.MAX_DEFAULT + 2


def test_main_comes_first_and_other_entry_points_list_only_their_own_options():
    """main's table first; an entry point that takes all of main's options lists only the rest."""
    block = role_docs.render(SPEC["argument_specs"], DEFAULTS)
    assert block.index("### Entry point `main`") < block.index("### Entry point `other`")
    other = block[block.index("### Entry point `other`") :]
    assert "Takes the options of `main` (above), and these:" in other
    assert "| `demo_only_here` | int |  | yes |" in other
    assert "`demo_name`" not in other[: other.index("### Entry point `partial`")]
    partial = block[block.index("### Entry point `partial`") :]
    assert "Takes the options of `main`" not in partial
    assert "| `demo_name` | str | `x` | no |" in partial


def test_write_then_check(tmp_path, capsys):
    """A stale README is named with the fix by --check, rewritten by the default mode, prose kept."""
    roles = _role(tmp_path)
    assert role_docs.main(["--check", "--roles-dir", str(roles)]) == 1
    assert "roles/demo/README.md: stale" in capsys.readouterr().err
    assert role_docs.main(["--roles-dir", str(roles)]) == 0
    text = (roles / "demo" / "README.md").read_text()
    assert text.startswith("# demo\n\nWhat it does.\n\n" + role_docs.BEGIN)
    assert text.endswith(role_docs.END + "\n\n## Example\n\nKept.\n")
    assert role_docs.main(["--check", "--roles-dir", str(roles)]) == 0


def test_the_stale_message_names_the_fix(tmp_path, capsys):
    """--check prints the one-line fix."""
    roles = _role(tmp_path)
    role_docs.main(["--check", "--roles-dir", str(roles)])
    assert "fix: python tools/role_docs.py" in capsys.readouterr().err


def test_a_readme_without_markers_gets_the_block_at_its_end(tmp_path, capsys):
    """No markers yet: the block is appended, the text before it kept."""
    roles = _role(tmp_path, readme="# demo\n\nProse.\n")
    assert role_docs.main(["--check", "--roles-dir", str(roles)]) == 1
    assert "roles/demo/README.md: stale, has no generated block yet" in capsys.readouterr().err
    assert role_docs.main(["--roles-dir", str(roles)]) == 0
    text = (roles / "demo" / "README.md").read_text()
    assert text.startswith("# demo\n\nProse.\n\n" + role_docs.BEGIN + "\n")
    assert text.endswith(role_docs.END + "\n")


def test_a_default_missing_from_the_spec_is_reported(tmp_path, capsys):
    """A variable of defaults/main.yml that main's spec lacks fails both modes, named with the file."""
    roles = _role(tmp_path, defaults={**DEFAULTS, "demo_forgotten": 3, "demo_lost": "y"})
    assert role_docs.main(["--check", "--roles-dir", str(roles)]) == 1
    err = capsys.readouterr().err
    assert "roles/demo/defaults/main.yml: demo_forgotten, demo_lost not in meta/argument_specs.yml" in err
    assert role_docs.main(["--roles-dir", str(roles)]) == 1
    assert "demo_forgotten" in capsys.readouterr().err


def test_a_spec_default_that_differs_from_defaults_is_reported():
    """The README shows the spec's default: one that defaults/main.yml contradicts is a problem."""
    problems = role_docs.spec_problems(SPEC["argument_specs"], {**DEFAULTS, "demo_name": "y"}, "roles/demo")
    assert problems == [
        "roles/demo/meta/argument_specs.yml: the default of demo_name differs from defaults/main.yml's;"
        " fix: give both the same value"
    ]


@pytest.mark.parametrize(
    ("readme", "expected"),
    [
        (f"# demo\n\n{role_docs.BEGIN}\nold table\n", f"1 line(s) {role_docs.BEGIN} and 0 line(s) {role_docs.END}"),
        (f"# demo\n\nold table\n{role_docs.END}\n", f"0 line(s) {role_docs.BEGIN} and 1 line(s) {role_docs.END}"),
        (f"# demo\n\n{role_docs.END}\nx\n{role_docs.BEGIN}\n", f"the {role_docs.END} line (line 3) comes before"),
    ],
    ids=["end-removed", "begin-removed", "swapped"],
)
def test_a_removed_marker_is_an_error(tmp_path, capsys, readme, expected):
    """One marker gone (or out of order): an error naming the README and the fix, and the README left alone."""
    roles = _role(tmp_path, readme=readme)
    assert role_docs.main(["--roles-dir", str(roles)]) == 1
    err = capsys.readouterr().err
    assert "roles/demo/README.md: " in err
    assert expected in err
    assert "fix: put the marker back" in err
    assert (roles / "demo" / "README.md").read_text() == readme
    with pytest.raises(role_docs.DocsError, match=r"not one of each|comes before"):
        role_docs.splice(readme, "block\n", "roles/demo")


def test_markup_becomes_markdown():
    """Ansible's C(), I(), B(), U() and L() read as Markdown; angle brackets outside code do not vanish as HTML."""
    text = role_docs.markdown("C(x) I(it) B(bold) U(https://e.org) L(site, https://e.org) <host>")
    assert text == "`x` *it* **bold** <https://e.org> [site](https://e.org) &lt;host&gt;"


def test_inline_yaml_keeps_types_readable():
    """Defaults read as YAML: quoted where YAML would read them otherwise, one line for a multi-line string."""
    assert role_docs.inline_yaml("") == "''"
    assert role_docs.inline_yaml("0") == "'0'"
    assert role_docs.inline_yaml(None) == "null"
    assert role_docs.inline_yaml(False) == "false"
    assert role_docs.inline_yaml({"a": 1}) == "{a: 1}"
    assert "\n" not in role_docs.inline_yaml(textwrap.dedent("one\n  two\n"))


def _readme_row(role, name):
    """The row of option `name` in the checkout's roles/<role>/README.md."""
    return _row((REPO / "roles" / role / "README.md").read_text(encoding="utf-8"), name)


def test_the_range_column_shows_the_bounds_preflight_enforces():
    """A BOUNDS entry and a planner NUMBERS entry appear, as those tables give them, in the README's range cell."""
    low, high = common.BOUNDS["vllm_build_nice"]
    assert f"| `{low}` to `{high}` |" in _readme_row("vllm_build", "vllm_build_nice")
    low, _high = common.BOUNDS["vllm_build_timeout"]
    assert f"| at least `{low}` |" in _readme_row("vllm_build", "vllm_build_timeout")
    _kind, low, low_ok, high, _example = vllm_cpu_planner.NUMBERS["memory_fraction"]
    assert not low_ok
    assert f"| above `{low}`, at most `{high}` |" in _readme_row("vllm_plan", "vllm_plan_memory_fraction")
    _kind, low, _low_ok, high, _example = vllm_cpu_planner.NUMBERS["tp"]
    assert f"| `{low}` to `{high}` |" in _readme_row("vllm_plan", "vllm_plan_tp")


def test_choices_and_a_range_share_the_cell():
    """An option with choices and a bound shows both; one with neither an empty cell."""
    ranges = {"demo_mode": ("`1` to `2`", "test"), "demo_name": ("", "test")}
    block = role_docs.render(SPEC["argument_specs"], DEFAULTS, ranges)
    assert "| `a`, `b`; `1` to `2` |" in _row(block, "demo_mode")
    assert _row(block, "demo_name").startswith("| `demo_name` | str | `x` | no |  | The name. |")


def _collection_copy(tmp_path):
    """The checkout's roles/ and plugins/ copied under tmp_path; returns the copy's root."""
    root = tmp_path / "collection"
    for part in ("roles", "plugins"):
        shutil.copytree(REPO / part, root / part, symlinks=True)
    return root


def _check(root):
    return subprocess.run(
        [sys.executable, str(TOOL), "--check", "--roles-dir", str(root / "roles")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_bounded_name_no_spec_documents_fails_the_check(tmp_path):
    """A BOUNDS entry for a variable no role's spec has: --check fails naming it, the table and the fix."""
    root = _collection_copy(tmp_path)
    assert _check(root).returncode == 0, "the copy as it is passes"
    table = root / role_docs.BOUNDS_FILE
    table.write_text(table.read_text() + '\nBOUNDS["vllm_build_undocumented_knob"] = (0, 9)\n')
    result = _check(root)
    assert result.returncode == 1
    assert (
        f"ERROR {role_docs.BOUNDS_FILE}: BOUNDS: vllm_build_undocumented_knob: bounded, but no role's"
        " meta/argument_specs.yml documents it; fix: add vllm_build_undocumented_knob to the spec" in result.stderr
    )


def test_a_planner_number_the_role_does_not_feed_fails_the_check(tmp_path):
    """A planner NUMBERS key that vllm_plan_options feeds from no plain variable: --check fails naming it."""
    root = _collection_copy(tmp_path)
    table = root / role_docs.NUMBERS_FILE
    table.write_text(table.read_text() + '\nNUMBERS["new_knob"] = ("int", 1, True, 9, "2")\n')
    result = _check(root)
    assert result.returncode == 1
    assert "roles/vllm_plan/vars/main.yml: vllm_plan_options.new_knob: not a plain" in result.stderr
    assert "fix: feed it from the role's variable" in result.stderr
