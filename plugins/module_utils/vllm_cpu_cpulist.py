"""Kernel cpulist helpers ("0-3,8,10-11" <-> [0, 1, 2, 3, 8, 10, 11]).

The kernel prints CPU and node sets in this "list" format in sysfs
(``online``, ``nodeN/cpulist``, ``thread_siblings_list``), in
``/proc/self/status`` (``Cpus_allowed_list``) and in cgroup cpuset files.
Plain Python: used by the fact module, the planner and the filters alike.
"""


def parse_cpulist(text):
    """Return the sorted, de-duplicated CPU ids of a kernel cpulist string.

    An empty string or a lone newline is the empty set (a memory-only node's
    ``cpulist`` holds just "\\n"). Anything else that is not a comma-separated
    list of ``N`` or ``N-M`` (N <= M) raises ValueError.
    """
    if not isinstance(text, str):
        raise ValueError(f"cpulist must be a string, got {text!r}")
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
            raise ValueError(f"invalid cpulist {text!r}: bad element {part!r}") from None
        if hi < lo:
            raise ValueError(f"invalid cpulist {text!r}: descending range {part!r}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def _cpu_id(token):
    # int() alone would accept "+1", " 1" and "1_0"; the kernel never prints those.
    if not token.isdigit() or not token.isascii():
        raise ValueError(token)
    return int(token)


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
