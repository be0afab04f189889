"""The rollout's batch sizes: what rollout_serial may be, and the batches Ansible makes of it.

Also the rollout play's order: one canary host of each build class and service mode first
(a wheel or an image is per class and mode), then the rest (``canary_order``).

Plain Python (no Ansible import), used by the filters the rollout play's ``hosts`` and
``serial``, preflight and the rollout role's batch check call.
"""

import re

# A canary host alone, then a tenth of the group per batch (at least one host):
# groups of up to 19 hosts still go one host at a time, 1,000 hosts take 11
# batches instead of 1,000, and a change that fails its gate stops on one host.
DEFAULT_SERIAL = (1, "10%")

_ITEM = re.compile(r"([1-9][0-9]{0,5})(%?)\Z")
FIX = (
    'fix: set it to a number of hosts (1, 5), a percentage ("10%") or a list of them'
    ' (-e rollout_serial=1,10% or -e \'{"rollout_serial": [1, "10%"]}\')'
)


class SerialError(ValueError):
    """rollout_serial cannot be a play's serial; the message names the variable, the value and the fix."""


def _item(value, variable):
    text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    match = _ITEM.match(text) if text is not None else None
    if not match or (match.group(2) and int(match.group(1)) > 100):
        raise SerialError(
            f"{variable}: {value!r} is neither a positive number of hosts nor a percentage of 1-100%; {FIX}"
        )
    return f"{int(match.group(1))}%" if match.group(2) else int(match.group(1))


def parse_serial(value, variable="rollout_serial"):
    """The play's serial as a list of ints and "N%" strings; None means DEFAULT_SERIAL.

    Takes what -e gives (strings: "5", "10%", "1,10%") and what the inventory or JSON
    gives (ints, lists). Raises SerialError for anything Ansible would misread: 0, a
    negative or fractional number, a percentage above 100, an empty list.
    """
    if value is None:
        return list(DEFAULT_SERIAL)
    if isinstance(value, str) and "," in value:
        value = value.split(",")
    if isinstance(value, (list, tuple)):
        if not value:
            raise SerialError(f"{variable}: is an empty list; {FIX}")
        return [_item(item, variable) for item in value]
    return [_item(value, variable)]


def batch_sizes(serial, total):
    """The batch sizes Ansible makes of ``total`` hosts with this serial list (PlaybookExecutor's rule).

    A percentage is of all the play's hosts, rounded down, at least 1; the last entry repeats.
    """
    sizes, left, index = [], total, 0
    while left > 0:
        item = serial[min(index, len(serial) - 1)]
        size = max(1, int(int(item[:-1]) / 100.0 * total)) if isinstance(item, str) else item
        size = min(size, left)
        sizes.append(size)
        left -= size
        index += 1
    return sizes


def _hashable(key):
    """A host's key (a list such as [build class, service mode] from Jinja) as a set member."""
    if isinstance(key, dict):
        return tuple(sorted((str(name), _hashable(value)) for name, value in key.items()))
    if isinstance(key, (list, tuple)):
        return tuple(_hashable(item) for item in key)
    return key


def canary_order(hosts, keys):
    """The rollout play's hosts, canaries first, and the canary batches: ``(order, canary_batches)``.

    ``hosts`` are the play's hosts in inventory order; ``keys`` maps each host the batches change to
    what its wheel or image depends on (its build class and service mode). A host with no key, or
    None, is never a canary (the first play served it, or it left the run). The canary of a key is
    its first host in inventory order, and the canaries go in the order their keys first appear.

    The first batch holds the canaries, but never more than half the hosts (at least one), so a
    small fleet of one host per class is not drained all at once: the canaries that do not fit get
    one batch each, right after it. Then the other hosts, in inventory order. With a single key (or
    none) nothing moves: the order is the inventory's and the one canary batch is its first host,
    as before canaries per class.
    """
    hosts = list(dict.fromkeys(hosts))
    canaries, seen = [], set()
    for host in hosts:
        key = keys.get(host)
        if key is None:
            continue
        key = _hashable(key)
        if key not in seen:
            seen.add(key)
            canaries.append(host)
    if len(canaries) < 2:
        return hosts, [hosts[:1]] if hosts else []
    room = max(1, len(hosts) // 2)
    batches = [canaries[:room]] + [[host] for host in canaries[room:]]
    chosen = set(canaries)
    return canaries + [host for host in hosts if host not in chosen], batches


def canary_sizes(canaries):
    """The sizes of the canary batches, given as the batches (lists of hosts) or their sizes."""
    sizes = []
    for batch in canaries or ():
        size = batch if isinstance(batch, int) and not isinstance(batch, bool) else len(batch)
        if size < 1:
            raise SerialError(
                f"canaries: {canaries!r} holds an empty batch; fix: give the canary batches of vllm_rollout_order"
            )
        sizes.append(size)
    return sizes


def play_serial(value, canaries=None, variable="rollout_serial"):
    """The rollout play's serial: ``rollout_serial`` as given, or, unset (None), the canary batches then 10%.

    An operator's value is the play's serial exactly as Ansible reads it (``parse_serial``); the play's
    hosts are still in canary-first order, so its first batches start with the canaries. Unset, the
    serial is one entry per canary batch (``canary_order``), then DEFAULT_SERIAL's 10%: ``[3, "10%"]``
    for three classes, and DEFAULT_SERIAL itself for one class or without canaries.
    """
    serial = parse_serial(value, variable)
    sizes = canary_sizes(canaries)
    if value is not None or not sizes:
        return serial
    return sizes + list(DEFAULT_SERIAL[1:])
