"""GetPreferredAllocation: which free groups to hand a multi-group request. Deterministic, no I/O.

The answer minimises one lexicographic score of the whole set (``must_include`` and the chosen groups together):
the fewest parent containers, the most balanced group sizes, the fewest ``vertical:low`` groups, the most containers
left whole where some are in use, then the lowest topology orders. It has exactly ``size`` ids: ``must_include``'s
first, as given, then the chosen ones in topology order; unknown available ids are ignored.

Must hold: polynomial for every request size (nothing is enumerated beyond a bounded exhaustive search), and exact
under the first three criteria always. The algorithm, its complexity and where it is a best effort:
docs/contributing/design/preference.md."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import combinations, groupby
from math import comb
from operator import add
from typing import cast

from agent.errors import PreferenceError
from agent.policy.grouping import Group

LOW = "vertical:low"
EXHAUSTIVE_LIMIT = 20_000  # parents that share a topology-order prefix only (see the module docstring)
IN_USE_LIMIT = 2_000  # combinations decided exhaustively for criterion (4): a few ms at most

IN, OPEN, DEAD = 0, 1, 2  # a parent's state during the walk


def preferred_allocation(
    table: Mapping[str, Group],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    index: PreferenceIndex | None = None,
    spoiled: Collection[tuple[int | None, ...]] = frozenset(),
) -> list[str]:
    """``size`` ids from ``available`` (known ids only) that contain ``must_include``. ``index`` is
    ``table``'s :class:`PreferenceIndex` when the caller keeps one (made here otherwise); ``spoiled``
    the container keys (key prefixes) in use already, see :func:`spoiled_containers`."""
    must = list(dict.fromkeys(must_include))
    unknown = [i for i in must if i not in table]
    if unknown:
        raise PreferenceError(f"unknown must-include device id(s): {_named(unknown)}")
    if size < len(must):
        raise PreferenceError(f"allocation size {size} is smaller than the {len(must)} must-include ids")
    wanted = dict.fromkeys(available)
    for i in must:
        wanted.pop(i, None)
    if index is None:
        index = PreferenceIndex(table)
    rows = sorted([r for r in map(index.rank.get, wanted) if r is not None])
    need = size - len(must)
    if need > len(rows):
        raise PreferenceError(f"allocation size {size} exceeds the {len(must) + len(rows)} available ids")
    if need == 0:
        return must
    spoiled = frozenset(spoiled)
    if spoiled and comb(len(rows), need) > IN_USE_LIMIT:  # parents left whole walked last (see above)
        rows.sort(key=lambda r: (_whole(index.groups[r].key, spoiled), r))
    chosen = _Search(index, rows, [table[i] for i in must], need, spoiled).run()
    return must + [g.id for g in sorted(chosen, key=lambda g: index.rank[g.id])]


def _named(ids: Sequence[str], most: int = 8, length: int = 60) -> str:
    """Ids for an error message: quoted (a newline in one stays on the line), cut short, the first ``most``."""
    shown = ", ".join(repr(i if len(i) <= length else f"{i[:length]}...") for i in ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


def spoiled_containers(keys: Iterable[tuple[int | None, ...]]) -> frozenset[tuple[int | None, ...]]:
    """Every container key (each prefix) of the groups ``keys``: the containers no longer whole."""
    return frozenset(key[:n] for key in keys for n in range(1, len(key) + 1))


def _whole(key: tuple[int | None, ...], spoiled: frozenset[tuple[int | None, ...]]) -> tuple[bool, ...]:
    """Per ancestor of a group at ``key``, nearest first: is it whole (not in ``spoiled``)?"""
    return tuple(key[:n] not in spoiled for n in range(len(key) - 1, 0, -1))


def whole_touched(keys: Iterable[tuple[int | None, ...]], spoiled: frozenset[tuple[int | None, ...]]
                  ) -> tuple[int, ...]:
    """Criterion (4): per level above the groups, nearest first, the whole containers they touch."""
    keys = list(keys)
    depth = max((len(k) for k in keys), default=1)
    return tuple(len({k[:n] for k in keys if len(k) > n and k[:n] not in spoiled}) for n in range(depth - 1, 0, -1))


class PreferenceIndex:
    """A table's groups in topology order (ties by id) with their features: made once per table by whoever
    keeps the table (the device table does), not per request."""

    def __init__(self, table: Mapping[str, Group]) -> None:
        ids = list(table)
        values = list(table.values())
        keys = [g.key for g in values]
        self.unknown = any(None in k for k in keys)  # without unknown ids, the topology order is the key itself
        orders = [g.order for g in values] if self.unknown else cast("list[tuple[int, ...]]", keys)
        ranked = sorted(range(len(keys)), key=lambda i: (orders[i], values[i].id))
        self.rank = {ids[i]: r for r, i in enumerate(ranked)}
        self.groups = [values[i] for i in ranked]
        self.orders = [orders[i] for i in ranked]
        self.sizes = [len(g.cores) for g in self.groups]
        self.low = [_has_low(g) for g in self.groups]
        self.parents: dict[tuple[int | None, ...], int] = {}
        self.parent = [self.parents.setdefault(g.key[:-1], len(self.parents)) for g in self.groups]


def _has_low(g: Group) -> bool:
    for p, _ in g.polarization:  # noqa: SIM110 (a loop: twice as fast as any() over a generator)
        if p == LOW:
            return True
    return False


def _top_sum(values: Sequence[int], m: int) -> int:
    """The sum of the ``m`` largest values."""
    return sum(sorted(values, reverse=True)[:m]) if m > 0 else 0


class _Remaining:
    """The counts of the parents not yet reached, for answers without low groups: can at most ``j``
    of them add ``h`` or more groups? A histogram of their counts: the ``j`` largest come first.
    Parents leave it in walk order."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.hist = [0] * (max(counts, default=0) + 1)
        for c in counts:
            self.hist[c] += 1

    def leave(self, count: int) -> None:
        self.hist[count] -= 1

    def at_least(self, j: int, h: int) -> bool:
        if j < 0:
            return False
        for value in range(len(self.hist) - 1, 0, -1):
            if h <= 0 or j == 0:
                break
            k = min(j, self.hist[value])
            h -= k * value
            j -= k
        return h <= 0


