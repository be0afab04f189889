"""roles/vllm_service's model versions through ansible-playbook, on the controller (local connection), into a
temporary home. tasks_from model_path (what tasks_from stage runs after the account) copies a controller model into
a version of its own beside the one served (<home>/models/.versions/<name>@<digest>), only when the controller's
model or the host's copy changed since that version's stamp. tasks_from model_link points the served path at it in
one rename. A copy that fails leaves the served model as it was; a copy an older role made in place becomes a
version without a copy; prune_models removes the versions nothing names.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from ansible_collections.vllm.cpu_fleet.plugins.module_utils import vllm_converged
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
ENV = dict(
    os.environ,
    ANSIBLE_NOCOLOR="1",
    ANSIBLE_FORCE_COLOR="0",
    ANSIBLE_RETRY_FILES_ENABLED="0",
    ANSIBLE_STDOUT_CALLBACK="default",
    ANSIBLE_CALLBACK_RESULT_FORMAT="json",
)


def digest(source):
    return vllm_converged.digest(vllm_converged.tree_signature(str(source)))


def run(tmp_path, with_digest=True, check=False, entries=("model_path", "model_link"), extra=None, ok=True):
    """One run of the entries; returns (output, {register name: result}) of the copy and the link."""
    source = tmp_path / "controller" / "tiny"
    variables = {
        "vllm_service_model_source": "path",
        "vllm_service_model_path": str(source),
        "vllm_service_home": str(tmp_path / "home"),
        "vllm_service_config_dir": str(tmp_path / "etc"),
        "vllm_service_user": "root",
        "vllm_service_group": "root",
        **(extra or {}),
    }
    if with_digest:  # what preflight gives the host
        variables["vllm_service_model_files"] = digest(source)
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"vllmhost": host}}}
    role = "vllm.cpu_fleet.vllm_service"
    tasks = [{"name": entry, "ansible.builtin.include_role": {"name": role, "tasks_from": entry}} for entry in entries]
    tasks.append({"name": "Say what it did", "ansible.builtin.debug": {"msg": "DID={{ {'copy': vllm_service_model_copy | default({}), 'link': vllm_service_model | default({}), 'pruned': vllm_service_models_pruned | default({})} | to_json }}"}})  # noqa: E501
    play = [{"hosts": "all", "gather_facts": False, "tasks": tasks}]
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(variables))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    argv = [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), "-e", f"@{tmp_path / 'vars.yml'}"]
    proc = subprocess.run(
        [*argv, *(["--check"] if check else []), str(tmp_path / "play.yml")],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    if not ok:
        assert proc.returncode != 0, out
        return out, None
    marker = out.rfind('"msg": "DID=')
    assert proc.returncode == 0 and marker >= 0, out
    return out, json.loads(json.loads("{" + out[marker:].split("\n", 1)[0] + "}")["msg"][len("DID=") :])


def controller_model(tmp_path, weights=b"weights" * 100, config='{"a": 1}\n'):
    source = tmp_path / "controller" / "tiny"
    source.mkdir(parents=True, exist_ok=True)
    (source / "config.json").write_text(config)
    (source / "model.safetensors").write_bytes(weights)
    (tmp_path / "etc").mkdir(exist_ok=True)
    return source


def version_of(tmp_path, source):
    return tmp_path / "home" / "models" / ".versions" / f"tiny@{digest(source)[:16]}"


def test_the_copy_runs_once_and_again_only_when_a_side_changed(tmp_path):
    source = controller_model(tmp_path)
    served = tmp_path / "home" / "models" / "tiny"
    version = version_of(tmp_path, source)
    stamp = Path(f"{version}.stamp")

    out, did = run(tmp_path)
    assert did["copy"].get("changed") is True and did["link"].get("changed") is True, out
    assert os.readlink(served) == str(version)
    assert (served / "model.safetensors").read_bytes() == b"weights" * 100
    first_stamp = stamp.read_text()

    # Nothing changed on either side: no copy (no checksums), the stamp as it was, the link as it was.
    out, did = run(tmp_path)
    assert did["copy"].get("skipped") is True and did["link"].get("changed") is False, out
    assert stamp.read_text() == first_stamp

    # A check-mode run reads and changes nothing either.
    out, did = run(tmp_path, check=True)
    assert did["copy"].get("skipped") is True and did["link"].get("changed") is False, out

    # A file edited on the host: the copy puts the controller's back (into the same version).
    (version / "model.safetensors").write_bytes(b"tampered")
    out, did = run(tmp_path)
    assert did["copy"].get("changed") is True and did["link"].get("changed") is False, out
    assert (served / "model.safetensors").read_bytes() == b"weights" * 100
    out, did = run(tmp_path)
    assert did["copy"].get("skipped") is True, out

    # A file removed on the host: copied again.
    (version / "config.json").unlink()
    out, did = run(tmp_path)
    assert did["copy"].get("changed") is True and (served / "config.json").exists(), out

    # Without preflight's digest (the role run on its own) the role reads the same digest itself.
    out, did = run(tmp_path, with_digest=False)
    assert did["copy"].get("skipped") is True and did["link"].get("changed") is False, out


def test_a_new_model_is_staged_beside_the_served_one_and_served_only_by_the_link(tmp_path):
    source = controller_model(tmp_path)
    served = tmp_path / "home" / "models" / "tiny"
    run(tmp_path)
    old = version_of(tmp_path, source)

    controller_model(tmp_path, weights=b"other weights", config='{"a": 2, "b": 3}\n')
    new = version_of(tmp_path, source)
    assert new != old

    # Staging alone (what site.yml and upgrade.yml do before any drain): the instances still serve the old model.
    out, did = run(tmp_path, entries=("model_path",))
    assert did["copy"].get("changed") is True, out
    assert os.readlink(served) == str(old) and (served / "model.safetensors").read_bytes() == b"weights" * 100
    assert (new / "model.safetensors").read_bytes() == b"other weights"

    # A check-mode pass (the rollout's) says the link would switch, and switches nothing.
    out, did = run(tmp_path, check=True)
    assert did["link"].get("changed") is True and os.readlink(served) == str(old), out

    # The switch: one rename; the old version stays for a rollback until prune.
    out, did = run(tmp_path)
    assert did["copy"].get("skipped") is True and did["link"].get("changed") is True, out
    assert os.readlink(served) == str(new) and (served / "config.json").read_text() == '{"a": 2, "b": 3}\n'
    assert (old / "model.safetensors").read_bytes() == b"weights" * 100

    # Prune keeps what a snapshot names, then removes it once no snapshot does.
    snapshots = tmp_path / "rollout"
    (snapshots / "r1").mkdir(parents=True)
    (snapshots / "r1" / "model-links").write_text(f"{served}\t{old}\n")
    keep = {"vllm_service_model_snapshot_roots": [str(snapshots)]}
    out, did = run(tmp_path, entries=("prune_models",), extra=keep)
    assert did["pruned"].get("changed") is False and old.is_dir(), out
    (snapshots / "r1" / "model-links").unlink()
    out, did = run(tmp_path, entries=("prune_models",), extra=keep)
    assert did["pruned"].get("changed") is True, out
    assert not old.exists() and not Path(f"{old}.stamp").exists()
    assert new.is_dir() and Path(f"{new}.stamp").is_file() and os.readlink(served) == str(new)
    out, did = run(tmp_path, entries=("prune_models",), extra=keep)
    assert did["pruned"].get("changed") is False, out


def test_a_copy_that_fails_half_way_leaves_the_served_model_as_it_was(tmp_path):
    source = controller_model(tmp_path)
    served = tmp_path / "home" / "models" / "tiny"
    run(tmp_path)
    old = version_of(tmp_path, source)

    # The new model's copy fails after it started: its version holds a file where a directory goes, so the copy
    # stops with part of the files written (as a disk that filled up would leave it).
    controller_model(tmp_path, weights=b"new weights", config='{"a": 3}\n')
    (source / "tokenizer").mkdir()
    (source / "tokenizer" / "vocab.json").write_text("{}")
    version_of(tmp_path, source).mkdir(parents=True)
    (version_of(tmp_path, source) / "tokenizer").write_text("in the way")
    out, nothing = run(tmp_path, ok=False)
    assert nothing is None and "Copy the model from the controller into its version" in out, out
    assert os.readlink(served) == str(old), out
    assert (served / "model.safetensors").read_bytes() == b"weights" * 100
    assert (served / "config.json").read_text() == '{"a": 1}\n'
    # The next run completes that version and serves it.
    (version_of(tmp_path, source) / "tokenizer").unlink()
    out, did = run(tmp_path)
    assert did["copy"].get("changed") is True and os.readlink(served) == str(version_of(tmp_path, source)), out
    assert (served / "model.safetensors").read_bytes() == b"new weights"


def test_a_model_an_older_role_copied_in_place_becomes_a_version_without_a_copy_or_a_restart(tmp_path):
    source = controller_model(tmp_path)
    served = tmp_path / "home" / "models" / "tiny"
    served.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (served / name).write_bytes((source / name).read_bytes())
    listing = subprocess.run(
        ["bash", "-c", "find \"$1\" -type f -printf '%P\\t%s\\t%T@\\n' | LC_ALL=C sort | sha256sum | cut -d' ' -f1",
         "-", str(served)], capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (tmp_path / "etc" / "model-copy.stamp").write_text(f"{digest(source)} {listing}\n")

    # A check-mode run predicts no switch (the copy is this model) and moves nothing.
    out, did = run(tmp_path, check=True)
    assert did["link"].get("changed") is False and served.is_dir() and not served.is_symlink(), out

    out, did = run(tmp_path)
    version = version_of(tmp_path, source)
    assert did["copy"].get("skipped") is True and did["link"].get("changed") is False, out
    assert os.readlink(served) == str(version) and (served / "model.safetensors").read_bytes() == b"weights" * 100
    assert not (tmp_path / "etc" / "model-copy.stamp").exists()


def test_a_copy_in_place_of_another_model_is_kept_as_a_version_and_the_new_one_staged(tmp_path):
    source = controller_model(tmp_path)
    served = tmp_path / "home" / "models" / "tiny"
    served.mkdir(parents=True)
    (served / "model.safetensors").write_bytes(b"what the old role copied")

    out, did = run(tmp_path, check=True)
    assert did["link"].get("changed") is True and served.is_dir() and not served.is_symlink(), out

    out, did = run(tmp_path, entries=("model_path",))
    kept = Path(os.readlink(served))
    assert kept.name.startswith("tiny@in-place-")
    assert (kept / "model.safetensors").read_bytes() == b"what the old role copied"
    out, did = run(tmp_path)
    assert did["link"].get("changed") is True and os.readlink(served) == str(version_of(tmp_path, source)), out
    assert kept.is_dir()  # until prune: a rollback points the link back at it
