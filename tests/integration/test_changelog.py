"""CHANGELOG.md is generated (issue 34): antsibull-changelog writes it from changelogs/changelog.yaml, the
released versions, which `antsibull-changelog release` fills from one fragment per change in
changelogs/fragments/. The fragments and changelog.yaml are valid, CHANGELOG.md is exactly what
`antsibull-changelog generate` writes, galaxy.yml's version agrees with the releases, and entries stay short
enough for an operator to read (the detail lives in docs/). How to add a fragment and release:
changelogs/config.yaml's header."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO
from packaging.version import Version

ANTSIBULL_CHANGELOG = Path(sys.executable).parent / "antsibull-changelog"
CHANGELOGS = REPO / "changelogs"
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
CHANGES = yaml.safe_load((CHANGELOGS / "changelog.yaml").read_text())
CONFIG = yaml.safe_load((CHANGELOGS / "config.yaml").read_text())
# The sections whose entries make a major version (semantic versioning).
MAJOR_SECTIONS = {"breaking_changes", "removed_features"}
# One entry: a few sentences an operator needs; more belongs in docs/.
MAX_ENTRY = 700


def antsibull_changelog(*argv, cwd):
    return subprocess.run(
        [str(ANTSIBULL_CHANGELOG), *argv], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def pending_fragments():
    """{name: content} of the fragments no release has taken yet."""
    return {
        path.name: yaml.safe_load(path.read_text())
        for path in sorted((CHANGELOGS / "fragments").iterdir())
        if path.suffix in {".yml", ".yaml"}
    }


def latest_release():
    return max(CHANGES["releases"], key=Version)


def entries(changes):
    """(section, text) of each entry of a release's changes or a fragment, plugin and object lists left out."""
    for section, value in changes.items():
        if section.startswith("add "):
            continue
        for text in [value] if isinstance(value, str) else value:
            yield section, text


def test_fragments_and_changelog_yaml_lint_clean():
    lint = antsibull_changelog("lint", cwd=REPO)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
    lint_yaml = antsibull_changelog("lint-changelog-yaml", str(CHANGELOGS / "changelog.yaml"), cwd=REPO)
    assert lint_yaml.returncode == 0 and not lint_yaml.stdout.strip(), lint_yaml.stdout + lint_yaml.stderr


def test_changelog_md_is_what_antsibull_changelog_generates(tmp_path):
    # A scratch copy: generate rewrites CHANGELOG.md (config: ../CHANGELOG.md) and reads galaxy.yml's name.
    shutil.copytree(CHANGELOGS, tmp_path / "changelogs")
    shutil.copy(REPO / "galaxy.yml", tmp_path)
    shutil.copy(REPO / "CHANGELOG.md", tmp_path)
    generate = antsibull_changelog("generate", cwd=tmp_path)
    assert generate.returncode == 0, generate.stdout + generate.stderr
    assert CONFIG["changelog_filename_template"] == "../CHANGELOG.md"
    assert (tmp_path / "CHANGELOG.md").read_text() == (REPO / "CHANGELOG.md").read_text(), (
        "CHANGELOG.md is not what antsibull-changelog writes from changelogs/changelog.yaml: do not edit it by "
        "hand; add a fragment to changelogs/fragments/, and run `antsibull-changelog generate` (or `release`)"
    )


def test_galaxy_version_is_the_latest_release_or_the_next():
    version, latest = Version(GALAXY["version"]), Version(latest_release())
    assert version >= latest, f"galaxy.yml's version {version} is older than the latest release {latest}"
    pending = {section for content in pending_fragments().values() for section, _text in entries(content)}
    if version > latest and pending & MAJOR_SECTIONS:
        assert version.major > latest.major, (
            f"unreleased fragments hold {sorted(pending & MAJOR_SECTIONS)}: the next version after {latest} "
            f"is a major one, not {version}"
        )


def test_the_latest_release_says_why_it_is_what_it_is():
    # A major release says so up front: its summary, and the porting notes that made it major.
    latest = CHANGES["releases"][latest_release()]
    assert latest["changes"].get("release_summary"), "the latest release has no release_summary"
    previous = [Version(v) for v in CHANGES["releases"] if Version(v) < Version(latest_release())]
    if previous and Version(latest_release()).major > max(previous).major:
        assert set(latest["changes"]) & MAJOR_SECTIONS, "a major release without breaking changes"


def test_entries_are_short_and_fragments_well_formed():
    fragments = pending_fragments()
    sections = {name for name, _title in CONFIG["sections"]} | {
        CONFIG["prelude_section_name"],
        CONFIG["trivial_section_name"],
    }
    for name, content in fragments.items():
        assert isinstance(content, dict) and content, f"{name}: empty fragment"
        unknown = {key for key in content if not key.startswith("add ")} - sections
        assert not unknown, f"{name}: sections {sorted(unknown)} are none of changelogs/config.yaml's"
    texts = [(f"fragment {name}", s, t) for name, c in fragments.items() for s, t in entries(c)]
    texts += [
        (f"release {version}", s, t) for version, r in CHANGES["releases"].items() for s, t in entries(r["changes"])
    ]
    long = [
        f"{where} ({section}, {len(text)} chars): {text[:60]}..."
        for where, section, text in texts
        if len(text) > MAX_ENTRY
    ]
    assert not long, "entries longer than an operator reads (the detail goes to docs/):\n" + "\n".join(long)


def test_the_readme_pins_the_version_galaxy_yml_releases():
    readme = (REPO / "README.md").read_text()
    version = str(GALAXY["version"])
    assert f"dist/vllm-cpu_fleet-{version}.tar.gz" in readme
    assert version in CHANGES["releases"], f"galaxy.yml's {version} is not a release of changelogs/changelog.yaml"


def test_the_docs_name_no_version_of_the_collection_but_galaxy_ymls_and_no_tag_that_does_not_exist():
    """A README or doc that names the collection's artifact names galaxy.yml's version, the one that is built and
    released; a git tag it tells users to pin exists."""
    artifacts, tags = [], []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        artifacts += [(path.name, v) for v in re.findall(r"vllm-cpu_fleet-(\d+\.\d+\.\d+)\.tar\.gz", text)]
        tags += [(path.name, v) for v in re.findall(r"version:\s*(v\d+\.\d+\.\d+)\b", text)]
    assert artifacts, "the README names how to pin the collection's artifact"
    wrong = [(name, v) for name, v in artifacts if v != GALAXY["version"]]
    assert not wrong, f"galaxy.yml's version is {GALAXY['version']}; these name another: {wrong}"
    existing = set(
        subprocess.run(["git", "tag", "--list"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    )
    missing = [(name, tag) for name, tag in tags if tag not in existing]
    assert not missing, f"these name a tag the repository does not have: {missing}"


def test_requires_ansible_admits_the_tested_core_and_no_untested_release():
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"])
    pinned = re.search(r"^ansible-core==(\S+)$", (REPO / "requirements.txt").read_text(), re.M)[1]
    assert Version(pinned) in spec, f"requires_ansible {spec} refuses the ansible-core the tests run ({pinned})"
    tested = Version(pinned)
    assert Version(f"{tested.major}.{tested.minor + 1}.0") not in spec, f"{spec} admits a release nothing tested"
