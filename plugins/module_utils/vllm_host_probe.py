"""What preflight must ask the host itself, read in the facts module's one run (stdlib only, read-only).

``probe(spec)`` answers the sections ``spec`` names; each is optional:

- ``install``: {python, root, version, host_wheelhouse, active_link, snapshot_dirs} -> the Python that
  makes the virtualenv (version, wheel tag, whether venv and ensurepip import), glibc, free space under
  the install root and the host wheelhouse (at their nearest existing directory), the install records
  (``vllm-install.json``) of every ``<root>/<version>-*`` directory, the active-version link, and which
  of those directories a rollout snapshot or record in snapshot_dirs names.
- ``build``: {python, dirs} -> the build Python's version, MemAvailable, the least free space under dirs.
- ``service``: {user, listen_address, [models_dir, model_version]} -> every listening TCP socket (port, pid,
  comm, and whether it belongs to one of our vllm@ instances), the addresses listen_address resolves to, free
  /dev/shm, the effective capabilities, whether /sys/fs/cgroup is cgroup v2; with a controller model, the free
  space under models_dir and the bytes its version (model_version) holds already.
- ``converged``: {path} -> the converged record there and whether its witnesses still hold
  (module_utils/vllm_converged.py).
- ``storage``: {path} -> the size of the file system that holds path (a monitoring host's Prometheus storage).
- ``loadbalancer``: {socket, backend} -> HAProxy's ``show servers state <backend>`` answer from its admin socket
  (or why there is none): servers a drain left out make their hosts' converged decision a full run.
- ``container``: {podman, seccomp, dirs, tools} -> whether SELinux enforces, ``podman --version`` (or why it did
  not run), whether podman's default seccomp profile is there, the free space under each of dirs (podman's storage,
  the image build's work root: at their nearest existing directory) and where each of tools is on PATH (crun,
  debootstrap); container mode (plugin_utils/preflight/container.py).

One module run answers all of them: each remote run costs a large fleet's controller more than what it reads.
"""

import contextlib
import glob
import io
import os
import pwd
import shutil
import socket
import struct
import subprocess
import sys

from ansible_collections.vllm.cpu_fleet.plugins.module_utils import vllm_common
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_converged import read_record
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_host_addresses import NLM_F_DUMP, NetlinkError, ask
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_prune import snapshot_paths

_LISTEN = "0A"
# sock_diag (linux/inet_diag.h): a dump of the TCP sockets in the states asked for. Asked for LISTEN alone,
# the kernel walks only its listening table; /proc/net/tcp walks the whole connection table, empty buckets
# included (8 ms on a 2-CPU VM with one listener, more with the connections of a busy server).
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
TCPF_LISTEN = 1 << 10
_INET_DIAG_REQ = struct.Struct("=BBBBL48x")
# inet_diag_msg: family, state, timer, retrans, then the socket id (source port first, network order), then
# expires, rqueue, wqueue, uid, inode.
_INET_DIAG_PORT = struct.Struct(">H")
_INET_DIAG_UID_INODE = struct.Struct("=LL")
# One interpreter start: the version even when venv/ensurepip are missing (python3-venv comes later from the
# toolchain role, so preflight judges the two separately), then the import error if there is one.
_PYTHON_INFO = """import sys
print('%d.%d cp%d%d' % (sys.version_info[:2] * 2))
try:
    import venv, ensurepip
except Exception as exc:
    print('%s: %s' % (type(exc).__name__, exc))
"""


def _is_this_interpreter(python):
    """Whether ``python`` is the interpreter running this code (usually: both are the host's python3)."""
    found = shutil.which(python)
    return bool(found) and os.path.realpath(found) == os.path.realpath(sys.executable)


def _run_python(python, code):
    """(stdout, error) of ``python -c code``; error is the last line of what went wrong, else ''.

    In this process when ``python`` is this interpreter: the same answers without starting one more.
    """
    if _is_this_interpreter(python):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(code, {})
        except Exception as exc:
            return "", f"{type(exc).__name__}: {exc}"
        return out.getvalue().strip(), ""
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return "", str(exc)
    if done.returncode:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return "", (lines or [f"exit code {done.returncode}"])[-1]
    return done.stdout.decode("utf-8", "replace").strip(), ""


