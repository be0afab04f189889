"""Rewrite references to this collection's modules, filters, roles and playbooks to their
fully qualified names (vllm.cpu_fleet.<name>), and module_utils imports to the collection's
import path. Idempotent: run it again after a rebase or merge brings in new short names.

    python tools/fqcn.py          # rewrite in place, list the files it changed
    python tools/fqcn.py --check  # exit 1 and list the files that still need it

What it rewrites, by line, never inside an already qualified name:
  YAML (site.yml, playbooks/, roles/, molecule/) and the playbooks embedded in tests/*.py:
    a task key naming one of plugins/modules/*.py;  `| <filter>` for each plugins/filter/*.yml;
    `role: <role>`, `roles: [<role>, ...]`, `- <role>` under `roles:`, and `name: <role>` right
    under include_role/import_role, for each roles/*;
    in playbooks/, `import_playbook: <file>.yml` of a playbook the collection ships.
  Python (plugins/, tests/, molecule/, benchmarks/, tools/):
    `ansible.module_utils.<ours>` and `from ansible.module_utils import <ours>`.
"""

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
PREFIX = f"{GALAXY['namespace']}.{GALAXY['name']}"
MODULE_UTILS_PACKAGE = f"ansible_collections.{PREFIX}.plugins.module_utils"

MODULES = sorted(p.stem for p in (REPO / "plugins/modules").glob("*.py") if p.stem != "__init__")
FILTERS = sorted(p.stem for p in (REPO / "plugins/filter").glob("*.yml"))
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir())
MODULE_UTILS = sorted(p.stem for p in (REPO / "plugins/module_utils").glob("*.py") if p.stem != "__init__")
SHIPPED_PLAYBOOKS = sorted(
    p.stem for p in (REPO / "playbooks").glob("*.yml") if f"playbooks/{p.name}" not in GALAXY.get("build_ignore", [])
)


def _alternatives(names):
    # Longest first, so vllm_cpu_plan_check is not read as vllm_cpu_plan.
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))


# A name is short when no dot or word character precedes it and none follows.
MODULE_KEY = re.compile(rf"^(\s*(?:-\s+)?)({_alternatives(MODULES)}):(\s|$)")
FILTER_USE = re.compile(rf"(\|\s*)({_alternatives(FILTERS)})(?![\w.])")
ROLE_KEY = re.compile(rf"^(\s*(?:-\s+)?role:\s+)([\"']?)({_alternatives(ROLES)})\2(\s*(?:#.*)?)$")
ROLE_NAME = re.compile(rf"^(\s*name:\s+)([\"']?)({_alternatives(ROLES)})\2(\s*(?:#.*)?)$")
ROLE_LIST = re.compile(r"^(\s*(?:-\s+)?roles:\s*\[)([^\]]*)(\].*)$")
ROLES_KEY = re.compile(r"^(\s*)(?:-\s+)?roles:\s*$")
ROLE_ITEM = re.compile(rf"^(\s*-\s+)([\"']?)({_alternatives(ROLES)})\2(\s*(?:#.*)?)$")
ROLE_CALL = re.compile(r"^\s*(?:-\s+)?(?:ansible\.builtin\.)?(?:include|import)_role:\s*$")
PLAYBOOK_IMPORT = re.compile(
    rf"^(\s*(?:-\s+)?(?:ansible\.builtin\.)?import_playbook:\s+)({_alternatives(SHIPPED_PLAYBOOKS)})\.yml(\s*)$"
)
PY_DOTTED = re.compile(rf"\bansible\.module_utils\.({_alternatives(MODULE_UTILS)})\b")
PY_FROM = re.compile(rf"^(\s*)from ansible\.module_utils import ({_alternatives(MODULE_UTILS)})\b", re.M)


def _qualify_role_list(match):
    roles = [name.strip() for name in match.group(2).split(",")]
    roles = [f"{PREFIX}.{name}" if name in ROLES else name for name in roles]
    return match.group(1) + ", ".join(roles) + match.group(3)


def rewrite_yaml_lines(text, *, in_playbooks=False):
    lines = text.splitlines(keepends=True)
    previous = ""
    roles_indent = None  # indentation of the `roles:` key whose list is being read
    for index, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if roles_indent is not None and line.strip() and indent <= roles_indent and not line.lstrip().startswith("-"):
            roles_indent = None
        new = MODULE_KEY.sub(rf"\g<1>{PREFIX}.\g<2>:\g<3>", line)
        new = FILTER_USE.sub(rf"\g<1>{PREFIX}.\g<2>", new)
        new = ROLE_KEY.sub(rf"\g<1>\g<2>{PREFIX}.\g<3>\g<2>\g<4>", new)
        new = ROLE_LIST.sub(_qualify_role_list, new)
        if roles_indent is not None:
            new = ROLE_ITEM.sub(rf"\g<1>\g<2>{PREFIX}.\g<3>\g<2>\g<4>", new)
        if ROLES_KEY.match(line):
            roles_indent = len(ROLES_KEY.match(line).group(1))
        if ROLE_CALL.match(previous):
            new = ROLE_NAME.sub(rf"\g<1>\g<2>{PREFIX}.\g<3>\g<2>\g<4>", new)
        if in_playbooks:
            new = PLAYBOOK_IMPORT.sub(rf"\g<1>{PREFIX}.\g<2>\g<3>", new)
        lines[index] = new
        if line.strip():
            previous = line
    return "".join(lines)


def rewrite_python(text, *, embeds_playbooks=False):
    text = PY_FROM.sub(rf"\g<1>from {MODULE_UTILS_PACKAGE} import \g<2>", text)
    text = PY_DOTTED.sub(rf"{MODULE_UTILS_PACKAGE}.\g<1>", text)
    if embeds_playbooks:
        text = rewrite_yaml_lines(text)
    return text


def targets():
    yield REPO / "site.yml", rewrite_yaml_lines
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        yield path, lambda text: rewrite_yaml_lines(text, in_playbooks=True)
    for top in ("roles", "molecule"):
        for path in sorted((REPO / top).rglob("*.yml")):
            yield path, rewrite_yaml_lines
    for top in ("plugins", "benchmarks", "tools"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path != Path(__file__).resolve():
                yield path, rewrite_python
    for top in ("tests", "molecule"):
        for path in sorted((REPO / top).rglob("*.py")):
            if "fixtures" not in path.parts:
                yield path, lambda text: rewrite_python(text, embeds_playbooks=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file needs rewriting")
    args = parser.parse_args()
    changed = []
    for path, rewrite in targets():
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            changed.append(path.relative_to(REPO).as_posix())
            if not args.check:
                path.write_text(new)
    for name in changed:
        print(name)
    # The new import path can sort differently: let ruff put the imports back in order.
    python = [name for name in changed if name.endswith(".py")]
    if python and not args.check and shutil.which("ruff"):
        subprocess.run(["ruff", "check", "--quiet", "--select", "I", "--fix", *python], cwd=REPO, check=False)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
