"""playbooks/preflight.yml through ansible-playbook: every bad input stops the
run with a message naming host, variable and fix, and nothing is changed.

The hosts are the controller (local connection) seeing a recorded 2-socket
Sapphire Rapids (AMX) through vllm_plan_facts_root; each host of the bad run
carries exactly one mistake, so one run checks them all. The controller is
Debian 12 (gcc 12.2), which is what the compiler case relies on.
"""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, load_expected_facts
from test_fact_cache import cached

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
MACHINE = "spr-2s-amx"
BASE_PORT = 18000


def sibling_pair():
    core = load_expected_facts(MACHINE)["numa_nodes"][0]["cores"][1]
    return core[0], core[1]


@pytest.fixture(scope="module")
def busy_port():
    """A port some other program listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.fixture(scope="module")
def controller_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("controller")
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    wheels = root / "artifacts" / "x86_64"
    wheels.mkdir(parents=True)
    (wheels / "vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl").write_bytes(b"stand-in: preflight only looks for it")
    return {"model": str(model), "artifacts": str(root / "artifacts")}


def run_preflight(
    tmp_path, machine_root, controller_inputs, hosts, loadbalancers=None, env=None, monitoring=None, playbook=None
):
    inventory = tmp_path / "inventory.yml"
    common = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vllm_version": "0.32.0",
        "vllm_plan_facts_root": str(machine_root(MACHINE)),
        "vllm_plan_base_port": BASE_PORT,
        "vllm_plan_max_jobs": 1,
        "vllm_build_gcc122_workaround": True,
        "vllm_build_python": sys.executable,
        "vllm_build_work_root": str(tmp_path / "build"),
        "vllm_build_ccache_dir": str(tmp_path / "ccache"),
        "vllm_install_source": "wheel",
        "vllm_install_deps_source": "index",
        "vllm_install_artifacts_dir": controller_inputs["artifacts"],
        # The 0.32.0 wheel is built (the build role skips): preflight asks for no build input. Another release
        # would be built: with oneDNN from upstream and torch from an index, the controller holds no input for it.
        "vllm_build_artifacts_dir": controller_inputs["artifacts"],
        "vllm_build_onednn_tarball": "",
        "vllm_build_torch_source": "index",
        "vllm_install_python": sys.executable,
        "vllm_install_root": str(tmp_path / "opt-vllm"),
        "vllm_install_host_wheelhouse": str(tmp_path / "host-wheelhouse"),
        "vllm_service_model_path": controller_inputs["model"],
        "vllm_service_api_key": "preflight-test-key-5e0d7c41a9b3f826",
        # The hosts are all this controller: no listen address or firewall of their own to check.
        "vllm_service_listen_address": "0.0.0.0",
        "vllm_service_firewall": "none",
        "loadbalancer_plain_http": True,
        # Plain HTTP to the instances: the hosts are this controller.
        "vllm_fleet_backend_network_trusted": True,
    }
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": common,
                    "children": {
                        "vllm_hosts": {"hosts": hosts},
                        "loadbalancers": {"hosts": {name: (loadbalancers or {})[name] for name in loadbalancers or []}},
                        # Declared even when empty, as the README asks of an inventory without monitoring.
                        "monitoring": {"hosts": dict(monitoring or {})},
                    },
                }
            }
        )
    )
    before = snapshot(tmp_path)
    result = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(inventory), str(playbook or "playbooks/preflight.yml")],
        cwd=REPO,
        env={
            **os.environ,
            "ANSIBLE_STDOUT_CALLBACK": "default",
            "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
            "ANSIBLE_FORKS": "8",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=900, check=False,
    )
    assert snapshot(tmp_path) == before, "preflight wrote under the hosts' paths"
    return result


def snapshot(tmp_path):
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "machines" not in p.parts)


def recap(output):
    """host -> {ok, changed, failed, ...} from the PLAY RECAP."""
    found = {}
    for line in output.split("PLAY RECAP")[-1].splitlines():
        match = re.match(r"^(\S+)\s+:\s+(.*)$", line.strip())
        if match:
            found[match.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))}
    return found


def failure_of(output, host):
    """The failure message(s) Ansible printed for ``host`` (one-line or indented JSON)."""
    decoder = json.JSONDecoder()
    messages = []
    for match in re.finditer(r"^fatal: \[" + re.escape(host) + r"\]: FAILED! => ", output, re.M):
        data, _unused = decoder.raw_decode(output, match.end())
        messages.append(data.get("msg") or data.get("assertion") or json.dumps(data))
    return " ".join(messages)


def test_good_inputs_pass_and_change_nothing(tmp_path, machine_root, controller_inputs):
    result = run_preflight(tmp_path, machine_root, controller_inputs, {"good-1": {}, "good-2": {}})
    assert result.returncode == 0, result.stdout[-4000:]
    assert "Preflight passed on 2 host(s)." in result.stdout
    stats = recap(result.stdout)
    assert stats["good-1"]["changed"] == 0 and stats["good-2"]["changed"] == 0


def test_the_network_facts_are_the_addresses_unless_the_inventory_asks_for_setups_whole_subset(
    tmp_path, machine_root, controller_inputs
):
    cache = tmp_path.parent / f"{tmp_path.name}-facts"
    hosts = {"lean": {}, "whole": {"vllm_fleet_network_facts": "network"}}
    env = {"ANSIBLE_CACHE_PLUGIN": "jsonfile", "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache)}
    result = run_preflight(tmp_path, machine_root, controller_inputs, hosts, env=env)
    assert result.returncode == 0, result.stdout[-4000:]
    lean, whole = (cached(cache, host)[1] for host in ("lean", "whole"))
    for facts in (lean, whole):
        assert facts["default_ipv4"]["address"] in facts["all_ipv4_addresses"]
    assert "interfaces" in whole and "interfaces" not in lean
    addresses = ("default_ipv4", "default_ipv6", "all_ipv4_addresses", "all_ipv6_addresses")
    assert {k: lean[k] for k in addresses} == {k: whole[k] for k in addresses}


def test_each_bad_input_is_named_with_its_fix_and_nothing_changes(tmp_path, machine_root, controller_inputs, busy_port):
    cpu, sibling = sibling_pair()
    cases = {
        # host: (its one mistake, words its message must contain)
        "unknown-version": ({"vllm_version": "0.99.0"}, ["vllm_version", "not supported", "set it to one of"]),
        # The artifact store may still be empty (site.yml's build play fills it); a named wheel must exist.
        "no-wheel": (
            {"vllm_install_wheel_file": str(tmp_path / "missing" / "vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl")},
            ["vllm_install_source is wheel", "does not exist", "Build it first"],
        ),
        "offline-cpu": (
            {"vllm_plan_omp_threads_bind": ["1-3,999"]},
            ["vllm_plan_omp_threads_bind[0]", "999", "does not exist or is offline", "fix: drop it"],
        ),
        "shared-core": (
            {"vllm_plan_omp_threads_bind": [f"{cpu}", f"{sibling}"]},
            ["vllm_plan_omp_threads_bind[1]", "same physical core", "fix:"],
        ),
        "kv-too-big": ({"vllm_plan_kvcache_gib": 600}, ["vllm_plan_kvcache_gib", "fix: lower kvcache_gib"]),
        "weights-fit-nowhere": ({"vllm_plan_model_size_gib": 5000}, ["vllm_plan_model_size_gib", "fit no NUMA node"]),
        "tp-six": ({"vllm_plan_tp": 6}, ["vllm_plan_tp", "size 6 is not supported", "fix:"]),
        "old-gcc": (
            {"vllm_build_gcc122_workaround": False},
            ["old-gcc: vllm_version: vLLM 0.32.0 needs gcc >= 12.3 on x86_64", "Debian-12 installs gcc 12.2.0",
             "fix: build this class on a builder group host running", "Ubuntu-24 (gcc 13.2.0)",
             "vllm_build_gcc122_workaround: true"],
        ),
        "lb-port": (
            {"loadbalancer_port": BASE_PORT},
            ["loadbalancer_port", str(BASE_PORT), "fix: move vllm_plan_base_port"],
        ),
        "port-taken": (
            {"vllm_plan_base_port": busy_port},
            [f"port {busy_port} is held by", "vllm_plan_base_port", "fix:"],
        ),
        "no-model": (
            {"vllm_service_model_path": str(tmp_path / "nowhere")},
            ["vllm_service_model_path", "no config.json", "point it at"],
        ),
        # The key would cross the network to the instances in clear text.
        "plain-untrusted": (
            {"vllm_fleet_backend_network_trusted": "false"},
            ["plain-untrusted: vllm_service_tls_certificate: is empty, so the instances serve plain HTTP",
             "vllm_fleet_backend_network_trusted: true"],
        ),
        "tls-without-ca": (
            {"vllm_service_tls_certificate": "-----BEGIN CERTIFICATE-----", "vllm_service_tls_key": "tls-s3cret-key"},
            ["tls-without-ca: vllm_fleet_backend_tls_ca_certificate: is empty, and this host has a certificate"],
        ),
        "small-disk": ({"vllm_build_min_free_gib": 1000000}, ["GiB free under", "vllm_build_min_free_gib", "fix:"]),
        "gpu-mem-flag": (
            {"vllm_service_extra_args": ["--gpu-memory-utilization", "0.95"]},
            ["--gpu-memory-utilization", "size RAM", "vllm_plan_gpu_memory_utilization"],
        ),
        "no-api-key": (
            {"vllm_service_api_key": ""},
            ["vllm_service_api_key: is empty", "fix: set vllm_service_api_key", "vllm_service_allow_unauthenticated"],
        ),
        "bad-serial": ({"rollout_serial": "0%"}, ["rollout_serial", "percentage of 1-100%", "fix: set it"]),
        "network-typo": (
            {"vllm_fleet_network_facts": "all"},
            ["vllm_fleet_network_facts must be one of: addresses, network, got: all", "fix:"],
        ),
        "gpu-mem-unfit": (
            {"vllm_plan_gpu_memory_utilization": 0.6, "vllm_plan_omp_threads_bind": ["1-20", "21-40"]},
            ["vllm_plan_gpu_memory_utilization", "2 ranks on NUMA node 0", "fix: set it to at most 0.5"],
        ),
        # Values as -e or an INI inventory's [group:vars] give them (strings), which the roles read as written.
        "list-as-string": (
            {"vllm_service_extra_args": "--enable-prefix-caching"},
            ["vllm_service_extra_args: is the string '--enable-prefix-caching'", "fix: give a list"],
        ),
        "bool-y": ({"vllm_build_force": "y"}, ["vllm_build_force: is the string 'y'", "fix: write true or false"]),
        "key-as-list": ({"vllm_service_api_key": ["s3cret"]}, ["vllm_service_api_key: is a list", "fix: give a"]),
        "keep-none": (
            {"vllm_install_keep_versions": "0"},
            ["vllm_install_keep_versions: is 0, outside its range; fix: set it at least 1"],
        ),
        "v-version": ({"vllm_version": "v0.32.0"}, ["v-version: vllm_version: is 'v0.32.0'", "fix: write 0.32.0"]),
        # An unquoted 0.32 is a YAML number: named as the variable written, not as vllm_install_version (issue 44).
        "float-version": (
            {"vllm_version": 0.32},
            ["float-version: vllm_version: is the number 0.32", 'fix: quote the whole release'],
        ),
        # A line break would add a directive of its own to the unit file.
        "line-break": (
            {"vllm_service_home": "/var/lib/vllm\nExecStartPre=/bin/true"},
            ["line-break: vllm_service_home: has a line break or control character", "fix: write it on one line"],
        ),
        # What the role and the plan set, given again.
        "port-in-args": (
            {"vllm_service_extra_args": ["--port", "9999"]},
            ["vllm_service_extra_args: has --port", "--port: vllm_plan_base_port"],
        ),
        "env-over-plan": (
            {"vllm_service_extra_env": {"VLLM_CPU_KVCACHE_SPACE": "500"}},
            ["vllm_service_extra_env: sets VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_KVCACHE_SPACE: the plan"],
        ),
        # Each input checked for the syntax of the file or command it reaches (issue 32 item 9).
        "system-user": (
            {"vllm_service_user": "root", "vllm_service_group": "adm"},
            ["system-user: vllm_service_user: is 'root', a system user of the distribution",
             "system-user: vllm_service_group: is 'adm', a system group", "fix: a group of the fleet's own"],
        ),
        "system-home": (
            {"vllm_service_home": "/etc", "rollout_state_dir": "/var/lib/../lib"},
            ["system-home: vllm_service_home: is '/etc', a system directory", "fix: give a directory of the fleet's",
             "system-home: rollout_state_dir: is '/var/lib/../lib', not a normalised path"],
        ),
        # Across two roles of one host: a rollback replaces the config directory whole (issue 44 item 9).
        "owned-overlap": (
            {"vllm_service_config_dir": "/etc/ssl/private", "rollout_state_dir": "/var/lib/vllm",
             "vllm_service_home": "/var/lib/vllm"},
            ["owned-overlap: vllm_service_config_dir: is '/etc/ssl/private', inside /etc/ssl, a directory of the",
             "owned-overlap: rollout_state_dir: is '/var/lib/vllm', the same directory as vllm_service_home"],
        ),
        "quoted-key": (
            {"vllm_service_api_key": 'quo"te\\s3cret'},
            ["quoted-key: vllm_service_api_key: is a secret (not shown), not a bearer token", "fix: use a key such"],
        ),
        "weak-key": (
            {"vllm_service_api_key": "demo-api-key"},
            ["weak-key: vllm_service_api_key: is a secret (not shown), too weak: it is shorter than 24 characters",
             "fix: use a random key such as `openssl rand -hex 32`", "vllm_service_allow_weak_api_key: true"],
        ),
        "env-value": (
            {"vllm_service_extra_env": {"GREETING": "caf\u00e9", "A\nB": "1"}},
            ["env-value: vllm_service_extra_env['GREETING']: is 'caf\u00e9', has a line break, a control character",
             "env-value: vllm_service_extra_env: is 'A\\nB', not a variable name"],
        ),
        # A string where a number goes (-e gives strings): named, not a Python comparison error.
        "nice-string": (
            {"vllm_build_nice": "eighty"},
            ["nice-string: vllm_build_nice: is 'eighty', not a whole number; fix: write a whole number from -20 to"],
        ),
    }
    # A controller model larger than the room beside the served one (a sparse 15 TiB file: no copy is ever tried).
    big = tmp_path / "controller-big-model"
    big.mkdir()
    (big / "config.json").write_text("{}")
    with open(big / "model.safetensors", "wb") as weights:
        weights.truncate(15 * 1024**4)
    cases["model-room"] = (
        {"vllm_service_model_path": str(big)},
        ["model-room: vllm_service_home: /var/lib/vllm/models has ", f"the model vllm_service_model_path ({big}) is",
         "staged there beside the one the instances serve and needs 15360.00 GiB more; fix: free space there"],
    )
    # Something in the way of the converged record: the run's last step could not write it.
    (tmp_path / "record-dir").mkdir()
    cases["record-dir"] = (
        {"vllm_fleet_converged_record": str(tmp_path / "record-dir")},
        ["record-dir: vllm_fleet_converged_record: ", "record-dir is a directory on the host", "fix: remove"],
    )
    hosts = {name: variables for name, (variables, _unused) in cases.items()}
    hosts["good"] = {}
    # Strings the roles read alike (through | bool, as text): they pass.
    hosts["good-strings"] = {
        "vllm_build_force": "false",
        "toolchain_install_compiler": "true",
        "vllm_service_max_num_seqs": "8",
        "vllm_install_keep_host_wheelhouse": "no",
    }
    # A weak key on purpose (a demo's), as the -e of a run gives the choice.
    hosts["good-weak-key"] = {"vllm_service_api_key": "demo-api-key", "vllm_service_allow_weak_api_key": "true"}
    # A load balancer alone: what goes into haproxy.cfg as written is checked before its packages change.
    lb_cases = {
        "lb-words": (
            {"loadbalancer_check_interval": "2 s", "loadbalancer_metrics_allow": ["monitoring"]},
            ["lb-words: loadbalancer_check_interval: is '2 s', not a time HAProxy reads", "'monitoring' is no address"],
        ),
        # `path_beg /v1/ /#x` would be `path_beg /v1/ /` in HAProxy: every route forwarded.
        "lb-hash": (
            {"loadbalancer_allowed_path_prefixes": ["/v1/", "/#x"], "loadbalancer_log_target": "stdout # x"},
            ["lb-hash: loadbalancer_allowed_path_prefixes[1]: is '/#x', and HAProxy's configuration reads '#' in it as"
             " the start of a comment", "lb-hash: loadbalancer_log_target: is 'stdout # x'"],
        ),
    }
    loadbalancers = {"lb-port": {}, **{name: variables for name, (variables, _unused) in lb_cases.items()}}
    result = run_preflight(tmp_path, machine_root, controller_inputs, hosts, loadbalancers=loadbalancers)
    cases.update(lb_cases)
    output = result.stdout
    assert result.returncode != 0
    stats = recap(output)
    assert all(host_stats["changed"] == 0 for host_stats in stats.values()), stats
    assert "s3cret" not in output and "demo-api-key" not in output and "tls-s3cret-key" not in output
    for host, (_unused, words) in cases.items():
        message = failure_of(output, host)
        assert message, f"{host}: no failure reported\n{output[-3000:]}"
        assert message.startswith(host) or f"{host}:" in message, message
        for word in words:
            assert word in message, f"{host}: {word!r} missing from: {message}"
    # The gate runs on a host that passed (the only one here): its one failure is the gate's.
    gate = failure_of(output, "good")
    assert gate.startswith("Preflight failed on ") and "nothing was changed" in gate, gate
    assert set(re.search(r"Preflight failed on (.*?) \(", gate).group(1).split(", ")) == set(cases)


def test_monitoring_inputs_and_unreachable_targets_are_named_with_their_fix(tmp_path, machine_root, controller_inputs):
    # The monitoring hosts scrape each host at scrape_address: one of them names no host that resolves.
    hosts = {"good-1": {"scrape_address": "127.0.0.1"}, "ghost-1": {"scrape_address": "no-such-host.invalid"}}
    monitoring = {
        "mon-good": {"scrape_address": "127.0.0.1"},
        "mon-bad": {"monitoring_prometheus_retention_time": "15 days", "monitoring_alert_webhook_url": "hooks.example"},
    }
    for variables in (*hosts.values(), *monitoring.values()):
        variables["monitoring_target_address_var"] = "scrape_address"
    (tmp_path / "two").mkdir()
    result = run_preflight(tmp_path / "two", machine_root, controller_inputs, hosts, monitoring=monitoring)
    output = result.stdout
    assert result.returncode != 0
    assert all(host_stats["changed"] == 0 for host_stats in recap(output).values())
    bad = failure_of(output, "mon-bad")
    for words in (
        "mon-bad: monitoring_prometheus_retention_time: is '15 days', not a Prometheus duration above 0; fix:",
        "mon-bad: monitoring_alert_webhook_url: is no http or https URL with a host (the value is not shown: a"
        " webhook URL may carry its token); fix:",
    ):
        assert words in bad, bad
    assert "hooks.example" not in bad  # a webhook URL may be its receiver's secret
    # Two monitoring hosts would be two unclustered stacks: refused (on mon-good: mon-bad stopped at its inputs).
    two = "mon-good: monitoring_group: 'monitoring' holds 2 hosts (mon-bad, mon-good)"
    assert two in failure_of(output, "mon-good")
    (tmp_path / "one").mkdir()
    result = run_preflight(
        tmp_path / "one", machine_root, controller_inputs, hosts, monitoring={"mon-good": monitoring["mon-good"]}
    )
    output = result.stdout
    assert result.returncode != 0
    # Checked after the plans, on the monitoring host that passed: every unreachable target at once, the refused
    # ones (nothing listens on 127.0.0.1 there) fine.
    reach = failure_of(output, "mon-good")
    assert reach.startswith(
        f"mon-good: monitoring: cannot reach ghost-1 (no-such-host.invalid) port {BASE_PORT} from the monitoring host"
        " (the name does not resolve"
    ), reach
    assert "fix: open the network path from mon-good to that port, or set monitoring_target_address_var" in reach
    assert "ghost-1 (no-such-host.invalid) port 9100" in reach
    assert "good-1" not in reach and "127.0.0.1" not in reach, reach


def test_a_group_option_the_collections_plays_do_not_follow_is_refused(tmp_path, machine_root, controller_inputs):
    # playbooks/preflight.yml runs on the groups by name: a host whose options name other groups is refused there,
    # with every such option named; a host with the defaults passes its own checks.
    regrouped = {"vllm_service_loadbalancer_group": "monitoring", "loadbalancer_backend_group": "monitoring"}
    result = run_preflight(tmp_path, machine_root, controller_inputs, {"good": {}, "regrouped": regrouped})
    assert result.returncode != 0, result.stdout[-4000:]
    message = failure_of(result.stdout, "regrouped")
    expected = (("vllm_service_loadbalancer_group", "loadbalancers"), ("loadbalancer_backend_group", "vllm_hosts"))
    for name, group in expected:
        assert (
            f"regrouped: {name}: is 'monitoring', but the collection's playbooks run their plays on the group {group!r}"
            in message
        ), message
    assert "collection's playbooks" not in failure_of(result.stdout, "good")
