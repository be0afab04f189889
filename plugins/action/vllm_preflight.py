"""Action plugin vllm.cpu_fleet.vllm_preflight (documented in plugins/modules/vllm_preflight.py)."""

import copy
import functools
import os
import re
import time
from pathlib import Path
from typing import ClassVar

import yaml
from ansible.errors import AnsibleError, AnsibleUndefinedVariable
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import filter_loader, lookup_loader, test_loader
from ansible.template import is_trusted_as_template, trust_as_template
from ansible.utils.display import Display
from ansible_collections.vllm.cpu_fleet.plugins.module_utils import vllm_converged, vllm_lb_backends
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_cpu_releases as releases
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight import checks
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.common import ephemeral_cache_warning
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import PlanError, plan
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import (
    InvalidReleaseRowError,
    release_overrides,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_tls import is_ip

COLLECTION = Path(__file__).resolve().parents[2]
ROLES = COLLECTION / "roles"
SECTIONS = (
    "plan",
    "toolchain",
    "build_host",
    "install",
    "service",
    "rollout",
    "container",
    "loadbalancer",
    "monitoring",
)
SECTION_ROLES = {
    "plan": "vllm_plan",
    "toolchain": "toolchain",
    "build_host": "vllm_build",
    "install": "vllm_install",
    "service": "vllm_service",
    "rollout": "rollout",
    "container": "vllm_image",
    "loadbalancer": "loadbalancer",
    "monitoring": "monitoring",
}
# The collection's files that make a host's state, for the converged digest (a change re-converges every host;
# documentation does not count).
COLLECTION_PARTS = ("roles", "plugins", "playbooks")
# What preflight derives from the inputs alone (never from the host's current state, which the run changes)
# and the roles act on: part of a host's converged digest.
DERIVED_INPUTS = (
    "vllm_install_release",
    "vllm_install_class",
    "vllm_install_torch",
    "vllm_install_wanted",
    "vllm_install_manifest",
    "vllm_build_release",
    "vllm_image_inputs",
)
# The OS facts the roles and inventories read (setup's values), for the converged digest.
OS_FACTS = (
    "distribution",
    "distribution_version",
    "distribution_major_version",
    "os_family",
    "architecture",
    "all_ipv4_addresses",
    "all_ipv6_addresses",
    "default_ipv4",
    "default_ipv6",
)
# What the roles read from the vllm_cpu facts themselves (the compiler verdict); the rest reaches them only
# through the plan. Not the facts' key: it moves with every reboot and with a NUMA node's MemTotal (a VM's
# memory hot-plug or balloon), which change nothing a role does unless they change the plan.
CPU_FACTS = ("arch", "isa")
display = Display()
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# The shared values (vllm_install_source, loadbalancer_port, ...): every section may read them.
SHARED_ROLE = "vllm_fleet"
ROLE_NAMES = (SHARED_ROLE, *SECTION_ROLES.values())
ROLE_FILES = ("defaults/main.yml", "vars/main.yml")
# A lookup a template calls by name: lookup('ansible.builtin.env', ...), query('...').
_LOOKUP = re.compile(r"\b(?:lookup|query|q)\(\s*'([A-Za-z0-9_.]+)'")
# A template that only names a variable ("{{ vllm_plan_tp }}"): half of what the roles' defaults hold.
_REFERENCE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
# A variable with a constant default ("{{ vllm_version | default(none) }}"), and those constants' values.
_DEFAULTED = re.compile(
    r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\|\s*default\(\s*(none|false|true|\{\}|\[\]|'')\s*\)\s*\}\}"
)
_CONSTANTS = {"none": None, "false": False, "true": True, "{}": {}, "[]": [], "''": ""}
# Text around references ("{{ vllm_fleet_controller_cache }}/wheelhouse"): split, references at odd indices.
_PIECES = re.compile(r"(\{\{\s*[A-Za-z_][A-Za-z0-9_]*\s*\}\})")
_TEMPLATE_MARKS = re.compile(r"\{[{%#]|[}%#]\}")
# Ansible's type names in its validator's messages ("<class '..._AnsibleTaggedStr'> cannot be converted to a float").
_TAGGED_TYPE = re.compile(r"<class '(?:[\w.]+\.)?_?(?:AnsibleTagged|AnsibleLazyTemplate)?(\w+)'>")
# Deeper than any chain of references in the roles: a loop (a: "{{ b }}", b: "{{ a }}") goes to Ansible, which says so.
_MAX_REFERENCES = 20


def _type_name(match):
    return {"Str": "a string", "List": "a list", "Dict": "a dict"}.get(match[1], match[1])


