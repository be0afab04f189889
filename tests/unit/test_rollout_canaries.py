"""One canary of each build class and service mode (issue 41, item 5): the rollout play's order and its batches.

A wheel or an image is per build class and per service mode. The filter vllm_rollout_order puts the first host (in
inventory order) of each (class, mode) the batches change first, then the others in inventory order; unset,
rollout_serial is one batch of those canaries (at most half the hosts; those that do not fit get a batch each), then
10% per batch. The tests go through the filter plugin, as the plays call it.
"""

import importlib.util
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleFilterError
from ansible.executor.playbook_executor import PlaybookExecutor
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

CLASSES = ["x86_64-avx512", "x86_64-amx", "aarch64-sve"]


def filters():
    path = REPO / "plugins/filter/vllm_rollout.py"
    spec = importlib.util.spec_from_file_location("vllm_rollout_filters_canaries", path)
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    return plugin.FilterModule().filters()


FILTERS = filters()


def order(hosts, keys):
    return FILTERS["vllm_rollout_order"](hosts, keys)


def batches(serial, hosts, canaries):
    return FILTERS["vllm_rollout_batches"](serial, hosts, canaries=canaries)


def ansible_batches(serial, hosts):
    """Ansible's own batching of a play over ``hosts`` (in this order) with this serial."""
    executor = SimpleNamespace(_inventory=SimpleNamespace(get_hosts=lambda *args, **kwargs: list(hosts)))
    play = SimpleNamespace(hosts=list(hosts), order=None, serial=serial)
    return [list(batch) for batch in PlaybookExecutor._get_serialized_batches(executor, play)]


def fleet(total, classes, mode="venv"):
    """``total`` hosts, the classes in turn (inventory order), {host: [class, mode]}."""
    return {f"h{i:04d}": [CLASSES[i % classes], mode] for i in range(total)}


# A fleet: hosts in inventory order, each with a (class, mode) or None (the first play served it).
KEYS = st.one_of(st.none(), st.tuples(st.sampled_from(CLASSES), st.sampled_from(["venv", "container"])).map(list))
NAMES = st.integers(0, 10_000).map(lambda n: f"host-{n}")
FLEETS = st.lists(st.tuples(NAMES, KEYS), max_size=60, unique_by=lambda pair: pair[0])


def as_key(key):
    return None if key is None else tuple(key)


