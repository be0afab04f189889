"""Preflight's shared helpers and the checks every host's inputs get, whatever its sections (vllm_preflight.py).

The types as written, absolute and portable host paths, one-line texts, the numbers' bounds, the names of accounts
and groups, the versions, the converged record; and the helpers more than one section uses (addresses, networks, host
names, the release overrides).
"""

import ipaddress
import math
import os
import re

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import kind_of
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import normalize_version
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_syntax import (
    account_name,
    host_path,
    network,
    number,
    owned_directory,
    pip_index_url,
    pip_trusted_host,
    say,
)

# The directories the roles create and own or chmod (and what they do there): never a system directory.
GIB = 1024**3
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
    "vllm_image_work_root": "the role builds the image in and removes what it built there",
    "vllm_image_host_dir": "the role copies image archives into and removes them from",
}
# Owned directories that may be one directory: both hold Ansible's local facts, each role its own file.
SHARED_DIRECTORIES = (frozenset(("vllm_install_local_facts_dir", "toolchain_local_facts_dir")),)
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
    "vllm_image_builders_group",
    "loadbalancer_backend_group",
)
# The group each group option must name when the collection's own playbooks run the roles: their plays run on these
# groups by name (a play's hosts: cannot read a host's variable), so another value would split the fleet in two.
PLAY_GROUPS = {
    "loadbalancer_backend_group": "vllm_hosts",
    "vllm_service_loadbalancer_group": "loadbalancers",
    "rollout_loadbalancer_group": "loadbalancers",
    "vllm_build_builders_group": "builders",
    "vllm_image_builders_group": "builders",
    "monitoring_group": "monitoring",
}
# Numbers the roles use as written, with their bounds (inclusive; None: unbounded). The planner bounds its own
# (vllm_plan_*); loadbalancer_port, vllm_service_block_size and the service's timers have their own checks.
BOUNDS = {
    "loadbalancer_max_removed_servers_percent": (0, 100),
    "loadbalancer_check_fall": (1, None),
    "loadbalancer_check_rise": (1, None),
    "loadbalancer_retries": (0, None),
    "loadbalancer_maxconn": (1, 500000),
    "loadbalancer_auth_failures_per_minute": (0, 1000000),
    "loadbalancer_drain_timeout": (0, None),
    "loadbalancer_ready_timeout": (0, None),
    "vllm_build_nice": (-20, 19),
    "vllm_build_min_free_gib": (0, None),
    "vllm_build_min_available_gib_per_job": (0, None),
    "vllm_build_timeout": (1, None),
    "vllm_fleet_run_lock_lease": (1, None),
    "rollout_min_available": (0, None),
    "vllm_build_poll_interval": (1, None),
    "vllm_install_keep_versions": (1, None),
    "vllm_install_min_free_gib": (0, None),
    "vllm_image_keep": (1, None),
    "vllm_image_base_refresh_days": (0, 3650),
    "monitoring_certificate_warning_days": (1, 3650),
    "monitoring_certificate_critical_days": (0, 3650),
    "vllm_image_min_free_gib": (0, None),
    "vllm_service_container_shm_mib": (64, 1048576),
    "vllm_service_max_model_len": (1, None),
    "vllm_service_max_num_seqs": (1, None),
    "vllm_service_max_num_batched_tokens": (1, None),
    "vllm_service_shm_mib_per_instance": (0, None),
    "vllm_service_health_stall_timeout": (1, None),
    "vllm_service_liveness_interval": (1, 3600),
    "vllm_service_liveness_timeout": (1, 600),
    "vllm_service_liveness_failures": (1, 100),
    "vllm_service_health_max_restarts": (0, None),
    "vllm_service_smoke_max_tokens": (1, None),
}
# The BOUNDS that are not whole numbers.
BOUND_FLOATS = ("vllm_build_min_available_gib_per_job", "vllm_install_min_free_gib", "vllm_image_min_free_gib")
# The role versions that default to vllm_version; the roles name directories and compare versions by them as
# written.
ROLE_VERSIONS = ("vllm_install_version", "vllm_build_version", "toolchain_vllm_version")
# What Ansible's bool filter (the roles' `| bool`) reads as true or false; the argument spec takes more (y, t).
BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0"}
WHOLE_NUMBER = re.compile(r"^\s*[+-]?[0-9]+\s*\Z")
# A DNS name: dot-separated labels of letters, digits and inner hyphens.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"^(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*\Z")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Texts that span lines by design (one_line()): PEM texts go to files of their own, the smoke prompt into JSON;
# the API keys have a check of their own.
MULTI_LINE_OPTIONS = (
    "loadbalancer_tls_certificate",
    "loadbalancer_tls_key",
    "loadbalancer_tls_ca_certificate",
    "vllm_service_tls_certificate",
    "vllm_service_tls_key",
    "vllm_fleet_backend_tls_ca_certificate",
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


def owned_overlaps(host, validated):
    """Two directories the roles own on one host are apart: one inside (or equal to) another would be given to two
    owners, or removed with the other (a rollback replaces the config directory whole)."""
    owned = sorted(
        (name, value.rstrip("/") or "/")
        for name, value in validated.items()
        if name in OWNED_DIRECTORIES and isinstance(value, str) and value.startswith("/")
    )
    problems = []
    for index, (name, value) in enumerate(owned):
        for other, other_value in owned[index + 1 :]:
            if frozenset((name, other)) in SHARED_DIRECTORIES:
                continue
            if value == other_value:
                how = f"the same directory as {other}"
            elif value.startswith(other_value + "/") or other_value == "/":
                how = f"inside {other} ({other_value!r})"
            elif other_value.startswith(value + "/") or value == "/":
                how = f"above {other} ({other_value!r})"
            else:
                continue
            problems.append(
                f"{host}: {name}: is {value!r}, {how}: {OWNED_DIRECTORIES[name]}, and"
                f" {OWNED_DIRECTORIES[other]}; fix: give each its own directory, neither inside the other."
            )
    return problems


# The roles whose pip reaches an index, and the route each can take instead (hash-pinned from the wheelhouse).
PIP_ROUTES = {
    "vllm_install_pip": "vllm_install_deps_source: wheelhouse (the default: every wheel pinned by its sha256)",
    "vllm_build_pip": "vllm_build_torch_source: wheelhouse (the default) for torch",
}


def pip_indexes(host, validated):
    """The indexes pip reaches, one per route: each URL and trusted host as pip reads it, and extra indexes only with
    their opt-in. pip takes every package from whichever of its indexes offers the highest version (it prefers
    none), so a name published on a second index replaces the one meant (dependency confusion)."""
    problems = []
    for prefix, instead in PIP_ROUTES.items():
        if f"{prefix}_index_url" not in validated:
            continue
        trusted = [item for item in validated.get(f"{prefix}_trusted_hosts") or [] if isinstance(item, str)]
        for item in validated.get(f"{prefix}_trusted_hosts") or []:
            refusal = pip_trusted_host(item)
            if refusal:
                problems.append(say(host, f"{prefix}_trusted_hosts", item, refusal))
        urls = [(f"{prefix}_index_url", validated[f"{prefix}_index_url"])] if validated[f"{prefix}_index_url"] else []
        extras = validated.get(f"{prefix}_extra_index_urls") or []
        urls += [(f"{prefix}_extra_index_urls", item) for item in extras]
        for name, url in urls:
            refusal = pip_index_url(url, trusted)
            if refusal:
                problems.append(say(host, name, url, refusal))
        if extras and validated.get(f"{prefix}_allow_extra_indexes") is not True:
            problems.append(
                f"{host}: {prefix}_extra_index_urls: is {extras!r}, more indexes beside"
                f" {validated[f'{prefix}_index_url'] or 'the one in the host pip configuration'}, and pip takes each"
                " package from whichever index offers the highest version, so a name published on another replaces"
                f" the one meant (dependency confusion); fix: serve every package from one index ({prefix}_index_url:"
                f" a mirror or proxy that carries them all), use {instead}, or set {prefix}_allow_extra_indexes: true"
                " to accept the mix."
            )
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


def play_groups(host, v):
    """Under the collection's playbooks (site.yml, upgrade.yml through preflight.yml): each group option names the
    group those playbooks' plays run on."""
    return [
        f"{host}: {name}: is {v[name]!r}, but the collection's playbooks run their plays on the group {group!r}"
        f" whatever it says, so the roles and the plays would disagree on which hosts are {group}; fix: put the hosts"
        f" in the group {group!r} and drop {name}, or run the roles from a playbook of your own."
        for name, group in PLAY_GROUPS.items()
        if name in v and v[name] != group
    ]


def bounds(host, v):
    """The numbers of BOUNDS inside their range (a null leaves vLLM's or the role's default)."""
    problems = []
    for name, (low, high) in BOUNDS.items():
        value = v.get(name)
        if value is None:
            continue
        # A value the argument spec could not convert (-e gives strings) is still here as written.
        _unused, refusal = number(value, low, high, whole=name not in BOUND_FLOATS)
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
    if isinstance(wanted, (int, float)) and not isinstance(wanted, bool):
        # An unquoted 0.32 in YAML: a number, which the roles' versions that follow it render as "0.32".
        known = False
        problems.append(
            f"{host}: vllm_version: is the number {wanted!r} (YAML reads an unquoted version with one dot as a"
            " number, and 0.30 as 0.3); fix: quote the whole release as the table names it, such as"
            ' vllm_version: "0.32.0".'
        )
        wanted = str(wanted)
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


def networks(host, name, v, netmask=False):
    """Each entry of the list option name is an address or a network, as strict as its destinations read it
    (vllm_syntax.network: HAProxy ACLs, nftables sets, systemd's IPAddressAllow=; netmask: HAProxy alone reads it):
    no host bits, /0 only with vllm_fleet_allow_every_source, no keyword or name."""
    everyone = v.get("vllm_fleet_allow_every_source") is True
    problems = []
    for index, entry in enumerate(v.get(name) or []):
        refusal = network(entry, netmask=netmask, everyone=everyone)
        if refusal and refusal.problem == "no address or network":
            # The wording the first check had (tests and runbooks quote it).
            problems.append(
                f"{host}: {name}: {entry!r} is no address or network; fix: list addresses or CIDR networks, such as"
                " 10.0.5.0/24 or 2001:db8::/64."
            )
        elif refusal:
            problems.append(say(host, f"{name}[{index}]", entry, refusal))
    return problems


# What AWX / Automation Platform injects into every job's variables (the older name first).
JOB_VARIABLES = ("tower_job_id", "awx_job_id")
# Where ansible-runner keeps a job inside an execution environment: its private data directory, removed with it.
RUNNER_DIR = "/runner"


def ephemeral_cache_warning(cache, task_vars, cwd):
    """A warning when a job of AWX / Automation Platform keeps the controller cache where the job's end removes it
    (its working directory, the project's copy, or ansible-runner's /runner), else None. The cache holds the built
    wheels, the wheelhouse, the sources and the model: lost with each job, every run builds and fetches again."""
    job = next((task_vars[name] for name in JOB_VARIABLES if task_vars.get(name) not in (None, "")), None)
    if job is None or not isinstance(cache, str) or not cache:
        return None
    path = os.path.normpath(os.path.join(cwd, cache))
    throwaway = [base for base in (os.path.normpath(cwd), RUNNER_DIR) if path == base or path.startswith(base + "/")]
    if not throwaway:
        return None
    return (
        f"vllm_fleet_controller_cache: {path} is inside {throwaway[0]}, which job {job} removes when it ends: "
        "the built wheels, the wheelhouse, the sources and the model are made or fetched again by every job; "
        "fix: set vllm_fleet_controller_cache to a persistent directory the execution environment mounts "
        "(AWX: Settings > Jobs > Paths to expose to isolated jobs; a container group: a volume)."
    )