def _trusted(value):
    """The collection's own role files, trusted as templates as Ansible trusts them when it loads a role."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    if isinstance(value, dict):
        return {key: _trusted(item) for key, item in value.items()}
    return value


@functools.cache
def _role_file(role, name):
    """A YAML file of the collection's roles, parsed once per process: plain YAML in C (a tenth of Ansible's loader's
    time). Callers only read it."""
    path = ROLES / role / name
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_YAML_LOADER) or {}


@functools.cache
def _role_defaults():
    """Every role's defaults as written (names of groups, paths), for comparing an input with its default."""
    found = {}
    for role in ROLE_NAMES:
        found.update(_role_file(role, "defaults/main.yml"))
    return found


@functools.cache
def _role_vars(role, name):
    """A role's defaults or vars file, trusted as templates."""
    return _trusted(_role_file(role, name))


def _render(templar, variables, value, depth=0):
    """templar.template(value), without compiling a template for the three shapes of most trusted role defaults.

    A string that only names a variable takes that variable's rendered value; one that gives a variable a
    constant default (none, false, true, {}, [], '') takes the variable's value if it is set, else the constant;
    text around references to variables whose values are strings is those strings joined. Jinja gives the same
    values; anything else (other types to join, other expressions, a loop of references deeper than the roles
    have) goes to templar. A compile costs milliseconds and Ansible keeps no compiled template across the
    workers it forks per host, so this is most of the action's own time.
    """
    if isinstance(value, str):
        if depth < _MAX_REFERENCES and "{{" in value and is_trusted_as_template(value):
            rendered = _render_simple(templar, variables, value, depth)
            if rendered is not _NOT_SIMPLE:
                return rendered
    elif isinstance(value, dict):
        return {key: _render(templar, variables, item, depth) for key, item in value.items()}
    elif isinstance(value, list):
        return [_render(templar, variables, item, depth) for item in value]
    return templar.template(value)


_NOT_SIMPLE = object()


def _render_simple(templar, variables, value, depth):
    """_render's shortcuts for a trusted template, or _NOT_SIMPLE."""
    match = _REFERENCE.fullmatch(value)
    if match:
        if match[1] in variables:
            return _render(templar, variables, variables[match[1]], depth + 1)
        return _NOT_SIMPLE
    match = _DEFAULTED.fullmatch(value)
    if match:
        if match[1] not in variables:
            return copy.copy(_CONSTANTS[match[2]])
        try:
            return _render(templar, variables, variables[match[1]], depth + 1)
        except AnsibleUndefinedVariable:
            # A value that renders to undefined takes the default in Jinja: templar says which.
            return _NOT_SIMPLE
    pieces = _PIECES.split(value)
    if any(_TEMPLATE_MARKS.search(text) for text in pieces[::2]):
        return _NOT_SIMPLE
    joined = []
    for index, piece in enumerate(pieces):
        if index % 2:
            name = _REFERENCE.fullmatch(piece)[1]
            if name not in variables:
                return _NOT_SIMPLE
            piece = _render(templar, variables, variables[name], depth + 1)
            if not isinstance(piece, str):
                return _NOT_SIMPLE
        joined.append(piece)
    return "".join(joined)


def _unreadable(host, name, err):
    """The problem of a variable whose value cannot be templated (a lookup of a missing file, an undefined name)."""
    said = " ".join(str(getattr(err, "message", "") or err).split())
    return (
        f"{host}: {name}: cannot be read: {said[:400]}; fix: make what it reads (test certificates:"
        " ansible-playbook vllm.cpu_fleet.tls_test_certs), or correct the variable."
    )


def _address_text(value):
    """An address as the server lines write it (str() of a string or a number), or None for what did not render
    to one."""
    return str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None


def _options(role):
    return _role_file(role, "meta/argument_specs.yml")["argument_specs"]["main"]["options"]


@functools.cache
def _distribution_compilers():
    """{file stem: gcc version} of every distribution the toolchain role has a vars file for (Debian-12: "12")."""
    files = sorted((ROLES / "toolchain" / "vars").glob("*-*.yml"))
    versions = {path.stem: _role_file("toolchain", f"vars/{path.name}") for path in files}
    return {stem: found["toolchain_gcc_distribution_version"] for stem, found in versions.items()}


@functools.cache
def _collection_signature():
    """The collection's files that make a host's state, as the converged digest holds them (the same all run)."""
    return [
        vllm_converged.tree_signature(COLLECTION / part, ("__pycache__",), (".md",), content=True)
        for part in COLLECTION_PARTS
    ]


def _load_template_plugins():
    """Load the Jinja plugins the roles' files call: Ansible loads every builtin filter and test file at a process's
    first filter or test, and a lookup at its first call, so each worker forked per host would load them again."""
    filter_loader.get("ansible.builtin.basename")
    test_loader.get("ansible.builtin.version")
    texts = yaml.safe_dump([_role_file(role, name) for role in ROLE_NAMES for name in ROLE_FILES])
    for name in sorted(set(_LOOKUP.findall(texts))):
        lookup_loader.get(name)


