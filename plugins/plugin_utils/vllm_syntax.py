"""What each destination of an input can carry: one rule per file or command the roles write a value into.

Preflight (vllm_preflight.py) and the release table (vllm_cpu_releases.py) apply these to every value that reaches
the destination, wherever the value comes from (an inventory option, a release row, an override). A rule takes the
value and returns None when the destination carries it exactly as written, else a Refusal: what the destination
would make of it and what to write instead; ``say`` turns that into preflight's message
"<host>: <variable>: is <value>, <problem>; fix: <fix>.".

Standard library only: scripts/wheelhouse.py imports vllm_cpu_releases.py (and so this file) by itself.
"""

import ipaddress
import math
import re
from typing import NamedTuple


class Refusal(NamedTuple):
    problem: str
    fix: str


def say(host, name, value, refusal, secret=False):
    """The house message for a refusal; a secret (keys, tokens) is never shown, only that it is refused."""
    shown = "is a secret (not shown)" if secret else f"is {value!r}"
    where = f"{host}: " if host else ""
    return f"{where}{name}: {shown}, {refusal.problem}; fix: {refusal.fix}."


CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Printable ASCII: what survives every destination below byte for byte.
PRINTABLE_ASCII = re.compile(r"^[\x20-\x7e]*\Z")

# ------------------------------------------------------------------------------------------------ HAProxy

# HAProxy's configuration tokenizer (cfgparse.c parse_line, 2.6): blanks separate words, `#` starts a comment,
# `"` and `'` open quotes, `\` escapes the next character, a line break ends the line and NUL ends the text.
HAPROXY_SPECIAL = re.compile(r"[\s#\"'\\\x00-\x1f\x7f]")
# A request path as RFC 3986 writes one (segments of pchar: unreserved, %HH, sub-delims, : @), without what
# HAProxy's tokenizer reads otherwise (the sub-delim `'` opens a quote).
URL_PATH = re.compile(r"^/(?:[A-Za-z0-9._~!$&()*+,;=:@/-]|%[0-9A-Fa-f]{2})*\Z")


def haproxy_word(value):
    """One word of a haproxy.cfg line, read back exactly as written."""
    if not isinstance(value, str) or not value:
        return Refusal("no word HAProxy reads (it is empty or not a string)", "write it as one word of text")
    special = HAPROXY_SPECIAL.search(value)
    if special:
        return Refusal(
            f"and HAProxy's configuration reads {special[0]!r} in it as "
            + _haproxy_meaning(special[0])
            + " (it would not be one word of that line)",
            "one word without blanks, #, quotes, backslashes or control characters",
        )
    return None


def _haproxy_meaning(char):
    if char == "#":
        return "the start of a comment (the rest of the line is dropped)"
    if char in "\"'":
        return "a quote"
    if char == "\\":
        return "an escape"
    if char in " \t":
        return "a word separator"
    return "the end of the line or of the text"


def haproxy_words(value):
    """Several words of one haproxy.cfg line, separated by blanks (`log stdout format raw local0`)."""
    if not isinstance(value, str) or not value.strip():
        return Refusal("no HAProxy words (it is empty or not a string)", "write the words on one line")
    if CONTROL.search(value.replace("\t", " ")):
        return Refusal("has a line break or control character inside a haproxy.cfg line", "write it on one line")
    for word in value.split():
        refusal = haproxy_word(word)
        if refusal:
            return refusal
    return None


def url_path(value, prefix=False):
    """A request path HAProxy matches (path, path_beg) and sends (option httpchk): RFC 3986 path characters only,
    absolute, without dot segments, and one haproxy.cfg word. prefix: matched as a prefix (path_beg), where "/"
    would match every route."""
    refusal = haproxy_word(value)
    if refusal:
        return refusal
    if not value.startswith("/"):
        return Refusal("not an absolute request path", "start it with /, such as /v1/")
    if not URL_PATH.match(value):
        return Refusal(
            "has characters a request path does not carry as written (RFC 3986: letters, digits, - . _ ~ ! $ & ( ) *"
            " + , ; = : @ / and %HH)",
            "write the path as clients send it, percent-encoding anything else",
        )
    if any(segment in (".", "..") for segment in value.split("/")):
        return Refusal("has a dot segment (. or ..), which clients' paths are normalised without", "drop it")
    if prefix and value == "/":
        return Refusal(
            "a prefix of every route, including vLLM's unauthenticated ones (/invocations, /tokenize, /detokenize)",
            "list only the routes clients need (default: /v1/ and /health)",
        )
    return None


