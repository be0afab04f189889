"""The Python steps of scripts/wheelhouse.sh, one subcommand each (python3 scripts/wheelhouse.py <step> ...).

    torch-pin VERSION ARCH [OVERRIDES]
                                    the release table's torch pin, with the rows of OVERRIDES (a vars file
                                    setting vllm_release_overrides, as the probe's --as-inventory writes
                                    it) over the table's; exit 1 naming the fix when the version is in neither
    up-to-date MANIFEST KEY [LOCK]  exit 0 when the manifest has this inputs key, every file it lists and,
                                    with LOCK, was made from that lock (its sha256)
    lock-path DIST VERSION TAG PLATFORM TORCH_SPEC EXCLUDED
                                    the committed lock's path for these inputs (scripts/wheelhouse-locks/);
                                    the file may not exist
    bundle-files MANIFEST           the dependency wheels' file names, one a line
    requirements DIR DIST VERSION PYVER ARCH TORCH_SPEC EXCLUDED
                                    the vLLM wheel's requirements for the target, torch pinned, excluded left out
    lock REPORT EXCLUDED            "name==version --hash=sha256:<digest>" of pip's --report closure, excluded
                                    left out; the digest is the one the index published (exit 1 when it gave none)
    manifest DIR MANIFEST LOCK DIST VERSION PYVER TAG PLATFORM ARCH EXCLUDED KEY TORCH_SPEC
                                    write the manifest from LOCK (the vLLM wheel's line and the dependencies'), or
                                    exit 1 naming the refused wheels: a pin without a hash, a file whose sha256 is
                                    not its pin's
    summary MANIFEST                "<n> wheels, <size> MiB"

EXCLUDED is a space-separated list of names. Needs packaging, and PyYAML for OVERRIDES: both are
ansible-core's own requirements, so the Python that runs Ansible has them (the script ships with the
collection, tools/ does not).
"""

import glob
import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename


class Refused(Exception):
    """The wheel set must not be used; the message lists why."""