# Read now, at import: Ansible imports this plugin in its main process (the strategy loads the class before it
# queues the task) and forks a worker per host, so every host's run inherits them instead of reading ~20 files,
# walking the collection's files and loading the template plugins again.
for _role in ROLE_NAMES:
    for _name in ROLE_FILES:
        _role_vars(_role, _name)
    _options(_role)
_distribution_compilers()
_collection_signature()
_load_template_plugins()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    ARGUMENT_SPEC: ClassVar[dict] = {
        "sections": {"type": "list", "elements": "str", "choices": list(SECTIONS)},
        "gather_subset": {
            "type": "list",
            "elements": "str",
            "choices": ["addresses", "network", "systemd"],
            "default": [],
        },
        "converged": {"type": "bool", "default": False},
        "fleet": {"type": "dict"},
        "fleet_only": {"type": "bool", "default": False},
        "collection_plays": {"type": "bool", "default": False},
    }
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    @staticmethod
    def _variables(task_vars, roles):
        """task_vars over the roles' vars and defaults: in a role's own task they are there already."""
        merged = {}
        for role in (SHARED_ROLE, *roles):
            merged.update(_role_vars(role, "defaults/main.yml"))
        for role in roles:
            merged.update(_role_vars(role, "vars/main.yml"))
        merged.update(task_vars)
        return merged

    @staticmethod
    def _typed(host, role, merged, templar):
        """The role's variables templated and typed by its argument spec: (values, problems).

        Each value rendered goes back into merged (templar's variables): a later template that references it reads
        the value instead of rendering it again (Ansible renders a variable anew at every reference).
        """
        options = _options(role)
        provided, unreadable = {}, []
        for name in options:
            if name in merged:
                try:
                    merged[name] = provided[name] = _render(templar, merged, merged[name])
                except AnsibleError as err:
                    # A value that reads a file or a variable that is not there (a certificate not made yet, a
                    # cache not filled): named with the rest, and the checks go on without it.
                    unreadable.append(_unreadable(host, name, err))
                    merged.pop(name)
        result = ArgumentSpecValidator(options).validate(provided)
        problems = [
            f"{host}: {_TAGGED_TYPE.sub(_type_name, message)}; fix: give it the type"
            f" roles/{role}/meta/argument_specs.yml names"
            for message in result.error_messages
        ]
        # The planner reads its knobs itself (and checks them); every other role reads its variables as written.
        if role != "vllm_plan":
            problems += checks.written_types(host, options, provided, result.validated_parameters)
        problems += checks.host_paths(host, options, result.validated_parameters)
        problems += checks.host_directories(host, result.validated_parameters)
        problems += checks.one_line(host, options, result.validated_parameters)
        problems += checks.pip_indexes(host, result.validated_parameters)
        return result.validated_parameters, problems, unreadable

    def _sections(self, host, task_vars, merged, templar):
        groups = task_vars.get("groups", {})
        is_vllm_host = host in groups.get("vllm_hosts", [])
        # A load balancer is not planned: its inputs are typed here, its checks are its role's tasks.
        balances = ["loadbalancer"] if host in groups.get("loadbalancers", []) else []
        # A monitoring host is not planned either; every host the exporters run on (site.yml: vLLM hosts, load
        # balancers, monitoring hosts, while the monitoring group has hosts) reads the exporters' knobs.
        watchers = groups.get(_render(templar, merged, merged.get("monitoring_group", "monitoring")), [])
        watched = watchers and (is_vllm_host or balances or host in watchers)
        balances += ["monitoring"] if watched else []
        if balances and not is_vllm_host and host not in groups.get("builders", []):
            return balances
        sections = ["plan", "toolchain", *balances]
        builders = groups.get("builders", [])
        if _render(templar, merged, merged.get("vllm_install_source", "index")) == "wheel" and (
            host in builders or not builders
        ):
            sections.append("build_host")
        fleet = getattr(self, "_fleet_values", None)
        serving, building = ActionModule._container_roles(host, task_vars, merged, templar, fleet)
        if is_vllm_host:
            # A container host installs no venv: the image is its install (the container section).
            sections += ["service", "rollout"] if serving else ["install", "service", "rollout"]
        if serving or building:
            sections.append("container")
        return sections

    @staticmethod
    def _fleet(task_vars):
        """What the checks read of the fleet's other hosts, the same for every host of a run: whether any vLLM host
        of the inventory serves from a container (its inventory value: the default is venv; a value that does not
        render counts for none). Each hostvars[host] builds that host's whole variable set (its facts copied and
        cleaned): read for every host by every host, the run's cost grew with the square of the fleet, so the
        preflight play reads it once (fleet_only, run_once) and passes it to every host (fleet)."""
        hostvars = task_vars.get("hostvars", {})
        containers = False
        for name in task_vars.get("groups", {}).get("vllm_hosts", []):
            try:
                containers = str(hostvars[name].get("vllm_service_mode", "venv")) == "container"
            except (KeyError, AnsibleError):
                continue
            if containers:
                break
        # The run's day (UTC): every host of the run names the same image base (its refresh period) by it.
        return {"containers": containers, "run_day": int(time.time() // 86400)}

    @staticmethod
    def _container_roles(host, task_vars, merged, templar, fleet=None):
        """(serving, building): whether this host serves from a container (vllm_service_mode), and whether it may
        build the fleet's image (a host of the image builders' group, or a vLLM host where there is none) while any
        vLLM host of the inventory serves from one (_fleet)."""
        groups = task_vars.get("groups", {})
        vllm_hosts = groups.get("vllm_hosts", [])
        serving = (
            host in vllm_hosts and _render(templar, merged, merged.get("vllm_service_mode", "venv")) == "container"
        )
        builders = groups.get(_render(templar, merged, merged.get("vllm_image_builders_group", "builders")), [])
        if not (host in builders or (not builders and host in vllm_hosts)):
            return serving, False
        if serving:
            return serving, True
        return serving, bool((ActionModule._fleet(task_vars) if fleet is None else fleet).get("containers"))

    def _warn_ephemeral_cache(self, task_vars):
        """Said once per run (fleet_only): a job of AWX / Automation Platform whose controller cache ends with it."""
        merged = self._variables(task_vars, [])
        try:
            cache = _render(self._templar.copy_with_new_env(available_variables=merged), merged,
                            merged.get("vllm_fleet_controller_cache"))
        except AnsibleError:
            return  # each host's checks name what does not render
        warning = ephemeral_cache_warning(cache, task_vars, os.environ.get("PWD") or os.getcwd())
        if warning:
            display.warning(warning)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        host = task_vars.get("inventory_hostname", "host")
        _unused, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        if args["fleet_only"]:
            result.update(changed=False, fleet=self._fleet(task_vars))
            self._warn_ephemeral_cache(task_vars)
            # The inventory's release rows are the fleet's: a known release they replace is said once per run.
            if task_vars.get(releases.OVERRIDES_VARIABLE):
                try:
                    overrides = self._templar.template(task_vars[releases.OVERRIDES_VARIABLE])
                except AnsibleError:
                    overrides = None  # each host's checks name what does not render
                for warning in releases.replaced_row_warnings(overrides):
                    display.warning(warning)
            return result
        roles = [SECTION_ROLES[name] for name in SECTIONS]
        merged = self._variables(task_vars, roles)
        templar = self._templar.copy_with_new_env(available_variables=merged)
        # The fleet's values read once for the run (the preflight play), else by this host when it needs them.
        self._fleet_values = args["fleet"]
        sections = args["sections"] or self._sections(host, task_vars, merged, templar)

        problems, warnings, v = [], [], {}
        # The container section reads the service's inputs too (the model source, the keys, the extra environment).
        serves = "container" in sections and host in task_vars.get("groups", {}).get("vllm_hosts", [])
        typed = [SHARED_ROLE, *(SECTION_ROLES[name] for name in sections), *(["vllm_service"] if serves else [])]
        unreadable = []
        for role in dict.fromkeys(typed):
            values, found, unread = self._typed(host, role, merged, templar)
            v.update(values)
            problems += found
            unreadable += unread
        # Read by the checks but in no argument spec: the inventory's release rows, and vllm_service's
        # model argument (derived in its vars/main.yml).
        for name in ("vllm_release_overrides", "vllm_service_model_arg"):
            if name in merged:
                v[name] = _render(templar, merged, merged[name])
        if "plan" in sections and "vllm_version" in merged:
            # The fleet's release, which the roles' own versions follow (a load balancer has none).
            v["vllm_version"] = _render(templar, merged, merged["vllm_version"])
        if "service" in sections:
            v["vllm_service_tls_names"] = self._tls_names(host, merged, templar, task_vars)
            # What the role writes into each instance's environment besides the plan's (vllm_service_extra_env
            # may not replace it).
            runtime_env = _role_file("vllm_service", "vars/main.yml")["vllm_service_runtime_env"]
            v["vllm_service_runtime_env_names"] = sorted(runtime_env)
        found, releases_known = checks.versions(host, v)
        problems += checks.bounds(host, v) + found
        # Across the host's roles: the directories each owns are apart.
        problems += checks.owned_overlaps(host, v)
        problems += checks.names(host, v, task_vars.get("groups", {}), _role_defaults())
        if args["collection_plays"]:
            problems += checks.play_groups(host, v)
        if "loadbalancer" in sections:
            problems += checks.loadbalancer(host, v, self._backend_addresses(v, task_vars))
        if "service" in sections:
            problems += checks.service_sources(host, v)
        if "monitoring" in sections:
            groups = task_vars.get("groups", {})
            problems += checks.monitoring(
                host,
                v,
                monitoring_host=host in groups.get(v["monitoring_group"], []),
                loadbalancer=host in groups.get("loadbalancers", []),
            )
        if problems:
            # Wrong types make every later check guess: say them first, alone.
            return self._fail(result, unreadable + problems)

        facts = dict(task_vars.get("ansible_facts", {}))
        recorded = live_servers = None
        probe = self._probe_spec(sections, v)
        # The controller's model as names, sizes and times: it names the version a host stages
        # (roles/vllm_service/tasks/model_path.yml), and its size is the room that needs there.
        model_files = None
        if "service" in sections and v.get("vllm_service_model_source") == "path" and v.get("vllm_service_model_path"):
            model_files = vllm_converged.tree_signature(v["vllm_service_model_path"])
            name = os.path.basename(str(v["vllm_service_model_path"]).rstrip("/"))
            models = f"{v['vllm_service_home']}/models"
            probe["service"]["models_dir"] = models
            probe["service"]["model_version"] = (
                f"{models}/.versions/{name}@{vllm_converged.digest(model_files)[:16]}"
            )
        watchers = task_vars.get("groups", {}).get(v.get("monitoring_group", "monitoring"), [])
        if "monitoring" in sections and host in watchers and v.get("monitoring_prometheus_retention_size") == "auto":
            # The size of Prometheus' file system (monitoring_prometheus_retention_size: auto).
            probe["storage"] = {"path": v["monitoring_prometheus_storage_path"]}
        if args["converged"]:
            probe["converged"] = {"path": v["vllm_fleet_converged_record"]}
            if "loadbalancer" in sections:
                # Which servers are not ready there: their hosts are not converged (vllm_converged.decide_fleet).
                probe["loadbalancer"] = {
                    "socket": v["loadbalancer_admin_socket"],
                    "backend": v["loadbalancer_backend_name"],
                }
        new_facts = {}
        if "plan" in sections or probe or "vllm_cpu" not in facts:
            # The facts of the plan section, or the cached ones confirmed by their key (a changed host is read again).
            # An inventory that reads more network facts than the addresses asks for setup's whole subset.
            subsets = [v.get("vllm_fleet_network_facts", s) if s == "addresses" else s for s in args["gather_subset"]]
            module = self._read_host(merged, templar, facts, probe, subsets, task_vars)
            if module.get("failed"):
                return self._fail(result, [*unreadable, f"{host}: {self._facts_failure(module, merged, templar)}"])
            probe = module.get("vllm_host_probe", {})
            recorded = probe.pop("converged", None)
            live_servers = probe.pop("loadbalancer", None)
            new_facts = module["ansible_facts"]
            facts.update(new_facts)
            merged["ansible_facts"] = facts
            templar = self._templar.copy_with_new_env(available_variables=merged)

        host_plan = None
        if "plan" in sections:
            options = _render(templar, merged, merged["vllm_plan_options"])
            overrides = options.pop("release_overrides", None) or {}
            try:
                with release_overrides(overrides):
                    host_plan = plan(facts["vllm_cpu"], options)
                new_facts["vllm_plan"] = host_plan
            except PlanError as err:
                problems += err.problems
            except InvalidReleaseRowError as err:
                problems += [f"{host}: {p}" for p in err.problems]
        elif "vllm_plan" in task_vars:
            host_plan = templar.template(task_vars["vllm_plan"])
        elif {"build_host", "service"} & set(sections):
            missing_plan = f"{host}: no vllm_plan fact; run the vllm_plan role (site.yml's first play) first."
            return self._fail(result, [*unreadable, missing_plan])

        if not releases_known:
            # The planner named the unknown vllm_version (versions() a role's own): every check below reads the release.
            return self._fail(result, unreadable + problems)
        if "toolchain" in sections:
            role_templar = self._templar.copy_with_new_env(
                available_variables=dict(merged, role_path=str(ROLES / "toolchain"))
            )
            stem, dist_vars = self._distribution(role_templar)
            found, said, out = checks.toolchain(host, v, facts, stem, dist_vars, _distribution_compilers())
            problems += found
            warnings += said
            new_facts.update(out)
        # Without a plan (it failed above, its problems said) the checks that need one wait for the fix.
        if "build_host" in sections and host_plan:
            found, out = checks.build_host(host, v, host_plan, probe["build"])
            problems += found
            new_facts.update(out)
        if "install" in sections:
            found, out = checks.install(
                host,
                v,
                facts,
                host_plan,
                probe["install"],
                v["vllm_install_wheel_pending"],
                v["vllm_install_toolchain_pending"],
            )
            problems += found
            new_facts.update(out)
        if "service" in sections:
            # The address the load balancers write into this host's server lines, now that the facts it may read
            # are here.
            address = self._backend_address(host, merged, templar, task_vars, v)
            if address:
                problems += checks.backend_addresses(host, address[0], {host: address[1]})
        if "service" in sections and host_plan:
            loadbalancers = task_vars.get("groups", {}).get(v["vllm_service_loadbalancer_group"], [])
            problems += checks.service(host, v, facts, host_plan, probe["service"], loadbalancers)
            problems += checks.model_room(host, v, probe["service"], model_files)
        if "rollout" in sections:
            problems += checks.rollout(host, v)
        if "service" in sections:
            problems += checks.mode_knobs(host, v["vllm_service_mode"], self._set_knobs(task_vars))
        if "container" in sections:
            serving, building = self._container_roles(host, task_vars, merged, templar, self._fleet_values)
            v["vllm_image_base_day"] = (self._fleet_values or {}).get("run_day", int(time.time() // 86400))
            found, out = checks.container(
                host,
                v,
                facts,
                host_plan if serving else None,
                probe["container"],
                serving=serving,
                building=building,
                wheel_pending=boolean(_render(templar, merged, merged.get("vllm_install_wheel_pending", False))),
            )
            problems += found
            new_facts.update(out)
        if "monitoring" in sections:
            watchers = task_vars.get("groups", {}).get(v["monitoring_group"], [])
            problems += checks.monitoring_platform(host, facts, host in watchers)
            problems += checks.monitoring_hosts(host, v["monitoring_group"], watchers)
            if "storage" in probe:
                # monitoring_prometheus_retention_size: auto, from the size of the storage's file system.
                new_facts["monitoring_prometheus_retention_size_auto"] = checks.auto_retention_size(
                    probe["storage"]["size_bytes"]
                )
        if recorded:
            problems += checks.converged_record(host, recorded)

        for warning in warnings:
            display.warning(warning)
        if problems or unreadable:
            return self._fail(result, unreadable + problems)
        if args["converged"]:
            new_facts["vllm_fleet_converged_inputs"] = {
                "own": self._own_digest(sections, v, facts, host_plan, new_facts),
                "peers": self._peers(host, sections, v, groups=task_vars.get("groups", {})),
                "recorded": recorded,
                "full_converge": v["vllm_fleet_full_converge"],
                "record": v["vllm_fleet_converged_record"],
                # What a monitoring host reads of this host beyond its own digest: its exporters' knobs and the
                # address it is scraped at (module_utils/vllm_converged.py, decide_fleet).
                "watch": self._watch_digest(host, v, merged, templar, new_facts) if "monitoring" in sections else None,
                "monitors": host in task_vars.get("groups", {}).get(v["monitoring_group"], []),
                # A container host needs its builder too: the image is made there.
                "installs_wheel": "service" in sections
                and (v["vllm_install_source"] == "wheel" or v["vllm_service_mode"] == "container"),
                # A load balancer's servers that are not ready (drain, maint): their hosts take the full run.
                "not_ready": self._not_ready(live_servers),
            }
        if model_files is not None:
            # The role skips its copy while this and the host's files are what the version's copy left.
            new_facts["vllm_service_model_files"] = vllm_converged.digest(model_files)
        result.update(changed=False, ansible_facts=new_facts)
        return result

    @staticmethod
    def _tls_names(host, merged, templar, task_vars):
        """What the host's certificate must name: its inventory name (HAProxy's verifyhost, unless it is an address)
        and the addresses the load balancers and (with monitoring hosts) Prometheus use for it, where they render
        now (an address from facts not gathered yet is checked by the clients at the host's gate)."""
        names = [] if is_ip(host) else [host]
        variables = [_render(templar, merged, merged.get("loadbalancer_backend_address_var", "ansible_host"))]
        monitoring = _render(templar, merged, merged.get("monitoring_group", "monitoring"))
        if task_vars.get("groups", {}).get(monitoring):
            variables.append(_render(templar, merged, merged.get("monitoring_target_address_var", "ansible_host")))
        for name in variables:
            try:
                value = _render(templar, merged, merged[name]) if name in merged else host
            except AnsibleError:  # an address from facts not gathered yet is left to the clients
                continue
            if isinstance(value, str) and value and value not in names:
                names.append(value)
        return names

    @staticmethod
    def _backend_address(host, merged, templar, task_vars, v):
        """(variable, value): this host's address on its load balancers' server lines (the variable
        loadbalancer_backend_address_var names, else the inventory name), or None where no load balancer balances
        it or it does not render yet (an address from facts not gathered: the load balancer says it). The variable
        is the first load balancer's, as vllm_service_listen_address's default reads it."""
        loadbalancers = task_vars.get("groups", {}).get(v["vllm_service_loadbalancer_group"])
        if not loadbalancers:
            return None
        try:
            name = task_vars.get("hostvars", {})[loadbalancers[0]].get("loadbalancer_backend_address_var")
        except (KeyError, AnsibleError):
            name = None
        try:
            name = name or _render(templar, merged, merged.get("loadbalancer_backend_address_var", "ansible_host"))
            value = _render(templar, merged, merged[name]) if name in merged else host
        except AnsibleError:
            return None
        return (name, _address_text(value)) if _address_text(value) is not None else None

    @staticmethod
    def _backend_addresses(v, task_vars):
        """{backend host: its address} as the load balancer's server lines take it (vllm_lb_servers: the value of
        the variable loadbalancer_backend_address_var names, else the inventory name), for the hosts whose address
        renders now (one from facts not gathered yet is checked again by the role's preflight, after they are)."""
        hostvars = task_vars.get("hostvars", {})
        variable = v.get("loadbalancer_backend_address_var", "ansible_host")
        found = {}
        for name in task_vars.get("groups", {}).get(v.get("loadbalancer_backend_group", "vllm_hosts"), []):
            try:
                value = hostvars[name].get(variable, name)
            except (KeyError, AnsibleError):
                continue
            if _address_text(value) is not None:
                found[name] = _address_text(value)
        return found

    @staticmethod
    def _own_digest(sections, v, facts, host_plan, new_facts):
        """The digest of everything of this host's own that its roles act on (module_utils/vllm_converged.py)."""
        model = v.get("vllm_service_model_path") if v.get("vllm_service_model_source") == "path" else None
        # The monitoring role runs on every run, converged hosts included (site.yml): its knobs and section are no
        # input of what the record holds (a new retention time must not converge the fleet again).
        unrecorded = {"vllm_fleet_full_converge", *_options("monitoring")}
        return vllm_converged.digest(
            {
                "collection": _collection_signature(),
                "sections": [name for name in sections if name != "monitoring"],
                # Forcing a full run is not an input: the record it keeps or writes is the same.
                "options": {name: value for name, value in v.items() if name not in unrecorded},
                "plan": host_plan,
                "cpu": {name: (facts.get("vllm_cpu") or {}).get(name) for name in CPU_FACTS},
                "os": {name: facts.get(name) for name in OS_FACTS},
                "derived": {name: new_facts.get(name) for name in DERIVED_INPUTS},
                "model_files": vllm_converged.tree_signature(model) if model else None,
            }
        )

    @staticmethod
    def _watch_digest(host, v, merged, templar, new_facts=None):
        """The digest of what a monitoring host's files say of this host besides its own digest: the exporters' and
        monitoring knobs as this host's variables give them (left out of its own digest, so that a new retention
        time converges the monitoring hosts only) and the address Prometheus scrapes it at."""
        name = v.get("monitoring_target_address_var") or "ansible_host"
        try:
            address = _render(templar, merged, merged[name]) if name in merged else host
        except AnsibleError:  # an address from facts not gathered yet: the monitoring host converges (None)
            address = None
        options = _options("monitoring")
        # What preflight derived for the monitoring role on a monitoring host: the retention size auto gives.
        derived = (new_facts or {}).get("monitoring_prometheus_retention_size_auto")
        return vllm_converged.digest(
            {
                "options": {key: value for key, value in v.items() if key in options},
                "address": str(address),
                **({"retention_size_auto": derived} if derived else {}),
            }
        )

    @staticmethod
    def _peers(host, sections, v, groups):
        """The hosts whose own inputs this host's files depend on: its load balancers (their addresses in the
        firewall) and builders (the wheel) for a vLLM host, the backends for a load balancer, and the monitoring
        hosts for both."""
        peers = []
        if "service" in sections:
            peers += groups.get(v["vllm_service_loadbalancer_group"], [])
            if v["vllm_install_source"] == "wheel" or v.get("vllm_service_mode") == "container":
                peers += groups.get("builders", [])
        if "loadbalancer" in sections:
            peers += groups.get(v["loadbalancer_backend_group"], [])
        # The instance firewall and HAProxy's exporter admit the monitoring hosts: one joining or leaving
        # converges them.
        if {"service", "loadbalancer"} & set(sections):
            peers += groups.get(v["monitoring_group"], [])
        # A monitoring host's files (scrape targets, rules, the instances' CA) come from every host it watches:
        # the exporters run on the vLLM hosts, the load balancers and the monitoring hosts.
        if host in groups.get(v["monitoring_group"], []):
            peers += groups.get(v["loadbalancer_backend_group"], []) + groups.get("vllm_hosts", [])
            peers += groups.get("loadbalancers", []) + groups.get(v["monitoring_group"], [])
        return sorted(set(peers) - {host})

    @staticmethod
    def _not_ready(live_servers):
        """{server: 'drain' | 'maint'} of a load balancer's answer; {} without one (no HAProxy yet, a socket that does
        not answer: the load balancer play converges it and the rollout reads every server again)."""
        text = (live_servers or {}).get("servers_state")
        if not text:
            return {}
        try:
            states = vllm_lb_backends.server_states(text)
        except vllm_lb_backends.BackendError:
            return {}
        return {name: state["admin"] for name, state in sorted(states.items()) if state["admin"] != "ready"}

    @staticmethod
    def _probe_spec(sections, v):
        spec = {}
        if "install" in sections:
            spec["install"] = {
                "python": v["vllm_install_python"],
                "root": v["vllm_install_root"],
                "version": v["vllm_install_version"] or "",
                "host_wheelhouse": v["vllm_install_host_wheelhouse"],
                "active_link": v["vllm_install_active_link"],
                # Where rollout snapshots live (as roles/vllm_install/tasks/prune.yml reads them).
                "snapshot_dirs": [v.get("rollout_state_dir", "/var/lib/vllm-rollout"), "/var/lib/vllm-rollback"],
            }
        if "build_host" in sections:
            spec["build"] = {
                "python": v["vllm_build_python"],
                "dirs": [v["vllm_build_work_root"], v["vllm_build_ccache_dir"]],
            }
        if "service" in sections:
            spec["service"] = {"user": v["vllm_service_user"], "listen_address": v["vllm_service_listen_address"]}
        if "container" in sections:
            spec["container"] = checks.container_probe_spec(v)
        return spec

    @staticmethod
    def _set_knobs(task_vars):
        """The knobs of one mode the inventory (or -e) sets to other than their role default, as written: the
        container section refuses those of the other mode."""
        defaults = _role_defaults()
        return sorted(
            name
            for name in (*checks.VENV_ONLY, *checks.CONTAINER_ONLY)
            if name in task_vars and task_vars[name] != defaults.get(name)
        )

    @staticmethod
    def _facts_failure(module, merged, templar):
        """The facts module's failure, naming the inputs it read by their variables."""
        message = module.get("msg", "vllm_cpu_facts failed")
        numa = _render(templar, merged, merged.get("vllm_plan_numa", "strict"))
        choices = _options("vllm_plan")["vllm_plan_numa"]["choices"]
        if numa not in choices:
            return f"vllm_plan_numa: is {numa!r}; fix: set it to one of {', '.join(choices)}."
        root = _render(templar, merged, merged.get("vllm_plan_facts_root", "/"))
        if root != "/":
            return f"vllm_plan_facts_root: {root}: {message}"
        return message

    def _read_host(self, merged, templar, facts, probe, gather_subset, task_vars):
        """One run of vllm_cpu_facts: the facts (or the cached ones confirmed by their key) and the probe's answers."""
        args = {
            "root": _render(templar, merged, merged.get("vllm_plan_facts_root", "/")),
            "numa": _render(templar, merged, merged.get("vllm_plan_numa", "strict")),
            "gather_subset": gather_subset,
        }
        if "vllm_cpu" in facts and "vllm_cpu_key" in facts:
            args["cache_key"] = facts["vllm_cpu_key"]
        if probe:
            args["probe"] = probe
        return self._execute_module(module_name="vllm.cpu_fleet.vllm_cpu_facts", module_args=args, task_vars=task_vars)

    def _distribution(self, templar):
        """The toolchain role's vars file for this host (its rule: roles/toolchain/vars/main.yml) and its contents."""
        path = templar.template(trust_as_template("{{ toolchain_vars_file }}"))
        if not path:
            return "", {}
        return Path(path).stem, _role_file("toolchain", f"vars/{Path(path).name}")

    @staticmethod
    def _fail(result, problems):
        # Sections that read the same input say the same problem (an unknown release: the plan, the toolchain,
        # the build and the install): once. A variable that could not be read is said once, as unreadable, not
        # again by the checks that then saw it empty.
        problems = list(dict.fromkeys(problems))
        unread = tuple(p[: p.index(" cannot be read: ")] for p in problems if " cannot be read: " in p)
        problems = [p for p in problems if " cannot be read: " in p or not p.startswith(unread)] if unread else problems
        result.update(failed=True, changed=False, problems=problems, msg="\n".join(problems))
        return result
