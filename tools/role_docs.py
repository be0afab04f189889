"""Write each role's variable documentation into its README.md from meta/argument_specs.yml.

The argument spec is the one source of a role's options: their types, defaults, choices and descriptions. For every
role under roles/ that has meta/argument_specs.yml, this renders one Markdown section per entry point (main first,
then the others in the spec's order) with a table of its options, and writes it into roles/<role>/README.md between

    <!-- BEGIN generated from meta/argument_specs.yml: do not edit -->
    <!-- END generated -->

leaving the rest of the README (purpose, examples, notes) as it is. A README without the markers gets the block at
its end; a README with only one of them, or with them out of order or twice, is an error and is left alone.

    python tools/role_docs.py          # rewrite the generated blocks, list the READMEs it changed
    python tools/role_docs.py --check  # exit 1 and name each stale README and each problem of a spec

A default comes from the option's `default:` in the spec, else from roles/<role>/defaults/main.yml; it is shown as
inline YAML, cut with an ellipsis past MAX_DEFAULT characters. A variable of defaults/main.yml that the main entry
point's spec lacks, or whose spec default differs from it, is a problem in both modes (exit 1): the spec is then not
the whole truth the README is generated from.

The "choices or range" column shows an option's choices from the spec and its range from the tables preflight
enforces, loaded from the collection beside the roles directory: BOUNDS in plugins/plugin_utils/preflight/common.py
(inclusive; None unbounded) and the planner's NUMBERS in plugins/plugin_utils/vllm_cpu_planner.py, whose keys are
planner options: roles/vllm_plan/vars/main.yml's vllm_plan_options names the role variable each is fed from. A
bounded variable that no role's spec documents, or a NUMBERS key that vllm_plan_options feeds from no plain
variable, is a problem in both modes. A roles directory with no plugins/ beside it has no ranges.
"""

import argparse
import importlib.util
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BEGIN = "<!-- BEGIN generated from meta/argument_specs.yml: do not edit -->"
END = "<!-- END generated -->"
FIX = "python tools/role_docs.py"
MAX_DEFAULT = 60
ELLIPSIS = "\N{HORIZONTAL ELLIPSIS}"
HEADER = ("option", "type", "default", "required", "choices or range", "description")
# The tables that bound the roles' numbers, as (file under the collection root, table): preflight's BOUNDS and the
# planner's NUMBERS.
BOUNDS_FILE = "plugins/plugin_utils/preflight/common.py"
NUMBERS_FILE = "plugins/plugin_utils/vllm_cpu_planner.py"
# Where the planner's NUMBERS keys become variables: roles/vllm_plan/vars/main.yml's vllm_plan_options maps each
# planner option to the role variable it is fed from.
PLAN_VARS = "vllm_plan/vars/main.yml"
PLAN_OPTIONS = "vllm_plan_options"
PLAIN_VARIABLE = re.compile(r"^\{\{\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*\}\}$")

# Ansible's documentation markup (ansible-doc's classic forms) and what it becomes in Markdown.
MARKUP = re.compile(r"\b(?P<kind>RV|[CVOEPIBMLU])\((?P<text>[^)]*)\)")


class DocsError(Exception):
    """A README or spec this tool cannot work on; the message names the file and the fix."""


def _escape(text):
    """Markdown-escape plain text for a table cell: pipes, and angle brackets that would read as HTML."""
    return text.replace("|", r"\|").replace("<", "&lt;").replace(">", "&gt;")


def code(text):
    """`text` as a Markdown code span fit for a table cell (a pipe escaped; backticks inside get a longer fence)."""
    text = text.replace("|", r"\|")
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _convert(match):
    """One piece of Ansible markup as Markdown."""
    kind, text = match.group("kind"), match.group("text")
    if kind in ("I", "B"):
        mark = "*" if kind == "I" else "**"
        return f"{mark}{_escape(text)}{mark}"
    if kind == "U":
        return f"<{text}>"
    if kind == "L":
        label, _sep, url = text.rpartition(",")
        return f"[{_escape(label.strip())}]({url.strip()})"
    return code(text)


