"""GetPreferredAllocation policy: keep multi-group requests close, balanced and deterministic."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import combinations
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import PreferenceError
from agent.policy import preference
from agent.policy.grouping import Group, GroupingSettings, group_topology
from agent.policy.preference import preferred_allocation
from agent.topology.embedded import load_embedded
from topology_devkit.synthetic import SHAPES, build_topology

Z16 = group_topology(load_embedded("z16-lpar"), GroupingSettings(levels=("book", "socket")))
BOOKS = Z16.by_id("topology/book")
SOCKETS = Z16.by_id("topology/socket")
PR = group_topology(load_embedded("pr40714")).by_id("topology/book")
VERTICAL = group_topology(load_embedded("z16-vertical"), GroupingSettings(levels=("socket",))).by_id("topology/socket")


def test_two_books_come_from_one_drawer() -> None:
    available = ["drawer0-book0", "drawer1-book4", "drawer1-book6"]
    assert preferred_allocation(BOOKS, available, [], 2) == ["drawer1-book4", "drawer1-book6"]


def test_must_include_pulls_the_rest_into_its_drawer() -> None:
    got = preferred_allocation(BOOKS, list(BOOKS), ["drawer1-book5"], 2)
    assert got[0] == "drawer1-book5" and got[1].startswith("drawer1-")


def test_two_sockets_come_from_one_book() -> None:
    got = preferred_allocation(SOCKETS, list(SOCKETS), [], 2)
    assert got == ["drawer0-book0-socket0", "drawer0-book0-socket1"]


def test_balanced_ranks_on_the_pr40714_machine() -> None:
    # Books of 12, 12 and 1 cores: two ranks take the two big books, not the 1-core one.
    assert preferred_allocation(PR, list(PR), [], 2) == ["drawer0-book0", "drawer0-book1"]
    assert preferred_allocation(PR, ["drawer0-book2", "drawer0-book1", "drawer0-book0"], [], 1) == ["drawer0-book0"]


def test_vertical_low_groups_come_last_among_equals() -> None:
    free = ["drawer0-book1-socket0", "drawer0-book1-socket1", "drawer0-book0-socket0"]
    assert preferred_allocation(VERTICAL, free, [], 1) == ["drawer0-book0-socket0"]


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        (["drawer0-book0"], ["nope"], 1, "unknown must-include"),
        (["drawer0-book0"], [], 2, "exceeds"),
        (["drawer0-book0", "drawer0-book1"], ["drawer0-book0", "drawer0-book1"], 1, "smaller"),
    ],
)
def test_impossible_requests_are_errors(available: list[str], must: list[str], size: int, message: str) -> None:
    with pytest.raises(PreferenceError, match=message):
        preferred_allocation(BOOKS, available, must, size)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_answer_is_exact_contains_must_and_is_deterministic(data: st.DataObject) -> None:
    table = data.draw(st.sampled_from([BOOKS, SOCKETS, PR, VERTICAL]))
    ids = list(table)
    available = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=len(available)))
    size = data.draw(st.integers(min_value=len(must), max_value=len(available)))
    got = preferred_allocation(table, available, must, size)
    assert len(got) == size and len(set(got)) == size
    assert set(must) <= set(got) <= set(available)
    assert got == preferred_allocation(table, list(reversed(available)), must, size)


# --- the exhaustive search the policy replaced, kept as the reference --------------------------------
# Today's scoring, unchanged: every combination of the free groups (in topology order) is scored and
# the first lowest score wins.

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


def _left_whole(chosen: Sequence[Group], in_use: frozenset[tuple[int | None, ...]]) -> tuple[int, ...]:
    """The rule of (4), modelled here on its own: how many containers that were whole (no group in or
    over them in use) the answer breaks, the parents' level first, then the grandparents'."""
    broken = []
    for up in (1, 2):
        above = {g.key[:len(g.key) - up] for g in chosen if len(g.key) > up}
        broken.append(sum(1 for container in above if container not in in_use))
    return tuple(broken)


def exhaustive(table: Mapping[str, Group], available: Sequence[str], must_include: Sequence[str],
               size: int, in_use: frozenset[tuple[int | None, ...]] = frozenset()) -> list[str]:
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
    def score(extra: Sequence[Group]) -> tuple[Any, ...]:
        parents, spread, lows, orders = _score([*fixed, *extra])
        return (parents, spread, lows, _left_whole([*fixed, *extra], in_use) if in_use else (), orders)

    best = min(combinations(free, need), key=score)
    return must + [g.id for g in sorted(best, key=lambda g: (g.order, g.id))]


def make_group(key: tuple[int | None, ...], cores: int, low: bool) -> Group:
    """A group of ``cores`` SMT-2 cores at ``key``, with a vertical:low CPU or all horizontal."""
    level = ("drawer", "book", "socket")[len(key) - 1]
    gid = "-".join(f"{lv}{'x' if k is None else k}" for lv, k in zip(("drawer", "book", "socket"), key, strict=False))
    cpus = tuple(range(2 * cores))
    polarization = (("vertical:high", 2 * cores - 1), ("vertical:low", 1)) if low else (("horizontal", 2 * cores),)
    return Group(level=level, resource=f"topology/{level}", id=gid, key=key, cpus=cpus,
                 cores=tuple((2 * c, 2 * c + 1) for c in range(cores)), threads_per_core=2,
                 polarization=polarization, memory_nodes=(0,), recorded_nodes=())


DRAWER_IDS = st.sampled_from([0, 1, 2, 3, None, -1])  # None and -1 share topology order -1 (a tie)


@st.composite
def small_tables(draw: st.DrawFn) -> dict[str, Group]:
    """Up to 12 books or sockets over random drawers and books, random sizes and vertical:low flags."""
    key: st.SearchStrategy[tuple[int | None, ...]]
    if draw(st.booleans()):
        key = st.tuples(DRAWER_IDS, st.integers(0, 7))
    else:
        key = st.tuples(DRAWER_IDS, st.integers(0, 3), st.integers(0, 2))
    n = draw(st.integers(1, 12))
    keys: list[tuple[int | None, ...]] = draw(st.lists(key, min_size=n, max_size=n, unique=True))
    biggest = draw(st.integers(1, 4))
    low_share = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    groups = [make_group(k, draw(st.integers(1, biggest)), draw(st.floats(0, 1)) < low_share) for k in keys]
    return {g.id: g for g in groups}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_same_answers_as_the_exhaustive_search(data: st.DataObject) -> None:
    table = data.draw(small_tables())
    ids = list(table)
    kept = data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids)))
    extra = data.draw(st.lists(st.sampled_from([*ids, "not-a-device"]), max_size=2))  # repeats, unknown ids
    available = data.draw(st.permutations([i for i, keep in zip(ids, kept, strict=True) if keep] + extra))
    must = data.draw(st.lists(st.sampled_from(ids), unique=True, max_size=3))
    free = [i for i in dict.fromkeys(available) if i in table and i not in must]
    for size in range(len(must), len(must) + len(free) + 1):
        assert preferred_allocation(table, available, must, size) == exhaustive(table, available, must, size)
    for size in {len(must) - 1, len(must) + len(free) + 1} - {-1}:
        with pytest.raises(PreferenceError) as want:
            exhaustive(table, available, must, size)
        with pytest.raises(PreferenceError, match=re.escape(str(want.value))):
            preferred_allocation(table, available, must, size)


def test_tied_topology_orders_give_the_exhaustive_answers() -> None:
    # Drawers None and -1 both have topology order -1: their books tie under (4) and interleave.
    shape = {(-1, 0): (3, True), (-1, 2): (3, True), (None, 0): (3, True), (None, 1): (2, True),
             (0, 0): (1, True), (0, 1): (2, False), (0, 2): (3, False), (0, 4): (3, True)}
    table = {g.id: g for g in (make_group(k, cores, low) for k, (cores, low) in shape.items())}
    assert preferred_allocation(table, list(table), [], 5) == [
        "drawerx-book0", "drawerx-book1", "drawer0-book1", "drawer0-book2", "drawer0-book4"]
    for must in ([], ["drawerx-book1"], ["drawer-1-book2", "drawer0-book0"]):
        for size in range(len(must), len(table) + 1):
            assert preferred_allocation(table, list(table), must, size) == exhaustive(table, list(table), must, size)


@pytest.mark.parametrize("size", [4, 6, 8])
def test_requests_of_4_6_and_8_books_on_z16_400_give_the_exhaustive_answers(size: int) -> None:
    books = group_topology(build_topology(SHAPES["z16-400"])).by_id("topology/book")
    assert len(books) == 16
    assert preferred_allocation(books, list(books), [], size) == exhaustive(books, list(books), [], size)


def large_table(drawers: int = 40, books: int = 4, low_from: int | None = None) -> dict[str, Group]:
    """``drawers`` x ``books`` books of 12 or 13 cores; from drawer ``low_from`` on, every other
    book has a vertical:low CPU."""
    groups = [make_group((d, d * books + b), 13 if (d + b) % 3 == 0 else 12,
                         low_from is not None and d >= low_from and b % 2 == 1)
              for d in range(drawers) for b in range(books)]
    return {g.id: g for g in groups}


def test_a_large_request_stays_in_the_fewest_drawers() -> None:
    table = {g.id: g for g in (make_group((d, 4 * d + b), 6, False) for d in range(40) for b in range(4))}
    assert preferred_allocation(table, list(table), [], 8) == [f"drawer{d}-book{b}" for d in (0, 1)
                                                                for b in range(4 * d, 4 * d + 4)]
    got = preferred_allocation(table, list(table), ["drawer7-book29"], 8)
    assert got[0] == "drawer7-book29" and {i.split("-")[0] for i in got} == {"drawer0", "drawer7"}


def _counting(calls: Counter[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return fn(*args, **kwargs)
    return counted


@pytest.mark.parametrize("size", [8, 40, 80, 120, 159])
def test_a_large_request_does_bounded_work(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """8 of 160 books is C(160, 8) ~ 10^13 combinations: count the work instead of timing it."""
    table = large_table(low_from=25)
    calls: Counter[str] = Counter()
    monkeypatch.setattr(preference, "_has_low", _counting(calls, "features", preference._has_low))
    monkeypatch.setattr(preference, "combinations", _counting(calls, "combinations", combinations))
    for cls, name in ((preference._MixedTables, "reach"), (preference._Remaining, "at_least"),
                      (preference._Search, "_solve")):
        monkeypatch.setattr(cls, name, _counting(calls, "lookups" if name != "_solve" else "windows",
                                                 getattr(cls, name)))
    index = preference.PreferenceIndex(table)
    assert calls["features"] == len(table)  # once per group, not once per scored combination
    calls.clear()
    got = preferred_allocation(table, list(table), ["drawer30-book121"], size, index)
    assert len(got) == size and got[0] == "drawer30-book121"
    assert calls["combinations"] == 0
    assert calls["features"] == 0  # the index kept: no feature worked out again
    assert 1 <= calls["windows"] <= 2  # books of 12 and 13 cores: at most two size windows
    assert calls["lookups"] <= calls["windows"] * 40  # per window, at most one lookup per drawer
    assert preferred_allocation(table, list(table), ["drawer30-book121"], size) == got  # index made in the call


def test_a_changed_table_is_read_again() -> None:
    table = {g.id: g for g in (make_group((0, b), 4, False) for b in range(3))}
    table |= {g.id: g for g in (make_group((1, b), 4, False) for b in range(3, 5))}
    assert preferred_allocation(table, list(table), [], 2) == ["drawer0-book0", "drawer0-book1"]
    table["drawer0-book0"] = make_group((0, 0), 4, True)  # the same dict, another group: now vertical:low
    assert preferred_allocation(table, list(table), [], 2) == ["drawer0-book1", "drawer0-book2"]
    del table["drawer0-book1"], table["drawer0-book2"]
    assert preferred_allocation(table, list(table), [], 2) == ["drawer1-book3", "drawer1-book4"]
    with pytest.raises(PreferenceError, match="exceeds the 3 available"):
        preferred_allocation(table, [*table, "drawer0-book1"], [], 4)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_among_equal_answers_the_most_whole_containers_are_left(data: st.DataObject) -> None:
    table = data.draw(small_tables())
    ids = list(table)
    held = data.draw(st.lists(st.sampled_from(ids), unique=True, max_size=3))
    other = data.draw(st.lists(st.tuples(DRAWER_IDS, st.integers(0, 7)), max_size=2))  # another level's groups
    keys = [table[i].key for i in held] + other
    in_use = frozenset(k[:n] for k in keys for n in range(1, len(k) + 1))
    available = [i for i in ids if i not in held]
    must = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=2)) if available else []
    for size in range(len(must), len(available) + 1):
        assert preferred_allocation(table, available, must, size, spoiled=in_use) == exhaustive(
            table, available, must, size, in_use)


def test_a_socket_goes_to_the_book_in_use_on_z16() -> None:
    # drawer0-book1-socket0 held: its sibling breaks no whole book; drawer0-book0-socket0 would.
    in_use = preference.spoiled_containers([SOCKETS["drawer0-book1-socket0"].key])
    available = [i for i in SOCKETS if i != "drawer0-book1-socket0"]
    assert preferred_allocation(SOCKETS, available, [], 1, spoiled=in_use) == ["drawer0-book1-socket1"]
    assert preferred_allocation(SOCKETS, available, [], 1) == ["drawer0-book0-socket0"]  # nothing in use: lowest


def test_unknown_must_include_ids_are_named_quoted_and_few_on_one_line() -> None:
    with pytest.raises(PreferenceError) as refused:
        preferred_allocation(BOOKS, [], ["\n", *(f"nope{n}" for n in range(20))], 1)
    message = str(refused.value)
    assert "\n" not in message and "'\\n'" in message and "and 13 more" in message