# A DNS name (RFC 1123): dot-separated labels of letters, digits and inner hyphens, 253 characters at most.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
DNS_NAME = re.compile(rf"^(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*\Z")


def _plain_ip(text):
    """The IPv4 or IPv6 address text is, written as an address alone (no zone index: `%eth0` is no word of the
    destinations below), else None."""
    if not isinstance(text, str) or "%" in text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def backend_address(value):
    """A server's address on its HAProxy `server` line (`server NAME ADDRESS:PORT ssl verify required ...`) and in
    the admin socket's `set server ... addr`: one IP address or one DNS name, nothing else. Anything after a blank
    is another server keyword (`backup`, `weight 0`, `disabled`), a `:` a port of its own, a `#` a comment that
    drops `ssl verify required` (the key crosses in clear)."""
    # A name's last label is not all digits (RFC 1123 2.1): libc reads 10.0.0.256 or 10.1 as no address or another.
    if _plain_ip(value) or (isinstance(value, str) and DNS_NAME.match(value) and not value.split(".")[-1].isdigit()):
        return None
    return Refusal(
        "no IP address or DNS name; HAProxy writes it into the server line as written, where a blank starts"
        " another server keyword (backup, weight 0), a colon a port and a # a comment that drops the server's"
        " ssl verify required",
        "set it to the host's IPv4 or IPv6 address (without brackets or port) or its DNS name",
    )


# ------------------------------------------------------------------------------------------------ pip

# What pip's --index-url / --extra-index-url / --trusted-host read as one URL or host (argv words of a pip command).
_URL_TEXT = re.compile(r"^[A-Za-z0-9._~!$&()*+,;=:@/%?\[\]-]+\Z")
_PORT = re.compile(r"^[0-9]{1,5}\Z")


def _host_port(text):
    """(host, port or None) of text when it is a DNS name or an IP address with an optional :port, else None."""
    if text.startswith("["):
        host, _bracket, port = text[1:].partition("]")
        if (port and not port.startswith(":")) or not _plain_ip(host) or _plain_ip(host).version != 6:
            return None
        port = port[1:]
    elif text.count(":") == 1:
        host, _colon, port = text.partition(":")
    elif ":" in text:
        return None  # an IPv6 address is written in brackets, as URLs and pip's --trusted-host read it
    else:
        host, port = text, ""
    if (text.count(":") == 1 and not port) or (port and not (_PORT.match(port) and 0 < int(port) < 65536)):
        return None
    if _plain_ip(host) or (DNS_NAME.match(host) and not host.split(".")[-1].isdigit()):
        return host, port or None
    return None


def pip_trusted_host(value):
    """One --trusted-host of pip: a host name or IP address, with an optional :port."""
    if isinstance(value, str) and _host_port(value):
        return None
    return Refusal(
        "no host pip's --trusted-host reads (a DNS name or IP address, optionally :port)",
        "write the index's host, such as mirror.example.com or mirror.example.com:8443",
    )


def _url_problem(value, example):
    """The URL rules pip's indexes and apt's archives share: one argument word, http(s), a host, no credentials."""
    fix = f"write its URL, such as {example}"
    if not isinstance(value, str) or not _URL_TEXT.match(value):
        return Refusal("no URL read as one word (blanks, quotes, control or non-ASCII characters)", fix)
    scheme, _separator, rest = value.partition("://")
    authority = rest.split("/", 1)[0].split("?", 1)[0]
    if scheme.lower() not in ("https", "http") or not authority:
        return Refusal("no http(s) URL with a host", fix)
    if "@" in authority:
        return Refusal(
            "carries credentials, which would stand in a command line (shown with -v, kept in logs)",
            "give the credentials in the host's configuration (pip's, apt's auth.conf.d or ~/.netrc), the URL without",
        )
    if not _host_port(authority):
        return Refusal("has no DNS name or IP address as its host", fix)
    return None


