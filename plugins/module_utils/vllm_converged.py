"""The converged record: how a re-run knows, in its one facts run per host, that a host needs nothing.

A host that finished site.yml (or upgrade.yml) keeps a record of what it converged to: the digest of every
input the roles read for it, and witnesses of its state - the sha256 of the files the roles wrote, the
permission bits and numeric owner of those files and their directories, the listing (names and sizes) of
large trees (the model), the targets of links, the units that must be active. The next run's preflight
reads the record and checks every witness on the host in the same module run; the controller computes
this run's digest. The roles then skip a host only when both hold:

- the digest equals the recorded one: every option of every role it runs (typed by the argument specs,
  templated for this host), the plan, the facts' key, the OS facts the roles read, the release rows, what
  preflight derived from them (what to install), the collection's files and the controller files the host
  receives (the model), and the own digests of its peers (a vLLM host's load balancers and, for built
  wheels, builders; a load balancer's backends), so that a change anywhere a host's files depend on
  reaches it;
- every witness still holds (a hand-edited, removed, replaced, re-moded or re-owned file, a stopped unit, an
  nftables table flushed or edited while its oneshot unit still says active: the full run).

Anything else, and ``vllm_fleet_full_converge``, takes the full run, which removes the record before it
changes anything and writes it again only after the host passed every gate. Host-side functions use the
standard library only (they run inside modules).
"""

import grp
import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_common import file_sha256
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_lb_backends import server_owner

# 2: the witnesses hold the files' and directories' modes and owners (a record of format 1 is no record).
RECORD_FORMAT = 2