def markdown(text):
    """Ansible-marked-up text as one line of Markdown for a table cell or a paragraph."""
    text = " ".join(str(text).split())
    pieces, start = [], 0
    for match in MARKUP.finditer(text):
        pieces.append(_escape(text[start : match.start()]))
        pieces.append(_convert(match))
        start = match.end()
    pieces.append(_escape(text[start:]))
    return "".join(pieces)


def paragraph(description):
    """A spec description (a string or a list of strings) joined into one Markdown paragraph."""
    if description is None:
        return ""
    items = description if isinstance(description, list) else [description]
    return markdown(" ".join(str(item) for item in items))


def inline_yaml(value, limit=MAX_DEFAULT):
    """`value` as YAML on one line (flow style), cut to `limit` characters with an ellipsis."""
    text = yaml.safe_dump(value, default_flow_style=True, width=sys.maxsize, allow_unicode=True)
    text = text.removesuffix("\n").removesuffix("\n...")
    if "\n" in text:
        text = yaml.safe_dump(value, default_flow_style=True, width=sys.maxsize, default_style='"').strip()
    text = " ".join(text.split("\n"))
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + ELLIPSIS
    return text


def type_of(spec):
    """The option's type, with its elements' type for a list: `list of str`."""
    kind = spec.get("type", "str")
    if spec.get("elements"):
        return f"{kind} of {spec['elements']}"
    return kind


def range_text(low, low_ok, high):
    """A range as words for a table cell: `1` to `10`, at least `0`, above `0`, at most `1`; empty if unbounded."""
    words = []
    if low is not None:
        words.append(f"{'at least' if low_ok else 'above'} {code(str(low))}")
    if high is not None:
        if low is not None and low_ok:
            return f"{code(str(low))} to {code(str(high))}"
        words.append(f"at most {code(str(high))}")
    return ", ".join(words)


def option_row(name, spec, defaults, ranges=None):
    """One table row of an option; its default from the spec, else from the role's defaults/main.yml; its range
    from `ranges` (variable to its range text and source), after its choices."""
    if "default" in spec:
        default = code(inline_yaml(spec["default"]))
    elif name in defaults:
        default = code(inline_yaml(defaults[name]))
    else:
        default = ""
    choices = ", ".join(code(inline_yaml(choice)) for choice in spec.get("choices") or [])
    bounded = (ranges or {}).get(name, ("",))[0]
    cells = (
        code(name),
        type_of(spec),
        default,
        "yes" if spec.get("required") else "no",
        "; ".join(cell for cell in (choices, bounded) if cell),
        paragraph(spec.get("description")),
    )
    return "| " + " | ".join(cells) + " |"


def options_table(options, defaults, ranges=None):
    """The Markdown table of `options` (name to spec), in the spec's order."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines.extend(option_row(name, spec or {}, defaults, ranges) for name, spec in options.items())
    return lines


def entry_point_section(name, entry, main_options, defaults, ranges=None):
    """The Markdown lines of one entry point: heading, short and long description, options."""
    lines = [f"### Entry point `{name}`", ""]
    if entry.get("short_description"):
        lines += [markdown(entry["short_description"]), ""]
    description = entry.get("description") or []
    for item in description if isinstance(description, list) else [description]:
        lines += [markdown(item), ""]
    options = entry.get("options") or {}
    if name != "main" and main_options and all(options.get(key) == spec for key, spec in main_options.items()):
        own = {key: spec for key, spec in options.items() if key not in main_options}
        if not own:
            return [*lines, "Takes the options of `main` (above), and no other.", ""]
        lines += ["Takes the options of `main` (above), and these:", ""]
        options = own
    elif not options:
        return [*lines, "No options.", ""]
    return [*lines, *options_table(options, defaults, ranges), ""]


def render(specs, defaults, ranges=None):
    """The generated README block, markers included, of a role's `argument_specs` mapping."""
    main_options = (specs.get("main") or {}).get("options") or {}
    order = sorted(specs, key=lambda entry: entry != "main")
    lines = [
        BEGIN,
        "## Entry points and variables",
        "",
        "Generated from [meta/argument_specs.yml](meta/argument_specs.yml) by `python tools/role_docs.py`: edit the"
        " spec, then run it; never this section.",
        "",
    ]
    for entry in order:
        lines += entry_point_section(entry, specs[entry] or {}, main_options, defaults, ranges)
    return "\n".join([*lines[:-1], END]) + "\n"