class _MixedTables:
    """Suffix tables over a sequence of parents, for answers that need low groups: can exactly ``j``
    of the parents ``i..`` add exactly ``h`` non-low groups and ``e`` or more groups in all?

    A pool of the ``m`` extra parents that holds the request has at least ``need`` groups, so its
    parents fall short of the fullest one (``c`` groups) by at most ``slack`` groups in all: a set of
    parents is kept as (count, non-low groups, shortfall <= slack), bit ``j * S + h * W + d``, and
    ``e`` groups means a shortfall of at most ``j * c - e``. Usually ``slack < c``: a few bits, not one
    per possible low group count.
    """

    def __init__(self, weights: Sequence[tuple[int, int]], layers: int, slack: int) -> None:
        self.full = max((h + l_ for h, l_ in weights), default=0)
        self.h_max = _top_sum([h for h, _ in weights], layers)
        self.slack = slack
        pad = max((self.full - h - l_ for h, l_ in weights), default=0)
        self.width = slack + 1 + pad  # a shortfall past slack spills into the pad, then is masked off
        self.layer = (self.h_max + 1) * self.width
        field = (1 << (slack + 1)) - 1
        layer = field * (((1 << self.layer) - 1) // ((1 << self.width) - 1))
        keep = layer * (((1 << ((layers + 1) * self.layer)) - 1) // ((1 << self.layer) - 1))
        table = 1  # the empty set
        self.suffix = [table] * (len(weights) + 1)
        for i in range(len(weights) - 1, -1, -1):
            h, l_ = weights[i]
            table = (table | (table << (self.layer + h * self.width + self.full - h - l_))) & keep
            self.suffix[i] = table

    def reach(self, i: int, j: int, h: int, e: int) -> bool:
        if j < 0 or h < 0 or h > self.h_max:
            return False
        short = j * self.full - e  # the largest shortfall that still adds e groups
        if short < 0:
            return False
        if short > self.slack:
            short = self.slack
        return (self.suffix[i] >> (j * self.layer + h * self.width)) & ((2 << short) - 1) != 0

    def most_highs(self, j: int) -> int:
        """The most non-low groups ``j`` of all the parents add within the slack (-1: none)."""
        layer = (self.suffix[0] >> (j * self.layer)) & ((1 << self.layer) - 1)
        return (layer.bit_length() - 1) // self.width if layer else -1


class _Search:
    """One call's search over the free groups (rows of the table index), in topology order."""

    def __init__(self, index: PreferenceIndex, rows: list[int], fixed: list[Group], need: int,
                 spoiled: frozenset[tuple[int | None, ...]] = frozenset()) -> None:
        self.need = need
        self.spoiled = spoiled
        self.fixed = fixed
        self.groups = [index.groups[r] for r in rows]
        self.orders = [index.orders[r] for r in rows]
        self.sizes = [index.sizes[r] for r in rows]
        self.low = [index.low[r] for r in rows]
        self.any_low = any(self.low)
        self.parent = [index.parent[r] for r in rows]  # the table's parent numbers
        self.n_parents = len(index.parents)
        self.pinned = [False] * self.n_parents  # must-include parents: their groups cost no parent
        for g in fixed:
            self.pinned[index.parents[g.key[:-1]]] = True
        self.any_pinned = bool(fixed)
        self.fixed_sizes = [len(g.cores) for g in fixed]
        # Runs of one parent in topology order: one per parent unless two parents share an order
        # prefix (null and -1 ids).
        self.runs = [(j, list(run)) for j, run in groupby(range(len(self.groups)), self.parent.__getitem__)]
        n_parents = len({j for j, _ in self.runs})
        self.contiguous = len(self.runs) == n_parents and (
            not index.unknown or len({o[:-1] for o in self.orders}) == n_parents)
        # Per distinct size, per parent: the free groups (non-low, low).
        self.values = sorted(set(self.sizes))
        slot = {v: i for i, v in enumerate(self.values)}
        self.highs_by = [[0] * self.n_parents for _ in self.values]
        self.lows_by = [[0] * self.n_parents for _ in self.values]
        counts = [0] * self.n_parents
        for (s, j, low), c in Counter(zip(self.sizes, self.parent, self.low, strict=True)).items():
            (self.lows_by if low else self.highs_by)[slot[s]][j] += c
            counts[j] += c
        free_pinned = sum(c for c, p in zip(counts, self.pinned, strict=True) if p)
        others = sorted((c for c, p in zip(counts, self.pinned, strict=True) if not p), reverse=True)
        self.m = 0  # the fewest extra parents
        while free_pinned < need:
            free_pinned += others[self.m]
            self.m += 1
        self._fit: dict[tuple[int, int], bool] = {}

    def run(self) -> list[Group]:
        combinations_ = comb(len(self.groups), self.need)
        if (self.spoiled and combinations_ <= IN_USE_LIMIT) or (
                not self.contiguous and combinations_ <= EXHAUSTIVE_LIMIT):
            return self._exhaustive()
        windows = self._windows()
        best: tuple[int, list[int]] | None = None
        for lo, hi in windows:
            lows, rows = self._solve(lo, hi)
            if len(windows) == 1:
                return [self.groups[r] for r in rows]
            key = (lows, rows)  # rows in walk order (topology order unless reordered): the lowest set first
            if best is None or key < best:
                best = key
        assert best is not None, "a feasible request has a window"
        return [self.groups[r] for r in best[1]]

    # --- (1) and (2): parents and size windows ---------------------------------------------
    def _slots(self, lo: int, hi: int) -> tuple[int, int]:
        """The first and last index of the free groups' sizes within lo..hi (first > last: none)."""
        return bisect_left(self.values, lo), bisect_right(self.values, hi) - 1

    def _counts(self, first: int, last: int) -> tuple[list[int], list[int]]:
        """Per parent, the free groups whose size has an index first..last: (non-low, low)."""
        if first > last:
            return [0] * self.n_parents, [0] * self.n_parents
        if first == last:
            return self.highs_by[first], self.lows_by[first]
        return ([sum(c) for c in zip(*self.highs_by[first:last + 1], strict=True)],
                [sum(c) for c in zip(*self.lows_by[first:last + 1], strict=True)])

    def _fits(self, lo: int, hi: int) -> bool:
        """Can the groups sized lo..hi fill the request from the pinned parents and m others?"""
        slots = self._slots(lo, hi)
        fit = self._fit.get(slots)
        if fit is None:
            highs, lows = self._counts(*slots)
            totals = list(map(add, highs, lows))
            if self.any_pinned:
                pinned = sum(c for c, p in zip(totals, self.pinned, strict=True) if p)
                totals = [c for c, p in zip(totals, self.pinned, strict=True) if not p]
            else:
                pinned = 0
            fit = self._fit[slots] = pinned + _top_sum(totals, self.m) >= self.need
        return fit

    def _windows(self) -> list[tuple[int, int]]:
        """Every narrowest size window [lo, lo + D] that holds must_include and can fill the request."""
        values = sorted(set(self.values) | set(self.fixed_sizes))
        if len(values) == 1:
            return [(values[0], values[0])]
        f_lo = min(self.fixed_sizes, default=values[-1])
        f_hi = max(self.fixed_sizes, default=values[0])
        starts = [v for v in values if v <= f_lo]
        width: int | None = None
        k = 0
        for lo in starts:  # the smallest feasible hi never decreases as lo grows
            while k < len(values) and (values[k] < max(lo, f_hi) or not self._fits(lo, values[k])):
                k += 1
            if k == len(values):
                break
            width = values[k] - lo if width is None else min(width, values[k] - lo)
        assert width is not None, "the widest window holds every free group"
        return [(lo, lo + width) for lo in starts if lo + width >= f_hi and self._fits(lo, lo + width)]

    # --- (3) and (4): low groups and topology order, inside one window -------------------------
    def _solve(self, lo: int, hi: int) -> tuple[int, list[int]]:
        """(low groups, the lowest-ordered optimal answer's rows) inside the size window lo..hi."""
        need, m = self.need, self.m
        first, last = self._slots(lo, hi)
        highs, lows = self._counts(first, last)
        if self.any_pinned:
            pinned_h = sum(h for h, p in zip(highs, self.pinned, strict=True) if p)
            pinned_l = sum(l_ for l_, p in zip(lows, self.pinned, strict=True) if p)
            others = [h for h, p in zip(highs, self.pinned, strict=True) if not p]
        else:
            pinned_h = pinned_l = 0
            others = highs
        without_lows = pinned_h + _top_sum(others, m) >= need
        sizes, low = self.sizes, self.low
        everything = first == 0 and last == len(self.values) - 1
        if everything and not (without_lows and self.any_low):
            runs = self.runs
        else:
            runs = [(j, [r for r in rows if lo <= sizes[r] <= hi and not (without_lows and low[r])])
                    for j, rows in self.runs]
            runs = [(j, rows) for j, rows in runs if rows]
        order = list(dict.fromkeys(j for j, _ in runs if not self.pinned[j]))  # by first row
        if without_lows:  # no low group needed: the others only
            return 0, self._walk(runs, order, _Remaining([highs[j] for j in order]), highs, lows, need, 0,
                                 pinned_h, 0)
        full = max((highs[j] + lows[j] for j in order), default=0)
        mixed = _MixedTables([(highs[j], lows[j]) for j in order], m, m * full - (need - pinned_h - pinned_l))
        h_free = mixed.most_highs(m)
        assert h_free >= 0, "a feasible window has a pool of m parents"
        h_target = pinned_h + h_free
        return need - h_target, self._walk(runs, order, mixed, highs, lows, h_target, need - h_target,
                                           pinned_h, pinned_l)

    def _walk(self, runs: list[tuple[int, list[int]]], order: list[int], rest: _Remaining | _MixedTables,
              highs: list[int], lows: list[int], h_target: int, l_target: int, pinned_h: int, pinned_l: int
              ) -> list[int]:
        """Take rows in topology order whenever an optimal answer contains them and all rows taken so far.

        A parent in use gives all its non-low rows (up to ``h_target``: without low rows, any ``need``
        non-low rows do) and low rows while fewer than ``l_target`` are taken. Any other parent is
        decided at its first row: in use if the rest can still be completed from the parents after
        it (a lookup in ``rest``), never again otherwise. Exact when parents are runs in topology
        order: then no other parent's row comes between a parent's first row and the rest of it.
        """
        need, m = self.need, self.m
        position = {j: i + 1 for i, j in enumerate(order)}  # the suffix of parents after j
        state = [IN if p else OPEN for p in self.pinned]
        h_left, l_left = pinned_h, pinned_l  # rows not yet walked in parents in use
        taken_h = taken_l = used = 0
        taken: list[int] = []
        for j, rows in runs:
            if state[j] == DEAD:
                continue
            if state[j] == OPEN:
                h_need = h_target - taken_h - h_left - highs[j]
                if isinstance(rest, _MixedTables):
                    l_need = l_target - taken_l - l_left - lows[j]
                    ok = rest.reach(position[j], m - used - 1, h_need, h_need + (l_need if l_need > 0 else 0))
                else:
                    rest.leave(highs[j])
                    ok = rest.at_least(m - used - 1, h_need)
                if not ok:
                    state[j] = DEAD
                    continue
                state[j] = IN
                used += 1
                h_left += highs[j]
                l_left += lows[j]
            if not l_target:  # non-low rows only: any of them will do
                taken += rows[:need - taken_h]
                taken_h = len(taken)
                h_left -= len(rows)
            elif self.contiguous and taken_h + highs[j] <= h_target and taken_l + lows[j] <= l_target:
                taken += rows  # the parent's whole run fits
                taken_h += highs[j]
                taken_l += lows[j]
                h_left -= highs[j]
                l_left -= lows[j]
            else:
                for r in rows:
                    if self.low[r]:
                        l_left -= 1
                        if taken_l < l_target:
                            taken.append(r)
                            taken_l += 1
                    else:
                        h_left -= 1
                        if taken_h < h_target:
                            taken.append(r)
                            taken_h += 1
            if taken_h + taken_l == need:
                return taken
        raise AssertionError(f"preferred allocation: the walk took {len(taken)} of {need}")

    # --- parents sharing a topology order prefix (null and -1 ids) ---------------------------
    def _exhaustive(self) -> list[Group]:
        """The exhaustive search: for the rare tables whose parents are not runs in topology order, and
        for criterion (4) (containers in use) on every request it can afford."""
        fixed = [(g.key[:-1], len(g.cores), _has_low(g), g.order) for g in self.fixed]
        rows = [(g.key[:-1], self.sizes[r], self.low[r], g.order) for r, g in enumerate(self.groups)]

        keys = [g.key for g in self.fixed]
        spoiled = self.spoiled

        def score(extra: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...], tuple[tuple[int, ...], ...]]:
            chosen = fixed + [rows[r] for r in extra]
            sizes = [s for _, s, _, _ in chosen]
            whole = whole_touched(keys + [self.groups[r].key for r in extra], spoiled) if spoiled else ()
            return (len({p for p, _, _, _ in chosen}), max(sizes) - min(sizes), sum(lw for _, _, lw, _ in chosen),
                    whole, tuple(sorted(o for _, _, _, o in chosen)))

        best = min(combinations(range(len(rows)), self.need), key=score)
        return [self.groups[r] for r in best]
