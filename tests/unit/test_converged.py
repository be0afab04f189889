"""The converged record: the decision to skip a host, and the witnesses read on the host (real files)."""

import grp
import json
import os
import pwd
import shutil
import weakref

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.filter.vllm_converged import vllm_converged_decide
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_converged import (
    decide,
    decide_fleet,
    digest,
    read_record,
    tree_signature,
    unwritable,
    write_record,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.checks import converged_record

OWN, LB, LB2 = "a" * 64, "b" * 64, "c" * 64


def recorded(own=OWN, peers=None, drift=()):
    return {"inputs": {"own": own, "peers": {"lb": LB} if peers is None else peers}, "drift": list(drift), "reason": ""}


def test_digest_does_not_depend_on_dict_order():
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})
    assert digest({"a": 1}) != digest({"a": "1"})


def test_a_host_whose_inputs_and_peers_are_as_recorded_is_skipped():
    out = decide(OWN, {"lb": LB}, recorded())
    assert out == {
        "inputs": {"own": OWN, "peers": {"lb": LB}},
        "converged": True,
        "reason": "unchanged since the last run",
        "forget": False,
    }


@pytest.mark.parametrize(
    ("own", "peers", "record", "reason"),
    [
        (OWN, {"lb": LB}, {"inputs": None, "drift": [], "reason": "no converged record"}, "no converged record"),
        ("d" * 64, {"lb": LB}, recorded(), "its own inputs changed since the last run"),
        (OWN, {"lb": LB2}, recorded(), "inputs of its peers changed since the last run: lb"),
        (OWN, {"lb": LB, "lb2": LB2}, recorded(), "inputs of its peers changed since the last run: lb2"),
        (OWN, {}, recorded(), "inputs of its peers changed since the last run: lb"),
        (OWN, {"lb2": None}, recorded(peers={}), "peers not in this run and not recorded: lb2"),
        (OWN, {"lb": LB}, recorded(drift=["/etc/vllm/a.env was changed"]), "/etc/vllm/a.env was changed"),
    ],
)
def test_anything_else_converges_the_host(own, peers, record, reason):
    out = decide(own, peers, record)
    assert not out["converged"]
    assert reason in out["reason"]
    # A record that no longer describes the host goes before the first change; no record: nothing to remove.
    assert out["forget"] is bool(record["inputs"])


def test_a_peer_outside_the_run_stands_at_its_recorded_digest():
    out = decide(OWN, {"lb": None}, recorded())
    assert out["converged"]
    assert out["inputs"]["peers"] == {"lb": LB}


def test_full_converge_runs_the_host_but_keeps_a_record_that_still_holds():
    out = decide(OWN, {"lb": LB}, recorded(), full_converge=True)
    assert (out["converged"], out["forget"], out["reason"]) == (False, False, "vllm_fleet_full_converge is set")
    out = decide("d" * 64, {"lb": LB}, recorded(), full_converge=True)
    assert (out["converged"], out["forget"]) == (False, True)


def fleet_inputs(lb_own=LB, vllm_own=OWN, builder_own="e" * 64, full_converge=False):
    """One vLLM host that installs built wheels, its load balancer and a builder, each with a matching record."""
    return {
        "vllm1": {
            "own": vllm_own,
            "peers": ["lb", "builder"],
            "recorded": recorded(peers={"lb": LB, "builder": "e" * 64}),
            "installs_wheel": True,
            "full_converge": full_converge,
        },
        "lb": {"own": lb_own, "peers": ["vllm1"], "recorded": recorded(LB, {"vllm1": OWN})},
        "builder": {"own": builder_own, "peers": [], "recorded": recorded("e" * 64, {})},
    }


def test_the_fleet_decision_skips_every_host_whose_record_holds():
    out = decide_fleet(fleet_inputs(), ["builder"])
    assert {host: d["converged"] for host, d in out.items()} == {"vllm1": True, "lb": True, "builder": True}


def test_a_changed_load_balancer_converges_its_backends_and_their_builder():
    out = decide_fleet(fleet_inputs(lb_own=LB2), ["builder"])
    assert out["lb"]["reason"] == "its own inputs changed since the last run"
    assert out["vllm1"]["reason"] == "inputs of its peers changed since the last run: lb"
    # vllm1's install runs and takes its wheel from the build play, whose manifest makes the build itself a no-op.
    assert (out["builder"]["converged"], out["builder"]["reason"]) == (False, "builds for vllm1")