def digest(value):
    """The sha256 of a JSON value, independent of dict order; anything JSON cannot say is said by str()."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tree_signature(root, skip_dirs=(), skip_suffixes=(), content=False):
    """(relative path, size, mtime ns) of every file under root, sorted; [] when root is not a directory.

    For the controller's own files. The model it copies: an edit or a copy changes a size or a modification
    time, and reading every byte of a model on every run would cost more than the run saves. With content,
    (relative path, size, sha256) instead, for the collection (a few megabytes, read in milliseconds): a
    second clone, a checkout or a copy with other times but the same files is the same collection.
    """
    found = []
    for current, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skip_dirs)
        for name in files:
            if name.endswith(skip_suffixes):
                continue
            path = os.path.join(current, name)
            try:
                status = os.stat(path)
            except OSError:
                continue
            if content:
                try:
                    stamp = file_sha256(path)
                except OSError:
                    continue
            else:
                stamp = status.st_mtime_ns
            found.append((os.path.relpath(path, root), status.st_size, stamp))
    return sorted(found)


def decide(own, peers, recorded, full_converge=False):
    """Whether a run can skip a host: {inputs, converged, reason, forget}.

    own: this run's digest of the host's own inputs; peers: {peer host: its own digest, or None when the peer
    is not in this run (a --limit): the recorded one stands for it, since this run changes nothing there};
    recorded: the probe's answer ({inputs, drift, reason}). inputs is what a full run records afterwards;
    forget: the record exists but no longer describes the host (remove it before changing anything).
    """
    recorded = recorded or {}
    before = recorded.get("inputs") or {}
    before_peers = before.get("peers") or {}
    effective = {host: value or before_peers.get(host) for host, value in sorted(peers.items())}
    unknown = sorted(host for host, value in effective.items() if not value)
    moved = sorted(set(before_peers) ^ set(effective) | {h for h in effective if before_peers.get(h) != effective[h]})
    if not before:
        reason = recorded.get("reason") or "no converged record"
    elif recorded.get("drift"):
        reason = "changed on the host since the last run: " + "; ".join(recorded["drift"][:5])
    elif before.get("own") != own:
        reason = "its own inputs changed since the last run"
    elif unknown:
        reason = f"peers not in this run and not recorded: {', '.join(unknown)}"
    elif moved:
        reason = f"inputs of its peers changed since the last run: {', '.join(moved)}"
    else:
        reason = None
    return {
        "inputs": {"own": own, "peers": effective},
        "converged": reason is None and not full_converge,
        "reason": reason or ("vllm_fleet_full_converge is set" if full_converge else "unchanged since the last run"),
        "forget": bool(before) and reason is not None,
    }


def decide_fleet(inputs_by_host, builders=()):
    """Every host's decision at once: {host: decide(...)}.

    inputs_by_host: {host: its vllm_fleet_converged_inputs} for the hosts of this run; a peer missing from it is
    outside the run (--limit). A monitoring host (monitors) is decided on own and watch digests together. A builder
    changes while any changing host installs the wheels builders make.
    """
    own = {host: inputs["own"] for host, inputs in inputs_by_host.items()}
    decisions = {}
    for host, inputs in inputs_by_host.items():
        if not inputs.get("monitors"):
            decisions[host] = decide(
                inputs["own"],
                {peer: own.get(peer) for peer in inputs["peers"]},
                inputs.get("recorded"),
                bool(inputs.get("full_converge")),
            )

    # What a monitoring host's files hold of each host: its whole decided inputs (the fleet_inputs label that
    # VllmFleetDrift compares with the host's record moves with its peers too; another monitoring host: its own
    # digest, so that the value does not depend on the order hosts are decided in) and its watch digest (its
    # monitoring knobs and scrape address, left out of its own digest: such a knob converges the monitoring hosts
    # alone). A host outside this run has none: its recorded value stands.
    watched = {
        host: digest([decisions[host]["inputs"] if host in decisions else inputs["own"], inputs.get("watch")])
        for host, inputs in inputs_by_host.items()
    }
    for host, inputs in inputs_by_host.items():
        if inputs.get("monitors"):
            decisions[host] = decide(
                digest([inputs["own"], inputs.get("watch")]),
                {peer: watched.get(peer) for peer in inputs["peers"]},
                inputs.get("recorded"),
                bool(inputs.get("full_converge")),
            )
    decisions = dict(sorted(decisions.items()))
    _not_ready_on_loadbalancers(decisions, inputs_by_host)
    wheel_hosts = [h for h, d in decisions.items() if not d["converged"] and inputs_by_host[h].get("installs_wheel")]
    if wheel_hosts:
        named = ", ".join(wheel_hosts[:5]) + (f" and {len(wheel_hosts) - 5} more" if len(wheel_hosts) > 5 else "")
        for builder in builders:
            if decisions.get(builder, {}).get("converged"):
                decisions[builder] = dict(decisions[builder], converged=False, reason="builds for " + named)
    return decisions


def _not_ready_on_loadbalancers(decisions, inputs_by_host):
    """A host with a server that some load balancer of this run holds drained or in maintenance is not converged:
    its record's witnesses are on the host, and a run lost (or an HAProxy that restored an older state) left the
    server out of the pool; the rollout's recovery gates the host and puts it back. Decided in place."""
    found = {}
    for lb, inputs in sorted(inputs_by_host.items()):
        for server, admin in sorted((inputs.get("not_ready") or {}).items()):
            owner = server_owner(server, decisions)
            if owner is not None and owner != lb:
                found.setdefault(owner, []).append(f"{server} is in {admin} on {lb}")
    for host, said in found.items():
        if decisions[host]["converged"]:
            recorded = (inputs_by_host[host].get("recorded") or {}).get("inputs")
            decisions[host] = dict(
                decisions[host],
                converged=False,
                reason="not in service on every load balancer: " + "; ".join(said[:5]),
                forget=bool(recorded),
            )


# ---- on the host (standard library only) ----


def _paths_under(paths):
    """(files, directories) under each path (a file itself, or a directory and its tree), sorted; missing ones
    skipped."""
    files, directories = set(), set()
    for path in paths:
        if os.path.isfile(path):
            files.add(path)
        elif os.path.isdir(path):
            for current, dirs, names in os.walk(path):
                dirs.sort()
                directories.add(current)
                files.update(os.path.join(current, name) for name in names)
    return sorted(files), sorted(directories)


