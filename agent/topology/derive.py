"""Turn raw per-CPU sysfs records into the topology model. Pure: no I/O.

Kernel ids are used where they agree with the sibling masks; where they do not (pre-5.7
kernels print ``physical_package_id = -1`` and a ``core_id`` that is really a container id;
old guests print ``book_id = 0`` for single-CPU book masks), a level falls back to ids
derived from the masks, numbered in order of first appearance as lscpu does. CPUs without a
``topology/`` directory (offline ones) get the containers whose masks list them (pre-5.7
kernels keep offline CPUs in the masks), else None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent.topology.model import Cpu, Machine, Topology

# Levels from the outermost in: each level's parent key is made of the levels before it.
LEVELS: tuple[str, ...] = ("drawer", "book", "socket", "core")


@dataclass(frozen=True, slots=True)
class RawCpu:
    """What sysfs says about one CPU, before any interpretation."""

    cpu: int
    online: bool
    configured: bool
    polarization: str
    dedicated: bool | None
    address: int | None
    has_topology: bool
    ids: Mapping[str, int | None]  # level -> kernel id (None: file absent or -1)
    # level -> sibling mask (None: file absent). "core" is thread_siblings, "socket" core_siblings.
    masks: Mapping[str, frozenset[int] | None]


def _level_masks(raws: list[RawCpu], level: str) -> dict[int, frozenset[int]]:
    """CPU -> its mask at ``level``: its own, else the mask of another CPU that lists it."""
    own: dict[int, frozenset[int]] = {}
    for r in raws:
        mask = r.masks.get(level)
        if mask is not None and r.has_topology:
            own[r.cpu] = mask if r.cpu in mask else mask | {r.cpu}
    result = dict(own)
    for mask in {id(m): m for m in own.values()}.values():  # each distinct mask object once
        for member in mask:
            result.setdefault(member, mask)
    return result


def _assign_level(
    raws: list[RawCpu],
    level: str,
    parents: dict[int, tuple[int | None, ...]],
    masks: dict[int, frozenset[int]],
    by_cpu: dict[int, RawCpu],
) -> dict[int, int | None]:
    """CPU -> id at ``level``, kernel ids when consistent with the masks (``_level_masks``), else derived ids.
    ``by_cpu``: every CPU's record; ``parents``: every CPU's ids at the levels above."""
    if not masks:
        # No masks at this level: trust the id files alone (CPUs without a topology dir get None).
        return {r.cpu: (r.ids.get(level) if r.has_topology else None) for r in raws}

    # Distinct masks in order of first appearance (ascending CPU number), like lscpu.
    ordered: list[frozenset[int]] = []
    seen: set[frozenset[int]] = set()
    for cpu in sorted(masks):
        m = masks[cpu]
        if m not in seen:
            seen.add(m)
            ordered.append(m)

    # The kernel id of a mask: the id its members with a topology dir report (all must agree).
    kernel_id: dict[frozenset[int], int | None] = {}
    consistent = True
    for m in ordered:
        reported = {r.ids.get(level) for c in m if (r := by_cpu.get(c)) is not None and r.has_topology}
        if len(reported) != 1 or None in reported:
            consistent = False
            break
        kernel_id[m] = reported.pop()
    if consistent:
        # Two different masks under the same parent with the same id: the ids are not real.
        owner: dict[tuple[tuple[int | None, ...], int | None], frozenset[int]] = {}
        for m in ordered:
            first = min((c for c in m if c in parents), default=None)  # the parent of its first present CPU
            key = (() if first is None else parents[first], kernel_id[m])
            if owner.setdefault(key, m) != m:
                consistent = False
                break
    index = {m: (kernel_id[m] if consistent else i) for i, m in enumerate(ordered)}
    return {r.cpu: (index[masks[r.cpu]] if r.cpu in masks else None) for r in raws}


def build_topology(raws: list[RawCpu], machine: Machine, cpu_nodes: Mapping[int, int]) -> Topology:
    """The model for the CPUs described by ``raws`` on ``machine``."""
    raws = sorted(raws, key=lambda r: r.cpu)
    by_cpu = {r.cpu: r for r in raws}
    parents: dict[int, tuple[int | None, ...]] = dict.fromkeys(by_cpu, ())
    assigned: dict[str, dict[int, int | None]] = {}
    thread_masks: dict[int, frozenset[int]] = {}
    for level in LEVELS:
        masks = _level_masks(raws, level)
        ids = _assign_level(raws, level, parents, masks, by_cpu)
        assigned[level] = ids
        if level == "core":  # the innermost level: nothing below needs its parents
            thread_masks = masks
        else:
            parents = {cpu: (*parent, ids.get(cpu)) for cpu, parent in parents.items()}

    cores, sockets, books, drawers = assigned["core"], assigned["socket"], assigned["book"], assigned["drawer"]
    present = set(by_cpu)
    cpus = []
    for r in raws:
        cpu = r.cpu
        mask = thread_masks.get(cpu)
        if not mask:
            siblings: tuple[int, ...] = ()
        elif mask <= present:
            siblings = tuple(sorted(mask))
        else:
            siblings = tuple(sorted(c for c in mask if c in present))  # present CPUs only
        cpus.append(Cpu(cpu, cores.get(cpu), sockets.get(cpu), books.get(cpu), drawers.get(cpu), siblings,
                        cpu_nodes.get(cpu), r.online, r.configured, r.polarization, r.dedicated, r.address))
    smt = max((len(c.siblings) for c in cpus if c.online), default=1) or 1
    return Topology(machine=replace(machine, smt_threads=max(smt, 1)), cpus=tuple(cpus))


def parse_sysinfo(text: str) -> dict[str, str]:
    """``/proc/sysinfo`` as key -> value (first occurrence wins; values stripped)."""
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            info.setdefault(key.strip(), value.strip())
    return info


def environment_from_sysinfo(info: Mapping[str, str]) -> str:
    """lpar, zvm or kvm from the innermost hypervisor level (VM00) of /proc/sysinfo."""
    control = info.get("VM00 Control Program")
    if control is not None:
        return "kvm" if "kvm" in control.lower() else "zvm"
    if "LPAR Name" in info or "LPAR Number" in info:
        return "lpar"
    return "unknown"
