"""roles/vllm_service tasks_from snapshot and restore through ansible-playbook, on the controller (local
connection), against a temporary root (issue 31, items 6 and 9).

The snapshot must hold what ran, not only the files a run writes: the firewall's live table, the key middleware,
the install the version link named (its record) and the models' identity; restore must put those back, refuse a
directory that no longer holds that install, and refuse a snapshot whose secrets are not this run's unless told
(vllm_service_rollback_old_secrets, the rollout's -e rollout_restore_old_secrets=true). systemctl and nft are fakes
on PATH: nft keeps "the kernel's" table in a file.

Container mode (issue 30): a container host is snapshotted by the image its units name and its Quadlet files, and
a rollback gives back that image's units, the keys as podman secrets, and leaves the version link alone; a rollback
across a mode switch gives back the other mode whole. podman is a fake too (its images and secrets are files).

Negative control: VLLM_SNAPSHOT_REF=<git ref> runs that ref's snapshot.yml and the restoring task of its
rollback.yml (units directory pointed at the temporary root) and that ref's rollout files instead of the role's:
every test fails but test_a_recovery_with_the_same_secrets_or_the_flag_restores, a restore both must do.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
ENV = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_RETRY_FILES_ENABLED="0")
TABLE_OLD = "table inet vllm_fleet {\n\tset sources4 {\n\t\telements = { 10.0.0.1 }\n\t}\n}\n"
TABLE_NEW = "table inet vllm_fleet {\n\tset sources4 {\n\t\telements = { 10.9.9.9 }\n\t}\n}\n"

FAKE_SYSTEMCTL = """#!/bin/bash
echo "$*" >> "$FAKE_ROOT/systemctl.log"
case "$1" in
  list-units) echo "vllm@vllm-0.service loaded active running vLLM" ;;
  disable) [ "$2" = --now ] && rm -f "$FAKE_ROOT/nft.table" ;;
  restart) [ "$2" = vllm-firewall.service ] &&
    grep -v '^#' "$FAKE_ROOT/etc/vllm/firewall.nft" >"$FAKE_ROOT/nft.table" ;;
esac
exit 0
"""
FAKE_NFT = """#!/bin/bash
state="$FAKE_ROOT/nft.table"
[ "$1" = -s ] && shift
case "$1" in
  list) [ -f "$state" ] && cat "$state" ;;
  delete) rm -f "$state" ;;
  -f) sed '1{/^table /d}' | sed '1{/^delete table /d}' > "$state.new" && mv "$state.new" "$state" ;;
  *) exit 2 ;;
esac
"""


FAKE_PODMAN = """#!/bin/bash
echo "$*" >> "$FAKE_ROOT/podman.log"
store="$FAKE_ROOT/podman-secrets"
mkdir -p "$store"
case "$1 $2" in
  "image exists") grep -qxF "$3" "$FAKE_ROOT/podman-images" 2>/dev/null ;;
  "secret ls") ls "$store" ;;
  "secret rm") rm -f "$store/$3" ;;
  "secret create") cat > "$store/$3" ;;
  *) exit 2 ;;