def _mode_and_owner(path):
    """A path's permission bits and numeric owner, as `0640 0:997`: a chmod or chown by hand is drift too (a key
    made readable to all, a directory handed to another user)."""
    status = os.stat(path)
    return f"{stat.S_IMODE(status.st_mode):04o} {status.st_uid}:{status.st_gid}"


def _listing(root):
    """{relative path: size} of the regular files under root."""
    out = {}
    for current, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            path = os.path.join(current, name)
            out[os.path.relpath(path, root)] = os.path.getsize(path)
    return out


# `systemctl is-enabled` of a unit that starts at boot: "generated" is a Quadlet unit (container mode), whose [Install]
# the generator turns into wants links on every boot; its .container file is a witnessed file.
STARTS_AT_BOOT = ("enabled", "generated")


def _units_state(units, verb):
    """{unit: state} from one `systemctl is-active` or `is-enabled` call (one line per unit, in order)."""
    if not units:
        return {}
    try:
        done = subprocess.run(
            ["systemctl", verb, "--", *units], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return dict.fromkeys(units, f"unknown ({type(exc).__name__})")
    lines = done.stdout.split("\n")
    return {
        unit: (lines[i].strip() if i < len(lines) and lines[i].strip() else "unknown") for i, unit in enumerate(units)
    }


def _account(kind, name):
    """A user as `uid:gid home`, a group as its gid; None when there is none (a userdel by hand)."""
    try:
        if kind == "user":
            entry = pwd.getpwnam(name)
            return f"{entry.pw_uid}:{entry.pw_gid} {entry.pw_dir}"
        return str(grp.getgrnam(name).gr_gid)
    except KeyError:
        return None


def _without_state(value):
    """nft's JSON without what changes while the rules stay the same: handles, counters' values, the version."""
    if isinstance(value, list):
        return [_without_state(item) for item in value if not (isinstance(item, dict) and "metainfo" in item)]
    if isinstance(value, dict):
        return {
            key: None if key == "counter" else _without_state(item) for key, item in value.items() if key != "handle"
        }
    return value


def nft_table(table):
    """The digest of the live nftables table `<family> <name>` (`nft -j list table`, normalised by _without_state), or
    None when there is none (flushed, deleted, or no nft)."""
    try:
        # /usr/sbin may be missing from a module's PATH (a become without secure_path): no table would be seen.
        nft = shutil.which("nft") or "/usr/sbin/nft"
        done = subprocess.run(
            [nft, "-j", "list", "table", *table.split()], capture_output=True, text=True, timeout=30, check=False
        )
        ruleset = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if not isinstance(ruleset, dict):
        return None
    return digest(_without_state(ruleset.get("nftables", [])))


def witness(spec):
    """The witnesses of spec {files: [paths], trees: [dirs], links: [paths], units: [names], users: [names],
    groups: [names], nft_tables: ['<family> <name>']} as they are now."""
    files, directories = _paths_under(spec.get("files", []))
    found = {
        "files": {path: file_sha256(path) for path in files},
        "modes": {path: _mode_and_owner(path) for path in (*files, *directories)},
        "trees": {root: _listing(root) for root in spec.get("trees", []) if os.path.isdir(root)},
        "links": {path: os.readlink(path) for path in spec.get("links", []) if os.path.islink(path)},
        "units": sorted(spec.get("units", [])),
    }
    accounts = [("user", name) for name in spec.get("users", [])] + [("group", name) for name in spec.get("groups", [])]
    if accounts:
        # The units run as these: files keep a deleted user's number, so the modes alone would not see it go.
        found["accounts"] = {f"{kind} {name}": _account(kind, name) for kind, name in accounts}
    if spec.get("nft_tables"):
        # A oneshot unit stays active after its table is flushed: the table's own content is the witness.
        found["nft_tables"] = {table: nft_table(table) for table in spec["nft_tables"]}
    return found


def write_record(path, inputs, spec, check=False):
    """Write the record of inputs ({own, peers}) with the witnesses of spec: (whether it changed, the witnesses).

    check: say whether it would change, write nothing.
    """
    record = {"format": RECORD_FORMAT, "inputs": inputs, "spec": spec, "witness": witness(spec)}
    text = json.dumps(record, sort_keys=True, indent=1) + "\n"
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False, record["witness"]
    except OSError:
        pass
    if not check:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        temporary = f"{path}.tmp"
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    return True, record["witness"]


def _drift(recorded, now):
    """What differs between the recorded witnesses and the ones read now, one line each."""
    said = []
    for path, sha in sorted(recorded.get("files", {}).items()):
        if path not in now["files"]:
            said.append(f"{path} is gone")
        elif now["files"][path] != sha:
            said.append(f"{path} was changed")
    said += [f"{path} is new" for path in sorted(set(now["files"]) - set(recorded.get("files", {})))]
    for path, was in sorted(recorded.get("modes", {}).items()):
        if now["modes"].get(path, was) != was:
            said.append(f"{path} has mode and owner {now['modes'][path]}, was {was}")
    for root, listing in sorted(recorded.get("trees", {}).items()):
        if now["trees"].get(root) != listing:
            said.append(f"the files under {root} changed")
    for path, target in sorted(recorded.get("links", {}).items()):
        if now["links"].get(path) != target:
            said.append(f"{path} no longer points at {target}")
    for account, was in sorted(recorded.get("accounts", {}).items()):
        is_now = now.get("accounts", {}).get(account)
        if is_now != was:
            said.append(f"{account} is gone" if is_now is None else f"{account} is {is_now}, was {was}")
    for table, was in sorted(recorded.get("nft_tables", {}).items()):
        is_now = now.get("nft_tables", {}).get(table)
        if is_now is None or is_now != was:  # a table recorded absent is no witness of a firewall either
            said.append(f"the nftables table {table} is {'gone' if is_now is None else 'not the one recorded'}")
    return said


def unwritable(path):
    """Why no record can be written at path (what is in its way), or "" when it can."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return f"{path} is a {'directory' if os.path.isdir(path) else 'special file'}"
        return ""
    except (FileNotFoundError, NotADirectoryError):
        pass  # no file yet; an ancestor may be in the way
    except OSError as exc:
        return f"{path} cannot be examined ({exc.strerror})"
    parent = os.path.dirname(path)
    while not os.path.exists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        return f"{parent}, where its directory would be, is not a directory"
    return ""


def read_record(path):
    """The probe's answer: {inputs, drift: [what changed], reason, unwritable}; inputs None without a usable
    record; unwritable says what would make the run's last step, writing the record, fail (unwritable())."""
    blocked = unwritable(path)
    if blocked:
        return {"inputs": None, "drift": [], "reason": f"no record can be written: {blocked}", "unwritable": blocked}
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return {"inputs": None, "drift": [], "reason": "no converged record"}
    except (OSError, ValueError) as exc:
        return {"inputs": None, "drift": [], "reason": f"the converged record {path} is unreadable ({exc})"}
    if (
        not isinstance(record, dict)
        or record.get("format") != RECORD_FORMAT
        or not isinstance(record.get("inputs"), dict)
    ):
        return {"inputs": None, "drift": [], "reason": f"the converged record {path} has another format"}
    spec, recorded = record.get("spec") or {}, record.get("witness") or {}
    try:
        now = witness(spec)
    except OSError as exc:
        return {"inputs": None, "drift": [], "reason": f"a witness of {path} is unreadable ({exc})"}
    drift = _drift(recorded, now)
    units = now["units"]
    drift += [f"{unit} is {state}" for unit, state in _units_state(units, "is-active").items() if state != "active"]
    drift += [
        f"{unit} is {state}" for unit, state in _units_state(units, "is-enabled").items() if state not in STARTS_AT_BOOT
    ]
    return {"inputs": record["inputs"], "drift": drift, "reason": ""}
