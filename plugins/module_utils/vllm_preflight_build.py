"""Preflight's build_host room: the builder's Python, memory for the job cap, disk, the local patches."""

import os

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_releases import release_info
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_preflight_common import _overrides


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
    return problems, {"vllm_build_release": release, "vllm_build_probe": probe}