esac
"""
IMAGE_OLD = "localhost/vllm-cpu-fleet/vllm:0.31.0-x86_64-0123456789abcdef"
IMAGE_NEW = "localhost/vllm-cpu-fleet/vllm:0.32.0-x86_64-fedcba9876543210"
# podman image inspect's IDs of the two images (podman image exists takes an ID as it takes a name).
ID_OLD = "sha256:" + "01" * 32
ID_NEW = "sha256:" + "fe" * 32
IDS = {IMAGE_OLD: ID_OLD, IMAGE_NEW: ID_NEW}


def write(path, text, mode=0o644):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


class Host:
    """A temporary root shaped like a serving vLLM host, and the plays that snapshot and restore it."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.config = tmp / "etc" / "vllm"
        self.units = tmp / "systemd"
        self.python = tmp / "usr" / "lib" / "vllm-service"
        self.home = tmp / "home"
        self.root = tmp / "opt" / "vllm"
        self.link = self.root / "current"
        self.snap = tmp / "rollout" / "r1"
        self.quadlet = tmp / "containers" / "systemd"
        for name, text in (("systemctl", FAKE_SYSTEMCTL), ("nft", FAKE_NFT), ("podman", FAKE_PODMAN)):
            write(tmp / "bin" / name, text, 0o755)
        write(tmp / "podman-images", f"{IMAGE_OLD}\n{IMAGE_NEW}\n{ID_OLD}\n{ID_NEW}\n")
        for version in ("0.31.0", "0.32.0"):
            write(self.root / f"{version}-x86_64" / "vllm-install.json", json.dumps({"wanted": {"version": version}}))

    def vars(self, **extra):
        return {
            "vllm_service_config_dir": str(self.config),
            "vllm_service_systemd_dir": str(self.units),
            "vllm_service_python_dir": str(self.python),
            "vllm_service_home": str(self.home),
            "vllm_service_active_link": str(self.link),
            "vllm_service_snapshot_dir": str(self.snap),
            "vllm_service_quadlet_dir": str(self.quadlet),
            "vllm_service_podman": str(self.tmp / "bin" / "podman"),
            **extra,
        }

    def serve(self, version, key, table, middleware, weights):
        """Write what a run of `version` with `key` leaves: config, secrets, units, firewall, middleware, model."""
        write(self.config / "plan.json", json.dumps({"vllm_version": version, "instances": [{"name": "vllm-0"}]}))
        write(self.config / "vllm-0.env", f"VERSION={version}\n")
        write(self.config / "firewall.nft", table)
        self.play([{"name": "Secrets as the role writes them", "ansible.builtin.template": {
            "src": str(REPO / "roles/vllm_service/templates/secrets.env.j2"),
            "dest": str(self.config / "secrets.env"), "mode": "0640"}}],
            vllm_service_api_key=key, vllm_service_api_key_previous="", vllm_service_hf_token="",
            vllm_service_allow_unauthenticated=False)  # fmt: skip
        write(self.units / "vllm@.service", f"[Service]\n# {version}\n")
        write(self.units / "vllm@vllm-0.service.d" / "instance.conf", f"ExecStart=serve {version}\n")
        write(self.units / "vllm-firewall.service", f"# firewall {version}\n")
        write(self.units / "nftables.service.d" / "vllm-fleet.conf", f"# reload {version}\n")
        write(self.tmp / "nft.table", table)
        write(self.python / "vllm_service_auth.py", middleware)
        write(self.home / "models" / "tiny" / "model.safetensors", weights)
        if self.link.is_symlink():
            self.link.unlink()
        self.link.symlink_to(self.root / f"{version}-x86_64")

    def serve_container(self, version, image, key, table):
        """Write what a container-mode run leaves: the venv mode's units gone, Quadlet's file, the image's name,
        the keys as podman secrets; the version link as the venv mode left it."""
        self.serve(version, key, table, f"# middleware {version}\n", f"weights {version}")
        (self.units / "vllm@.service").unlink()
        (self.units / "vllm@vllm-0.service.d" / "instance.conf").unlink()
        (self.units / "vllm@vllm-0.service.d").rmdir()
        write(self.quadlet / "vllm@vllm-0.container", f"[Container]\nImage={IDS[image]}\n")
        write(self.config / "image", image + "\n")
        write(self.config / "image-id", IDS[image] + "\n")
        write(self.config / "vllm-0.env", f"VERSION={version}\n")
        write(self.tmp / "podman-secrets" / "vllm-service-api-key", key)

    def play(self, tasks, **extra):
        """Run tasks on localhost with the fakes on PATH; returns (rc, output)."""
        inventory = {"all": {"hosts": {"vllmhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}  # fmt: skip
        (self.tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
        (self.tmp / "vars.yml").write_text(yaml.safe_dump(self.vars(**extra)))
        play = [{"hosts": "all", "gather_facts": False,
                 "environment": {"PATH": f"{self.tmp / 'bin'}:{os.environ['PATH']}", "FAKE_ROOT": str(self.tmp)},
                 "tasks": tasks}]  # fmt: skip
        (self.tmp / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
        proc = subprocess.run(
            [ANSIBLE_PLAYBOOK, "-i", str(self.tmp / "inventory.yml"), "-e", f"@{self.tmp / 'vars.yml'}",
             str(self.tmp / "play.yml")],
            cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        return proc.returncode, proc.stdout + proc.stderr

    def step(self, entry, **extra):
        return self.play([_task(entry, self.tmp)], **extra)


def _task(entry, tmp):
    """The role's entry point, or, for the negative control, the old ref's task file."""
    ref = os.environ.get("VLLM_SNAPSHOT_REF")
    if not ref:
        role = {"name": "vllm.cpu_fleet.vllm_service", "tasks_from": entry}
        return {"name": entry, "ansible.builtin.include_role": role}
    name = "snapshot" if entry == "snapshot" else "rollback"
    text = subprocess.run(["git", "show", f"{ref}:roles/vllm_service/tasks/{name}.yml"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    tasks = yaml.safe_load(text.replace("/etc/systemd/system", str(tmp / "systemd")))
    if entry == "restore":
        tasks = tasks[:1]  # the restoring shell; the rest starts and gates
    path = tmp / f"old-{entry}.yml"
    path.write_text(yaml.safe_dump(tasks, sort_keys=False))
    return {"name": entry, "ansible.builtin.include_tasks": str(path)}


@pytest.fixture
def host(tmp_path):
    """A host serving 0.31.0 with key k-old, snapshotted, then changed by a run to 0.32.0 with key k-new."""
    h = Host(tmp_path)
    h.serve("0.31.0", "k-old", TABLE_OLD, "# middleware 0.31\n", "old weights")
    rc, out = h.step("snapshot")
    assert rc == 0, out
    h.serve("0.32.0", "k-new", TABLE_NEW, "# middleware 0.32\n", "new weights, other size")
    return h


def ran_old(h):
    return {
        "link": os.readlink(h.link),
        "plan": json.loads((h.config / "plan.json").read_text())["vllm_version"],
        "key": "k-old" in (h.config / "secrets.env").read_text(),
        "units": (h.units / "vllm@vllm-0.service.d" / "instance.conf").read_text(),
        "firewall_unit": (h.units / "vllm-firewall.service").read_text(),
        "table": (h.tmp / "nft.table").read_text() if (h.tmp / "nft.table").exists() else None,
        "middleware": (h.python / "vllm_service_auth.py").read_text(),
    }


def test_a_rollback_of_the_run_that_took_it_gives_back_what_ran(host):
    rc, out = host.step("restore")
    assert rc == 0, out
    assert ran_old(host) == {
        "link": str(host.root / "0.31.0-x86_64"),
        "plan": "0.31.0",
        "key": True,
        "units": "ExecStart=serve 0.31.0\n",
        "firewall_unit": "# firewall 0.31.0\n",
        "table": TABLE_OLD,
        "middleware": "# middleware 0.31\n",
    }


def test_the_snapshot_holds_what_ran(host):
    assert (host.snap / "firewall" / "live.nft").read_text() == TABLE_OLD
    assert (host.snap / "python" / "vllm_service_auth.py").read_text() == "# middleware 0.31\n"
    assert (host.snap / "venv").read_text().strip() == str(host.root / "0.31.0-x86_64")
    assert json.loads((host.snap / "install.json").read_text()) == {"wanted": {"version": "0.31.0"}}
    assert str(host.home / "models" / "tiny") in (host.snap / "models.sha256").read_text()
    assert oct((host.snap).stat().st_mode & 0o777) == "0o700"


def test_a_loaded_table_is_restored_even_when_the_rules_file_differs(host):
    # What the kernel had is what ran: an edited rules file does not change it.
    rc, out = host.step("restore")
    assert rc == 0, out
    assert (host.tmp / "nft.table").read_text() == TABLE_OLD


def test_a_model_changed_since_the_snapshot_is_named(host):
    rc, out = host.play([
        _task("restore", host.tmp),
        {"name": "Show", "ansible.builtin.debug": {"msg": "DRIFT={{ vllm_service_restore_model_drift }}"}},
    ])  # fmt: skip
    assert rc == 0, out
    assert f"DRIFT=['{host.home / 'models' / 'tiny'}']" in out, out


def test_a_recovery_refuses_a_snapshot_with_older_secrets(host):
    rc, out = host.step("restore", vllm_service_rollback_old_secrets=False, vllm_service_api_key="k-new")
    assert rc != 0
    assert "rollout_restore_old_secrets=true" in out and "Nothing was restored" in out, out
    assert "k-old" not in out and "k-new" not in out, "a secret reached the output"
    assert ran_old(host)["plan"] == "0.32.0" and os.readlink(host.link) == str(host.root / "0.32.0-x86_64")
    assert (host.tmp / "nft.table").read_text() == TABLE_NEW


def test_a_recovery_with_the_same_secrets_or_the_flag_restores(host):
    rc, out = host.step("restore", vllm_service_rollback_old_secrets=False, vllm_service_api_key="k-old")
    assert rc == 0, out
    assert ran_old(host)["plan"] == "0.31.0"
    host.serve("0.32.0", "k-new", TABLE_NEW, "# middleware 0.32\n", "new weights, other size")
    rc, out = host.step("restore", vllm_service_rollback_old_secrets=True, vllm_service_api_key="k-new")
    assert rc == 0, out
    assert ran_old(host)["key"] is True


def test_a_directory_reinstalled_since_the_snapshot_is_refused(host):
    reinstalled = {"wanted": {"version": "0.31.0", "torch": "another"}}
    write(host.root / "0.31.0-x86_64" / "vllm-install.json", json.dumps(reinstalled))
    rc, out = host.step("restore")
    assert rc != 0
    assert "no longer holds the install that ran" in out and "Nothing was restored" in out, out
    assert os.readlink(host.link) == str(host.root / "0.32.0-x86_64")


def _rollout_file(name):
    ref = os.environ.get("VLLM_SNAPSHOT_REF")
    if not ref:
        return (REPO / name).read_text()
    return subprocess.run(["git", "show", f"{ref}:{name}"], cwd=REPO, capture_output=True, text=True, check=True).stdout


def test_the_rollout_restores_old_secrets_only_for_its_own_snapshot_or_with_the_flag():
    undo = yaml.safe_load(_rollout_file("roles/rollout/tasks/undo.yml"))
    rollback = next(t for t in undo if t.get("name") == "Roll back to this rollout's snapshot")["block"][0]
    assert rollback["vars"].get("vllm_service_rollback_old_secrets") == (
        "{{ not rollout_snapshot_lost | default(false) or rollout_restore_old_secrets | bool }}"
    )
    recover = yaml.safe_load(_rollout_file("roles/rollout/tasks/recover.yml"))
    carry = next(t for t in recover if t.get("name") == "Carry on with the lost rollout's record and snapshot")
    assert carry["ansible.builtin.set_fact"].get("rollout_snapshot_lost") is True
    assert yaml.safe_load(_rollout_file("roles/rollout/defaults/main.yml"))["rollout_restore_old_secrets"] is False


# ---- container mode (issue 30) ----


def ran(h):
    """What a host runs, read from its files (None: absent)."""

    def read(path):
        return path.read_text() if path.exists() else None

    return {
        "quadlet": read(h.quadlet / "vllm@vllm-0.container"),
        "image": read(h.config / "image"),
        "template": read(h.units / "vllm@.service"),
        "dropin": read(h.units / "vllm@vllm-0.service.d" / "instance.conf"),
        "link": os.readlink(h.link),
        "plan": json.loads((h.config / "plan.json").read_text())["vllm_version"],
        "secret": read(h.tmp / "podman-secrets" / "vllm-service-api-key"),
    }


def test_a_container_host_is_snapshotted_by_its_image_and_its_quadlet_files(tmp_path):
    h = Host(tmp_path)
    h.serve_container("0.31.0", IMAGE_OLD, "k-old", TABLE_OLD)
    rc, out = h.step("snapshot")
    assert rc == 0, out
    assert (h.snap / "mode").read_text() == "container\n"
    assert (h.snap / "image").read_text().strip() == (h.snap / "active").read_text().strip() == IMAGE_OLD
    assert (h.snap / "quadlet" / "vllm@vllm-0.container").read_text() == f"[Container]\nImage={ID_OLD}\n"
    assert not (h.snap / "venv").exists() and not (h.snap / "install.json").exists()
    assert list((h.snap / "units").iterdir()) == []


def test_a_container_rollback_gives_back_the_image_its_units_and_its_keys(tmp_path):
    h = Host(tmp_path)
    h.serve_container("0.31.0", IMAGE_OLD, "k-old", TABLE_OLD)
    assert h.step("snapshot")[0] == 0
    link = os.readlink(h.link)
    h.serve_container("0.32.0", IMAGE_NEW, "k-new", TABLE_NEW)
    os.remove(h.link)
    h.link.symlink_to(link)  # a container run leaves the version link alone
    rc, out = h.step("restore")
    assert rc == 0, out
    assert ran(h) == {
        "quadlet": f"[Container]\nImage={ID_OLD}\n",
        "image": IMAGE_OLD + "\n",
        "template": None,
        "dropin": None,
        "link": link,
        "plan": "0.31.0",
        "secret": "k-old",
    }
    # The restored key went to podman on standard input, never on its command line.
    log = (h.tmp / "podman.log").read_text()
    assert "secret create vllm-service-api-key -" in log and "k-old" not in log
    assert "k-old" not in out and "k-new" not in out, "a secret reached the output"


def test_a_failed_switch_to_the_venv_mode_rolls_back_to_the_container(tmp_path):
    h = Host(tmp_path)
    h.serve_container("0.31.0", IMAGE_OLD, "k-old", TABLE_OLD)
    assert h.step("snapshot")[0] == 0
    h.serve("0.32.0", "k-old", TABLE_NEW, "# middleware 0.32\n", "new weights")
    (h.quadlet / "vllm@vllm-0.container").unlink()
    (h.config / "image").unlink(missing_ok=True)
    rc, out = h.step("restore")
    assert rc == 0, out
    found = ran(h)
    assert (found["quadlet"], found["image"], found["template"], found["dropin"]) == (
        f"[Container]\nImage={ID_OLD}\n", IMAGE_OLD + "\n", None, None,
    )  # fmt: skip


def test_a_failed_switch_to_the_container_mode_rolls_back_to_the_venv(host):
    # The fixture's snapshot is of a venv host (0.31.0); the run then switched it to a container.
    host.serve_container("0.32.0", IMAGE_NEW, "k-new", TABLE_NEW)
    rc, out = host.step("restore")
    assert rc == 0, out
    found = ran(host)
    assert found["quadlet"] is None and found["image"] is None
    assert found["dropin"] == "ExecStart=serve 0.31.0\n" and found["link"] == str(host.root / "0.31.0-x86_64")


def test_a_container_snapshot_whose_image_is_gone_is_refused(tmp_path):
    h = Host(tmp_path)
    h.serve_container("0.31.0", IMAGE_OLD, "k-old", TABLE_OLD)
    assert h.step("snapshot")[0] == 0
    h.serve_container("0.32.0", IMAGE_NEW, "k-new", TABLE_NEW)
    write(h.tmp / "podman-images", f"{IMAGE_NEW}\n{ID_NEW}\n")
    rc, out = h.step("restore")
    assert rc != 0
    assert f"the image {IMAGE_OLD} as it was then ({ID_OLD}) is no longer on the host" in out, out
    assert "Nothing was restored" in out, out
    assert ran(h)["image"] == IMAGE_NEW + "\n"


def test_a_container_snapshot_whose_bits_are_gone_is_refused_though_the_name_is_there(tmp_path):
    # A forced rebuild gave the old name to new bits and the old ones were removed: the snapshot's units name the
    # old ID, which no name brings back.
    h = Host(tmp_path)
    h.serve_container("0.31.0", IMAGE_OLD, "k-old", TABLE_OLD)
    assert h.step("snapshot")[0] == 0
    h.serve_container("0.32.0", IMAGE_NEW, "k-new", TABLE_NEW)
    write(h.tmp / "podman-images", f"{IMAGE_OLD}\n{IMAGE_NEW}\n{ID_NEW}\n")
    rc, out = h.step("restore")
    assert rc != 0
    assert f"({ID_OLD}) is no longer on the host" in out and "Nothing was restored" in out, out


def test_a_container_snapshot_of_an_older_collection_is_checked_by_its_name(tmp_path):
    h = Host(tmp_path)
    h.serve_container("0.31.0", IMAGE_OLD, "k-old", TABLE_OLD)
    (h.config / "image-id").unlink()
    assert h.step("snapshot")[0] == 0
    h.serve_container("0.32.0", IMAGE_NEW, "k-new", TABLE_NEW)
    write(h.tmp / "podman-images", f"{IMAGE_NEW}\n{ID_OLD}\n{ID_NEW}\n")
    rc, out = h.step("restore")
    assert rc != 0
    assert f"the image {IMAGE_OLD} is no longer on the host" in out and "Nothing was restored" in out, out


def _serve_model_version(h, version):
    """models/tiny as tasks/model_path.yml leaves it: a link to .versions/tiny@<version>, which holds the weights."""
    staged = h.home / "models" / ".versions" / f"tiny@{version}"
    write(staged / "model.safetensors", f"weights {version}")
    served = h.home / "models" / "tiny"
    if served.is_symlink():
        served.unlink()
    elif served.exists():
        shutil.rmtree(served)
    served.symlink_to(staged)
    return staged


def test_a_rollback_points_the_served_model_back_at_the_version_that_ran(tmp_path):
    h = Host(tmp_path)
    h.serve("0.31.0", "k-old", TABLE_OLD, "# middleware 0.31\n", "unused")
    old = _serve_model_version(h, "v1")
    rc, out = h.step("snapshot")
    assert rc == 0, out
    assert (h.snap / "model-links").read_text() == f"{h.home / 'models' / 'tiny'}\t{old}\n"
    (h.home / "models" / "tiny").unlink()  # serve() writes weights where the link is
    h.serve("0.32.0", "k-new", TABLE_NEW, "# middleware 0.32\n", "unused")
    _serve_model_version(h, "v2")
    rc, out = h.play([
        _task("restore", h.tmp),
        {"name": "Show", "ansible.builtin.debug": {"msg": "DRIFT={{ vllm_service_restore_model_drift }}"}},
    ])  # fmt: skip
    assert rc == 0, out
    assert os.readlink(h.home / "models" / "tiny") == str(old)
    assert (h.home / "models" / "tiny" / "model.safetensors").read_text() == "weights v1"
    assert "DRIFT=[]" in out, out  # the version that ran is back: nothing to name


def test_a_rollback_refuses_a_snapshot_whose_model_version_is_gone(tmp_path):
    h = Host(tmp_path)
    h.serve("0.31.0", "k-old", TABLE_OLD, "# middleware 0.31\n", "unused")
    old = _serve_model_version(h, "v1")
    rc, out = h.step("snapshot")
    assert rc == 0, out
    (h.home / "models" / "tiny").unlink()
    h.serve("0.32.0", "k-new", TABLE_NEW, "# middleware 0.32\n", "unused")
    new = _serve_model_version(h, "v2")
    shutil.rmtree(old)
    rc, out = h.step("restore")
    assert rc != 0
    assert f"the model version {old} that {h.home / 'models' / 'tiny'} named is no longer on the host" in out, out
    assert "Nothing was restored" in out, out
    assert os.readlink(h.home / "models" / "tiny") == str(new) and ran_old(h)["plan"] == "0.32.0"
