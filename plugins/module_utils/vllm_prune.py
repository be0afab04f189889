"""Which installed vLLM virtualenvs prune may remove, and why (roles/vllm_install/tasks/prune.yml).

``decide()`` is the decision, pure: resolved paths in, a verdict per directory out. The rest reads the host
for it (standard library only, runs inside the vllm_prune module as root):

- every path is compared resolved (``os.path.realpath``): the install root is often on a data disk behind a
  symlink (/opt -> /data/opt), and the active link, a process's memory maps and a snapshot's ``readlink``
  each name a directory in their own way;
- versions are ordered by their version number (PEP 440, as ``packaging`` orders them), never by a
  directory's mtime;
- a directory is never removed while the active link points at it, a running process (a vllm@ instance
  above all) has loaded its libraries, or a rollout snapshot or record names it.
"""

import glob
import os
import re
import shutil

from ansible_collections.vllm.cpu_fleet.plugins.module_utils import vllm_common
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_common import public_version_key, version_key

# <root>/<version>-<build class>, or <version>-<build class>-r<8 hex of the install record> for a reinstall
# of the version a host serves (plugin_utils/preflight/install.py install_directory).
NAME = re.compile(r"^(?P<base>(?P<version>[^-/]+)-[^/]+?)(?:-r(?P<digest>[0-9a-f]{8}))?$")
# Where an interrupted prune left a directory it had renamed for removal: removed on the next run.
TRASH_PREFIX = ".vllm-prune-"
SITE_PACKAGES = re.compile(r"\s(/\S+?)/lib/python3[.\d]*/site-packages/")


def base_name(path):
    """<version>-<class> of an install directory (its -r<digest> reinstall suffix dropped), or None."""
    found = NAME.match(os.path.basename(path.rstrip("/")))
    return found["base"] if found else None


def _within(path, directory):
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def decide(candidates, active, protected, keep_versions, prune_versions):
    """What prune removes.

    candidates: [{"path": resolved directory, "version": its recorded version or None}], the installs beside
      the active one (the active one may be among them);
    active: {"path": resolved target of the active link, "version": ...}, or None when there is no usable link
      (then nothing is removed: what serves is unknown);
    protected: {resolved path: why}: directories in use (running processes, rollout snapshots and records);
      a candidate is kept when it is, or holds, one of them;
    keep_versions: versions kept with prune_versions, the active one included (at least 1);
    prune_versions: also remove every version but the active one and the newest keep_versions - 1 others.

    Returns {"remove": [{"path", "reason"}], "keep": [{"path", "reason"}]}, both sorted by path. Installs of
    the active version and class that a reinstall superseded (<base> beside <base>-r<digest>) are removed in
    either mode.
    """
    remove, keep = [], []
    ordered = sorted(candidates, key=lambda c: c["path"])
    if not active or not active.get("path"):
        why = "no active version link to compare with: nothing is pruned"
        return {"remove": [], "keep": [{"path": c["path"], "reason": why} for c in ordered]}
    active_path = active["path"]
    active_base = base_name(active_path)
    active_parent = os.path.dirname(active_path)
    active_version = public_version_key(active.get("version"))
    others = []
    for candidate in ordered:
        path = candidate["path"]
        if path == active_path:
            keep.append({"path": path, "reason": "the active version link points here"})
            continue
        uses = sorted(why for where, why in protected.items() if _within(where, path))
        if uses:
            keep.append({"path": path, "reason": "in use: " + "; ".join(uses)})
        elif active_base and os.path.dirname(path) == active_parent and base_name(path) == active_base:
            remove.append(
                {"path": path, "reason": f"an install of the active {active_base} that a reinstall superseded"}
            )
        else:
            others.append(candidate)
    if not prune_versions:
        keep.extend({"path": c["path"], "reason": "another version (versions are pruned by upgrade.yml)"}
                    for c in others)  # fmt: skip
        return _sorted(remove, keep)
    keyed = [(public_version_key(c.get("version")), c) for c in others]
    newest_first = sorted({key for key, _unused in keyed if key and key != active_version}, reverse=True)
    kept_versions = set(newest_first[: max(int(keep_versions), 1) - 1])
    for key, candidate in keyed:
        if key is None:
            keep.append(
                {"path": candidate["path"], "reason": "its version is unknown (no record, no version in the name)"}
            )
        elif key == active_version:
            keep.append({"path": candidate["path"], "reason": "the active version (another build class)"})
        elif key in kept_versions:
            keep.append({"path": candidate["path"], "reason": f"version {candidate['version']} is among the newest"
                         f" {max(int(keep_versions), 1)} kept (vllm_install_keep_versions)"})  # fmt: skip
        else:
            remove.append({"path": candidate["path"], "reason": f"version {candidate['version']} is older than the"
                           f" newest {max(int(keep_versions), 1)} kept (vllm_install_keep_versions)"})  # fmt: skip
    return _sorted(remove, keep)


