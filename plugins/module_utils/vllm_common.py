"""Helpers the host and controller code share, one home each: a JSON file read, a file's sha256, and the sort
key of a version string (packaging's order, without packaging). Standard library only: it ships to hosts with the
modules that import it (vllm_prune, vllm_converged, vllm_host_probe) and the controller's plugin_utils read it too."""

import hashlib
import json
import re

_CHUNK = 1 << 20
_RAISE = object()


def read_json(path, default=_RAISE):
    """The JSON document in ``path``. A missing, unreadable or invalid file raises (OSError, ValueError), or gives
    ``default`` when one is passed."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        if default is _RAISE:
            raise
        return default


def file_sha256(path):
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            sha.update(chunk)
    return sha.hexdigest()


# PEP 440 (the pattern packaging.version uses).
_VERSION = re.compile(
    r"""^\s*v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?P<pre>[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?
    (?P<dev>[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def version_key(text):
    """A sort key ordering version strings as packaging.version.Version does; None when text is no version."""
    found = _VERSION.match(text or "")
    if not found:
        return None
    release = [int(part) for part in found["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()  # 1.0 == 1.0.0
    if found["pre"]:
        pre = (1, _PRE_RANK[found["pre_l"].lower()], int(found["pre_n"] or 0))
    elif found["dev"] and not found["post"]:
        pre = (0,)  # 1.0.dev1 sorts before 1.0a1
    else:
        pre = (2,)
    post_n = found["post_n1"] or found["post_n2"]
    post = (1, int(post_n or 0)) if found["post"] else (0,)
    dev = (0, int(found["dev_n"] or 0)) if found["dev"] else (1,)
    local = tuple(
        (1, int(part), "") if part.isdigit() else (0, 0, part.lower())
        for part in re.split(r"[-_.]", found["local"] or "")
        if part
    )
    return (int(found["epoch"] or 0), tuple(release), pre, post, dev, local)


def public_version_key(text):
    """version_key without the local label (+cpu): 0.32.0 and 0.32.0+cpu are one version."""
    key = version_key(text)
    return key[:5] if key else None
