"""The agent's saved state as plain data: the groups it advertised (so a restarted agent keeps the ids
and CPU sets that running pods hold; kubelet's checkpoint still names them) and the holds it handed
out that pod-resources has not confirmed yet. Pure: dicts in, dicts out, every value checked.

A saved file is input like any other: an edited CPU number, a wrong type or a foreign layout is a
reason to distrust the whole file, said with the reason, never a crash.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agent import __version__
from agent.errors import NewerStateError, SavedStateError
from agent.policy.grouping import LEVELS, Group, Grouping, GroupingSettings, Uniform
from agent.policy.keys import DeviceKey
from agent.policy.ledger import SavedHolds
from agent.topology.model import POLARIZATIONS

SAVED_VERSION = 1
KEPT = "kept from before the restart"


def check_version(data: Any, what: str) -> None:
    """NewerStateError for a file of a newer format than :data:`SAVED_VERSION` (it must be kept, not replaced),
    SavedStateError for one of no known format. Versions so far: 1 (0.1.0 and later)."""
    version = data.get("version") if isinstance(data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > SAVED_VERSION:
        raise NewerStateError(f"{what} are format version {version}, newer than this agent reads ({SAVED_VERSION})")
    if version != SAVED_VERSION:
        raise SavedStateError(f"unknown version {version!r:.20} (expected {SAVED_VERSION})")


def newer_refusal(path: object, exc: NewerStateError) -> NewerStateError:
    """The one line an agent stops with when the file at ``path`` is of a newer format (it stays as it is)."""
    return NewerStateError(f"{path}: {exc}; topology-agent {__version__} neither uses nor replaces it and does not "
                           "start: run the release that wrote it, or remove the file once no pod holds its groups "
                           "(docs/admin/releases.md)")


def settings_key(settings: GroupingSettings) -> dict[str, Any]:
    """What must be equal for saved groups to stand for the current configuration."""
    key: dict[str, Any] = {
        "levels": list(settings.levels) if settings.levels is not None else None,
        "resource_prefix": settings.resource_prefix,
        "reserved_cpus": sorted(settings.reserved_cpus),
        "exclude_polarization": sorted(settings.exclude_polarization),
        "min_group_cores": settings.min_group_cores,
    }
    if settings.uniform_groups:  # only when on: files saved before the flag existed stay valid
        key["uniform_groups"] = True
    return key


def original_reason(reason: str) -> str:
    """The level reason as first found (a group kept across several restarts says so once)."""
    while reason.startswith(f"{KEPT} (") and reason.endswith(")"):
        reason = reason[len(KEPT) + 2:-1]
    return reason


def grouping_to_dict(grouping: Grouping, settings: GroupingSettings) -> dict[str, Any]:
    return {
        "version": SAVED_VERSION,
        "settings": settings_key(settings),
        "levels": list(grouping.levels),
        "level_reason": original_reason(grouping.level_reason),
        "fidelity": grouping.fidelity,
        "groups": [
            {"level": g.level, "resource": g.resource, "id": g.id, "key": list(g.key), "cpus": list(g.cpus),
             "cores": [list(c) for c in g.cores], "threads_per_core": g.threads_per_core,
             "polarization": [list(p) for p in g.polarization], "memory_nodes": list(g.memory_nodes),
             "recorded_nodes": list(g.recorded_nodes)}
            for g in grouping.groups
        ],
        **({"uniform": [[u.resource, u.cpus, list(u.left_out)] for u in grouping.uniform]} if grouping.uniform else {}),
    }


def _int(value: Any, what: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SavedStateError(f"{what} must be a whole number >= {minimum}, not {value!r:.40}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 253:
        raise SavedStateError(f"{what} must be a short non-empty string, not {value!r:.40}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise SavedStateError(f"{what} must be a list, not {type(value).__name__}")
    return value


def _group(g: Any, i: int, prefix: str, present: frozenset[int]) -> Group:
    if not isinstance(g, dict):
        raise SavedStateError(f"groups[{i}] must be an object")
    where = f"groups[{i}]"
    level = _str(g.get("level"), f"{where}.level")
    if level not in LEVELS:
        raise SavedStateError(f"{where}.level {level!r:.40} is not one of {', '.join(LEVELS)}")
    resource = _str(g.get("resource"), f"{where}.resource")
    if resource != f"{prefix}/{level}":
        raise SavedStateError(f"{where}.resource {resource!r:.60} is not {prefix}/{level}")
    key = tuple(None if k is None else _int(k, f"{where}.key") for k in _list(g.get("key"), f"{where}.key"))
    if len(key) != LEVELS.index(level) + 1:
        raise SavedStateError(f"{where}.key has {len(key)} parts for a {level}")
    cpus = tuple(_int(c, f"{where}.cpus") for c in _list(g.get("cpus"), f"{where}.cpus"))
    cores = tuple(tuple(_int(c, f"{where}.cores") for c in _list(core, f"{where}.cores"))
                  for core in _list(g.get("cores"), f"{where}.cores"))
    if not cpus or sorted(cpus) != list(cpus) or len(set(cpus)) != len(cpus):
        raise SavedStateError(f"{where}.cpus must be a non-empty sorted list of distinct CPUs")
    if sorted(c for core in cores for c in core) != list(cpus):
        raise SavedStateError(f"{where}.cores do not split its cpus")
    foreign = sorted(set(cpus) - present)
    if foreign:
        raise SavedStateError(f"{where} ({g.get('id')!r:.40}) names CPUs {', '.join(map(str, foreign[:8]))} that "
                              "this machine does not have")
    polarization = []
    for p in _list(g.get("polarization"), f"{where}.polarization"):
        pair = _list(p, f"{where}.polarization")
        if len(pair) != 2 or pair[0] not in POLARIZATIONS:
            raise SavedStateError(f"{where}.polarization entries are [polarization, count]")
        polarization.append((str(pair[0]), _int(pair[1], f"{where}.polarization")))
    return Group(
        level=level, resource=resource, id=_str(g.get("id"), f"{where}.id"), key=key, cpus=cpus, cores=cores,
        threads_per_core=_int(g.get("threads_per_core"), f"{where}.threads_per_core", 1),
        polarization=tuple(polarization),
        memory_nodes=tuple(_int(n, f"{where}.memory_nodes") for n in _list(g.get("memory_nodes"),
                                                                            f"{where}.memory_nodes")),
        recorded_nodes=tuple(_int(n, f"{where}.recorded_nodes") for n in _list(g.get("recorded_nodes"),
                                                                                f"{where}.recorded_nodes")))


def grouping_from_dict(data: Any, settings: GroupingSettings, present_cpus: Iterable[int]) -> Grouping | None:
    """The saved grouping; None when it was made under other settings (nothing wrong with it).

    SavedStateError says why a file cannot be trusted: a wrong type or layout, or CPUs this machine
    (``present_cpus``) does not have; NewerStateError, a newer format.
    """
    if not isinstance(data, dict):
        raise SavedStateError(f"the saved groups must be an object, not {type(data).__name__}")
    check_version(data, "the saved groups")
    if data.get("settings") != settings_key(settings):
        return None
    present = frozenset(present_cpus)
    groups = tuple(_group(g, i, settings.resource_prefix, present) for i, g in enumerate(_list(data.get("groups"),
                                                                                                "groups")))
    ids = [(g.resource, g.id) for g in groups]
    if len(set(ids)) != len(ids):
        raise SavedStateError("a device id appears twice")
    levels = tuple(_str(lv, "levels") for lv in _list(data.get("levels"), "levels"))
    unknown = [lv for lv in levels if lv not in LEVELS]
    if unknown:
        raise SavedStateError(f"levels {unknown[0]!r:.40} is not one of {', '.join(LEVELS)}")
    stray = sorted({g.level for g in groups} - set(levels))
    if stray:
        raise SavedStateError(f"groups at level {stray[0]} that levels does not list")
    reason = original_reason(_str(data.get("level_reason"), "level_reason"))
    uniform = []
    for item in _list(data.get("uniform", []), "uniform"):
        entry = _list(item, "uniform")
        if len(entry) != 3:
            raise SavedStateError("uniform entries are [resource, CPUs, [left-out ids]]")
        uniform.append(Uniform(_str(entry[0], "uniform"), _int(entry[1], "uniform CPUs", 1),
                               tuple(_str(i, "uniform ids") for i in _list(entry[2], "uniform ids"))))
    return Grouping(groups=groups, skipped=(), levels=levels, level_reason=f"{KEPT} ({reason})",
                    fidelity=_str(data.get("fidelity"), "fidelity"), uniform=tuple(uniform))


def holds_to_dict(holds: SavedHolds, settings: GroupingSettings) -> dict[str, Any]:
    """Every held device as a [resource, id] pair (``holds``, the layout of the pre-release
    agents that saved only unconfirmed holds), and the pods of the init-container holds as [resource,
    id, namespace, pod] (``pods``; an agent without it keeps those as unconfirmed holds)."""
    return {"version": SAVED_VERSION, "resource_prefix": settings.resource_prefix,
            "holds": [list(k) for k in sorted(holds.keys)],
            "pods": sorted([*k, *pod] for k, pods in holds.pods.items() for pod in pods)}


def holds_from_dict(data: Any, settings: GroupingSettings, known: Iterable[DeviceKey]) -> SavedHolds:
    """The saved holds that name devices advertised now; SavedStateError for a file not in this format."""
    if not isinstance(data, dict):
        raise SavedStateError("the saved holds are not an object of the expected version")
    check_version(data, "the saved holds")
    if data.get("resource_prefix") != settings.resource_prefix:
        return SavedHolds(frozenset(), {})
    known_keys = set(known)
    holds: set[DeviceKey] = set()
    for item in _list(data.get("holds"), "holds"):
        pair = _list(item, "holds")
        if len(pair) != 2:
            raise SavedStateError("holds are [resource, device id] pairs")
        key = (_str(pair[0], "holds"), _str(pair[1], "holds"))
        if key in known_keys:
            holds.add(key)
    pods: dict[DeviceKey, set[tuple[str, str]]] = {}
    for item in _list(data.get("pods", []), "pods"):
        row = [_str(v, "pods") for v in _list(item, "pods")]
        if len(row) != 4:
            raise SavedStateError("pods are [resource, device id, namespace, pod] rows")
        if (row[0], row[1]) in known_keys:
            pods.setdefault((row[0], row[1]), set()).add((row[2], row[3]))
    return SavedHolds(frozenset(holds), {k: frozenset(v) for k, v in pods.items()})
