"""Write requirements.lock: every package the controller's requirements.txt installs, pinned with its sha256.

    python tools/lock_requirements.py            # rewrite requirements.lock after editing requirements.txt
    python tools/lock_requirements.py --check    # exit 1 when requirements.lock is not requirements.txt's
    python tools/lock_requirements.py --constraint <(pip freeze)   # keep the versions a tested venv has

pip resolves requirements.txt for the Python that runs this tool (a dry run: nothing is installed) and its
report gives each package's version and the sha256 the index published for the file it chose. Each pin also
carries the digests PyPI's simple index (PEP 691) lists for that version's other files (other Pythons and
platforms), so the one lock installs wherever those files do. scripts/bootstrap.sh installs it with
`pip install --require-hashes`: a file whose bytes differ from its pin stops the install. The lock names the
sha256 of requirements.txt it was made from; tests/unit/test_requirements_lock.py fails when they drift.
"""

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "requirements.txt"
LOCK = REPO / "requirements.lock"
HEADER = "# sha256 of requirements.txt: "


def source_digest():
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def resolve(source, constraints=()):
    """[(name, version, sha256 of the chosen file)] of pip's closure of ``source`` for this Python."""
    with tempfile.TemporaryDirectory() as work:
        report = Path(work) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
             "--report", str(report), "-r", str(source), *(f"--constraint={c}" for c in constraints)],
            check=True,
        )
        items = json.loads(report.read_text())["install"]
    out = []
    for item in items:
        digest = ((item.get("download_info") or {}).get("archive_info") or {}).get("hashes", {}).get("sha256")
        if not digest:
            sys.exit(f"lock_requirements: the index gave no sha256 for {item['metadata']['name']}")
        out.append((canonicalize_name(item["metadata"]["name"]), item["metadata"]["version"], digest))
    return sorted(out)


def index_digests(name, version, index):
    """The sha256 of every file of name==version the index lists (PEP 691 JSON); empty when it cannot say."""
    request = urllib.request.Request(f"{index.rstrip('/')}/{name}/", headers={
        "Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            files = json.load(response)["files"]
    except (OSError, ValueError, KeyError):
        return set()
    found = set()
    for entry in files:
        filename = entry.get("filename", "")
        try:
            if filename.endswith(".whl"):
                _unused, file_version, _unused, _unused = parse_wheel_filename(filename)
            else:
                _unused, file_version = parse_sdist_filename(filename)
        except ValueError:
            continue
        if str(file_version) == version and entry.get("hashes", {}).get("sha256"):
            found.add(entry["hashes"]["sha256"])
    return found


def render(pins, digest, index):
    lines = [
        "# The controller's Python packages, every one pinned with its sha256 (pip install --require-hashes).",
        "# Made by python tools/lock_requirements.py from requirements.txt; edit that file, then run the tool.",
        f"{HEADER}{digest}",
    ]
    for name, version, chosen in pins:
        hashes = sorted({chosen} | (index_digests(name, version, index) if index else set()))
        lines.append(f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in hashes))
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the lock is requirements.txt's")
    parser.add_argument("--index", default="https://pypi.org/simple",
                        help="a PEP 691 index whose other files' digests are added ('' for none)")
    parser.add_argument("--constraint", action="append", default=[],
                        help="a pip constraints file (pip freeze of a venv that passed the tests)")
    args = parser.parse_args(argv)
    if args.check:
        recorded = next((line[len(HEADER):].strip() for line in LOCK.read_text().splitlines()
                         if line.startswith(HEADER)), None) if LOCK.exists() else None
        if recorded != source_digest():
            print("requirements.lock was not made from this requirements.txt; fix: python tools/lock_requirements.py")
            return 1
        return 0
    LOCK.write_text(render(resolve(SOURCE, args.constraint), source_digest(), args.index))
    print(f"lock_requirements: wrote {LOCK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
