"""The rollout's batch sizes: what rollout_serial may be, and the batches Ansible makes of it.

Plain Python (no Ansible import), used by the filters the rollout play's ``serial``,
preflight and the rollout role's batch check call.
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
