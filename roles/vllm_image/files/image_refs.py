#!/usr/bin/env python3
"""The fleet's images on this host, and which of them something names (roles/vllm_image/tasks/prune.yml).

Prints JSON {"images": podman images --format json, "protected": {reference: why}}: every reference of the
repository that a unit file (a Quadlet .container, a podman-run unit or drop-in), a container (running or not) or a
rollout snapshot or record (its image files, its units, state.json's from/to) names, by its name or by its ID (the
units run images by ID: every name of an image so named is protected). Reads only.
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _podman_json(podman, *args):
    done = subprocess.run([podman, *args, "--format", "json"], capture_output=True, timeout=120, check=False)
    if done.returncode:
        sys.exit(f"{podman} {' '.join(args)}: {done.stderr.decode('utf-8', 'replace').strip()}")
    return json.loads(done.stdout.decode() or "[]") or []


# An image ID as the units and podman ps write it (sha256:<hex>) or bare: 64 hex digits, not part of a longer run.
IMAGE_ID = re.compile(r"(?<![0-9a-f])(?:sha256:)?([0-9a-f]{64})(?![0-9a-f])")


def named(repository, unit_dirs, snapshot_dirs, containers, images=()):
    """{reference: why} of what names an image of repository, by its name or by its ID."""
    reference = re.compile(re.escape(repository) + r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
    names_of = {}
    for image in images:
        found_id = str(image.get("Id", "")).removeprefix("sha256:")
        names_of.setdefault(found_id, []).extend(
            name for name in image.get("Names") or [] if reference.fullmatch(name)
        )
    found = {}

    def note(text, why):
        for match in reference.findall(text):
            found.setdefault(match, why)
        for match in IMAGE_ID.findall(text):
            for name in names_of.get(match, []):
                found.setdefault(name, f"{why} (by the image's ID)")

    for directory in unit_dirs:
        units = glob.glob(os.path.join(directory, "vllm@*.container")) + glob.glob(
            os.path.join(directory, "vllm@.service")
        )
        units += glob.glob(os.path.join(directory, "vllm@*.service.d", "*.conf"))
        for path in sorted(units):
            note(_read(path), f"the unit file {path}")
    for container in containers:
        names = container.get("Names") or ["?"]
        note(f"{container.get('Image', '')} {container.get('ImageID', '')}", f"the container {names[0]}")
    for directory in snapshot_dirs:
        files = []
        patterns = ("image", "config/image", "config/image-id", "quadlet/*.container", "units/vllm@.service")
        for pattern in (*patterns, "units/*/*.conf"):
            files += glob.glob(os.path.join(directory, "*", pattern)) + glob.glob(os.path.join(directory, pattern))
        for path in sorted(files):
            note(_read(path), f"the rollout snapshot {os.path.dirname(path)}")
        state = os.path.join(directory, "state.json")
        note(_read(state), f"the rollout record {state}")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", required=True)
    parser.add_argument("--podman", default="podman")
    parser.add_argument("--unit-dir", action="append", default=[])
    parser.add_argument("--snapshot-dir", action="append", default=[])
    args = parser.parse_args()
    containers = _podman_json(args.podman, "ps", "--all")
    images = _podman_json(args.podman, "images")
    protected = named(args.repository, args.unit_dir, args.snapshot_dir, containers, images)
    print(json.dumps({"images": images, "protected": protected}))


if __name__ == "__main__":
    main()
