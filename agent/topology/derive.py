"""Turn raw per-CPU sysfs records into the topology model. Pure: no I/O.

Kernel ids are used where they agree with the sibling masks; where they do not (pre-5.7
kernels print ``physical_package_id = -1`` and a ``core_id`` that is really a container id;
old guests print ``book_id = 0`` for single-CPU book masks), a level falls back to ids
derived from the masks, numbered in order of first appearance as lscpu does. CPUs without a
``topology/`` directory (offline ones) get the containers whose masks list them (pre-5.7
kernels keep offline CPUs in the masks), else None.
"""

from __future__ import annotations

from agent.topology.frozen import Frozen
from agent.topology.model import Cpu, Machine, Topology

TYPE_CHECKING = False  # not typing's (see agent/cli.py)
if TYPE_CHECKING:
    from collections.abc import Mapping

_set = object.__setattr__

# Levels from the outermost in: each level's parent key is made of the levels before it.
LEVELS: tuple[str, ...] = ("drawer", "book", "socket", "core")


class RawCpu(Frozen):
    """What sysfs says about one CPU, before any interpretation."""

    __slots__ = ("cpu", "online", "configured", "polarization", "dedicated", "address", "has_topology", "ids",  # noqa: RUF023 (field order)
                 "masks")
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

    def __init__(self, cpu: int, online: bool, configured: bool, polarization: str, dedicated: bool | None,
                 address: int | None, has_topology: bool, ids: Mapping[str, int | None],
                 masks: Mapping[str, frozenset[int] | None]) -> None:
        _set(self, "cpu", cpu)
        _set(self, "online", online)
        _set(self, "configured", configured)
        _set(self, "polarization", polarization)
        _set(self, "dedicated", dedicated)
        _set(self, "address", address)
        _set(self, "has_topology", has_topology)
        _set(self, "ids", ids)
        _set(self, "masks", masks)


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
) -> dict[int, int | None]:
    """CPU -> id at ``level``, kernel ids when consistent with the masks, else derived ids."""
    masks = _level_masks(raws, level)
    by_cpu = {r.cpu: r for r in raws}
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
        reported = {by_cpu[c].ids.get(level) for c in m if c in by_cpu and by_cpu[c].has_topology}
        if len(reported) != 1 or None in reported:
            consistent = False
            break
        kernel_id[m] = reported.pop()
    if consistent:
        # Two different masks under the same parent with the same id: the ids are not real.
        owner: dict[tuple[tuple[int | None, ...], int | None], frozenset[int]] = {}
        for m in ordered:
            parent = next((parents[c] for c in sorted(m) if c in parents), ())
            key = (parent, kernel_id[m])
            if owner.setdefault(key, m) != m:
                consistent = False
                break
    index = {m: (kernel_id[m] if consistent else i) for i, m in enumerate(ordered)}
    return {r.cpu: (index[masks[r.cpu]] if r.cpu in masks else None) for r in raws}


def build_topology(raws: list[RawCpu], machine: Machine, cpu_nodes: Mapping[int, int]) -> Topology:
    """The model for the CPUs described by ``raws`` on ``machine``."""
    raws = sorted(raws, key=lambda r: r.cpu)
    parents: dict[int, tuple[int | None, ...]] = {r.cpu: () for r in raws}
    assigned: dict[str, dict[int, int | None]] = {}
    for level in LEVELS:
        ids = _assign_level(raws, level, parents)
        assigned[level] = ids
        parents = {cpu: (*parents[cpu], ids.get(cpu)) for cpu in parents}

    thread_masks = _level_masks(raws, "core")
    present = {r.cpu for r in raws}
    cpus = []
    for r in raws:
        mask = thread_masks.get(r.cpu)
        siblings = tuple(sorted(c for c in mask if c in present)) if mask else ()
        cpus.append(
            Cpu(
                cpu=r.cpu,
                core=assigned["core"].get(r.cpu),
                socket=assigned["socket"].get(r.cpu),
                book=assigned["book"].get(r.cpu),
                drawer=assigned["drawer"].get(r.cpu),
                siblings=siblings,
                node=cpu_nodes.get(r.cpu),
                online=r.online,
                configured=r.configured,
                polarization=r.polarization,
                dedicated=r.dedicated,
                address=r.address,
            )
        )
    smt = max((len(c.siblings) for c in cpus if c.online), default=1) or 1
    machine = Machine(machine.arch, machine.machine_type, machine.environment, machine.topology_facility,
                      machine.dispatching, max(smt, 1), machine.memory_nodes, machine.has_node_dirs)
    return Topology(machine=machine, cpus=tuple(cpus))


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
