"""Preflight's container section (vllm_service_mode: container): podman on the host (missing, older than 4.3,
without crun or its default seccomp profile), room in its storage for the image, the registry, what the image is
built from (the controller's wheelhouse for the image's suite, the built wheel), and the mixes the mode cannot serve
(a model from the hub, the knobs of the other mode). A key is served on every podman it accepts: before 5.3
(whose podman inspect shows an env secret) it is a file the key middleware reads (NAME_FILE).

``container()`` judges a host that serves from a container (``serving``) and a builder that makes the image for
such hosts (``building``); ``mode_knobs()`` judges every vLLM host, whatever its mode: a knob only the other mode
reads, set in the inventory, is a setting the operator believes in and the host would ignore.
"""

from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.install import GIB
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_container import (
    ContainerUnitError,
    image_reference,
    podman_env_file,
    podman_version,
    podman_version_ok,
    shm_need_mib,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_image import image_plan, registry_problems
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_syntax import archive_url, say

# podman's storage for root (graphroot of /etc/containers/storage.conf's default) and its default seccomp profile,
# which the role derives the units' profile from (vllm_container.seccomp_profile).
PODMAN_STORAGE = "/var/lib/containers/storage"
SECCOMP_DEFAULT = "/usr/share/containers/seccomp.json"
# Knobs only the venv mode reads (roles/vllm_install, the venv unit): set on a container host, each is a setting
# the host would ignore. vllm_install_deps_source: the image installs from the wheelhouse, always.
VENV_ONLY = {
    "vllm_service_venv": "the container runs the image's venv",
    "vllm_service_distribution": "the image's distribution follows vllm_install_source",
    "vllm_install_root": "no venv is installed on the host",
    "vllm_install_python": "the image's Python is its suite's (vllm_image_suite)",
    "vllm_install_host_wheelhouse": "no wheel is copied to the host",
    "vllm_install_deps_source": "the image installs the wheelhouse's exact pins, always",
    "vllm_install_pip_index_url": "the image is built from the wheelhouse, without an index",
    "vllm_install_pip_extra_index_urls": "the image is built from the wheelhouse, without an index",
    "vllm_install_pip_trusted_hosts": "the image is built from the wheelhouse, without an index",
    "vllm_install_pip_allow_extra_indexes": "the image is built from the wheelhouse, without an index",
    "vllm_install_torch_requirement": "the image takes the wheelhouse's torch",
    "vllm_install_min_free_gib": "the image's room is vllm_image_min_free_gib",
}
# Knobs only the container mode reads.
CONTAINER_ONLY = {
    "vllm_service_container_shm_mib": "the venv units share the host's /dev/shm",
    "vllm_service_container_allow_cgroup_v1": "the venv units apply their memory limits on cgroup v1 too",
}
# The environment the container mode adds to each instance's (vllm_service_container_runtime_env).
CONTAINER_ENV = ("USER", "LOGNAME")


def probe_spec(v):
    """What the facts module's probe reads on the host for this section. The image the units will run is looked for
    once the run knows it (roles/vllm_image's reference, during the rollout's own checks): it is a podman argument,
    so only a well-formed reference is passed."""
    image = v.get("vllm_service_container_image") or ""
    return {
        "podman": "podman",
        "seccomp": SECCOMP_DEFAULT,
        "dirs": [PODMAN_STORAGE, v["vllm_image_work_root"]],
        "tools": ["crun", "debootstrap"],
        "image": image if image and image_reference(image) is None else "",
    }


def mode_knobs(host, mode, set_knobs):
    """The knobs of the other mode that the inventory sets (``set_knobs``: their names, as the action found them)."""
    other = VENV_ONLY if mode == "container" else CONTAINER_ONLY
    named = [name for name in set_knobs if name in other]
    if not named:
        return []
    where = "venv" if mode == "container" else "container"
    reasons = "; ".join(f"{name}: {other[name]}" for name in named)
    return [
        f"{host}: vllm_service_mode: is {mode}, and the inventory sets {', '.join(named)}, which only the {where} mode"
        f" reads ({reasons}); fix: set them only for the {where} hosts (their group_vars or host_vars), or drop them."
    ]


def _podman(host, probe, problems):
    """podman's version tuple, or None with the problem said."""
    if not probe["podman_version"]:
        problems.append(
            f"{host}: vllm_service_mode: is container, and podman does not run here ({probe['podman_error']}); fix:"
            " install podman 4.3 or later and crun (apt-get install podman crun), or keep vllm_service_mode: venv."
        )
        return None
    if not podman_version_ok(probe["podman_version"]):
        problems.append(
            f"{host}: vllm_service_mode: is container, and this host's podman is {probe['podman_version']!r}, older"
            " than 4.3 (the oldest whose units the role writes); fix: install podman 4.3 or later (Debian 12's, or"
            " Debian 13's 5.4 with Quadlet), or keep vllm_service_mode: venv."
        )
        return None
    return podman_version(probe["podman_version"])


def _room(host, v, probe, need_gib, path, why):
    found = probe["free"].get(path)
    if found is None or found["bytes"] >= need_gib * GIB:
        return []
    return [
        f"{host}: {found['mount']} (for {path}) has {found['bytes'] / GIB:.1f} GiB free, and {why} needs"
        f" {need_gib:g} GiB (vllm_image_min_free_gib={v['vllm_image_min_free_gib']:g}); fix: free space there, or"
        " move podman's storage (graphroot in /etc/containers/storage.conf) to a larger file system."
    ]


def container(host, v, facts, plan, probe, serving, building, wheel_pending=False):
    """A container host's or an image builder's checks: (problems, facts)."""
    # The run's day, for the image role's plans of this run: the same base on the builder and on every host.
    problems, out = [], {"vllm_image_base_day": v["vllm_image_base_day"]}
    version = _podman(host, probe, problems)
    minimum = float(v["vllm_image_min_free_gib"])
    # Room is for an image still to come: once this run has brought it (the rollout's checks run after the build
    # and the load), the space it took is no shortfall.
    image_here = bool(probe.get("image_present"))
    if building:
        if facts.get("os_family") != "Debian":
            problems.append(
                f"{host}: builds the fleet's image (a host of {v['vllm_image_builders_group']}, or the first host of a"
                f" build class), and it is {facts.get('distribution')} {facts.get('distribution_version')}: the base is"
                " made with debootstrap from the Debian archive; fix: build on a Debian or Ubuntu host (the builders"
                " group)."
            )
        if not image_here:
            problems += _room(host, v, probe, 2 * minimum, PODMAN_STORAGE, "the image, its base and their layers")
        if v["vllm_image_work_root"] != PODMAN_STORAGE and not image_here:
            problems += _room(host, v, probe, minimum, v["vllm_image_work_root"], "the image's archive")
        for name in ("vllm_image_debian_mirror", "vllm_image_debian_security_mirror"):
            refusal = archive_url(v[name])
            if refusal:
                problems.append(say(host, name, v[name], refusal))
        if not serving:
            problems += registry_problems(
                host, v["vllm_image_registry"], v["vllm_image_transfer"], v["vllm_image_registries_allowed"]
            )
    if not serving:
        return problems, out
    if version is not None and not probe["tools"].get("crun"):
        problems.append(
            f"{host}: vllm_service_mode: is container, and crun is not installed (the units run the container with"
            " crun: podman 4.4's Quadlet names it, and runc fails the nested test hosts); fix: apt-get install crun."
        )
    if probe.get("selinux_enforcing"):
        problems.append(
            f"{host}: vllm_service_mode: is container, and SELinux enforces its policy here: the units mount the"
            " model, the key middleware and the instance's home into the container without SELinux labels (no"
            " :z/:Z), which the policy denies, so no instance would start; fix: serve this host with"
            " vllm_service_mode: venv (the container mode is run and tested without SELinux only)."
        )
    if not probe["cgroup2"] and not v.get("vllm_service_container_allow_cgroup_v1"):
        problems.append(
            f"{host}: vllm_service_mode: is container, and this host mounts the cgroup v1 (or hybrid) hierarchy at"
            " /sys/fs/cgroup: the units' MemoryMax=/MemoryHigh= would not reach the container (systemd sets only"
            " MemoryLimit= there) and crun leaves the containers' devices cgroups behind; fix: boot with the unified"
            " cgroup v2 hierarchy (systemd.unified_cgroup_hierarchy=1, the default of Debian 11 and later), serve"
            " this host with vllm_service_mode: venv, or set vllm_service_container_allow_cgroup_v1: true to serve"
            " without those limits."
        )
    if version is not None and not probe["seccomp_default"]:
        problems.append(
            f"{host}: vllm_service_mode: is container, and podman's default seccomp profile {SECCOMP_DEFAULT} is"
            " missing (the units' profile is derived from it, never unconfined); fix: install containers-common"
            " (Debian: golang-github-containers-common)."
        )
    if not building and not image_here:
        problems += _room(host, v, probe, minimum, PODMAN_STORAGE, "one more image and its archive")
    if v["vllm_service_model_source"] != "path":
        problems.append(
            f"{host}: vllm_service_model_source: is {v['vllm_service_model_source']}, and the container mode serves a"
            " model copied from the controller (the image holds no model and the host no venv to download one with);"
            " fix: download it on the controller and set vllm_service_model_source: path with vllm_service_model_path."
        )
    try:
        podman_env_file(v["vllm_service_extra_env"], host=host)
    except ContainerUnitError as err:
        problems += [problem.replace("environment", "vllm_service_extra_env", 1) for problem in err.problems]
    replaced = sorted(name for name in v["vllm_service_extra_env"] if name in CONTAINER_ENV)
    if replaced:
        problems.append(
            f"{host}: vllm_service_extra_env: sets {', '.join(replaced)}, which the container mode writes (the image"
            " has no account: the service user's name); fix: drop them."
        )
    shm = v.get("vllm_service_container_shm_mib")
    if plan and isinstance(shm, int):
        short = [
            f"{instance['name']} ({shm_need_mib(instance)} MiB)"
            for instance in plan.get("instances", [])
            if isinstance(instance, dict) and shm_need_mib(instance) > shm
        ]
        if short:
            problems.append(
                f"{host}: vllm_service_container_shm_mib: is {shm}, below what vLLM's shared-memory files take at"
                f" their full size for {', '.join(short)} (vLLM refuses to start when one does not fit, and a write"
                " past the size is a SIGBUS); fix: leave it null (sized from the plan) or set at least that."
            )
    if plan:
        image, found = image_plan(
            plan["vllm_version"],
            plan["build"]["build_class"],
            plan["arch"],
            {
                "registry": v["vllm_image_registry"],
                "transfer": v["vllm_image_transfer"],
                "source": v["vllm_install_source"],
                "package": v["vllm_install_package"],
                "suite": v["vllm_image_suite"],
                "wheelhouse": v["vllm_image_wheelhouse"],
                "wheel_store": v["vllm_image_wheel_store"],
                "image_store": v["vllm_image_store"],
                "wheel_pending": wheel_pending,
                "registries_allowed": v["vllm_image_registries_allowed"],
                "base_refresh_days": v["vllm_image_base_refresh_days"],
                "base_day": v["vllm_image_base_day"],
            },
            host,
        )
        problems += found
        if image:
            out["vllm_image_inputs"] = image["inputs"]
    return problems, out
