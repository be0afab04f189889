"""What Galaxy and Automation Hub run on the collection's artifact: ansible-test sanity on the installed
copy, with the ignore file it ships (tests/sanity/ignore-2.19.txt names shipped files only), and the
modules' compile and import tests on every target Python from the floor tests/config.yml declares up to
the controller's (on the interpreters this machine has; one that is missing is a skip that names it), and
antsibull-docs' lint of its documentation."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
FLOOR = tuple(
    int(part)
    for part in re.fullmatch(
        r">=\s*(\d+\.\d+)", yaml.safe_load((REPO / "tests/config.yml").read_text())["modules"]["python_requires"]
    )
    .group(1)
    .split(".")
)
# ansible-core 2.19's controller runs on 3.11 and newer; sanity itself runs the controller's Python (3.11).
CONTROLLER = (3, 11)
TARGETS_BELOW_CONTROLLER = [(3, minor) for minor in range(FLOOR[1], CONTROLLER[1])]


def dotted(version):
    return ".".join(map(str, version))


def _interpreter(version):
    """The directory holding pythonX.Y: PATH first, then pyenv's versions (this machine's kind has them)."""
    name = f"python{dotted(version)}"
    found = shutil.which(name)
    if found and "/.pyenv/shims/" not in found:
        return Path(found).parent
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for candidate in sorted(pyenv_root.glob(f"versions/{dotted(version)}.*/bin/{name}")):
        return candidate.parent
    return None


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """The artifact as ansible-galaxy installs it, under ansible_collections/<namespace>/<name>."""
    work = tmp_path_factory.mktemp("artifact")
    build = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work / "dist"), str(REPO)],
        cwd=work, capture_output=True, text=True, timeout=300, check=False,
    )
    assert build.returncode == 0, build.stderr
    (artifact,) = (work / "dist").glob("*.tar.gz")
    install = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "--force", "-p", str(work), str(artifact)],
        cwd=work, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=str(work / "none.cfg")),
    )
    assert install.returncode == 0, install.stdout + install.stderr
    root = work / "ansible_collections" / GALAXY["namespace"] / GALAXY["name"]
    assert (root / "MANIFEST.json").is_file(), install.stdout
    return root


def _sanity(root, *args, path_dirs=()):
    env = dict(os.environ, ANSIBLE_TEST_CONTENT_ROOT=str(root), PATH=os.pathsep.join(
        [*map(str, path_dirs), str(BIN), os.environ.get("PATH", "")]))
    return subprocess.run(
        [str(BIN / "ansible-test"), "sanity", "--local", "--color", "no", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )


def test_the_artifact_ships_its_sanity_ignore_file_and_python_floor(collection):
    assert (collection / "tests/sanity/ignore-2.19.txt").is_file()
    assert (collection / "tests/config.yml").is_file()
    shipped = (collection / "tests/sanity/ignore-2.19.txt").read_text().splitlines()
    for line in shipped:
        path = line.split()[0]
        assert (collection / path).exists(), f"the shipped ignore file names {path}, which the artifact lacks"
        assert "#" in line, f"an ignore line without its reason: {line}"


def test_ansible_test_sanity_passes_on_the_installed_artifact(collection):
    result = _sanity(collection, "--python", dotted(CONTROLLER))
    errors = [line for line in result.stdout.splitlines() + result.stderr.splitlines() if "ERROR" in line]
    assert result.returncode == 0, "\n".join(errors) or result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("version", TARGETS_BELOW_CONTROLLER, ids=lambda v: f"python{dotted(v)}")
def test_modules_compile_and_import_on_every_target_python_from_the_floor(collection, version):
    where = _interpreter(version)
    if where is None:
        pytest.skip(f"python{dotted(version)} is not on this machine: the collection's floor was not tested here")
    result = _sanity(collection, "--python", dotted(version), "--test", "compile", "--test", "import",
                     path_dirs=[where])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert f'"compile" on Python {dotted(version)}' in result.stdout, result.stdout


def _host_python_files(root):
    """What runs on managed hosts: modules, module_utils, and the scripts roles and playbooks copy or run there."""
    for pattern in ("plugins/modules/*.py", "plugins/module_utils/*.py", "roles/*/files/*.py", "playbooks/files/*.py"):
        yield from sorted(root.glob(pattern))


def test_host_code_parses_with_the_floors_grammar(collection):
    # On any machine, whatever interpreters it has: the grammar of the floor (match statements, except*,
    # type parameters and the like fail here), a lower bound of what the compile test above checks.
    files = list(_host_python_files(collection))
    assert len(files) > 20, files
    refused = []
    for path in files:
        try:
            ast.parse(path.read_text(), filename=str(path), feature_version=FLOOR)
        except SyntaxError as error:
            refused.append(f"{path.relative_to(collection)}:{error.lineno}: {error.msg}")
    assert not refused, f"not Python {dotted(FLOOR)}: " + "; ".join(refused)


def test_antsibull_docs_lints_the_installed_artifact_clean(collection):
    # What a docs site of the collection reads: every plugin's and every role entry point's documentation (an
    # entry point needs a description; a default must be a value of its option's type).
    result = subprocess.run(
        [str(BIN / "antsibull-docs"), "lint-collection-docs", "--plugin-docs", str(collection)],
        cwd=collection, capture_output=True, text=True, timeout=600, check=False,
        env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collection.parents[2]),
                 PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}"),
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout[-4000:] + result.stderr[-4000:]