def torch_pin(version, arch, overrides_file=""):
    """The release table's pin: plugins/plugin_utils/vllm_cpu_releases.py is the one home of the +cpu rule."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "plugin_utils"))
    from vllm_cpu_releases import OVERRIDES_VARIABLE, InvalidReleaseRowError, UnknownReleaseError
    from vllm_cpu_releases import torch_pin as pin

    overrides = {}
    if overrides_file:
        import yaml  # only here: the other steps need no PyYAML

        try:
            with open(overrides_file, encoding="utf-8") as handle:
                overrides = (yaml.safe_load(handle) or {}).get(OVERRIDES_VARIABLE) or {}
        except (OSError, yaml.YAMLError, AttributeError) as err:
            raise Refused(
                f"--release-overrides {overrides_file}: cannot read {OVERRIDES_VARIABLE} from it ({err}); "
                "fix: pass the vars file the release probe wrote (--as-inventory)"
            ) from err
    try:
        return pin(version, arch, overrides)
    except UnknownReleaseError as err:
        lacking = f"--release-overrides {overrides_file} has no row for {version}; " if overrides_file else ""
        raise Refused(
            f"{err}\nwheelhouse: {lacking}fix: pass the row's vars file with --release-overrides <file>, "
            "or the pin with --torch 'torch==X+cpu'"
        ) from err
    except InvalidReleaseRowError as err:
        raise Refused(f"--release-overrides {overrides_file}: {err}") from err


def _load(manifest):
    with open(manifest, encoding="utf-8") as handle:
        return json.load(handle)


def _files(data):
    return [data["vllm_wheel"], *(dep["file"] for dep in data["deps"])]


def up_to_date(manifest, key, lock_file=""):
    data, directory = _load(manifest), os.path.dirname(manifest)
    if lock_file and data.get("lock_sha256") != sha256(lock_file):
        return False
    return data.get("inputs_key") == key and all(os.path.isfile(os.path.join(directory, f)) for f in _files(data))


LOCKS = Path(__file__).resolve().parent / "wheelhouse-locks"


def lock_path(dist, version, tag, platform, torch_spec, excluded):
    """Where the reviewed lock of these inputs is committed: readable names, then a digest of the rest."""
    inputs = "\n".join([f"{canonicalize_name(dist)}=={version}", torch_spec, " ".join(sorted(excluded.split()))])
    digest = hashlib.sha256(inputs.encode()).hexdigest()[:12]
    return str(LOCKS / f"{canonicalize_name(dist)}-{version}-{tag}-{platform}-{digest}.txt")


def read_lock(lock_file):
    """{name: (version, [sha256, ...])} of a hash-pinned lock; Refused on a line that is no such pin."""
    pins, problems = {}, []
    with open(lock_file, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            words = line.split()
            name, sep, version = words[0].partition("==")
            hashes = [w.split(":", 1)[1] for w in words[1:] if w.startswith("--hash=sha256:")]
            rest = [w for w in words[1:] if not w.startswith("--hash=sha256:")]
            if not sep or not version or rest or not hashes:
                problems.append(f"{lock_file}:{number}: {line!r} is not 'name==version --hash=sha256:<digest>'")
                continue
            pins[canonicalize_name(name)] = (version, hashes)
    if problems:
        raise Refused("wheelhouse: refusing the lock:\n  " + "\n  ".join(problems))
    return pins


def bundle_files(manifest):
    return [dep["file"] for dep in _load(manifest)["deps"]]


def requirements(directory, dist, version, pyver, arch, torch_spec, excluded):
    """The torch pin first, then every Requires-Dist whose marker holds on the target, without its marker."""
    excluded = set(excluded.split())
    norm = canonicalize_name(dist).replace("-", "_")
    wheels = glob.glob(os.path.join(directory, f"{norm}-{version}-*.whl"))
    if len(wheels) != 1:
        raise Refused(f"expected one {norm}-{version} wheel in {directory}, found {wheels}")
    with zipfile.ZipFile(wheels[0]) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    env = {
        "python_version": pyver, "python_full_version": pyver + ".0", "platform_machine": arch,
        "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
        "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": "",
    }
    out = [torch_spec]
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name in excluded or name == "torch":
            continue
        req.marker = None
        out.append(str(req))
    return out


def lock(report, excluded):
    excluded = set(excluded.split())
    with open(report, encoding="utf-8") as handle:
        items = json.load(handle)["install"]
    out, unhashed = [], []
    for item in sorted(items, key=lambda i: canonicalize_name(i["metadata"]["name"])):
        name = canonicalize_name(item["metadata"]["name"])
        if name in excluded:
            continue
        info = item.get("download_info", {})
        digest = (info.get("archive_info") or {}).get("hashes", {}).get("sha256")
        if not digest:
            unhashed.append(f"{name} ({info.get('url', 'no url')})")
            continue
        out.append(f"{name}=={item['metadata']['version']} --hash=sha256:{digest}")
    if unhashed:
        raise Refused(
            "wheelhouse: the index gave no sha256 for " + ", ".join(unhashed) + "; fix: an index that publishes"
            " hashes (PEP 503 #sha256= links), or a reviewed lock (--lock FILE)"
        )
    return out


def sha256(path):
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()  # the controller's Python is 3.11+


def manifest(directory, path, lock_file, dist, version, pyver, tag, platform, arch, excluded, key, torch_spec):
    """Write the manifest; Refused when a pin has no wheel, a wheel must not be in a CPU wheelhouse
    (nvidia-*, excluded), torch is missing or not +cpu where it must be, or the vLLM wheel is missing."""
    excluded = excluded.split()
    pins = read_lock(lock_file)
    vllm_pin = pins.pop(canonicalize_name(dist), None)
    by_name = {}
    for f in os.listdir(directory):
        if f.endswith(".whl"):
            name, ver, _unused, _unused = parse_wheel_filename(f)
            by_name.setdefault((canonicalize_name(name), str(ver)), f)
    deps, problems = [], []
    for name, (ver, hashes) in pins.items():
        f = by_name.get((name, ver))
        if f is None:
            problems.append(f"{name}=={ver}: no wheel in {directory}")
            continue
        if name.startswith("nvidia-") or name in excluded:
            problems.append(f"{f}: must not be in a CPU wheelhouse")
        wheel = os.path.join(directory, f)
        digest = sha256(wheel)
        if digest not in hashes:
            problems.append(f"{f}: sha256 {digest} is not the lock's ({', '.join(hashes)})")
        deps.append({"name": name, "version": ver, "file": f, "sha256": digest, "size": os.path.getsize(wheel)})
    torch = [dep for dep in deps if dep["name"] == "torch"]
    if len(torch) != 1:
        problems.append("torch is not in the resolved set")
    elif (arch == "x86_64" or "+cpu" in torch_spec) and "+cpu" not in torch[0]["file"]:
        problems.append(f"{torch[0]['file']} is not the CPU build (no +cpu): refusing a CUDA torch")
    vllm = by_name.get((canonicalize_name(dist), version))
    if vllm is None:
        problems.append(f"{dist}=={version}: wheel missing")
    elif vllm_pin is None or vllm_pin[0] != version:
        problems.append(f"{dist}=={version}: the lock {lock_file} does not pin it")
    elif sha256(os.path.join(directory, vllm)) not in vllm_pin[1]:
        problems.append(f"{vllm}: sha256 {sha256(os.path.join(directory, vllm))} is not the lock's")
    if problems:
        raise Refused("wheelhouse: refusing this set:\n  " + "\n  ".join(problems))
    data = {
        "python_tag": tag, "python_version": pyver, "platform": platform, "arch": arch,
        "vllm_dist": dist, "vllm_version": version, "vllm_requirement": f"{dist}=={version}",
        "vllm_wheel": vllm, "vllm_wheel_sha256": sha256(os.path.join(directory, vllm)),
        "vllm_wheel_size": os.path.getsize(os.path.join(directory, vllm)),
        "torch_wheel": torch[0]["file"], "excluded": excluded, "inputs_key": key, "deps": deps,
        "lock_sha256": sha256(lock_file),
    }
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    return data


def summary(path):
    data, directory = _load(path), os.path.dirname(path)
    files = _files(data)
    return f"{len(files)} wheels, {sum(os.path.getsize(os.path.join(directory, f)) for f in files) / 2**20:.0f} MiB"


def _lines(lines):
    for line in lines:
        print(line)


def main(argv):
    step, args = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    steps = {
        "torch-pin": ((2, 3), lambda *a: print(torch_pin(*a))),
        "up-to-date": ((2, 3), lambda *a: 0 if up_to_date(*a) else 1),
        "lock-path": ((6,), lambda *a: print(lock_path(*a))),
        "bundle-files": ((1,), lambda *a: _lines(bundle_files(*a))),
        "requirements": ((7,), lambda *a: _lines(requirements(*a))),
        "lock": ((2,), lambda *a: _lines(lock(*a))),
        "manifest": ((12,), lambda *a: manifest(*a) and 0),
        "summary": ((1,), lambda *a: print(summary(*a))),
    }
    if step not in steps or len(args) not in steps[step][0]:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        return steps[step][1](*args) or 0
    except Refused as err:
        print(err, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
