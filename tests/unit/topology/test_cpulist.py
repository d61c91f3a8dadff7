"""The kernel's cpulist and cpumask formats."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import CpuListError
from agent.topology.cpulist import format_cpulist, parse_cpulist, parse_cpumask


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", []),
        ("0", [0]),
        ("0-2,10-12", [0, 1, 2, 10, 11, 12]),
        ("1-5,8-19", [1, 2, 3, 4, 5, *range(8, 20)]),
        ("3,1,2\n", [1, 2, 3]),
        ("0-140", list(range(141))),
    ],
)
def test_parse_cpulist(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1,,2", "0-4:2/1", "1 2"])
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(CpuListError, match="CPU list"):
        parse_cpulist(text)


def test_format_cpulist_uses_ranges() -> None:
    assert format_cpulist([48, 0, 1, 2, 23, 49, 50, 71]) == "0-2,23,48-50,71"
    assert format_cpulist([]) == ""


@pytest.mark.parametrize(
    ("mask", "cpus"),
    [
        ("0000,00000000,00000000,00000000,000000ff", list(range(8))),
        ("00000003", [0, 1]),
        ("1c00,00000000", [42, 43, 44]),
        ("0", []),
    ],
)
def test_parse_cpumask(mask: str, cpus: list[int]) -> None:
    assert parse_cpumask(mask) == cpus


def test_parse_cpumask_rejects_garbage() -> None:
    with pytest.raises(CpuListError, match="CPU mask"):
        parse_cpumask("xyz")


@given(st.sets(st.integers(min_value=0, max_value=4096), max_size=300))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == sorted(cpus)
    # The kernel's canonical form: no element repeats and ranges never touch.
    assert format_cpulist(parse_cpulist(text)) == text


@given(st.sets(st.integers(min_value=0, max_value=600), max_size=100))
def test_cpumask_agrees_with_cpulist(cpus: set[int]) -> None:
    value = sum(1 << c for c in cpus)
    words = f"{value:x}".rjust(8 * ((max(cpus, default=0) // 32) + 1), "0")
    mask = ",".join(words[i:i + 8] for i in range(0, len(words), 8))
    assert parse_cpumask(mask) == sorted(cpus)


@pytest.mark.parametrize("text", ["0-999999," * 200 + "0", ",".join(["0-999999"] * 50), "0-1000000"])
def test_a_cpulist_naming_more_than_a_million_cpus_is_refused_before_it_is_expanded(text: str) -> None:
    with pytest.raises(CpuListError, match="CPU list too large") as refused:
        parse_cpulist(text)
    assert len(str(refused.value)) < 200  # the list is quoted cut short, never whole


def test_a_bad_cpulist_is_quoted_cut_short() -> None:
    with pytest.raises(CpuListError) as refused:
        parse_cpulist("1" * 10_000 + "x")
    assert len(str(refused.value)) < 300 and "10001 characters" in str(refused.value)


def test_a_wide_cpumask_reads_in_linear_time_or_is_refused() -> None:
    assert parse_cpumask("f" * 60_000)[-1] == 60_000 * 4 - 1  # 65536 bytes of sysfs: quick, every bit
    with pytest.raises(CpuListError, match="CPU mask too large"):
        parse_cpumask("f" * 300_000)
