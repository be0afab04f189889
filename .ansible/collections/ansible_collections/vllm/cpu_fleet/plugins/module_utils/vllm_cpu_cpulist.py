"""Kernel cpulist helpers ("0-3,8,10-11" <-> [0, 1, 2, 3, 8, 10, 11]).

The kernel prints CPU and node sets in this "list" format in sysfs
(``online``, ``nodeN/cpulist``, ``thread_siblings_list``), in
``/proc/self/status`` (``Cpus_allowed_list``) and in cgroup cpuset files.
Plain Python: used by the fact module, the planner and the filters alike.
"""

import re

# Highest CPU id accepted anywhere: the kernel's NR_CPUS tops out at 8192 (x86_64,
# CONFIG_MAXSMP) and 4096 (arm64); 65535 leaves room and keeps every list small.
MAX_CPU_ID = 65535
# The kernel prints plain ASCII decimals. int() and str.isdigit() also accept
# "\u0663", "\uff13", "+3", " 3" and "3_0": an explicit ASCII pattern does not.
_ASCII_ID = re.compile(r"[0-9]+\Z")
_SHOW = 40


def show(value, limit=_SHOW):
    """repr() of value, cut to about ``limit`` characters for error messages."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def kind_of(value):
    """'a list', 'an integer', ... for messages about a value of the wrong type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a dict"
    return f"a {type(value).__name__}"


def parse_cpulist(text, max_cpu=MAX_CPU_ID):
    """Return the sorted, de-duplicated CPU ids of a kernel cpulist string.

    An empty string or a lone newline is the empty set (a memory-only node's
    ``cpulist`` holds just "\\n"). Anything else that is not a comma-separated
    list of ASCII ``N`` or ``N-M`` (N <= M <= max_cpu) raises ValueError, whose
    message quotes at most a short part of the text.
    """
    if not isinstance(text, str):
        raise ValueError(f"cpulist must be a string, got {show(text)}")
    body = text.strip()
    if not body:
        return []
    cpus = set()
    for part in body.split(","):
        first, sep, last = part.strip().partition("-")
        try:
            lo = _cpu_id(first)
            hi = _cpu_id(last) if sep else lo
        except ValueError:
            raise ValueError(f"invalid cpulist {show(text)}: bad element {show(part)}") from None
        if hi < lo:
            raise ValueError(f"invalid cpulist {show(text)}: descending range {show(part)}")
        if hi > max_cpu:
            raise ValueError(f"invalid cpulist {show(text)}: CPU id above {max_cpu} in {show(part)}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def _cpu_id(token):
    if not _ASCII_ID.match(token):
        raise ValueError(token)
    # Longer than any real id: compare by length instead of converting a huge string.
    return int(token) if len(token) <= 12 else 10**12


def format_cpulist(cpus):
    """Return the kernel cpulist string for an iterable of CPU ids.

    Ids are sorted and de-duplicated; runs of two or more consecutive ids
    become ``N-M`` as the kernel prints them ([0, 1] -> "0-1").
    """
    ids = set(cpus)
    for cpu in ids:
        # bool is an int subclass; True as a CPU id is a caller bug.
        if not isinstance(cpu, int) or isinstance(cpu, bool) or cpu < 0:
            raise ValueError(f"CPU ids must be non-negative integers, got {cpu!r}")
    ranges = []
    for cpu in sorted(ids):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