def archive_url(value):
    """A Debian archive debootstrap reads and the base's apt sources (deb822 URIs:) name: http(s), one word, a host.
    Plain http keeps integrity (every file is checked against the signed Release), not privacy."""
    return _url_problem(value, "http://deb.debian.org/debian")


def pip_index_url(value, trusted_hosts=()):
    """One index URL of pip (--index-url, --extra-index-url): https (http only to a trusted host, which pip otherwise
    ignores), a host, no credentials (the URL is in the task's command line, shown with -v and kept in logs)."""
    refusal = _url_problem(value, "https://mirror.example.com/simple")
    if refusal:
        return refusal
    scheme, _separator, rest = value.partition("://")
    authority = rest.split("/", 1)[0].split("?", 1)[0]
    if scheme.lower() == "http" and authority not in trusted_hosts and _host_port(authority)[0] not in trusted_hosts:
        return Refusal(
            "plain http, which pip ignores unless the host is a trusted host, and which lets anyone on the path"
            " change the wheels",
            "use https, or (a mirror inside your network) add its host to the role's pip_trusted_hosts",
        )
    return None


_PREFIX = re.compile(r"^(0|[1-9][0-9]{0,2})\Z")


def network(value, netmask=False, everyone=False):
    """An address or a CIDR network of a source list (nftables set elements, systemd's IPAddressAllow=, an HAProxy
    `acl ... src`), read as written and meaning what it says: no host bits (nft and HAProxy drop them silently, so
    10.9.9.9/0 admits every address), /0 only when everyone says it is meant, no keyword (systemd reads `any` as
    every address). netmask: the destination also reads a dotted IPv4 mask (HAProxy: 10.0.0.0/255.0.0.0)."""
    text = value if isinstance(value, str) else None
    address, slash, prefix = (text or "").partition("/")
    ip = _plain_ip(address)
    mask_ok = bool(slash) and (
        bool(_PREFIX.match(prefix)) or (netmask and ip is not None and ip.version == 4 and _plain_ip(prefix))
    )
    if ip is None or (slash and not mask_ok):
        return Refusal(
            "no address or network",
            "list addresses or CIDR networks, such as 10.0.5.0/24 or 2001:db8::/64",
        )
    try:
        meant = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return Refusal(
            f"a prefix or mask no IPv{ip.version} network has ({ip.max_prefixlen} bits at most, a mask's ones first)",
            f"write a prefix length from 1 to {ip.max_prefixlen}",
        )
    if slash and not _PREFIX.match(prefix) and meant.netmask != _plain_ip(prefix):
        # ipaddress reads 0.0.0.255 as a host mask (/24); HAProxy reads it as the mask it is.
        return Refusal("a host mask, not a network mask", f"write {meant} (a prefix length)")
    if slash and meant.network_address != ip:
        return Refusal(
            f"a network with host bits set, which nftables and HAProxy drop without a word: it admits {meant}",
            f"write {meant} if that network is meant"
            + (" (and set vllm_fleet_allow_every_source: true)" if meant.prefixlen == 0 and not everyone else "")
            + f", or {ip} for the one address",
        )
    if slash and meant.prefixlen == 0 and not everyone:
        return Refusal(
            "every address (a /0 network)",
            "list the networks meant, or set vllm_fleet_allow_every_source: true to admit everyone on purpose",
        )
    return None


# ------------------------------------------------------------------------------------------------ shell

# A variable name a POSIX shell's `export NAME=...` takes and an environment file carries.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


# Variables bash sets or reads itself (bash(1), "Shell Variables"): an `export` of one is overwritten at once (`_`,
# RANDOM), refused (the read-only ones) or changes how the script itself runs (IFS, BASH_ENV, SHELLOPTS).
SHELL_OWNED = frozenset(
    (
        "_", "BASH", "BASHOPTS", "BASHPID", "BASH_ALIASES", "BASH_ARGC", "BASH_ARGV", "BASH_ARGV0", "BASH_CMDS",
        "BASH_COMMAND", "BASH_ENV", "BASH_EXECUTION_STRING", "BASH_LINENO", "BASH_REMATCH", "BASH_SOURCE",
        "BASH_SUBSHELL", "BASH_VERSINFO", "BASH_VERSION", "BASH_XTRACEFD", "CDPATH", "DIRSTACK", "ENV",
        "EPOCHREALTIME", "EPOCHSECONDS", "EUID", "FUNCNAME", "GLOBIGNORE", "GROUPS", "HISTCMD", "IFS", "LINENO",
        "OLDPWD", "OPTARG", "OPTERR", "OPTIND", "PIPESTATUS", "POSIXLY_CORRECT", "PPID", "PS4", "PWD", "RANDOM",
        "SECONDS", "SHELLOPTS", "SHLVL", "SRANDOM", "UID",
    )
)  # fmt: skip


