"""rollout_serial: what the rollout play's serial may be, and the batches Ansible makes of it."""

from types import SimpleNamespace

import pytest
from ansible.executor.playbook_executor import PlaybookExecutor
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_rollout_serial import (
    DEFAULT_SERIAL,
    SerialError,
    batch_sizes,
    parse_serial,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [1, "10%"]),
        (1, [1]),
        ("5", [5]),
        ("10%", ["10%"]),
        (" 25% ", ["25%"]),
        ("100%", ["100%"]),
        ("1,10%", [1, "10%"]),
        ([1, "5", "20%"], [1, 5, "20%"]),
    ],
)
def test_what_ansible_and_the_command_line_give_is_read(value, expected):
    assert parse_serial(value) == expected


@pytest.mark.parametrize("value", [0, "0", -1, "-1", "0%", "101%", "1.5", 1.5, "ten", "", [], "1,,10%", True, {"a": 1}])
def test_values_ansible_would_misread_are_refused_naming_variable_and_fix(value):
    with pytest.raises(SerialError) as err:
        parse_serial(value)
    assert str(err.value).startswith("rollout_serial: ") and "fix: " in str(err.value)


def ansible_batches(serial, total):
    """Ansible's own batching of a play with this serial over ``total`` hosts."""
    hosts = [f"h{i}" for i in range(total)]
    executor = SimpleNamespace(_inventory=SimpleNamespace(get_hosts=lambda *args, **kwargs: list(hosts)))
    play = SimpleNamespace(hosts="all", order=None, serial=serial)
    return [len(batch) for batch in PlaybookExecutor._get_serialized_batches(executor, play)]


@pytest.mark.parametrize("serial", [[1], [3], ["10%"], ["30%"], [1, "10%"], [2, 5, "50%"], ["1%"], ["100%"]])
@pytest.mark.parametrize("total", [1, 2, 4, 9, 10, 19, 20, 37, 1000])
def test_batches_are_the_ones_ansible_makes(serial, total):
    assert batch_sizes(serial, total) == ansible_batches(serial, total)


def test_the_default_takes_small_groups_one_host_at_a_time_and_large_ones_in_tenths():
    default = parse_serial(None)
    assert default == list(DEFAULT_SERIAL)
    for total in range(1, 20):
        assert set(batch_sizes(default, total)) == {1}, total
    assert batch_sizes(default, 20) == [1] + [2] * 9 + [1]
    assert batch_sizes(default, 1000) == [1] + [100] * 9 + [99]
    assert max(batch_sizes(default, 1000)) <= 100


def _filters():
    import importlib.util

    from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("vllm_rollout_filters", REPO / "plugins/filter/vllm_rollout.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    return plugin.FilterModule().filters()


def test_the_filters_give_the_play_its_serial_and_the_role_its_batches():
    from ansible.errors import AnsibleFilterError

    filters = _filters()
    assert filters["vllm_rollout_serial"]("1,10%") == [1, "10%"]
    assert filters["vllm_rollout_batches"](None, 12) == [1] * 12
    assert filters["vllm_rollout_batches"]("2", ["a", "b", "c"]) == [["a", "b"], ["c"]]
    with pytest.raises(AnsibleFilterError, match=r"^h1: rollout_serial: '0' .*; fix: "):
        filters["vllm_rollout_serial"]("0", "h1")
