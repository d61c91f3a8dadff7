"""The kernel's CPU list and CPU mask formats, both ways. Pure functions."""

from __future__ import annotations

from collections.abc import Iterable

from agent.errors import CpuListError

MAX_CPUS = 1_000_000  # CPUs a list or mask may name in all: the kernel's NR_CPUS is at most 8192
SHOWN = 60  # characters of a bad list quoted in its error: one readable line, never the whole input


def shown(text: str) -> str:
    """``text`` quoted for an error message, cut to SHOWN characters."""
    return repr(text) if len(text) <= SHOWN else f"{text[:SHOWN]!r}... ({len(text)} characters)"


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel cpulist such as ``0-2,10-12`` or ``5`` (empty text: no CPUs).

    Returns the sorted, de-duplicated CPU numbers. Strides (``a-b:s/g``) are boot
    parameter syntax that sysfs never prints; they are rejected like any other garbage. A list
    naming more than MAX_CPUS CPUs in all (repeats counted) is refused before it is expanded.
    """
    text = text.strip()
    if not text:
        return []
    cpus: set[int] = set()
    named = 0
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise CpuListError(f"empty element in CPU list {shown(text)}")
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text, 10)
            hi = int(hi_text, 10) if sep else lo
        except ValueError:
            raise CpuListError(f"not a CPU list: {shown(text)} (bad element {shown(part)})") from None
        if lo < 0 or hi < lo:
            raise CpuListError(f"not a CPU list: {shown(text)} (bad range {shown(part)})")
        named += hi - lo + 1
        if named > MAX_CPUS:
            raise CpuListError(f"CPU list too large: {shown(text)} names more than {MAX_CPUS} CPUs")
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
    if len(digits) * 4 > MAX_CPUS:
        raise CpuListError(f"CPU mask too large: {shown(text.strip())} is wider than {MAX_CPUS} bits")
    try:
        value = int(digits, 16)
    except ValueError:
        raise CpuListError(f"not a CPU mask: {shown(text.strip())}") from None
    bits = bin(value)[:1:-1]  # least significant first; linear in the width, where shifting a big int is not
    return [bit for bit, digit in enumerate(bits) if digit == "1"]