def env_name(value):
    """An environment variable name (build.sh's `export NAME=`, an EnvironmentFile= line's `NAME=`)."""
    if isinstance(value, str) and value in SHELL_OWNED:
        return Refusal(
            "a variable bash sets or reads itself (an export of it is lost, refused or changes the script)",
            "use a name of the program's own",
        )
    if isinstance(value, str) and ENV_NAME.match(value):
        return None
    return Refusal(
        "not a variable name (written as `export NAME=...` in a shell script or `NAME=...` in an environment file,"
        " anything else there runs or sets something else)",
        "letters, digits and _ only, not a digit first",
    )


def shell_value(value):
    """A value build.sh writes with Ansible's `quote` (shlex.quote: one single-quoted word): it carries every
    character but NUL, which no shell variable can hold."""
    if not isinstance(value, str):
        return Refusal("not a string", "write the value as text")
    if "\x00" in value:
        return Refusal("has a NUL character, which no shell variable can hold", "drop it")
    return None


# ------------------------------------------------------------------------------------------------ systemd


def env_file_value(value):
    """A value of a systemd EnvironmentFile= line as the roles write it: `NAME={{ value | to_json }}`.

    to_json escapes `"` and `\\` as `\\"` and `\\\\`, which systemd's double quotes read back; everything it writes
    as \\n, \\t or \\uXXXX (line breaks, control characters, anything beyond ASCII) systemd reads as a backslash
    and letters, not as the character. So: printable ASCII.
    """
    if not isinstance(value, str):
        return Refusal("not a string", "write the value as text")
    if not PRINTABLE_ASCII.match(value):
        return Refusal(
            "has a line break, a control character or a character beyond ASCII, which the environment file"
            " (to_json, read by systemd) does not carry byte for byte",
            "printable ASCII characters only",
        )
    return None


# RFC 6750's b64token: what an `Authorization: Bearer` header carries as one token.
BEARER_TOKEN = re.compile(r"^[A-Za-z0-9._~+/-]+=*\Z")


def bearer_token(value):
    """An API key or hub token: sent as `Authorization: Bearer <token>` and written into an environment file."""
    if not isinstance(value, str) or not BEARER_TOKEN.match(value):
        return Refusal(
            "not a bearer token (RFC 6750: letters, digits, - . _ ~ + / and = at the end); blanks, quotes,"
            " backslashes or characters beyond ASCII are not sent or stored byte for byte",
            "use a key such as `openssl rand -hex 32`, in Ansible Vault",
        )
    return None


# ------------------------------------------------------------------------------------------------ paths

