"""Every relative Markdown link in README.md, docs/*.md and roles/*/README.md points at a file of the
repository, stays inside it, and every `#anchor` (in the same page or into another .md) names a heading
(GitHub's slug: lowercase, spaces to '-', punctuation but '-' and '_' dropped, '-1', '-2' for repeats) or
an `<a id=...>` of that page. `broken_links(root)` does the check on any tree, so the test of the check
runs it on a copy with one linked heading renamed."""

import re
import shutil
from pathlib import Path

from conftest import REPO

LINK = re.compile(r"(?<!\!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def documents(root):
    """The Markdown files whose links are checked."""
    root = Path(root)
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted(root.glob("roles/*/README.md"))]


def _prose(text):
    """The lines outside fenced code blocks, with inline code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else re.sub(r"`+[^`]*`+", "``", line))
    return lines


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor a page offers: its headings' slugs (repeats numbered) and its explicit ids."""
    found, seen = set(), {}
    text = path.read_text(encoding="utf-8")
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        match = HEADING.match(line)
        if match:
            base = slug(match[2])
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(EXPLICIT_ANCHOR.findall(line))
    return found


def links(path):
    """(line number, target) of every link in a page's prose."""
    for number, line in enumerate(_prose(path.read_text(encoding="utf-8")), 1):
        for pattern in (LINK, IMAGE, REFERENCE):
            for target in pattern.findall(line):
                yield number, target


def broken_links(root):
    """'file:line: target: why' for every relative link under root that does not resolve."""
    root = Path(root).resolve()
    problems, cache = [], {}
    for doc in documents(root):
        if not doc.exists():
            continue
        for number, target in links(doc):
            if SCHEME.match(target) or target.startswith("//"):
                continue
            where = f"{doc.relative_to(root)}:{number}: {target}"
            path_part, _sep, anchor = target.partition("#")
            if path_part.startswith("/"):
                problems.append(f"{where}: an absolute path, not a link inside the repository")
                continue
            dest = (doc.parent / path_part).resolve() if path_part else doc
            if dest != root and root not in dest.parents:
                problems.append(f"{where}: leaves the repository")
                continue
            if not dest.exists():
                problems.append(f"{where}: no such file")
                continue
            if anchor:
                if dest.is_dir() or dest.suffix != ".md":
                    problems.append(f"{where}: an anchor into a file that is not Markdown")
                    continue
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    problems.append(f"{where}: no heading or id '{anchor}' in {dest.relative_to(root)}")
    return problems


def test_slug_follows_github():
    assert slug("Container mode vs venv (issue 30)") == "container-mode-vs-venv-issue-30"
    assert slug("/dev/shm of a vLLM instance") == "devshm-of-a-vllm-instance"
    assert slug("Demo fleet: the first run on a fresh machine") == "demo-fleet-the-first-run-on-a-fresh-machine"
    assert slug("`vllm_install`: the [role](x.md)") == "vllm_install-the-role"


def test_every_relative_link_resolves():
    assert broken_links(REPO) == []


def test_the_check_finds_a_renamed_heading_a_missing_file_and_a_link_out(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Some heading\n\n[in page](#some-heading)\n")
    (tmp_path / "README.md").write_text(
        "# R\n\n[ok](docs/a.md#some-heading) [ok too](docs/a.md)\n\n```\n[in code](docs/none.md)\n```\n"
    )
    assert broken_links(tmp_path) == []
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Another heading\n\n[in page](#some-heading)\n")
    (tmp_path / "README.md").write_text(
        (tmp_path / "README.md").read_text() + "[gone](docs/none.md) [out](../shared/x.md)\n"
    )
    problems = broken_links(tmp_path)
    assert len(problems) == 4, problems
    assert sum("no heading or id 'some-heading'" in problem for problem in problems) == 2
    assert any("docs/none.md: no such file" in problem for problem in problems)
    assert any("../shared/x.md: leaves the repository" in problem for problem in problems)


def test_the_check_fails_on_a_copy_of_the_docs_with_a_linked_heading_renamed(tmp_path):
    for doc in documents(REPO):
        dest = tmp_path / doc.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(doc, dest)
    # The README's links into docs/ and roles/ resolve in the copy only where their targets are copied too.
    before = broken_links(tmp_path)
    benchmarks = tmp_path / "docs" / "benchmarks.md"
    text = benchmarks.read_text(encoding="utf-8")
    assert "\n## The whole CI run\n" in text
    benchmarks.write_text(text.replace("\n## The whole CI run\n", "\n## The CI run\n"), encoding="utf-8")
    after = broken_links(tmp_path)
    lost = sorted(set(after) - set(before))
    assert lost and all("no heading or id 'the-whole-ci-run'" in problem for problem in lost), lost