def _sorted(remove, keep):
    return {"remove": sorted(remove, key=lambda d: d["path"]), "keep": sorted(keep, key=lambda d: d["path"])}


# ---- reading the host -----------------------------------------------------------------------------------


def read_json(path):
    """The JSON document in path, None when it is missing, unreadable or invalid."""
    return vllm_common.read_json(path, None)


def recorded_version(venv):
    """The version the install record names (wanted.version, else imported_version), else the directory name's."""
    record = read_json(os.path.join(venv, "vllm-install.json"))
    record = record if isinstance(record, dict) else {}
    wanted = record.get("wanted") if isinstance(record.get("wanted"), dict) else {}
    for value in (wanted.get("version"), record.get("imported_version")):
        if isinstance(value, str) and version_key(value):
            return value
    found = NAME.match(os.path.basename(venv))
    return found["version"] if found and version_key(found["version"]) else None


def installs(root):
    """([{"path", "version"}] of the install directories under root, resolved; [leftovers of a stopped prune])."""
    found, trash = [], []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return found, trash
    for name in names:
        entry = os.path.join(root, name)
        if os.path.islink(entry) or not os.path.isdir(entry):
            continue  # the active link itself, files
        path = os.path.realpath(entry)
        if name.startswith(TRASH_PREFIX):
            trash.append(path)
        elif NAME.match(name):
            found.append({"path": path, "version": recorded_version(path)})
    return found, trash


def active_install(active_link):
    """{"path", "version"} of the directory the active link resolves to, or None (no link, or a dangling one)."""
    if not os.path.islink(active_link):
        return None
    path = os.path.realpath(active_link)
    if not os.path.isdir(path):
        return None
    return {"path": path, "version": recorded_version(path)}