# One component of a path the roles write into unit files, haproxy.cfg, scripts and commands: the POSIX portable
# file name characters and + @ (no blank, quote, backslash, $, %, # or anything a destination reads otherwise).
PATH_COMPONENT = re.compile(r"^[A-Za-z0-9._+@-]+\Z")
# Directories a role must never own, chmod or replace (the file system hierarchy's, and what the distributions keep
# under them), and every directory above them (/, /usr, /var).
SYSTEM_DIRECTORIES = frozenset(
    (
        "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/lost+found", "/media",
        "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr", "/var",
        "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/include",
        "/usr/share", "/usr/src", "/usr/games", "/usr/local", "/usr/local/bin", "/usr/local/sbin", "/usr/local/lib",
        "/usr/local/share", "/usr/local/etc", "/usr/local/include", "/usr/local/src", "/usr/local/games",
        "/var/lib", "/var/cache", "/var/log", "/var/spool", "/var/tmp", "/var/run", "/var/lock", "/var/mail",
        "/var/opt", "/var/local", "/var/backups", "/var/www", "/var/lib/dpkg", "/var/lib/apt", "/var/lib/rpm",
        "/var/lib/dnf", "/var/lib/systemd", "/var/log/journal", "/var/cache/apt", "/var/cache/dnf",
        "/etc/systemd", "/etc/systemd/system", "/etc/ssh", "/etc/ssl", "/etc/pki", "/etc/sudoers.d", "/etc/pam.d",
        "/etc/security", "/etc/default", "/etc/apt", "/etc/yum.repos.d", "/etc/cron.d", "/etc/profile.d",
        "/etc/ansible", "/etc/haproxy", "/etc/prometheus", "/etc/nftables.d", "/run/systemd", "/run/user",
        "/usr/lib/systemd", "/usr/lib/systemd/system", "/lib/systemd", "/lib/systemd/system",
    )
)  # fmt: skip
# Kernel file systems: nothing can be created or owned there.
VIRTUAL_ROOTS = ("/proc", "/sys", "/dev")
# The system directories where any service keeps a directory of its own (/etc/vllm, /var/lib/vllm, /opt/vllm):
# below the others (/etc/ssl, /usr/lib, /root, /var/lib/dpkg) every directory is the system's or one service's.
SERVICE_PARENTS = frozenset(
    (
        "/etc", "/etc/ansible", "/home", "/mnt", "/media", "/opt", "/run", "/srv", "/tmp", "/usr/local", "/var/cache",
        "/var/lib", "/var/local", "/var/log", "/var/opt", "/var/spool", "/var/tmp",
    )
)  # fmt: skip


def host_path(value):
    """A path on a host the roles write into unit files, scripts and commands: absolute, normalised (no `.`, `..`,
    `//` or trailing /, which the roles' joins and the records' keys would read otherwise), portable characters."""
    if not isinstance(value, str) or not value.startswith("/"):
        return Refusal("not an absolute path", "give an absolute path, such as /var/lib/vllm")
    parts = value.split("/")[1:]
    if value != "/" and any(part in ("", ".", "..") for part in parts):
        return Refusal(
            "not a normalised path (an empty, . or .. component, or a trailing /)",
            "write it without them, such as " + _normalised(value),
        )
    bad = [part for part in parts if part and not PATH_COMPONENT.match(part)]
    if bad:
        return Refusal(
            f"has {bad[0]!r}, with characters the unit files, scripts and haproxy.cfg the roles write it into read"
            " otherwise (blanks, quotes, backslashes, $ % # and control characters among them)",
            "letters, digits and . _ + @ - in each component",
        )
    return None


def _normalised(value):
    parts = []
    for part in value.split("/"):
        if part == "..":
            parts = parts[:-1]
        elif part not in ("", "."):
            parts.append(part)
    return "/" + "/".join(parts)


def owned_directory(value, what):
    """A directory a role creates, owns or chmods (what: what the role does with it): a host_path that is no system
    directory, none above one (/, /usr, /var) and none on a kernel file system."""
    refusal = host_path(value)
    if refusal:
        return refusal
    if value in SYSTEM_DIRECTORIES or any(system.startswith(value.rstrip("/") + "/") for system in SYSTEM_DIRECTORIES):
        return Refusal(
            f"a system directory, which {what}",
            "give a directory of the fleet's own, such as /var/lib/vllm or /opt/vllm",
        )
    if any(value == root or value.startswith(root + "/") for root in VIRTUAL_ROOTS):
        return Refusal(f"on a kernel file system, where {what} cannot happen", "give a directory on a disk")
    above = [system for system in SYSTEM_DIRECTORIES if value.startswith(system + "/")]
    nearest = max(above, key=len, default=None)
    if nearest is not None and nearest not in SERVICE_PARENTS:
        return Refusal(
            f"inside {nearest}, a directory of the system's or of another service's, which {what}",
            "give a directory of the fleet's own, such as /var/lib/vllm, /etc/vllm or /opt/vllm",
        )
    return None


def relative_path(value):
    """A path inside a tree the role joins it to (the source tree, the patches directory): relative, normalised, no
    `..` out of it, portable characters."""
    if not isinstance(value, str) or not value or value.startswith("/"):
        return Refusal("not a relative path", "a path inside the tree, such as requirements/cpu.txt")
    parts = value.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return Refusal("not a normalised path inside the tree (an empty, . or .. component)", "write it without them")
    bad = [part for part in parts if not PATH_COMPONENT.match(part)]
    if bad:
        return Refusal(f"has {bad[0]!r}, with characters outside . _ + @ - letters and digits", "rename it")
    return None


