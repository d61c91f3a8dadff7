"""Device states: what is held, what that blocks, and what the machine still has. Pure.

kubelet treats ``topology/book`` and ``topology/socket`` as unrelated resources, so the agent enforces exclusivity
across levels itself: a held book blocks its sockets, a held socket blocks its book (drawers likewise), and the
groups not advertised (:func:`shadow_groups`) block what they overlap when held.

Must hold: a blocked device is published ``Unhealthy`` so kubelet will not hand it out; a held device is never marked
and no id is ever dropped; a device the other mode holds (:func:`held_elsewhere`) is never handed out by this one
(Unhealthy here, tainted in DRA mode's slices). Why: docs/contributing/design/holds.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from agent.policy.grouping import Group, Grouping, GroupingSettings, group_topology
from agent.policy.keys import DeviceKey, Holder
from agent.topology.cpulist import format_cpulist
from agent.topology.model import Topology

MODES = ("deviceplugin", "dra")


@dataclass(frozen=True, slots=True)
class DeviceState:
    health: str  # "Healthy" | "Unhealthy"
    state: str  # healthy | allocated | held-elsewhere | blocked-by-overlap | unhealthy-offline
    reason: str = ""


def overlaps(a: Group, b: Group) -> bool:
    """Two groups of different levels share a container (a socket inside a book, ...)."""
    if a.level == b.level:
        return False
    n = min(len(a.key), len(b.key))
    return a.key[:n] == b.key[:n]


def overlap_map(grouping: Grouping, shadow: Iterable[Group] = ()) -> dict[DeviceKey, list[DeviceKey]]:
    """Each device -> the devices of other resources it overlaps (``shadow``: groups not advertised, from
    :func:`shadow_groups`, whose holds still block what they overlap)."""
    keys = {(g.resource, g.id): g for g in (*grouping.groups, *shadow)}
    return {k: [o for o, og in keys.items() if overlaps(g, og)] for k, g in keys.items()}


def shadow_groups(advertised: Grouping, topology: Topology, settings: GroupingSettings) -> tuple[Group, ...]:
    """The groups of every level that ``advertised`` leaves out: a level it does not advertise, a group too small.

    Something may hold them all the same: the other mode (a DRA claim on a socket while device-plugin mode advertises
    books only; a device-plugin pod on a socket while DRA mode publishes books only), or an earlier choice of levels.
    Their holds are known by their ids (pod-resources' rows, the saved holds, the DRA checkpoint), and block the
    advertised groups they overlap, as a held advertised group does."""
    try:
        every = group_topology(topology, replace(settings, levels=("drawer", "book", "socket"), min_group_cores=0,
                                                 uniform_groups=False))
    except ValueError:
        return ()
    known = {(g.resource, g.id) for g in advertised.groups}
    return tuple(g for g in every.groups if (g.resource, g.id) not in known)


def machine_health(advertised: Grouping, current: Topology, settings: GroupingSettings) -> dict[DeviceKey, str]:
    """Devices that are no longer whole, with the reason (others are absent from the result).

    A device stays whole while every CPU it was advertised with is still usable and still in
    the same container. New CPUs never reshape an advertised group.
    """
    # The advertised levels, not a fresh automatic choice (a level flip is not a broken group), and
    # every group whatever its size (a group that shrank is judged by its CPUs, not its size).
    try:
        now = group_topology(current, replace(settings, levels=advertised.levels or settings.levels,
                                              min_group_cores=0, uniform_groups=False))
    except ValueError as exc:
        return {(g.resource, g.id): f"topology unreadable: {exc}" for g in advertised.groups}
    now_cpus = {(g.resource, g.id): set(g.cpus) for g in now.groups}
    usable_now = {c.cpu for c in current.cpus if c.online and c.configured}
    broken: dict[DeviceKey, str] = {}
    for g in advertised.groups:
        key = (g.resource, g.id)
        missing = set(g.cpus) - now_cpus.get(key, set())
        if not missing:
            continue
        gone = sorted(c for c in missing if c not in usable_now)
        moved = sorted(missing - set(gone))
        parts = []
        if gone:
            parts.append(f"cpus {format_cpulist(gone)} offline or in standby")
        if moved:
            parts.append(f"cpus {format_cpulist(moved)} no longer usable in this group (moved, excluded or split)")
        broken[key] = "; ".join(parts)
    return broken


def held_elsewhere(held: Mapping[DeviceKey, Iterable[Holder]], mode: str) -> dict[DeviceKey, str]:
    """The devices the other mode holds, with who holds them: in device-plugin mode those held through a DRA claim
    (kubelet's device manager does not know them: it would hand them out), in DRA mode those held by a device-plugin
    allocation (the scheduler counts only claims: it would allocate them)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    claims = mode == "deviceplugin"
    out: dict[DeviceKey, str] = {}
    for key, holders in held.items():
        other = sorted(h for h in holders if bool(h.claim) == claims)
        if other:
            what = "a DRA claim" if claims else "a device-plugin allocation"
            out[key] = f"held through {what}: {other[0]}" + (f" and {len(other) - 1} more" if len(other) > 1 else "")
    return out


def elsewhere_conflict(key: DeviceKey, elsewhere: Mapping[DeviceKey, str],
                       overlap: Mapping[DeviceKey, Sequence[DeviceKey]]) -> str | None:
    """Why handing ``key`` out in this mode would give CPUs that the other mode holds (``elsewhere``, from
    :func:`held_elsewhere`) to a second holder, or None."""
    if key in elsewhere:
        return f"{key[0]} {key[1]} is {elsewhere[key]}"
    for other in overlap.get(key, ()):
        if other in elsewhere:
            return f"{key[0]} {key[1]} overlaps {other[0]} {other[1]}, {elsewhere[other]}"
    return None


def device_states(
    grouping: Grouping,
    held: Mapping[DeviceKey, Iterable[Holder]],
    broken: Mapping[DeviceKey, str],
    overlap: Mapping[DeviceKey, list[DeviceKey]] | None = None,
    elsewhere: Mapping[DeviceKey, str] | None = None,
) -> dict[DeviceKey, DeviceState]:
    """The published state of every advertised device (``elsewhere``: held by the other mode, from
    :func:`held_elsewhere`: Unhealthy although held, since what hands it out in this mode does not know the hold)."""
    overlap = overlap if overlap is not None else overlap_map(grouping)
    elsewhere = elsewhere or {}
    states: dict[DeviceKey, DeviceState] = {}
    for g in grouping.groups:
        key = (g.resource, g.id)
        holders = sorted(held.get(key, ()))
        if key in elsewhere:
            states[key] = DeviceState("Unhealthy", "held-elsewhere", elsewhere[key])
            continue
        if holders:  # never mark a device that is itself allocated (by what hands devices out in this mode)
            states[key] = DeviceState("Healthy", "allocated", ", ".join(map(str, holders)))
            continue
        blockers = [(o, sorted(held[o])) for o in overlap.get(key, []) if held.get(o)]
        if blockers:
            (res, dev), who = blockers[0]
            states[key] = DeviceState("Unhealthy", "blocked-by-overlap", f"{res} {dev} held by {who[0]}")
        elif key in broken:
            states[key] = DeviceState("Unhealthy", "unhealthy-offline", broken[key])
        else:
            states[key] = DeviceState("Healthy", "healthy")
    return states