def venvs_in_maps(text):
    """Every virtualenv whose site-packages a /proc/<pid>/maps text has mapped."""
    return sorted({found[1] for found in SITE_PACKAGES.finditer(text)})


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def _maps_as_owner(pid, uid, gid):
    """Reading another user's maps takes CAP_SYS_PTRACE, which root lacks in containers: read them as the
    process's own user, in a child that drops to it (as roles/vllm_service/files/vllm_fleet_state.py does)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.write(write_end, "\n".join(venvs_in_maps(_read(f"/proc/{pid}/maps"))).encode())
        except BaseException:
            os.write(write_end, b"\0")
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        text = answer.read().decode(errors="replace")
    os.waitpid(child, 0)
    if "\0" in text:
        raise PermissionError(f"/proc/{pid}/maps")
    return [line for line in text.splitlines() if line]


def process_venvs(proc="/proc"):
    """({resolved venv: why}, [problems]) for every process that has loaded a virtualenv's libraries.

    Every process counts (an operator's shell in an old venv too). A vllm@ unit none of whose processes has a
    readable virtualenv in its maps (its processes unreadable, or Python just starting) is a problem: its
    directory is unknown, so the caller removes nothing. A Python helper of a unit that loads no library
    (multiprocessing's resource tracker) is fine when another process of the unit names the virtualenv; the
    virtualenv its command line names is protected too.
    """
    used, units = {}, {}
    own_root = _root_of(os.path.join(proc, "self"))
    for pid_dir in glob.glob(os.path.join(proc, "[0-9]*")):
        pid = os.path.basename(pid_dir)
        if pid == str(os.getpid()):
            continue
        try:
            cgroup = _read(os.path.join(pid_dir, "cgroup"))
            owner = os.stat(pid_dir)
        except OSError:
            continue  # gone
        # The whole cgroup path up to the unit: containers each have their own vllm@vllm-0.service.
        unit = re.search(r"^[^:]*:[^:]*:(\S*?(vllm@[^/\s]*\.service))", cgroup, re.MULTILINE)
        label = f"{unit[2]} (pid {pid})" if unit else f"pid {pid}"
        # A unit under another root directory (a container's) runs from that machine's paths: its libraries still
        # protect what they name here, but one not readable yet stops nothing on this host.
        foreign = own_root is not None and _root_of(pid_dir) not in (None, own_root)
        seen = units.setdefault(unit[1], {"venvs": False, "unknown": []}) if unit and not foreign else None
        try:
            venvs = venvs_in_maps(_read(os.path.join(pid_dir, "maps")))
        except PermissionError:
            if seen is None:
                continue
            try:
                if os.geteuid() != 0:
                    raise PermissionError(pid)
                venvs = _maps_as_owner(pid, owner.st_uid, owner.st_gid)
            except OSError:
                seen["unknown"].append(f"{label}: its memory maps cannot be read")
                continue
        except OSError:
            continue  # gone
        for venv in venvs:
            used.setdefault(os.path.realpath(venv), f"{label} runs from it")
        if seen is None:
            continue
        seen["venvs"] = seen["venvs"] or bool(venvs)
        if not venvs and _is_python(pid_dir):
            named = _command_venv(pid_dir)
            if named:
                used.setdefault(named, f"{label} was started from it")
            seen["unknown"].append(f"{label}: a Python process that has loaded no virtualenv's libraries yet")
    problems = sorted(line for seen in units.values() if not seen["venvs"] for line in seen["unknown"])
    return used, problems


def _root_of(pid_dir):
    """(device, inode) of a process's root directory, or None where it cannot be read (a recorded tree)."""
    try:
        found = os.stat(os.path.join(pid_dir, "root"))
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _command_venv(pid_dir):
    """The resolved virtualenv a process's command line names (<venv>/bin/python...), or None."""
    try:
        argv0 = _read(os.path.join(pid_dir, "cmdline")).split("\0")[0]
    except OSError:
        return None
    if not re.search(r"/bin/python[.\d]*$", argv0):
        return None
    return os.path.realpath(os.path.dirname(os.path.dirname(argv0)))


def _is_python(pid_dir):
    try:
        return os.path.basename(os.readlink(os.path.join(pid_dir, "exe"))).startswith("python")
    except OSError:
        return False


def snapshot_paths(snapshot_dirs, active_link):
    """{resolved path: why} for every directory a rollout snapshot (<dir>/<id>/active, <dir>/active: the
    previous link target, as readlink wrote it) or a rollout record (<dir>/state.json: from, to) names."""
    named = {}
    link_dir = os.path.dirname(active_link)
    for directory in snapshot_dirs:
        for path in sorted(
            glob.glob(os.path.join(directory, "*", "active")) + glob.glob(os.path.join(directory, "active"))
        ):
            try:
                target = _read(path).strip()
            except OSError:
                continue
            if target:
                named.setdefault(os.path.realpath(os.path.join(link_dir, target)), f"the rollout snapshot {path}")
        record = read_json(os.path.join(directory, "state.json"))
        if isinstance(record, dict):
            for field in ("from", "to"):
                value = record.get(field)
                if isinstance(value, str) and value.startswith("/"):
                    named.setdefault(os.path.realpath(value), f"the rollout record {directory}/state.json ({field})")
    return named


def remove_tree(path, root):
    """Remove an install directory: renamed away first (one atomic step), so that no half-removed virtualenv
    with its install record is ever left under its own name for an install to take as complete."""
    trash = os.path.join(root, TRASH_PREFIX + os.path.basename(path))
    if os.path.lexists(trash):
        shutil.rmtree(trash)
    os.rename(path, trash)
    shutil.rmtree(trash)


def prune(root, active_link, keep_versions, prune_versions, snapshot_dirs, protect, check_mode, proc="/proc"):
    """Read the host, decide, remove (unless check_mode). Returns the module's result."""
    real_root = os.path.realpath(root)
    candidates, trash = installs(root)
    active = active_install(active_link)
    protected = {os.path.realpath(path): "this run's install (vllm_install_venv)" for path in protect if path}
    protected.update(snapshot_paths(snapshot_dirs, active_link))
    used, problems = process_venvs(proc)
    protected.update(used)
    decision = decide(candidates, active, protected, keep_versions, prune_versions)
    if problems:
        why = "not pruned: " + "; ".join(problems)
        decision = {"remove": [], "keep": sorted(decision["keep"] + [
            {"path": d["path"], "reason": why} for d in decision["remove"]], key=lambda d: d["path"])}  # fmt: skip
    result = {
        "root": real_root,
        "active": active["path"] if active else None,
        "protected": dict(sorted(protected.items())),
        "problems": problems,
        "removed": decision["remove"],
        "kept": decision["keep"],
        "changed": bool(decision["remove"] or trash),
    }
    if check_mode:
        return result
    for path in trash:
        shutil.rmtree(path, ignore_errors=True)
    removed = []
    for item in decision["remove"]:
        # The link may have moved since it was read: never remove what it names now.
        if os.path.realpath(active_link) == item["path"]:
            result["kept"].append({"path": item["path"], "reason": "the active version link points here (moved)"})
            continue
        remove_tree(item["path"], os.path.dirname(item["path"]))
        removed.append(item)
    result.update(removed=removed, changed=bool(removed or trash))
    return result