# A git ref (git check-ref-format's rules, in portable characters) passed as an argument to git: never an option.
GIT_REF = re.compile(r"^[A-Za-z0-9_+][A-Za-z0-9._+/-]*\Z")


def git_ref(value):
    """A tag or branch the roles pass to `git ls-remote` and `git clone` as an argument."""
    if (
        not isinstance(value, str)
        or not GIT_REF.match(value)
        or ".." in value
        or "//" in value
        or value.endswith(("/", ".", ".lock"))
    ):
        return Refusal(
            "not a git ref passed as written (git would refuse it, or read a leading - as an option)",
            "a tag such as v0.34.0",
        )
    return None


# A distribution name as PEP 508 writes one (the name importlib.metadata looks up).
DISTRIBUTION_NAME = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])\Z")


# ------------------------------------------------------------------------------------------------ accounts

# POSIX's portable user name (XBD 3.437, useradd's default NAME_REGEX without the trailing $): letters, digits,
# . _ -, not - first; at most 32 (utmp's limit).
ACCOUNT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")
# Accounts and groups the distributions create (Debian's base-passwd and packages, EL's setup and packages, and
# the fleet's own daemons): the role would set their home and shell, or give its secrets to their members.
SYSTEM_ACCOUNTS = frozenset(
    (
        "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy", "www-data",
        "backup", "list", "irc", "gnats", "nobody", "nogroup", "adm", "tty", "disk", "kmem", "dialout", "fax",
        "voice", "cdrom", "floppy", "tape", "sudo", "audio", "dip", "operator", "src", "shadow", "utmp", "video",
        "sasl", "plugdev", "staff", "users", "wheel", "input", "render", "kvm", "sgx", "netdev", "crontab",
        "messagebus", "sshd", "ssh", "_apt", "_chrony", "chrony", "polkitd", "syslog", "uuidd", "tss", "dnsmasq",
        "ntp", "postfix", "postdrop", "halt", "shutdown", "ftp", "mysql", "postgres", "docker", "lxd", "haproxy",
        "prometheus", "node-exporter", "alertmanager", "systemd-journal", "systemd-network", "systemd-resolve",
        "systemd-timesync", "systemd-coredump", "systemd-oom", "systemd-bus-proxy",
    )
)  # fmt: skip


def account_name(value, kind="user"):
    """A user or group name the role creates as a system account and writes into User=/Group= and file owners."""
    if not isinstance(value, str) or not ACCOUNT_NAME.match(value):
        return Refusal(
            f"no portable {kind} name",
            "letters, digits and _ . - (not a digit or - first, at most 32), such as vllm",
        )
    if value in SYSTEM_ACCOUNTS or value.startswith("systemd-"):
        what = (
            "whose members would read the service's secrets (secrets.env is readable by the group)"
            if kind == "group"
            else "whose home and shell the role would change, and which would run vLLM"
        )
        return Refusal(f"a system {kind} of the distribution, {what}", f"a {kind} of the fleet's own, such as vllm")
    return None


# ------------------------------------------------------------------------------------------------ numbers

WHOLE = re.compile(r"^\s*[+-]?[0-9]+\s*\Z")


def number(value, low=None, high=None, whole=True):
    """(the number, None) or (None, Refusal): a whole (or finite) number inside [low, high]; a string as -e gives
    one is read as the roles would (a whole number written as digits)."""
    kind = "a whole number" if whole else "a finite number"
    wanted = (
        f"from {low:g} to {high:g}"
        if low is not None and high is not None
        else f"at least {low:g}"
        if low is not None
        else f"at most {high:g}"
        if high is not None
        else ""
    )
    fix = f"write {kind}{' ' + wanted if wanted else ''}"
    found = _as_number(value, whole)
    if found is None:
        return None, Refusal(f"not {kind}", fix)
    if (low is not None and found < low) or (high is not None and found > high):
        return None, Refusal("outside its range", f"set it {wanted}")
    return found, None


def _as_number(value, whole):
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if whole:
            return int(value.strip()) if WHOLE.match(value) else None
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and (not whole or value.is_integer()):
        return int(value) if whole else value
    return None
