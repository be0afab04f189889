from itertools import pairwise

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import format_cpulist, parse_cpulist
from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
        ("0-1\n", [0, 1]),
        ("5", [5]),
        ("", []),
        ("\n", []),
        ("3,1-2,2", [1, 2, 3]),
        ("0-55,112-167", list(range(56)) + list(range(112, 168))),
    ],
)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1,,2", "1 2", "0x3", "+1", "1-2-3", "\u0661"])
def test_parse_cpulist_rejects_garbage(text):
    with pytest.raises(ValueError, match="invalid cpulist"):
        parse_cpulist(text)


def test_parse_cpulist_rejects_non_string():
    with pytest.raises(ValueError, match="must be a string"):
        parse_cpulist(None)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ([0, 1, 2, 3, 8], "0-3,8"),
        ([0, 1], "0-1"),
        ([8, 3, 2, 2, 1], "1-3,8"),
        ([], ""),
        ({5, 7}, "5,7"),
    ],
)
def test_format_cpulist(cpus, text):
    assert format_cpulist(cpus) == text


@pytest.mark.parametrize("bad", [[-1], [True], ["3"], [1.0]])
def test_format_cpulist_rejects_non_cpu_ids(bad):
    with pytest.raises(ValueError, match="non-negative integers"):
        format_cpulist(bad)


@given(st.sets(st.integers(min_value=0, max_value=4096)))
def test_cpulist_round_trip(cpus):
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == sorted(cpus)
    assert format_cpulist(parse_cpulist(text)) == text


@given(st.lists(st.integers(min_value=0, max_value=300)))
def test_format_is_canonical(cpus):
    # Canonical: no element is a range of one and adjacent elements never touch.
    text = format_cpulist(cpus)
    bounds = []
    for part in filter(None, text.split(",")):
        lo, _sep, hi = part.partition("-")
        bounds.append((int(lo), int(hi or lo)))
        assert not hi or int(hi) > int(lo)
    assert all(prev[1] + 1 < cur[0] for prev, cur in pairwise(bounds))