def spec_problems(specs, defaults, label):
    """What keeps the spec from being the whole truth: defaults its main entry point lacks or gives otherwise."""
    main_options = (specs.get("main") or {}).get("options") or {}
    problems = []
    missing = [name for name in defaults if name not in main_options]
    if missing:
        problems.append(
            f"{label}/defaults/main.yml: {', '.join(missing)} not in meta/argument_specs.yml's main entry point;"
            " fix: add an option each (type, default, its description from the comment above it in defaults/main.yml)"
        )
    differ = [
        name
        for name, value in defaults.items()
        if name in main_options and "default" in (main_options[name] or {}) and main_options[name]["default"] != value
    ]
    if differ:
        problems.append(
            f"{label}/meta/argument_specs.yml: the default of {', '.join(differ)} differs from defaults/main.yml's;"
            " fix: give both the same value"
        )
    return problems


def splice(text, block, label):
    """`text` (a README) with the block between its markers replaced by `block`, or `block` appended without them."""
    lines = text.splitlines(keepends=True)
    begins = [number for number, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [number for number, line in enumerate(lines) if line.strip() == END]
    if not begins and not ends:
        return text.rstrip("\n") + "\n\n" + block if text.strip() else block
    where = f"{label}/README.md"
    fix = f"put the marker back so that one {BEGIN} line and one {END} line enclose the generated block, then run {FIX}"
    if len(begins) != 1 or len(ends) != 1:
        found = f"{len(begins)} line(s) {BEGIN} and {len(ends)} line(s) {END}"
        raise DocsError(f"{where}: has {found}, not one of each; fix: {fix}")
    if ends[0] < begins[0]:
        raise DocsError(f"{where}: the {END} line (line {ends[0] + 1}) comes before the {BEGIN} line; fix: {fix}")
    return "".join(lines[: begins[0]]) + block + "".join(lines[ends[0] + 1 :])


def load_yaml(path, label):
    """The YAML document at `path`, a mapping; a DocsError naming it otherwise."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except yaml.YAMLError as error:
        raise DocsError(f"{label}: not valid YAML: {error}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DocsError(f"{label}: not a mapping")
    return data


def _table(root, relative, name):
    """The module-level `name` of the Python file `relative` under `root`, loaded from that file.

    The file is run as a module of its own name (its imports of the collection's other code resolve through
    collections/ of this checkout), so a copied tree's table is its own.
    """
    path = root / relative
    if not path.is_file():
        raise DocsError(f"{relative}: missing, so {name} cannot be read; fix: restore it, or point {FIX} at its tree")
    collections = str(REPO / "collections")
    if collections not in sys.path:
        sys.path.insert(0, collections)
    spec = importlib.util.spec_from_file_location(f"role_docs_table_{path.stem}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = getattr(module, name, None)
    if not isinstance(table, dict):
        raise DocsError(f"{relative}: has no {name} table (a dict); fix: restore it, or update {FIX}")
    return table


def bounded_variables(roles_dir):
    """Each bounded variable's range text and the table it comes from: preflight's BOUNDS (inclusive, None
    unbounded) and the planner's NUMBERS ((kind, low, low itself allowed, high, example)), the latter named by the role
    variable vllm_plan_options feeds each planner option from. Empty for a roles directory outside a collection (no
    plugins/ beside it)."""
    root = Path(roles_dir).parent
    if not (root / "plugins").is_dir():
        return {}
    ranges = {
        name: (range_text(low, True, high), f"{BOUNDS_FILE}: BOUNDS")
        for name, (low, high) in _table(root, BOUNDS_FILE, "BOUNDS").items()
    }
    options = load_yaml(Path(roles_dir) / PLAN_VARS, f"roles/{PLAN_VARS}").get(PLAN_OPTIONS) or {}
    for key, (_kind, low, low_ok, high, _example) in _table(root, NUMBERS_FILE, "NUMBERS").items():
        match = PLAIN_VARIABLE.match(str(options.get(key, "")).strip())
        if not match:
            raise DocsError(
                f"roles/{PLAN_VARS}: {PLAN_OPTIONS}.{key}: not a plain {{{{ variable }}}}, so the planner's bound"
                f" NUMBERS[{key!r}] names no role variable; fix: feed it from the role's variable, e.g."
                f' {key}: "{{{{ vllm_plan_{key} }}}}"'
            )
        ranges[match.group("name")] = (range_text(low, low_ok, high), f"{NUMBERS_FILE}: NUMBERS[{key!r}]")
    return ranges


def undocumented(ranges, documented):
    """The problems of bounded variables that no role's spec documents: no README would show their range."""
    return [
        f"{source}: {name}: bounded, but no role's meta/argument_specs.yml documents it; fix: add {name} to the spec"
        " of the role that reads it (type, default, description), or drop its bound"
        for name, (_text, source) in sorted(ranges.items())
        if name not in documented
    ]


def role_readme(role, ranges=None):
    """The README text `role` (a directory) should have, its current text, the problems of its spec, and the names of
    the options its spec documents."""
    label = f"{role.parent.name}/{role.name}"
    specs = load_yaml(role / "meta" / "argument_specs.yml", f"{label}/meta/argument_specs.yml").get("argument_specs")
    if not isinstance(specs, dict) or "main" not in specs:
        raise DocsError(f"{label}/meta/argument_specs.yml: no argument_specs.main; fix: add the main entry point")
    defaults = load_yaml(role / "defaults" / "main.yml", f"{label}/defaults/main.yml")
    readme = role / "README.md"
    current = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    wanted = splice(current or f"# `{role.name}`\n", render(specs, defaults, ranges), label)
    names = {name for entry in specs.values() for name in ((entry or {}).get("options") or {})}
    return wanted, current, spec_problems(specs, defaults, label), names


def run(roles_dir, check):
    """Check or rewrite every role's README under `roles_dir`; print what it finds; return the exit code."""
    roles = sorted(path.parent.parent for path in Path(roles_dir).glob("*/meta/argument_specs.yml"))
    if not roles:
        print(f"{roles_dir}: no role with meta/argument_specs.yml", file=sys.stderr)
        return 1
    stale, problems, documented = [], [], set()
    try:
        ranges = bounded_variables(roles_dir)
    except DocsError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 1
    for role in roles:
        try:
            wanted, current, found, names = role_readme(role, ranges)
        except DocsError as error:
            problems.append(str(error))
            continue
        problems.extend(found)
        documented |= names
        if wanted != current:
            stale.append((role / "README.md", BEGIN in current))
            if not check:
                (role / "README.md").write_text(wanted, encoding="utf-8")
    for path, marked in stale:
        name = f"{path.parent.parent.name}/{path.parent.name}/README.md"
        if check:
            what = "stale, not what meta/argument_specs.yml gives" if marked else "stale, has no generated block yet"
            print(f"{name}: {what}; fix: {FIX}", file=sys.stderr)
        else:
            print(f"{name}: rewritten")
    problems.extend(undocumented(ranges, documented))
    for problem in problems:
        print(f"ERROR {problem}", file=sys.stderr)
    return 1 if problems or (check and stale) else 0


def main(argv=None):
    """Command line: see the module's docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a README is stale")
    parser.add_argument("--roles-dir", type=Path, default=REPO / "roles", help="directory of the roles (roles/)")
    args = parser.parse_args(argv)
    return run(args.roles_dir, args.check)


if __name__ == "__main__":
    sys.exit(main())