def test_a_builder_converges_while_a_changing_host_installs_its_wheels():
    out = decide_fleet(fleet_inputs(vllm_own=OWN[:-1] + "f"), ["builder"])
    assert (out["builder"]["converged"], out["builder"]["reason"]) == (False, "builds for vllm1")
    assert not out["builder"]["forget"]  # its own record still describes it


def test_the_fleet_decision_takes_a_peer_outside_the_run_at_its_recorded_digest():
    inputs = fleet_inputs()
    del inputs["lb"]
    out = decide_fleet(inputs, ["builder"])
    assert out["vllm1"]["converged"]
    assert out["vllm1"]["inputs"]["peers"]["lb"] == LB


def test_the_builder_names_at_most_five_hosts_it_builds_for():
    template = fleet_inputs(vllm_own="f" * 64)["vllm1"]
    inputs = {f"vllm{i:02d}": dict(template) for i in range(8)}
    inputs["builder"] = fleet_inputs()["builder"]
    out = decide_fleet(inputs, ["builder"])
    assert out["builder"]["reason"] == "builds for vllm00, vllm01, vllm02, vllm03, vllm04 and 3 more"


def test_the_filter_reads_each_hosts_preflight_fact_and_names_a_host_without_one():
    hostvars = {host: {"vllm_fleet_converged_inputs": fact} for host, fact in fleet_inputs().items()}
    out = vllm_converged_decide(hostvars, ["vllm1", "lb", "builder"], ["builder"])
    assert all(d["converged"] for d in out.values())
    hostvars["lb"] = {}
    with pytest.raises(AnsibleFilterError, match=r"^lb: vllm_fleet_converged_inputs is not what .*fix: run the"):
        vllm_converged_decide(hostvars, ["vllm1", "lb"], [])


def test_the_filter_keeps_no_hosts_variables_while_it_reads_the_next():
    """Ansible's hostvars[host] builds the host's whole variable set, and what it returns refers to it: holding
    every host's fact as returned would hold every set at once, memory growing faster than the fleet."""

    class VariableSet:
        """Stands for a host's variables; a value read from it refers back to it, as Ansible's lazy containers do."""

        def __init__(self, fact):
            self.fact = fact

        def get(self, name):
            value = Fact(self.fact)
            value.variables = self
            return value

    class Fact(dict):
        pass

    facts = fleet_inputs()
    alive = []

    class HostVars:
        def __getitem__(self, host):
            assert not [ref for ref in alive if ref() is not None], "an earlier host's variables are still held"
            variables = VariableSet(facts[host])
            alive.append(weakref.ref(variables))
            return variables

    out = vllm_converged_decide(HostVars(), ["vllm1", "lb", "builder"], ["builder"])
    assert all(d["converged"] for d in out.values()) and len(alive) == 3


@pytest.fixture
def host(tmp_path):
    """A small host tree: a config directory, a model tree and the active-version link."""
    etc = tmp_path / "etc" / "vllm"
    etc.mkdir(parents=True)
    (etc / "vllm-0.env").write_text("VLLM_CPU_KVCACHE_SPACE=1\n")
    (etc / "plan.json").write_text("{}\n")
    (etc / "plan.json").chmod(0o644)  # whatever the umask
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (tmp_path / "opt-1").mkdir()
    (tmp_path / "current").symlink_to(tmp_path / "opt-1")
    spec = {"files": [str(etc)], "trees": [str(model)], "links": [str(tmp_path / "current")], "units": []}
    return tmp_path, spec


