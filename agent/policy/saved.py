"""The advertised groups as plain data, so a restarted agent can keep the ids and CPU sets that
running pods hold (kubelet's checkpoint still names them). Pure: dicts in, dicts out."""

from __future__ import annotations

from typing import Any

from agent.policy.grouping import Group, Grouping, GroupingSettings

SAVED_VERSION = 1


def settings_key(settings: GroupingSettings) -> dict[str, Any]:
    """What must be equal for saved groups to stand for the current configuration."""
    return {
        "levels": list(settings.levels) if settings.levels is not None else None,
        "resource_prefix": settings.resource_prefix,
        "reserved_cpus": sorted(settings.reserved_cpus),
        "exclude_polarization": sorted(settings.exclude_polarization),
        "min_group_cores": settings.min_group_cores,
    }


def grouping_to_dict(grouping: Grouping, settings: GroupingSettings) -> dict[str, Any]:
    return {
        "version": SAVED_VERSION,
        "settings": settings_key(settings),
        "levels": list(grouping.levels),
        "level_reason": grouping.level_reason,
        "fidelity": grouping.fidelity,
        "groups": [
            {"level": g.level, "resource": g.resource, "id": g.id, "key": list(g.key), "cpus": list(g.cpus),
             "cores": [list(c) for c in g.cores], "threads_per_core": g.threads_per_core,
             "polarization": [list(p) for p in g.polarization], "memory_nodes": list(g.memory_nodes),
             "recorded_nodes": list(g.recorded_nodes)}
            for g in grouping.groups
        ],
    }


def grouping_from_dict(data: Any, settings: GroupingSettings) -> Grouping | None:
    """The saved grouping, or None when it was made under other settings or cannot be read."""
    try:
        if data.get("version") != SAVED_VERSION or data.get("settings") != settings_key(settings):
            return None
        groups = tuple(
            Group(level=str(g["level"]), resource=str(g["resource"]), id=str(g["id"]),
                  key=tuple(None if k is None else int(k) for k in g["key"]), cpus=tuple(int(c) for c in g["cpus"]),
                  cores=tuple(tuple(int(c) for c in core) for core in g["cores"]),
                  threads_per_core=int(g["threads_per_core"]),
                  polarization=tuple((str(p), int(n)) for p, n in g["polarization"]),
                  memory_nodes=tuple(int(n) for n in g["memory_nodes"]),
                  recorded_nodes=tuple(int(n) for n in g["recorded_nodes"]))
            for g in data["groups"]
        )
        return Grouping(groups=groups, skipped=(), levels=tuple(str(lv) for lv in data["levels"]),
                        level_reason=f"kept from before the restart ({data['level_reason']})",
                        fidelity=str(data["fidelity"]))
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
