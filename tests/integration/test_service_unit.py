"""The unit's ExecStart as roles/vllm_service renders it, through ansible-playbook, per era and distribution.

Fake local hosts plan a recorded 2-socket Sapphire Rapids with the vllm_plan role,
then render the role's instance.conf.j2 with its defaults and vars: the command
comes from the vllm_serve_command filter (the release table decides), every flag
the role sets is there, and systemd-analyze accepts the drop-in. A real vLLM
start on this command is Molecule's (molecule/serve) to prove.

The same run renders the template unit, the secrets file and the firewall (rules,
unit, nftables.service drop-in): closed when something is missing (issue 32), and
the converged record's witness of the live table (module_utils/vllm_converged.py)
is checked with a stand-in nft.
"""

import copy
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
MACHINE = "spr-2s-amx"
MODEL = "/var/lib/vllm/models/tiny-llama"

PLAY = """
- name: Render each instance's command as roles/vllm_service does
  hosts: all
  gather_facts: false
  vars_files:
    - {repo}/roles/vllm_service/vars/main.yml
  tasks:
    - name: Plan
      ansible.builtin.include_role:
        name: vllm.cpu_fleet.vllm_plan
    - name: Render the drop-ins
      ansible.builtin.template:
        src: {repo}/roles/vllm_service/templates/instance.conf.j2
        dest: "{{{{ out }}}}/{{{{ inventory_hostname }}}}-{{{{ instance.name }}}}.conf"
        mode: "0644"
      loop: "{{{{ vllm_plan.instances }}}}"
      loop_control:
        loop_var: instance
      delegate_to: localhost
    - name: Render the template unit, the secrets and the firewall
      vars:
        vllm_service_firewall_sources: [10.0.0.9, "fd00::9"]
        vllm_service_monitoring_sources: [10.0.0.8]
        vllm_service_ephemeral_ports: 32768-60999
      ansible.builtin.template:
        src: "{repo}/roles/vllm_service/templates/{{{{ item }}}}.j2"
        dest: "{{{{ out }}}}/{{{{ inventory_hostname }}}}.{{{{ item }}}}.out"
        mode: "0644"
      loop: [vllm@.service, secrets.env, firewall.nft, vllm-firewall.service, nftables-vllm-fleet.conf,
             vllm-liveness.service, vllm-liveness.timer]
      delegate_to: localhost
"""

# host: (release, distribution, more variables)
HOSTS = {
    "early-cpu": ("0.13.0", "vllm-cpu", {"vllm_service_firewall": "systemd"}),
    "middle": ("0.20.0", "vllm", {"vllm_service_api_key": "", "vllm_service_allow_unauthenticated": True}),
    "current": ("0.32.0", "vllm", {"vllm_service_max_model_len": 512}),
    "current-cpu": ("0.32.0", "vllm-cpu", {
        "vllm_service_api_key_previous": "old-key",
        "vllm_service_extra_args": ["--chat-template", 'say "hi" to $HOME at 100%', "--x", "a b"],
    }),
    "new-from-inventory": ("0.34.0", "vllm", {}),
}  # fmt: skip


def _override_034():
    row = {k: v for k, v in RELEASES["0.33.0"].items() if k != "gcc_workarounds"}
    return {"0.34.0": dict(row, version="0.34.0", git_tag="v0.34.0")}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service-unit")
    from conftest import expand

    root = expand.expand(MACHINE, tmp / "machines" / MACHINE)
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("vllm", "python"):
        (venv / "bin" / name).write_text("#!/bin/sh\n")
        (venv / "bin" / name).chmod(0o755)
    hosts = {
        name: {
            "vllm_version": version,
            "vllm_service_distribution": dist,
            "vllm_service_active_link": str(venv),
            "vllm_service_model_path": MODEL,
            "vllm_service_listen_address": "10.0.0.5",
            "vllm_service_api_key": "fleet-key",
            **more,
        }
        for name, (version, dist, more) in HOSTS.items()
    }
    # The role's defaults at the inventory's lowest level, as a role's defaults are: host variables win.
    defaults = yaml.safe_load((REPO / "roles/vllm_service/defaults/main.yml").read_text())
    inventory = {
        "all": {
            "vars": {
                **defaults,
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "vllm_plan_facts_root": str(root),
                "vllm_release_overrides": _override_034(),
                "out": str(tmp / "out"),
            },
            "hosts": hosts,
        }
    }
    (tmp / "out").mkdir()
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "play.yml").write_text(PLAY.format(repo=REPO))
    result = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp / "inventory.yml"), str(tmp / "play.yml")],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORKS": "5"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    return tmp, venv