def test_a_written_record_reads_back_with_no_drift_and_is_written_once(host):
    root, spec = host
    record = root / "state" / "converged.json"
    inputs = {"own": OWN, "peers": {}}
    changed, witness = write_record(str(record), inputs, spec)
    assert changed
    assert sorted(witness["files"]) == [str(root / "etc/vllm/plan.json"), str(root / "etc/vllm/vllm-0.env")]
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    assert read_record(str(record)) == {"inputs": inputs, "drift": [], "reason": ""}
    assert write_record(str(record), inputs, spec)[0] is False
    assert write_record(str(record), {"own": LB, "peers": {}}, spec, check=True)[0] is True
    assert json.loads(record.read_text())["inputs"] == inputs  # check mode wrote nothing


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda root: (root / "etc/vllm/vllm-0.env").write_text("edited\n"), "vllm-0.env was changed"),
        (lambda root: (root / "etc/vllm/plan.json").unlink(), "plan.json is gone"),
        (lambda root: (root / "etc/vllm/extra.env").write_text("x"), "extra.env is new"),
        (lambda root: (root / "models/tiny/config.json").write_text("{1}"), "the files under"),
        (lambda root: (root / "models/tiny/weights.bin").write_text(""), "the files under"),
        (lambda root: ((root / "current").unlink(), (root / "current").symlink_to(root)), "no longer points at"),
        (lambda root: (root / "etc/vllm/vllm-0.env").chmod(0o666), "vllm-0.env has mode and owner 0666 "),
        (lambda root: (root / "etc/vllm").chmod(0o777), "etc/vllm has mode and owner 0777 "),
        (lambda root: os.chown(root / "etc/vllm/plan.json", 65534, 65534), "plan.json has mode and owner 0644 65534:"),
    ],
)
def test_every_kind_of_change_on_the_host_is_drift(host, change, said):
    root, spec = host
    record = root / "converged.json"
    write_record(str(record), {"own": OWN, "peers": {}}, spec)
    change(root)
    out = read_record(str(record))
    assert out["inputs"] == {"own": OWN, "peers": {}}
    assert len(out["drift"]) == 1
    assert said in out["drift"][0]
    assert not decide(OWN, {}, out)["converged"]


