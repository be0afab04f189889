"""requirements.lock, the controller's hash-pinned packages: made from requirements.txt, complete, installed as is."""

import importlib.util
import re

from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

spec = importlib.util.spec_from_file_location("lock_requirements", REPO / "tools" / "lock_requirements.py")
lock_requirements = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock_requirements)

PIN = re.compile(r"([a-z0-9][a-z0-9.-]*)==(\S+)((?: --hash=sha256:[0-9a-f]{64})+)")


def pins(text):
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_lock_was_made_from_this_requirements_txt():
    assert lock_requirements.main(["--check"]) == 0, "fix: python tools/lock_requirements.py"


def test_the_check_fails_when_requirements_txt_changes(tmp_path, monkeypatch, capsys):
    edited = tmp_path / "requirements.txt"
    edited.write_text((REPO / "requirements.txt").read_text() + "six==1.16.0\n")
    monkeypatch.setattr(lock_requirements, "SOURCE", edited)
    assert lock_requirements.main(["--check"]) == 1
    assert "python tools/lock_requirements.py" in capsys.readouterr().out


def test_every_line_is_an_exact_pin_with_its_sha256():
    lines = pins((REPO / "requirements.lock").read_text())
    assert len(lines) > 50  # ansible, molecule, ansible-lint and what they bring: not a stub
    for line in lines:
        assert PIN.fullmatch(line), f"requirements.lock: {line!r} is not 'name==version --hash=sha256:<digest>...'"


def test_every_top_level_pin_is_in_the_lock_at_its_version():
    locked = dict(PIN.fullmatch(line).groups()[:2] for line in pins((REPO / "requirements.lock").read_text()))
    for line in pins((REPO / "requirements.txt").read_text()):
        name, version = re.match(r"([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==(\S+)", line).groups()
        name = re.sub(r"[-_.]+", "-", name).lower()
        assert locked.get(name) == version, f"requirements.txt pins {name}=={version}, the lock {locked.get(name)}"


def test_bootstrap_installs_the_lock_with_hashes_required():
    script = (REPO / "scripts" / "bootstrap.sh").read_text()
    installs = re.findall(r'"\$venv/bin/pip" install [^\n]*', script)
    assert installs and all("--require-hashes" in line for line in installs), installs
    assert any('"$repo/requirements.lock"' in line for line in installs)
    assert "requirements.txt" not in "\n".join(installs)