@settings(max_examples=300, deadline=None)
@given(FLEETS)
def test_every_host_once_one_canary_per_class_and_mode_first_and_the_order_within_a_class_kept(pairs):
    hosts = [pair[0] for pair in pairs]
    keys = {host: key for host, key in pairs if key is not None}
    result = order(hosts, keys)
    got, canaries = result["hosts"], result["canaries"]
    # Every host exactly once.
    assert sorted(got) == sorted(hosts) and len(got) == len(hosts)
    present = list(dict.fromkeys(as_key(pair[1]) for pair in pairs if pair[1] is not None))
    flat = [host for batch in canaries for host in batch]
    if len(present) < 2:
        # One class and mode (or none): nothing moves, the first batch is the first host, as before.
        assert got == hosts
        assert canaries == ([hosts[:1]] if hosts else [])
        return
    # The canaries come first: the first host of each (class, mode), in the order the keys first appear.
    assert got[: len(flat)] == flat
    assert flat == [next(h for h, k in pairs if as_key(k) == key) for key in present]
    # Batch 1 holds one host of each (class, mode) present, unless that is more than half the hosts:
    # then half of them (at least one), and each of the others gets a batch of its own right after.
    room = max(1, len(hosts) // 2)
    assert canaries[0] == flat[:room]
    assert canaries[1:] == [[host] for host in flat[room:]]
    if len(hosts) >= 2 * len(present):
        assert len(canaries) == 1 and {as_key(keys[h]) for h in canaries[0]} == set(present)
    # Within a class and mode, and among the hosts that are no canary, the inventory order is kept.
    for key in [*present, None]:
        assert [h for h in got if as_key(keys.get(h)) == key] == [h for h in hosts if as_key(keys.get(h)) == key]
    assert [h for h in got if h not in flat] == [h for h in hosts if h not in flat]


@settings(max_examples=200, deadline=None)
@given(FLEETS)
def test_by_default_each_class_and_mode_passes_its_canary_before_any_other_host_of_it_changes(pairs):
    hosts = [pair[0] for pair in pairs]
    keys = {host: key for host, key in pairs if key is not None}
    result = order(hosts, keys)
    # The batch play's serial and the role's batch check give the batches Ansible makes of the play.
    serial = FILTERS["vllm_rollout_serial"](None, canaries=result["canaries"])
    made = ansible_batches(serial, result["hosts"])
    assert made == batches(None, result["hosts"], result["canaries"])
    assert made[: len(result["canaries"])] == result["canaries"]
    index = {host: n for n, batch in enumerate(made) for host in batch}
    for canary in (h for batch in result["canaries"] for h in batch):
        if canary in keys:
            same = [h for h in hosts if h != canary and as_key(keys.get(h)) == as_key(keys[canary])]
            assert all(index[canary] < index[h] for h in same), (canary, made)


@pytest.mark.parametrize(
    ("total", "classes", "sizes"),
    [
        (20, 1, [1] + [2] * 9 + [1]),
        (20, 3, [3] + [2] * 8 + [1]),
        (100, 1, [1] + [10] * 9 + [9]),
        (100, 3, [3] + [10] * 9 + [7]),
        (1000, 1, [1] + [100] * 9 + [99]),
        (1000, 3, [3] + [100] * 9 + [97]),
    ],
)
def test_the_default_batches_at_20_100_and_1000_hosts_of_one_and_three_classes(total, classes, sizes):
    keys = fleet(total, classes)
    result = order(list(keys), keys)
    made = batches(None, result["hosts"], result["canaries"])
    assert [len(batch) for batch in made] == sizes
    assert sorted({keys[host][0] for host in made[0]}) == sorted(CLASSES[:classes])
    assert made == ansible_batches(FILTERS["vllm_rollout_serial"](None, canaries=result["canaries"]), result["hosts"])


def test_one_class_of_venv_hosts_is_batched_exactly_as_before():
    keys = fleet(7, 1)
    hosts = list(keys)
    # The Molecule serve scenario's two hosts, and a fleet whose first host the first play served.
    for served in ([], ["h0000"]):
        result = order(hosts, {h: k for h, k in keys.items() if h not in served})
        assert result["hosts"] == hosts
        assert FILTERS["vllm_rollout_serial"](None, canaries=result["canaries"]) == [1, "10%"]
        assert batches(None, result["hosts"], result["canaries"]) == [[h] for h in hosts]
    result = order(["serve-vllm-1", "serve-vllm-2"], {"serve-vllm-1": ["x", "venv"], "serve-vllm-2": ["x", "venv"]})
    assert result == {"hosts": ["serve-vllm-1", "serve-vllm-2"], "canaries": [["serve-vllm-1"]]}


@pytest.mark.parametrize(
    ("fleet_keys", "expected"),
    [
        # A class of one host: its only host is its canary, in the first batch.
        ({"a1": "A", "a2": "A", "a3": "A", "a4": "A", "b1": "B"}, [["a1", "b1"], ["a2"], ["a3"], ["a4"]]),
        # One host per class: never the whole fleet at once (the capacity floor would refuse it).
        ({"a1": "A", "b1": "B"}, [["a1"], ["b1"]]),
        ({"a1": "A", "b1": "B", "c1": "C"}, [["a1"], ["b1"], ["c1"]]),
        ({"a1": "A", "b1": "B", "c1": "C", "a2": "A"}, [["a1", "b1"], ["c1"], ["a2"]]),
    ],
)
def test_small_fleets_and_a_class_of_one_host(fleet_keys, expected):
    keys = {host: [cls, "venv"] for host, cls in fleet_keys.items()}
    result = order(list(keys), keys)
    assert batches(None, result["hosts"], result["canaries"]) == expected


def test_a_given_rollout_serial_is_the_serial_as_given_over_the_canary_first_order():
    keys = {"a1": ["A", "venv"], "a2": ["A", "venv"], "a3": ["A", "venv"], "b1": ["B", "venv"]}
    keys["a4"] = ["A", "container"]
    result = order(list(keys), keys)
    assert result == {"hosts": ["a1", "b1", "a4", "a2", "a3"], "canaries": [["a1", "b1"], ["a4"]]}
    assert FILTERS["vllm_rollout_serial"](None, canaries=result["canaries"]) == [2, 1, "10%"]
    # Given: exactly that serial; "100%" is all at once, 1 one host at a time with each canary first.
    assert FILTERS["vllm_rollout_serial"]("5", canaries=result["canaries"]) == [5]
    assert batches("100%", result["hosts"], result["canaries"]) == [result["hosts"]]
    assert batches(1, result["hosts"], result["canaries"]) == [[h] for h in ["a1", "b1", "a4", "a2", "a3"]]
    assert batches("1,10%", result["hosts"], result["canaries"])[0] == ["a1"]
    # Sizes do as well as the batches; without canaries the default is [1, "10%"].
    assert FILTERS["vllm_rollout_serial"](None, canaries=[3]) == [3, "10%"]
    assert FILTERS["vllm_rollout_serial"](None, canaries=[]) == [1, "10%"]
    assert FILTERS["vllm_rollout_serial"](None) == [1, "10%"]


def test_bad_inputs_fail_with_a_message():
    with pytest.raises(AnsibleFilterError, match="keys must map hosts"):
        order(["a"], ["A"])
    with pytest.raises(AnsibleFilterError, match="empty batch"):
        FILTERS["vllm_rollout_serial"](None, canaries=[[]])
    assert order([], {}) == {"hosts": [], "canaries": []}
