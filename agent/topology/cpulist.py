"""The kernel's CPU list and CPU mask formats, both ways. Pure functions."""

from __future__ import annotations

from collections.abc import Iterable

from agent.errors import CpuListError


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel cpulist such as ``0-2,10-12`` or ``5`` (empty text: no CPUs).

    Returns the sorted, de-duplicated CPU numbers. Strides (``a-b:s/g``) are boot
    parameter syntax that sysfs never prints; they are rejected like any other garbage.
    """
    text = text.strip()
    if not text:
        return []
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise CpuListError(f"empty element in CPU list {text!r}")
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text, 10)
            hi = int(hi_text, 10) if sep else lo
        except ValueError:
            raise CpuListError(f"not a CPU list: {text!r} (bad element {part!r})") from None
        if lo < 0 or hi < lo:
            raise CpuListError(f"not a CPU list: {text!r} (bad range {part!r})")
        if hi - lo > 1_000_000:
            raise CpuListError(f"CPU range too large in {text!r}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def cpu_ranges(cpus: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Ascending CPU numbers as maximal (first, last) ranges."""
    ranges: list[tuple[int, int]] = []
    for c in sorted(set(cpus)):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1] = (ranges[-1][0], c)
        else:
            ranges.append((c, c))
    return tuple(ranges)


def format_ranges(ranges: Iterable[tuple[int, int]]) -> str:
    """(first, last) ranges as a kernel CPU list."""
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU numbers the way the kernel does: ascending ranges, ``0-23,48-71``."""
    return format_ranges(cpu_ranges(cpus))


def parse_cpumask(text: str) -> list[int]:
    """Parse a kernel hex CPU mask such as ``00000000,0000ffff`` (32-bit words, MSB first)."""
    digits = text.strip().replace(",", "")
    if not digits:
        return []
    try:
        value = int(digits, 16)
    except ValueError:
        raise CpuListError(f"not a CPU mask: {text.strip()!r}") from None
    cpus: list[int] = []
    bit = 0
    while value:
        if value & 1:
            cpus.append(bit)
        value >>= 1
        bit += 1
    return cpus
