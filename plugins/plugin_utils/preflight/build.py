"""Preflight's build_host section: the builder's Python, memory for the job cap, disk, the local patches, and every
build input the controller must hold (oneDNN source, torch wheel, staged tarball), all named before any host
changes."""

import glob
import os
import shlex

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_common import file_sha256
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.common import _overrides
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import release_info, torch_pin
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_wheelhouse import wheelhouse_command

# scripts/onednn-source.sh by its path in this copy of the collection (preflight runs on the controller).
ONEDNN_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))),
    "scripts",
    "onednn-source.sh",
)


def _controller_sha256(path):
    """sha256 of a controller file, or None when it is not a readable file."""
    try:
        return file_sha256(path)
    except OSError:
        return None


def _built(artifacts, version):
    """Whether the controller holds a built wheel of ``version`` for some build class: then this run may build
    nothing, and the build role checks its inputs itself if new inputs make it build again."""
    pattern = os.path.join(glob.escape(artifacts), "*", f"vllm-{glob.escape(version)}[+-]*.whl")
    return bool(artifacts) and bool(glob.glob(pattern))


def build_inputs(host, v, arch, probe, release, sha256=_controller_sha256, torch_wheels=glob.glob):
    """The controller files a build of ``release`` reads: every missing or different one, each with its fix."""
    problems = []
    tarball = v.get("vllm_build_onednn_tarball") or ""
    if tarball:
        have = sha256(tarball)
        want = v["vllm_build_onednn_sha256"]
        if have != want:
            state = "is missing" if have is None else f"has sha256 {have}, not vllm_build_onednn_sha256 {want}"
            problems.append(
                f"{host}: vllm_build_onednn_tarball: {tarball} {state}; fix: run"
                f" {shlex.join(['bash', ONEDNN_SCRIPT, '--dest', os.path.dirname(tarball)])} on the controller, or"
                " set vllm_build_onednn_tarball/vllm_build_onednn_sha256 to your copy ('' clones oneDNN from"
                " GitHub)."
            )
    if v.get("vllm_build_torch_source") == "wheelhouse" and probe.get("python"):
        tag = "cp" + probe["python"].replace(".", "")
        pin = torch_pin(release["version"], arch, _overrides(v))
        wheelhouse = v["vllm_build_wheelhouse"]
        if not torch_wheels(os.path.join(glob.escape(wheelhouse), tag, f"torch-{glob.escape(pin)}-{tag}-*.whl")):
            problems.append(
                f"{host}: vllm_build_wheelhouse: {wheelhouse}/{tag} has no torch-{pin}-{tag}-*.whl"
                f" (vllm_build_torch_source: wheelhouse); fix: run"
                f" {wheelhouse_command(wheelhouse, '--vllm', release['version'], '--python', probe['python'])} on"
                " the controller, or set vllm_build_torch_source: index with vllm_build_pip_index_url an index that"
                " carries torch's CPU build and the rest."
            )
    if v.get("vllm_build_source") == "path":
        path = v.get("vllm_build_source_path") or ""
        want = v.get("vllm_build_source_sha256") or release["sdist_sha256"]
        have = sha256(path) if path else None
        if have != want:
            state = "does not exist" if have is None else f"has sha256 {have}, expected {want}"
            problems.append(
                f"{host}: vllm_build_source_path: '{path}' {state}; fix: stage vllm-{release['version']}.tar.gz"
                " there, or set vllm_build_source_sha256 for your own tarball."
            )
    return problems


def build_host(host, v, plan, probe, controller_file=os.path.isfile):
    """The builder itself: its Python, memory for the job cap, disk, the local patches."""
    problems = []
    try:
        release = release_info(v["vllm_build_version"], _overrides(v))
    except ValueError as err:
        return [f"{host}: {err}"], {}
    if v["vllm_build_source"] == "sdist" and not release["sdist_sha256"]:
        problems.append(
            f"{host}: vllm_build_source: is sdist, and vLLM {release['version']} was published without one (wheels"
            " only); fix: set vllm_build_source: git (the release's tag), or path with a tarball you made."
        )
    if probe["python"] not in release["python_versions"]:
        told = f"Python {probe['python']}" if probe["python"] else f"not runnable ({probe['python_error']})"
        problems.append(
            f"{host}: vllm_build_python ({v['vllm_build_python']}) is {told}; vLLM {release['version']} supports "
            f"{', '.join(release['python_versions'])}; fix: point vllm_build_python at a supported interpreter."
        )
    jobs = int(plan["build"]["max_jobs"])
    if not plan["build"]["fits_memory"]:
        problems.append(
            f"{host}: vllm_plan.build.max_jobs={jobs} compile jobs do not fit this host's memory; fix: build on a"
            f" larger host (group {v['vllm_build_builders_group']}) or lower vllm_plan_max_jobs."
        )
    available_gib = probe["mem_available_kib"] / 1048576
    per_job = float(v["vllm_build_min_available_gib_per_job"])
    if available_gib < jobs * per_job:
        problems.append(
            f"{host}: {available_gib:.1f} GiB available, MAX_JOBS={jobs} needs {jobs * per_job:g} GiB"
            f" (vllm_build_min_available_gib_per_job={per_job:g}); fix: stop what uses the memory, or lower"
            " vllm_plan_max_jobs."
        )
    free_gib = probe["disk_free_kib"] / 1048576
    if free_gib < float(v["vllm_build_min_free_gib"]):
        problems.append(
            f"{host}: {free_gib:.1f} GiB free under {v['vllm_build_work_root']} / {v['vllm_build_ccache_dir']}, the"
            f" build needs {v['vllm_build_min_free_gib']} GiB (vllm_build_min_free_gib: build tree ~0.65 GiB, venv"
            f" ~1 GiB, ccache up to {v['vllm_build_ccache_max_size']}); fix: free space or move vllm_build_work_root"
            " / vllm_build_ccache_dir."
        )
    missing = [path for path in v["vllm_build_patches"] if not controller_file(path)]
    if missing:
        problems.append(
            f"{host}: vllm_build_patches names {', '.join(missing)}, not a file on the controller; fix: correct the"
            " path or drop it from the list."
        )
    if not _built(v.get("vllm_build_artifacts_dir") or "", release["version"]):
        problems += build_inputs(host, v, plan["arch"], probe, release)
    return problems, {"vllm_build_release": release, "vllm_build_probe": probe}
