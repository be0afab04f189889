"""Every filter and module the plugins register has documentation ansible-doc shows
(DOCUMENTATION, EXAMPLES, RETURN), and the documented options are exactly the ones the code accepts."""

import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.compat.version import LooseVersion
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_cpu_planner
from conftest import REPO

BIN = Path(sys.executable).parent
FQCN_PREFIX = "vllm.cpu_fleet."


def _load(path):
    spec = importlib.util.spec_from_file_location(f"plugin_under_doc_test_{path.stem}", path)
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    return plugin


# What Ansible registers: every name each filter plugin file returns, every module file.
FILTERS = {
    name: function
    for path in sorted(REPO.glob("plugins/filter/*.py"))
    for name, function in _load(path).FilterModule().filters().items()
}
MODULES = {path.stem: path for path in sorted(REPO.glob("plugins/modules/*.py"))}


def _ansible_doc(plugin_type, names):
    """{name: ansible-doc's JSON entry}; one call for all names, since each start costs seconds."""
    proc = subprocess.run(
        [str(BIN / "ansible-doc"), "-t", plugin_type, "-j", *(FQCN_PREFIX + name for name in names)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )
    assert proc.returncode == 0 and "Missing documentation" not in proc.stderr, proc.stderr
    return {fqcn.removeprefix(FQCN_PREFIX): entry for fqcn, entry in json.loads(proc.stdout).items()}


@pytest.fixture(scope="module")
def filter_docs():
    return _ansible_doc("filter", sorted(FILTERS))


@pytest.fixture(scope="module")
def module_docs():
    return _ansible_doc("module", sorted(MODULES))


def _assert_complete(name, entry):
    assert entry["doc"].get("short_description"), f"{name}: no short_description"
    assert entry["doc"].get("description"), f"{name}: no description"
    assert entry.get("examples"), f"{name}: no EXAMPLES"
    assert entry.get("return"), f"{name}: no RETURN"
    for option, spec in entry["doc"].get("options", {}).items():
        assert spec.get("description") and spec.get("type"), f"{name}: option {option} needs a description and a type"


def test_the_scan_sees_the_plugins():
    assert {"vllm_cpu_plan", "vllm_release", "vllm_build_assignments"} <= set(FILTERS)
    assert "vllm_cpu_facts" in MODULES


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_filter_is_documented_with_the_functions_parameters(filter_docs, name):
    entry = filter_docs[name]
    _assert_complete(name, entry)
    doc = entry["doc"]
    parameters = list(inspect.signature(FILTERS[name]).parameters.values())
    # Jinja passes the value before the pipe as the first parameter: ansible-doc calls it _input.
    names = ["_input", *(parameter.name for parameter in parameters[1:])]
    assert set(doc["options"]) == set(names), f"{name}: documented options != {names}"
    assert [part.strip() for part in doc.get("positional", "").split(",") if part.strip()] == names
    for option, parameter in zip(names, parameters, strict=True):
        spec = doc["options"][option]
        has_default = parameter.default is not inspect.Parameter.empty
        assert bool(spec.get("required")) is not has_default, f"{name}: {option} required must be {not has_default}"
        # A None default in the code means "not given" (the code substitutes {} or skips a check).
        if has_default and parameter.default is not None:
            assert spec.get("default") == parameter.default, f"{name}: {option} default != {parameter.default!r}"


def test_vllm_cpu_plan_documents_every_planner_option(filter_docs):
    suboptions = filter_docs["vllm_cpu_plan"]["doc"]["options"]["options"]["suboptions"]
    # release_overrides is taken out of the options by the filter, not by the planner.
    accepted = set(vllm_cpu_planner.DEFAULTS) | {"release_overrides"}
    assert set(suboptions) == accepted, (
        f"undocumented: {sorted(accepted - set(suboptions))}, not accepted: {sorted(set(suboptions) - accepted)}"
    )
    for option, default in vllm_cpu_planner.DEFAULTS.items():
        assert suboptions[option].get("default") == default, f"{option}: documented default != {default!r}"
    for option, (kind, *_bounds) in vllm_cpu_planner.NUMBERS.items():
        assert suboptions[option]["type"] == ("int" if kind == "int" else "float"), option
    choices = {"mode": vllm_cpu_planner.MODES, "numa": vllm_cpu_planner.NUMA_MODES, "dtype": vllm_cpu_planner.DTYPES}
    for option, accepted_values in choices.items():
        assert suboptions[option]["choices"] == list(accepted_values), option


class _SpecSeen(Exception):
    pass


def _argument_spec(path):
    """The argument_spec a module's main() gives AnsibleModule, without running the module.

    A module file that only documents an action plugin (plugins/action/<name>.py does the work): the
    argument spec that action validates its arguments with.
    """
    module = _load(path)
    action = REPO / "plugins" / "action" / path.name
    if not hasattr(module, "main") and action.is_file():
        return _load(action).ActionModule.ARGUMENT_SPEC

    def capture(argument_spec, **_):
        raise _SpecSeen(argument_spec)

    module.AnsibleModule = capture
    with pytest.raises(_SpecSeen) as seen:
        module.main()
    return seen.value.args[0]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_documented_with_its_argument_spec(module_docs, name):
    entry = module_docs[name]
    _assert_complete(name, entry)
    documented = entry["doc"].get("options", {})
    spec = _argument_spec(MODULES[name])
    assert set(documented) == set(spec), f"{name}: documented options != argument_spec {sorted(spec)}"
    for option, accepted in spec.items():
        for key in ("type", "default", "choices", "elements"):
            assert documented[option].get(key) == accepted.get(key), f"{name}: {option}: {key} differs"
        assert bool(documented[option].get("required")) == bool(accepted.get("required")), f"{name}: {option}: required"


def test_every_filter_and_module_says_the_release_that_added_it(filter_docs, module_docs):
    """version_added is the release changelogs/changelog.yaml lists the plugin under (antsibull-changelog finds new
    plugins by it), a released version, or, for one added since the last release, a version after galaxy.yml's."""
    changelog = yaml.safe_load((REPO / "changelogs/changelog.yaml").read_text())["releases"]
    listed = {}
    for release, entry in changelog.items():
        for plugin in entry.get("plugins", {}).get("filter", []):
            listed[("filter", plugin["name"])] = release
        for plugin in entry.get("modules", []):
            listed[("module", plugin["name"])] = release
    current = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    wrong = []
    for kind, docs in (("filter", filter_docs), ("module", module_docs)):
        for name, entry in docs.items():
            added = entry["doc"].get("version_added")
            if not added or added == "historical":
                wrong.append(f"{kind} {name}: no version_added")
            elif (kind, name) in listed and added != listed[(kind, name)]:
                wrong.append(f"{kind} {name}: version_added {added}, changelog.yaml lists it in {listed[(kind, name)]}")
            elif added not in changelog and LooseVersion(added) <= LooseVersion(current):
                wrong.append(f"{kind} {name}: version_added {added} is neither a release nor after {current}")
    assert not wrong, "\n".join(wrong)