def python_info(python):
    """Version ("3.11"), wheel tag ("cp311"), and whether it can make a virtualenv (venv and ensurepip)."""
    out, error = _run_python(python, _PYTHON_INFO)
    lines = out.splitlines()
    version, _sep, tag = (lines[0] if lines else "").partition(" ")
    if len(lines) > 1:
        error = lines[-1]
    ok = bool(version) and not error
    return {"python_version": version, "python_tag": tag, "python_ok": ok, "python_error": error}


def existing_dir(path):
    """The nearest existing directory of a path that may not exist yet."""
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return path


def mount_point(path):
    path = existing_dir(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def free_bytes(path):
    stat = os.statvfs(existing_dir(path))
    return stat.f_bavail * stat.f_frsize


def glibc_version():
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    except (ValueError, OSError, AttributeError, IndexError):
        return ""


def read_json(path):
    """The JSON object in path, {} when it is missing, unreadable, invalid or not an object."""
    data = vllm_common.read_json(path, {})
    return data if isinstance(data, dict) else {}


def link_target(path):
    try:
        return os.readlink(path) if os.path.islink(path) else ""
    except OSError:
        return ""


def install(spec):
    root, wheelhouse = spec["root"], spec["host_wheelhouse"]
    records = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(root), glob.escape(spec["version"]) + "-*"))):
        marker = os.path.join(path, "vllm-install.json")
        if os.path.isfile(marker):
            records[path] = read_json(marker)
    root_mount, wheelhouse_mount = mount_point(root), mount_point(wheelhouse)
    result = python_info(spec["python"])
    result.update(
        glibc=glibc_version(),
        root_mount=root_mount,
        root_free_bytes=free_bytes(root),
        wheelhouse_mount=wheelhouse_mount,
        wheelhouse_free_bytes=free_bytes(wheelhouse),
        same_fs=root_mount == wheelhouse_mount,
        records=records,
        active=link_target(spec["active_link"]),
        # This version's directories a rollout snapshot or record names (compared resolved, as prune does): a
        # rollback may need them as they are, so a reinstall goes beside them.
        in_snapshots=sorted(
            path
            for path in records
            if os.path.realpath(path) in snapshot_paths(spec.get("snapshot_dirs", []), spec["active_link"])
        ),
    )
    return result


def mem_available_kib():
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def build(spec):
    out, error = _run_python(spec["python"], "import sys; print('%d.%d' % sys.version_info[:2])")
    return {
        "python": out,
        "python_error": error,
        "mem_available_kib": mem_available_kib(),
        "disk_free_kib": min(free_bytes(d) for d in spec["dirs"]) // 1024,
    }


def _listening_inodes():
    """{socket inode: (port, uid)} of every listening TCP socket: over sock_diag, or from /proc where a kernel
    or a sandbox has no sock_diag for TCP."""
    try:
        return _listening_inodes_diag()
    except (OSError, NetlinkError, struct.error):
        return _listening_inodes_proc()


def _listening_inodes_diag():
    found = {}
    for family in (socket.AF_INET, socket.AF_INET6):
        request = _INET_DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, TCPF_LISTEN)
        for _unused, payload in ask(SOCK_DIAG_BY_FAMILY, NLM_F_DUMP, request, NETLINK_SOCK_DIAG):
            (port,) = _INET_DIAG_PORT.unpack_from(payload, 4)
            uid, inode = _INET_DIAG_UID_INODE.unpack_from(payload, 64)
            found[str(inode)] = (port, uid)
    return found


def _listening_inodes_proc():
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN:
                found[fields[9]] = (int(fields[1].rsplit(":", 1)[1], 16), int(fields[7]))
    return found


def _socket_owners(inodes):
    owners = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.setdefault(target[8:-1], pid)
    return owners


def _describe(pid, uid, service_uid):
    """(comm, "vllm" or "other"): ours when in a vllm@ unit's cgroup or, with /proc closed to us, the service user's."""
    if pid is not None:
        try:
            with (
                open(f"/proc/{pid}/comm", encoding="utf-8") as comm,
                open(f"/proc/{pid}/cgroup", encoding="utf-8") as cg,
            ):
                return comm.read().strip(), "vllm" if "/vllm@" in cg.read() else "other"
        except OSError:
            pass
    if uid == service_uid:
        return "a process of the service user", "vllm"
    return f"a process of uid {uid}", "other"


def listeners(service_user):
    try:
        service_uid = pwd.getpwnam(service_user).pw_uid
    except KeyError:
        service_uid = None
    inodes = _listening_inodes()
    owners = _socket_owners(inodes)
    out = []
    for inode, (port, uid) in sorted(inodes.items(), key=lambda item: item[1]):
        pid = owners.get(inode)
        comm, unit = _describe(pid, uid, service_uid)
        out.append({"port": port, "pid": int(pid) if pid else None, "comm": comm, "unit": unit})
    return out