@pytest.mark.parametrize(
    ("enabled", "drift"),
    [("enabled", []), ("generated", []), ("disabled", ["vllm@vllm-0.service is disabled"])],
)
def test_a_unit_that_starts_at_boot_is_no_drift_and_a_quadlet_unit_is_generated(host, monkeypatch, enabled, drift):
    root, spec = host
    fake = root / "bin"
    fake.mkdir()
    (fake / "systemctl").write_text(f'#!/bin/sh\n[ "$1" = is-active ] && echo active || echo {enabled}\n')
    (fake / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    spec = {**spec, "units": ["vllm@vllm-0.service"]}
    write_record(str(root / "converged.json"), {"own": OWN, "peers": {}}, spec)
    assert read_record(str(root / "converged.json"))["drift"] == drift


def test_the_users_and_groups_the_units_run_as_are_witnessed(tmp_path):
    """A user deleted or re-created by hand is drift: the files keep its old number, so their modes would not say."""
    me, my_group = pwd.getpwuid(os.getuid()), grp.getgrgid(os.getgid())
    spec = {"users": [me.pw_name], "groups": [my_group.gr_name]}
    record = tmp_path / "converged.json"
    _unused, witnessed = write_record(str(record), {"own": OWN, "peers": {}}, spec)
    assert witnessed["accounts"] == {
        f"user {me.pw_name}": f"{me.pw_uid}:{me.pw_gid} {me.pw_dir}",
        f"group {my_group.gr_name}": str(my_group.gr_gid),
    }
    assert read_record(str(record))["drift"] == []
    # What the record says when the accounts it names are gone or have other numbers (the real ones stay as they are).
    saved = json.loads(record.read_text())
    saved["spec"] = {"users": [me.pw_name, "no-such-user-vllm-fleet"], "groups": ["no-such-group-vllm-fleet"]}
    saved["witness"]["accounts"] = {
        f"user {me.pw_name}": "4242:4242 /nowhere",
        "user no-such-user-vllm-fleet": "999:999 /var/lib/vllm",
        "group no-such-group-vllm-fleet": "999",
    }
    record.write_text(json.dumps(saved))
    out = read_record(str(record))
    assert sorted(out["drift"]) == sorted(
        [
            "group no-such-group-vllm-fleet is gone",
            f"user {me.pw_name} is {me.pw_uid}:{me.pw_gid} {me.pw_dir}, was 4242:4242 /nowhere",
            "user no-such-user-vllm-fleet is gone",
        ]
    )
    assert not decide(OWN, {}, out)["converged"]


@pytest.mark.parametrize(
    ("text", "reason"),
    [(None, "no converged record"), ("{", "is unreadable"), ('{"format": 0, "inputs": {}}', "has another format")],
)
def test_a_missing_unreadable_or_foreign_record_is_no_record(tmp_path, text, reason):
    path = tmp_path / "converged.json"
    if text is not None:
        path.write_text(text)
    out = read_record(str(path))
    assert out["inputs"] is None
    assert reason in out["reason"]
    assert decide(OWN, {}, out)["reason"] == out["reason"]


@pytest.mark.parametrize(
    ("layout", "said"),
    [
        ("directory", "converged.json is a directory"),
        ("file-parent", "state, where its directory would be, is not a directory"),
        ("file-grandparent", "state, where its directory would be, is not a directory"),
    ],
)
def test_a_record_path_something_is_in_the_way_of_is_refused_before_the_run(tmp_path, layout, said):
    path = tmp_path / "state" / "fleet" / "converged.json"
    if layout == "directory":
        path.mkdir(parents=True)
    elif layout == "file-parent":
        path.parent.parent.mkdir()
        path.parent.write_text("")
        said = "fleet" + said.removeprefix("state")
    else:
        path.parent.parent.write_text("")
    out = read_record(str(path))
    assert out["inputs"] is None
    assert said in out["unwritable"]
    assert not decide(OWN, {}, out)["converged"]
    (problem,) = converged_record("h", out)
    assert problem.startswith(f"h: vllm_fleet_converged_record: {tmp_path}/")
    assert "; fix: " in problem
    with pytest.raises(OSError):
        write_record(str(path), {"own": OWN, "peers": {}}, {})


@pytest.mark.parametrize("layout", ["missing", "missing-parents", "file", "link-to-file"])
def test_a_record_path_that_can_hold_the_record_passes(tmp_path, layout):
    path = tmp_path / "state" / "converged.json"
    if layout == "missing":
        path.parent.mkdir()
    elif layout == "file":
        path.parent.mkdir()
        path.write_text("{}")
    elif layout == "link-to-file":
        path.parent.mkdir()
        (tmp_path / "elsewhere.json").write_text("{}")
        path.symlink_to(tmp_path / "elsewhere.json")
    assert unwritable(str(path)) == ""
    assert converged_record("h", read_record(str(path))) == []
    write_record(str(path), {"own": OWN, "peers": {}}, {})


def test_the_tree_signature_sees_size_and_time_and_skips_caches(tmp_path):
    (tmp_path / "a.py").write_text("x")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.pyc").write_text("y")
    first = tree_signature(tmp_path, ("__pycache__",))
    assert [entry[0] for entry in first] == ["a.py"]
    os.utime(tmp_path / "a.py", ns=(1, 1))
    assert tree_signature(tmp_path, ("__pycache__",)) != first
    assert tree_signature(tmp_path / "missing") == []
    (tmp_path / "README.md").write_text("z")
    assert [entry[0] for entry in tree_signature(tmp_path, ("__pycache__",), (".md",))] == ["a.py"]


def test_the_collections_signature_is_its_content_not_its_times(tmp_path):
    """A second clone (same files, other times) is the same collection; an edit of the same size is another."""
    first = tmp_path / "clone-1"
    (first / "roles").mkdir(parents=True)
    (first / "roles" / "a.yml").write_text("x: 1\n")
    (first / "b.py").write_text("print(1)\n")
    second = tmp_path / "clone-2"
    shutil.copytree(first, second)
    for path in (second / "roles" / "a.yml", second / "b.py"):
        os.utime(path, ns=(1, 1))
    assert tree_signature(second) != tree_signature(first)  # by times: another tree
    assert tree_signature(second, content=True) == tree_signature(first, content=True)
    (second / "b.py").write_text("print(2)\n")
    os.utime(second / "b.py", ns=(1, 1))
    assert tree_signature(second, content=True) != tree_signature(first, content=True)


def test_the_own_digest_holds_every_option_but_the_full_converge_switch():
    from ansible_collections.vllm.cpu_fleet.plugins.action.vllm_preflight import ActionModule

    v = {"vllm_service_port": 8000, "vllm_fleet_full_converge": False, "vllm_service_model_source": "hub"}
    cpu = {"arch": "x86_64", "isa": {"avx512f": True}, "memory_mib": 1024}
    base = {"vllm_cpu_key": "k", "distribution": "Debian", "vllm_cpu": cpu}

    def own(facts=None, plan=None, **changes):
        return ActionModule._own_digest(["plan"], {**v, **changes}, facts or base, plan or {"instances": []}, {})

    assert own(vllm_fleet_full_converge=True) == own()
    assert own(vllm_service_port=8001) != own()
    assert own(plan={"instances": [1]}) != own()
    # What the roles read from the CPU facts (the compiler verdict) is an input ...
    assert own(facts={**base, "vllm_cpu": {**cpu, "isa": {"avx512f": False}}}) != own()
    assert own(facts={**base, "vllm_cpu": {**cpu, "arch": "aarch64"}}) != own()
    # ... the facts' key is not: a reboot or a VM's balloon moves it, and reaches the roles only through the plan.
    assert own(facts={**base, "vllm_cpu_key": "k2", "vllm_cpu": {**cpu, "memory_mib": 2048}}) == own()


MON = "7" * 64
WATCH = {"vllm1": "8" * 64, "lb": "9" * 64, "mon": "6" * 64}


def watched_fleet():
    """fleet_inputs() with a monitoring host that watches vllm1 and lb, each record as the last run wrote it: vllm1
    and lb have the monitoring host as a peer by its own digest; it has them by their decided inputs and watch
    digests."""
    inputs = fleet_inputs()
    for host in ("vllm1", "lb"):
        inputs[host]["peers"].append("mon")
        inputs[host]["recorded"]["inputs"]["peers"]["mon"] = MON
        inputs[host]["watch"] = WATCH[host]
    inputs["mon"] = {"own": MON, "watch": WATCH["mon"], "monitors": True, "peers": ["lb", "vllm1"], "recorded": None}
    inputs["mon"]["recorded"] = {"inputs": decide_fleet(inputs, ["builder"])["mon"]["inputs"], "drift": []}
    return inputs


def test_a_monitoring_host_whose_record_holds_is_skipped_like_every_host():
    out = decide_fleet(watched_fleet(), ["builder"])
    assert {host: d["converged"] for host, d in out.items()} == {
        "builder": True,
        "lb": True,
        "mon": True,
        "vllm1": True,
    }


def test_an_exporter_knob_of_one_host_converges_the_monitoring_host_alone():
    inputs = watched_fleet()
    inputs["vllm1"]["watch"] = "5" * 64  # its host_class label, say: its own digest does not move
    out = decide_fleet(inputs, ["builder"])
    assert [host for host, d in out.items() if not d["converged"]] == ["mon"]
    assert out["mon"]["reason"] == "inputs of its peers changed since the last run: vllm1"
    assert out["mon"]["forget"]


def test_a_monitoring_knob_converges_the_monitoring_host_alone():
    # The monitoring host's own monitoring knobs (a retention time) are in its watch digest, not its own.
    inputs = watched_fleet()
    inputs["mon"]["watch"] = "4" * 64
    out = decide_fleet(inputs, ["builder"])
    assert [host for host, d in out.items() if not d["converged"]] == ["mon"]
    assert out["mon"]["reason"] == "its own inputs changed since the last run"


def test_a_changed_plan_converges_the_host_and_the_monitoring_host_that_scrapes_it():
    inputs = watched_fleet()
    inputs["vllm1"]["own"] = "f" * 64
    out = decide_fleet(inputs, ["builder"])
    assert not out["vllm1"]["converged"] and not out["mon"]["converged"]
    assert out["mon"]["reason"] == "inputs of its peers changed since the last run: lb, vllm1"


def test_a_host_whose_peers_moved_moves_its_drift_label_on_the_monitoring_host():
    # lb changed: vllm1's own digest did not, its recorded inputs (and the fleet_inputs label on its target) do.
    inputs = watched_fleet()
    inputs["lb"]["own"] = LB2
    out = decide_fleet(inputs, ["builder"])
    assert out["vllm1"]["reason"] == "inputs of its peers changed since the last run: lb"
    assert out["mon"]["reason"] == "inputs of its peers changed since the last run: lb, vllm1"


def test_a_host_that_watches_nothing_is_decided_on_its_own_digest_as_before():
    inputs = fleet_inputs()
    inputs["vllm1"]["watch"] = "3" * 64  # watched, but vllm1 is no monitoring host
    assert decide_fleet(inputs, ["builder"])["vllm1"]["converged"]


def test_a_monitoring_host_takes_a_peer_outside_the_run_at_its_recorded_value():
    inputs = watched_fleet()
    del inputs["vllm1"]
    out = decide_fleet(inputs, ["builder"])
    assert out["mon"]["converged"], out["mon"]


def test_two_monitoring_hosts_are_decided_the_same_in_any_order():
    inputs = watched_fleet()
    inputs["mon2"] = dict(inputs["mon"], own="2" * 64, peers=["lb", "mon", "vllm1"])
    inputs["mon"] = dict(inputs["mon"], peers=["lb", "mon2", "vllm1"])
    forward = decide_fleet(inputs, ["builder"])
    backward = decide_fleet(dict(reversed(list(inputs.items()))), ["builder"])
    assert forward == backward
    assert forward["mon"]["inputs"]["peers"]["mon2"] == digest(["2" * 64, WATCH["mon"]])


# ---- a server left out of the pool on a load balancer (issue 41 item 7; review N5) ----


def fleet_with_two_backends(not_ready):
    """vllm1 and vllm1-b (a host whose name starts like vllm1's), both recorded and unchanged, behind lb."""
    inputs = fleet_inputs()
    inputs["vllm1-b"] = dict(inputs["vllm1"], peers=["lb"], installs_wheel=False, recorded=recorded(peers={"lb": LB}))
    inputs["lb"] = dict(
        inputs["lb"], peers=["vllm1", "vllm1-b"], recorded=recorded(LB, {"vllm1": OWN, "vllm1-b": OWN}),
        not_ready=not_ready,
    )  # fmt: skip
    return inputs


def test_a_host_drained_on_a_load_balancer_is_not_converged_and_its_record_goes():
    out = decide_fleet(fleet_with_two_backends({"vllm1-vllm-1": "drain", "gone-vllm-0": "maint"}), ["builder"])
    assert (out["vllm1"]["converged"], out["vllm1"]["forget"]) == (False, True)
    assert out["vllm1"]["reason"] == "not in service on every load balancer: vllm1-vllm-1 is in drain on lb"
    # The load balancer itself, and a host whose name only starts the same, stay skipped; a server of a host this
    # run does not hold (gone) is no host's.
    assert out["lb"]["converged"] and out["vllm1-b"]["converged"]
    # vllm1 installs built wheels: its builder takes part, as for any changing host.
    assert out["builder"]["reason"] == "builds for vllm1"


def test_every_not_ready_server_is_named_and_ready_ones_change_nothing():
    out = decide_fleet(fleet_with_two_backends({"vllm1-b-vllm-0": "maint", "vllm1-b-vllm-1": "drain"}), ["builder"])
    assert out["vllm1-b"]["reason"] == (
        "not in service on every load balancer: vllm1-b-vllm-0 is in maint on lb; vllm1-b-vllm-1 is in drain on lb"
    )
    assert out["vllm1"]["converged"]
    quiet = decide_fleet(fleet_with_two_backends({}), ["builder"])
    assert all(d["converged"] for d in quiet.values())


def test_the_preflight_action_reads_drained_and_maintenance_servers_from_the_admin_socket_answer():
    from ansible_collections.vllm.cpu_fleet.plugins.action.vllm_preflight import ActionModule
    from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

    answer = (REPO / "tests" / "fixtures" / "haproxy" / "show_servers_state_drain_maint.txt").read_text()
    found = ActionModule._not_ready({"servers_state": answer, "error": ""})
    assert found == {"h1-vllm-1": "maint", "h2-vllm-0": "drain"}
    # No HAProxy yet, or an answer that is not HAProxy's: nothing is known out of the pool.
    assert ActionModule._not_ready({"servers_state": None, "error": "no admin socket"}) == {}
    assert ActionModule._not_ready({"servers_state": "Unknown command.\n", "error": ""}) == {}
    assert ActionModule._not_ready(None) == {}
