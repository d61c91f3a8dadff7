"""GetPreferredAllocation: which free groups to hand a multi-group request. Pure, deterministic.

Preference, most important first: groups that share a parent container (books of one drawer,
sockets of one book), then groups of equal size (balanced tensor-parallel ranks), then groups
without ``vertical:low`` CPUs, then the lowest ids in topology order. ``must_include`` ids are
always part of the answer, which has exactly ``size`` ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from math import comb

from agent.errors import PreferenceError
from agent.policy.grouping import Group

EXHAUSTIVE_LIMIT = 20_000  # candidate sets scored one by one below this many; greedy above


def _parent(g: Group) -> tuple[int | None, ...]:
    return g.key[:-1]


def _has_low(g: Group) -> bool:
    return any(p == "vertical:low" for p, _ in g.polarization)


def _score(chosen: Sequence[Group]) -> tuple[int, int, int, tuple[tuple[int, ...], ...]]:
    sizes = [len(g.cores) for g in chosen]
    return (
        len({_parent(g) for g in chosen}),
        max(sizes) - min(sizes),
        sum(_has_low(g) for g in chosen),
        tuple(sorted(g.order for g in chosen)),
    )


def preferred_allocation(
    table: Mapping[str, Group],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """``size`` ids from ``available`` (known ids only) that contain ``must_include``."""
    must = list(dict.fromkeys(must_include))
    unknown = [i for i in must if i not in table]
    if unknown:
        raise PreferenceError(f"unknown must-include device id(s): {', '.join(unknown)}")
    if size < len(must):
        raise PreferenceError(f"allocation size {size} is smaller than the {len(must)} must-include ids")
    free = [table[i] for i in dict.fromkeys(available) if i in table and i not in must]
    need = size - len(must)
    if need > len(free):
        raise PreferenceError(f"allocation size {size} exceeds the {len(must) + len(free)} available ids")
    fixed = [table[i] for i in must]
    if need == 0:
        return must
    free.sort(key=lambda g: (g.order, g.id))
    if comb(len(free), need) <= EXHAUSTIVE_LIMIT:
        best = min(combinations(free, need), key=lambda extra: _score([*fixed, *extra]))
        return must + [g.id for g in sorted(best, key=lambda g: (g.order, g.id))]
    return must + [g.id for g in _greedy(fixed, free, need)]


def _greedy(fixed: list[Group], free: list[Group], need: int) -> list[Group]:
    """Fill from the parents that already hold chosen groups, then the fullest parents."""
    by_parent: dict[tuple[int | None, ...], list[Group]] = {}
    for g in free:
        by_parent.setdefault(_parent(g), []).append(g)
    fixed_parents = {_parent(g) for g in fixed}
    target = len(fixed[0].cores) if fixed else None

    def parent_rank(item: tuple[tuple[int | None, ...], list[Group]]) -> tuple[int, int, tuple[int, ...]]:
        parent, groups = item
        return (0 if parent in fixed_parents else 1, -min(len(groups), need), tuple(-1 if k is None else k
                                                                                  for k in parent))

    chosen: list[Group] = []
    for _, groups in sorted(by_parent.items(), key=parent_rank):
        size_target = target if target is not None else max(len(g.cores) for g in groups)
        groups = sorted(groups, key=lambda g: (abs(len(g.cores) - size_target), _has_low(g), g.order))
        for g in groups:
            if len(chosen) == need:
                break
            chosen.append(g)
            target = target if target is not None else len(g.cores)
        if len(chosen) == need:
            break
    return sorted(chosen, key=lambda g: (g.order, g.id))