def _exec_start(path):
    lines = [line for line in path.read_text().splitlines() if line.startswith("ExecStart=")]
    assert lines[0] == "ExecStart=", "the drop-in must reset the template's ExecStart first"
    return lines[-1][len("ExecStart=") :]


def _instances(tmp, host):
    found = sorted((tmp / "out").glob(f"{host}-vllm-*.conf"))
    assert found, host
    return found


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_each_instance_runs_the_releases_entry_point_with_every_flag(rendered, host):
    tmp, venv = rendered
    version, dist, more = HOSTS[host]
    for index, conf in enumerate(_instances(tmp, host)):
        line = _exec_start(conf)
        if dist == "vllm":
            head = f"{venv}/bin/vllm serve {MODEL} "
        else:
            head = f"{venv}/bin/python -m vllm.entrypoints.openai.api_server --model {MODEL} "
        assert line.startswith(head), line
        flags = (f"--served-model-name tiny-llama --host 10.0.0.5 --port {8000 + index} --dtype bfloat16 "
                 "--block-size 128 --middleware vllm_service_auth.RequireApiKey")  # fmt: skip
        assert line[len(head) :].startswith(flags), line
        assert f"(vLLM {version})" in conf.read_text()
        if "vllm_service_max_model_len" in more:
            assert line.endswith("--max-model-len 512")
        # vLLM never gets a key (it would log --api-key and --config values before 0.29): the middleware checks it.
        assert not [word for word in ("--api-key", "--config", "fleet-key", "old-key") if word in line], line
        if "vllm_service_api_key_previous" in more:
            assert line.endswith('--chat-template "say \\"hi\\" to $$HOME at 100%%" --x "a b"'), line


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_every_rendered_command(rendered, tmp_path):
    tmp, _unused = rendered
    for conf in sorted((tmp / "out").glob("*.conf")):
        unit = tmp_path / f"{conf.stem}.service"
        unit.write_text(f"[Service]\nType=exec\nExecStart={_exec_start(conf)}\n")
        verify = ["systemd-analyze", "verify", str(unit)]
        result = subprocess.run(verify, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0 and unit.name not in result.stderr, (conf.name, result.stderr)


def test_the_plan_behind_the_units_is_the_releases(rendered):
    tmp, _unused = rendered
    # The 0.34.0 host was planned from its inventory row alone: its drop-in names it.
    text = _instances(tmp, "new-from-inventory")[0].read_text()
    assert "(vLLM 0.34.0)" in text and "/bin/vllm serve " in text


# ---- closed when something is missing (issue 32) ----

KEYED = sorted(h for h, (*_unused, more) in HOSTS.items() if more.get("vllm_service_api_key", "fleet-key"))
NFTABLES = sorted(
    h for h, (*_unused, more) in HOSTS.items() if more.get("vllm_service_firewall", "nftables") == "nftables"
)


def _lines(rendered, host, name):
    tmp, _unused = rendered
    return [line for line in (tmp / "out" / f"{host}.{name}.out").read_text().splitlines() if not line.startswith("#")]


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_instances_require_the_firewall_and_the_secrets_file(rendered, host):
    unit = _lines(rendered, host, "vllm@.service")
    # Requires=, not Wants=: a table that fails to load keeps the instances down, stopping it stops them.
    assert ("Requires=vllm-firewall.service" in unit and "After=vllm-firewall.service" in unit) == (host in NFTABLES)
    assert not [line for line in unit if "Wants=vllm-firewall" in line]
    # The file is required (no `-`): an instance whose secrets.env is gone does not start.
    assert "EnvironmentFile=/etc/vllm/secrets.env" in unit
    assert not [line for line in unit if line.startswith("EnvironmentFile=-")], unit


def _exec_start_pre(rendered, host):
    return [
        line[len("ExecStartPre=") :]
        for line in _lines(rendered, host, "vllm@.service")
        if line.startswith("ExecStartPre=")
    ]


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_an_instance_with_a_key_configured_does_not_start_without_it(rendered, host):
    pre = _exec_start_pre(rendered, host)
    if host not in KEYED:  # serving without a key on purpose (vllm_service_allow_unauthenticated)
        assert pre == []
        return
    assert len(pre) == 1 and pre[0].startswith("/bin/sh -c "), pre
    # Run it as systemd would: `$$` is a `$`, %i the instance; the environment is what secrets.env gave.
    script = shlex.split(pre[0].replace("$$", "$").replace("%i", "vllm-0"))[2]
    for environ, code in (
        ({}, 1),
        ({"VLLM_SERVICE_API_KEY": ""}, 1),
        ({"VLLM_API_KEY": "k"}, 1),
        ({"VLLM_SERVICE_API_KEY": "k"}, 0),
        ({"VLLM_SERVICE_API_KEY": 'a "b" $c'}, 0),
    ):
        done = subprocess.run(
            ["/bin/sh", "-c", script],
            env={"PATH": "/usr/bin:/bin", **environ},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == code, (environ, done.stderr)
        assert ("no VLLM_SERVICE_API_KEY in /etc/vllm/secrets.env" in done.stderr) == bool(code), done.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_key_check(rendered, tmp_path):
    unit = tmp_path / "keycheck.service"
    unit.write_text(
        f"[Service]\nType=exec\nExecStartPre={_exec_start_pre(rendered, 'current')[0]}\nExecStart=/bin/true\n"
    )
    verify = ["systemd-analyze", "verify", str(unit)]
    result = subprocess.run(verify, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and unit.name not in result.stderr, result.stderr


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_the_secrets_file_says_to_serve_without_a_key_only_when_chosen(rendered, host):
    secrets = _lines(rendered, host, "secrets.env")
    if host in KEYED:
        assert 'VLLM_SERVICE_API_KEY="fleet-key"' in secrets
        assert not [line for line in secrets if "ALLOW_UNAUTHENTICATED" in line]
    else:
        assert secrets == ['VLLM_SERVICE_ALLOW_UNAUTHENTICATED="1"'], secrets


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_the_keys_are_kept_under_names_vllm_does_not_read(rendered, host):
    # vLLM reads VLLM_API_KEY; 0.13 to 0.28 write it verbatim into their compile cache.
    secrets = _lines(rendered, host, "secrets.env")
    assert not [line for line in secrets if line.startswith("VLLM_API_KEY")], secrets
    if "vllm_service_api_key_previous" in HOSTS[host][2]:
        assert 'VLLM_SERVICE_PREVIOUS_API_KEY="old-key"' in secrets


def _input_chain(rendered, host):
    text = "\n".join(_lines(rendered, host, "firewall.nft"))
    return [line.strip() for line in text.split("chain input {", 1)[1].split("}\n}", 1)[0].splitlines() if line.strip()]


def test_sources_reach_only_the_instance_ports(rendered):
    """The ephemeral range (vLLM's internal ZMQ/gloo listeners) admits no source: only this host (lo)."""
    tmp, _unused = rendered
    for host in NFTABLES:
        ports = sorted(8000 + i for i in range(len(_instances(tmp, host))))
        instance_ports = "{ " + ", ".join(map(str, ports)) + " }"
        chain = _input_chain(rendered, host)
        assert chain[:4] == [
            "type filter hook input priority filter; policy accept;",
            'iif "lo" accept',
            "ct state established,related accept",
            f"tcp dport != {instance_ports[:-2]}, 32768-60999 }} accept",
        ], chain
        admitted = chain[4:-1]
        assert chain[-1] == "counter reject with tcp reset"
        assert {line.split(" saddr ")[1].split()[0] for line in admitted} == {
            "@sources4", "@sources6", "@monitoring4", "@monitoring6"
        }  # fmt: skip
        for line in admitted:
            assert line.endswith(f"tcp dport {instance_ports} accept"), line


def test_the_firewall_loads_after_the_host_firewalls_and_again_after_their_flush(rendered):
    for host in NFTABLES:
        unit = _lines(rendered, host, "vllm-firewall.service")
        assert "After=nftables.service firewalld.service" in unit
        # Not PartOf=: its restart would restart every instance (they require it).
        assert not [line for line in unit if line.startswith(("PartOf=", "BindsTo="))]
        dropin = _lines(rendered, host, "nftables-vllm-fleet.conf")
        load = "/usr/sbin/nft -f /etc/vllm/firewall.nft"
        assert dropin == ["[Service]", f"ExecStartPost={load}", f"ExecReload={load}", f"ExecStopPost={load}"], dropin


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_firewall_unit_and_drop_in(rendered, tmp_path):
    tmp, _unused = rendered
    # The drop-in on a stand-in for Debian's nftables.service.
    base = "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n"
    for name, head in (("vllm-firewall.service", ""), ("nftables-vllm-fleet.conf", base)):
        unit = tmp_path / f"{name.split('.', maxsplit=1)[0]}.service"
        unit.write_text(head + (tmp / "out" / f"current.{name}.out").read_text())
        verify = ["systemd-analyze", "verify", str(unit)]
        result = subprocess.run(verify, capture_output=True, text=True, timeout=60, check=False)
        assert unit.name not in result.stderr, result.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_liveness_check_and_its_timer(rendered, tmp_path):
    tmp, _unused = rendered
    for name in ("vllm-liveness.service", "vllm-liveness.timer"):
        unit = tmp_path / name
        unit.write_text((tmp / "out" / f"current.{name}.out").read_text())
    for name in ("vllm-liveness.service", "vllm-liveness.timer"):
        result = subprocess.run(["systemd-analyze", "verify", str(tmp_path / name)], capture_output=True, text=True,
                                timeout=60, check=False)  # fmt: skip
        assert name not in result.stderr, result.stderr
    timer = (tmp / "out" / "current.vllm-liveness.timer.out").read_text()
    # After each check ended, never two at once.
    assert "\nOnUnitInactiveSec=15\n" in timer and "\nWantedBy=timers.target\n" in timer
    service = (tmp / "out" / "current.vllm-liveness.service.out").read_text()
    script = "/usr/local/lib/vllm-service/vllm_liveness.py"
    assert f"\nExecStart=/usr/bin/python3 {script} /etc/vllm/liveness.json /run/vllm-liveness\n" in service
    assert "\nCapabilityBoundingSet=\n" in service and "\nRuntimeDirectoryPreserve=yes\n" in service


# ---- the converged record witnesses the live table, not only its unit ----

LIVE = {
    "nftables": [
        {"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
        {"table": {"family": "inet", "name": "vllm_fleet", "handle": 4}},
        {"set": {"family": "inet", "name": "sources4", "table": "vllm_fleet", "type": "ipv4_addr", "handle": 2,
                 "flags": ["interval"], "elem": ["10.0.0.9"]}},
        {"chain": {"family": "inet", "table": "vllm_fleet", "name": "input", "handle": 1, "type": "filter",
                   "hook": "input", "prio": 0, "policy": "accept"}},
        {"rule": {"family": "inet", "table": "vllm_fleet", "chain": "input", "handle": 9, "expr": [
            {"counter": {"packets": 0, "bytes": 0}}, {"reject": {"type": "tcp reset"}}]}},
    ]
}  # fmt: skip


@pytest.fixture
def fake_nft(tmp_path, monkeypatch):
    """An `nft` on PATH that lists the table written to tmp_path/table.json, or fails as nft does for a missing one."""
    (tmp_path / "bin").mkdir()
    nft = tmp_path / "bin" / "nft"
    missing = "{ echo 'Error: No such file or directory' >&2; exit 1; }"
    nft.write_text(f"#!/bin/sh\n[ -f {tmp_path}/table.json ] || {missing}\nexec cat {tmp_path}/table.json\n")
    nft.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")

    def load(ruleset):
        if ruleset is None:
            (tmp_path / "table.json").unlink(missing_ok=True)
        else:
            (tmp_path / "table.json").write_text(json.dumps(ruleset))

    return load


def _reloaded(ruleset, handle_offset=10, packets=7, elem=None):
    out = copy.deepcopy(ruleset)
    for item in out["nftables"]:
        for body in item.values():
            if "handle" in body:
                body["handle"] += handle_offset
            if elem is not None and "elem" in body:
                body["elem"] = elem
            for expr in body.get("expr", []):
                if "counter" in expr:
                    expr["counter"] = {"packets": packets, "bytes": packets * 60}
    out["nftables"][0]["metainfo"]["version"] = "1.0.9"
    return out


def test_the_record_witnesses_the_live_table(fake_nft, tmp_path):
    from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_converged import read_record, write_record

    spec = {"units": [], "nft_tables": ["inet vllm_fleet"]}
    record = str(tmp_path / "state" / "converged.json")
    fake_nft(LIVE)
    _unused, witnessed = write_record(record, {"own": "a", "peers": {}}, spec)
    assert witnessed["nft_tables"]["inet vllm_fleet"]
    assert read_record(record)["drift"] == []
    # Loaded again (new handles), packets counted, another nft: the same rules, no drift; the record stays as it is.
    fake_nft(_reloaded(LIVE))
    assert read_record(record)["drift"] == []
    assert write_record(record, {"own": "a", "peers": {}}, spec)[0] is False
    # Flushed (`nft flush ruleset`, a restart of Debian's nftables.service): drift, though the unit is still active.
    fake_nft(None)
    assert read_record(record)["drift"] == ["the nftables table inet vllm_fleet is gone"]
    # Edited by hand: drift.
    fake_nft(_reloaded(LIVE, elem=["10.0.0.9", "0.0.0.0/0"]))
    assert read_record(record)["drift"] == ["the nftables table inet vllm_fleet is not the one recorded"]


def test_a_spec_without_tables_records_no_table_witness(fake_nft, tmp_path):
    from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_converged import witness

    fake_nft(LIVE)
    assert "nft_tables" not in witness({"units": []})
    assert "nft_tables" not in witness({"units": [], "nft_tables": []})