def resolve(address):
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(info[4][0] for info in infos))


def shm_free_mib(path="/dev/shm"):
    try:
        stat = os.statvfs(path)
    except OSError:
        return 0
    return -(-stat.f_bavail * stat.f_frsize // (1024 * 1024))


def cap_eff():
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return line.split()[1]
    return "0"


def tree_bytes(root):
    """The bytes of the files under root (0 when it is not there)."""
    total = 0
    for current, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(current, name)).st_size
            except OSError:
                continue
    return total


def service(spec):
    found = {
        "listeners": listeners(spec["user"]),
        "listen_ips": resolve(spec["listen_address"]),
        "shm_free_mib": shm_free_mib(),
        "cap_eff": cap_eff(),
        "cgroup2": os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
    }
    if spec.get("model_version"):
        # The room a controller model's version needs (roles/vllm_service/tasks/model_path.yml): what is free
        # there, and what the version holds already.
        found["models_dir"] = spec["models_dir"]
        found["models_free_bytes"] = free_bytes(spec["models_dir"])
        found["model_staged_bytes"] = tree_bytes(spec["model_version"])
    return found


def converged(spec):
    return read_record(spec["path"])


def _first_line(argv):
    """(first line of stdout, error) of a short command; error is '' when it ran and exited 0."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return "", str(exc)
    out = done.stdout.decode("utf-8", "replace").strip().splitlines()
    if done.returncode:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return "", (lines or [f"exit code {done.returncode}"])[-1]
    return (out or [""])[0], ""


def _image_exists(podman, reference):
    """Whether podman's storage holds the image (`podman image exists`: exit 0 yes, 1 no)."""
    if not reference:
        return False
    try:
        done = subprocess.run([podman, "image", "exists", reference], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def selinux_enforcing(path="/sys/fs/selinux/enforce"):
    """Whether SELinux enforces its policy (selinuxfs says 1); False without SELinux."""
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip() == "1"
    except (OSError, ValueError):
        return False


def container(spec):
    version, error = _first_line([spec["podman"], "--version"])
    return {
        "selinux_enforcing": selinux_enforcing(spec.get("selinux_enforce", "/sys/fs/selinux/enforce")),
        "image_present": bool(version) and _image_exists(spec["podman"], spec.get("image", "")),
        "podman_version": version,
        "podman_error": error,
        "seccomp_default": os.path.isfile(spec["seccomp"]),
        "free": {path: {"mount": mount_point(path), "bytes": free_bytes(path)} for path in spec.get("dirs", [])},
        "tools": {name: shutil.which(name) or "" for name in spec.get("tools", [])},
        "cgroup2": os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
    }


def storage(spec):
    """The size of the file system that holds spec's path (at its nearest existing directory): a monitoring host's
    Prometheus storage, for monitoring_prometheus_retention_size: auto."""
    path = existing_dir(spec["path"])
    found = os.statvfs(path)
    return {"mount": mount_point(path), "size_bytes": found.f_blocks * found.f_frsize}


def loadbalancer(spec, timeout=5.0):
    """HAProxy's `show servers state <backend>` answer from its admin socket, or why there is none: a load
    balancer's converged decision reads which servers are not ready (module_utils/vllm_converged.py)."""
    path = spec["socket"]
    if not os.path.exists(path):
        return {"servers_state": None, "error": f"no admin socket at {path}"}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(path)
            conn.sendall(f"show servers state {spec['backend']}\n".encode())
            chunks = []
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as exc:
        return {"servers_state": None, "error": f"the admin socket {path} did not answer ({exc})"}
    return {"servers_state": b"".join(chunks).decode("utf-8", "replace"), "error": ""}


SECTIONS = {
    "install": install,
    "build": build,
    "service": service,
    "converged": converged,
    "container": container,
    "loadbalancer": loadbalancer,
    "storage": storage,
}


def probe(spec):
    """{section: answer} for each section of spec (see the module docstring)."""
    unknown = sorted(set(spec) - set(SECTIONS))
    if unknown:
        raise ValueError(f"probe: unknown section(s) {', '.join(unknown)}; known: {', '.join(sorted(SECTIONS))}")
    return {name: SECTIONS[name](section) for name, section in spec.items() if section is not None}
