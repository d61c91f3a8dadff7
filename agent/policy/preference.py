"""GetPreferredAllocation: which free groups to hand a multi-group request. Pure, deterministic.

The answer minimises one lexicographic score of the whole set (``must_include`` and the chosen
groups together), most important first:

1. the fewest distinct parent containers (``Group.key[:-1]``: the drawer of a book, the book of a
   socket);
2. the smallest difference between the largest and the smallest group in cores (balanced
   tensor-parallel ranks);
3. the fewest groups with ``vertical:low`` CPUs;
4. the lowest sorted tuple of topology orders (``Group.order``).

``must_include`` ids are always part of the answer, which has exactly ``size`` ids: the
``must_include`` ids first, as given, then the chosen ones in topology order. Unknown available ids
are ignored.

How, without scoring combinations (N free groups, P parents, d distinct group sizes):

* Each group's features (parent, size in cores, vertical:low, topology order) are computed once.
* (1) The fewest extra parents ``m``: ``must_include``'s parents cost nothing; then the parents
  with the most free groups first.
* (2) The narrowest size window ``[lo, lo + D]`` (``lo`` one of the sizes, holding
  ``must_include``'s sizes) whose groups fill the request from those parents plus ``m`` others:
  two pointers over the sorted sizes. Every window of width ``D`` that can is a candidate; an
  answer's sizes lie in one of them.
* (3) Per window, the fewest vertical:low groups: none when the ``m`` parents richest in other
  groups suffice; otherwise a bitset dynamic programme over (parents used, non-low groups, low
  groups) finds the most non-low groups ``H`` a pool of ``m`` parents can give while still
  holding the request. Then every non-low group of the parents used is in the answer, with the
  fewest low ones.
* (4) Lowest topology orders: walk the window's groups in topology order and take each group
  when some optimal answer contains it and every group taken so far (the standard greedy for the
  lexicographically smallest set). A parent is decided at its first group; whether the rest can
  still be completed is one lookup in a table, built backwards over the parents not yet reached,
  of what ``j`` of them can add (non-low and low groups). The window whose answer has the fewest
  low groups, then the lowest orders, wins.

Complexity: O(d * N log N) when no parent mixes vertical:low groups with others (the usual case:
horizontal polarization, or every group with low CPUs); otherwise add, per candidate window, two
bitset tables of P entries of (m + 1) * (H + 1) * (L + 1) bits (L: low groups) and N lookups in
them: O(d * N * m * H * L / w) word operations (w = 64), at most O(N^5 / w) in theory and
microseconds on machines that exist. Polynomial for every request size; nothing is enumerated.

Ties under (4) are broken by id, as an exhaustive search in topology order would; ties happen only
when ``Group.order`` is not one-to-one (a topology file mixing null and -1 container ids). There the
exhaustive search (today's) is kept for small requests, since its tie-break on id sequences differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from math import comb
from typing import cast

from agent.errors import PreferenceError
from agent.policy.grouping import Group

LOW = "vertical:low"
TIED_ORDERS_EXHAUSTIVE_LIMIT = 20_000  # tied topology orders only (see the module docstring)

IN, OPEN, DEAD = 0, 1, 2  # a parent's state during the walk


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
    must_set = set(must)
    free = [table[i] for i in dict.fromkeys(available) if i in table and i not in must_set]
    need = size - len(must)
    if need > len(free):
        raise PreferenceError(f"allocation size {size} exceeds the {len(must) + len(free)} available ids")
    if need == 0:
        return must
    return must + [g.id for g in _Search([table[i] for i in must], free, need).run()]


def _has_low(g: Group) -> bool:
    for p, _ in g.polarization:  # noqa: SIM110 (a loop: twice as fast as any() over a generator)
        if p == LOW:
            return True
    return False


def _top_sum(values: Sequence[int], m: int) -> int:
    """The sum of the ``m`` largest values."""
    return sum(sorted(values, reverse=True)[:m]) if m > 0 else 0


class _Tables:
    """Suffix tables over a sequence of parents: can at most ``j`` of the parents ``i..`` add exactly
    ``h`` non-low and ``l`` low groups? One big int per suffix, bit ``j * S + h * W + l``; taking a
    parent shifts a whole table by one layer ``S`` plus its counts. With ``lows=False`` the low
    counts are left out (``W = 1``)."""

    def __init__(self, weights: Sequence[tuple[int, int]], layers: int, lows: bool) -> None:
        self.h_max = _top_sum([h for h, _ in weights], layers)  # no set of <= layers parents adds more
        self.l_max = _top_sum([l_ for _, l_ in weights], layers) if lows else 0
        self.width = self.l_max + 1
        self.layer = (self.h_max + 1) * self.width
        full = (1 << ((layers + 1) * self.layer)) - 1
        table = full // ((1 << self.layer) - 1)  # the empty set, in every layer ("at most j parents")
        self.suffix = [table] * (len(weights) + 1)
        for i in range(len(weights) - 1, -1, -1):
            h, l_ = weights[i]
            table = (table | (table << (self.layer + h * self.width + (l_ if lows else 0)))) & full
            self.suffix[i] = table

    def exact(self, i: int, j: int, h: int, low_at_least: int) -> bool:
        """Can at most ``j`` of parents ``i..`` add exactly ``h`` non-low and at least ``low_at_least`` low groups?"""
        if j < 0 or h < 0 or h > self.h_max or low_at_least > self.l_max:
            return False
        low = max(low_at_least, 0)
        return (self.suffix[i] >> (j * self.layer + h * self.width + low)) & ((1 << (self.width - low)) - 1) != 0

    def at_least(self, i: int, j: int, h: int) -> bool:
        """Can at most ``j`` of parents ``i..`` add ``h`` or more groups (a table without lows)?"""
        if j < 0 or h > self.h_max:
            return False
        h = max(h, 0)
        return (self.suffix[i] >> (j * self.layer + h)) & ((1 << (self.layer - h)) - 1) != 0

    def most_highs(self, j: int, total: int) -> int:
        """The most non-low groups ``h`` that at most ``j`` of all the parents add together with at
        least ``total - h`` low ones (-1: none do)."""
        layer = (self.suffix[0] >> (j * self.layer)) & ((1 << self.layer) - 1)
        for h in range(self.h_max, -1, -1):
            low = max(total - h, 0)
            if low > self.l_max:
                return -1  # fewer non-low groups need even more low ones
            if (layer >> (h * self.width + low)) & ((1 << (self.width - low)) - 1):
                return h
        return -1


class _Search:
    """One call's search: the features of every free group, computed once, in topology order."""

    def __init__(self, fixed: list[Group], free: list[Group], need: int) -> None:
        self.need = need
        self.fixed = fixed
        features = []
        for g in free:
            key = g.key
            features.append((cast("tuple[int, ...]", key) if None not in key else g.order, g.id, g))
        features.sort(key=lambda f: (f[0], f[1]))  # topology order; ids are unique
        self.groups = [g for _, _, g in features]
        self.orders = [o for o, _, _ in features]
        self.sizes = [len(g.cores) for g in self.groups]
        self.low = [_has_low(g) for g in self.groups]
        fixed_parents = {g.key[:-1] for g in fixed}
        index: dict[tuple[int | None, ...], int] = {}
        self.parent = [index.setdefault(g.key[:-1], len(index)) for g in self.groups]
        # Parents are runs in topology order unless two of them share an order prefix (null and -1 ids).
        self.contiguous = len({o[:-1] for o in self.orders}) == len(index) and all(
            a <= b for a, b in zip(self.parent, self.parent[1:], strict=False))
        self.n_parents = len(index)
        self.pinned = [False] * self.n_parents  # a must-include parent: its groups cost no parent
        for p, j in index.items():
            self.pinned[j] = p in fixed_parents
        self.fixed_sizes = [len(g.cores) for g in fixed]
        # Per distinct size, per parent: the free groups (non-low, low).
        self.values = sorted(set(self.sizes))
        slot = {v: i for i, v in enumerate(self.values)}
        self.highs_by = [[0] * self.n_parents for _ in self.values]
        self.lows_by = [[0] * self.n_parents for _ in self.values]
        for j, s, low in zip(self.parent, self.sizes, self.low, strict=True):
            (self.lows_by if low else self.highs_by)[slot[s]][j] += 1
        counts = [sum(c) for c in zip(*self.highs_by, *self.lows_by, strict=True)]
        free_pinned = sum(c for j, c in enumerate(counts) if self.pinned[j])
        others = sorted((c for j, c in enumerate(counts) if not self.pinned[j]), reverse=True)
        self.m = 0  # the fewest extra parents
        while free_pinned < need:
            free_pinned += others[self.m]
            self.m += 1

    def run(self) -> list[Group]:
        if not self.contiguous and comb(len(self.groups), self.need) <= TIED_ORDERS_EXHAUSTIVE_LIMIT:
            return self._exhaustive()
        best: tuple[int, list[tuple[tuple[int, ...], str]], list[int]] | None = None
        for lo, hi in self._windows():
            lows, rows = self._solve(lo, hi)
            key = (lows, [(self.orders[r], self.groups[r].id) for r in rows], rows)
            if best is None or key[:2] < best[:2]:
                best = key
        assert best is not None, "a feasible request has a window"
        return [self.groups[r] for r in best[2]]

    # --- (1) and (2): parents and size windows ---------------------------------------------
    def _counts(self, lo: int, hi: int) -> tuple[list[int], list[int]]:
        """Per parent, the free groups with lo <= size <= hi: (non-low, low)."""
        inside = [i for i, v in enumerate(self.values) if lo <= v <= hi]
        if not inside:
            return [0] * self.n_parents, [0] * self.n_parents
        if len(inside) == 1:
            return self.highs_by[inside[0]], self.lows_by[inside[0]]
        return ([sum(c) for c in zip(*(self.highs_by[i] for i in inside), strict=True)],
                [sum(c) for c in zip(*(self.lows_by[i] for i in inside), strict=True)])

    def _fits(self, lo: int, hi: int) -> bool:
        """Can the groups sized lo..hi fill the request from the pinned parents and m others?"""
        highs, lows = self._counts(lo, hi)
        totals = [h + l_ for h, l_ in zip(highs, lows, strict=True)]
        pinned = sum(c for c, p in zip(totals, self.pinned, strict=True) if p)
        return pinned + _top_sum([c for c, p in zip(totals, self.pinned, strict=True) if not p], self.m) >= self.need

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
        highs, lows = self._counts(lo, hi)
        pinned_h = sum(h for h, p in zip(highs, self.pinned, strict=True) if p)
        pinned_l = sum(l_ for l_, p in zip(lows, self.pinned, strict=True) if p)
        rows = [r for r, s in enumerate(self.sizes) if lo <= s <= hi]
        if pinned_h + _top_sum([h for h, p in zip(highs, self.pinned, strict=True) if not p], m) >= need:
            rows = [r for r in rows if not self.low[r]]  # no low group needed: the others only
            order = self._first_rows(rows)
            tables = _Tables([(highs[j], 0) for j in order], m, lows=False)
            return 0, self._walk(rows, order, tables, highs, lows, need, 0, pinned_h, 0)
        order = self._first_rows(rows)
        tables = _Tables([(highs[j], lows[j]) for j in order], m, lows=True)
        h_free = tables.most_highs(m, need - pinned_h - pinned_l)
        assert h_free >= 0, "a feasible window has a pool of m parents"
        h_target = pinned_h + h_free
        return need - h_target, self._walk(rows, order, tables, highs, lows, h_target, need - h_target,
                                           pinned_h, pinned_l)

    def _first_rows(self, rows: Sequence[int]) -> list[int]:
        """The unpinned parents of ``rows``, in topology order."""
        seen: dict[int, None] = {}
        for r in rows:
            j = self.parent[r]
            if not self.pinned[j]:
                seen.setdefault(j, None)
        return list(seen)

    def _walk(self, rows: list[int], order: list[int], tables: _Tables, highs: list[int], lows: list[int],
              h_target: int, l_target: int, pinned_h: int, pinned_l: int) -> list[int]:
        """Take rows in topology order whenever an optimal answer contains them and all rows taken so far.

        A parent in use gives all its non-low rows (up to ``h_target``: with ``l_target`` 0 the rows are
        non-low only and any ``need`` of them do) and low rows while fewer than ``l_target`` are taken.
        Any other parent is decided at its first row: in use if the rest can still be completed from
        the parents after it, a lookup in ``tables``; never again otherwise. Exact when parents are
        runs in topology order (then no other parent's row comes between a parent's first row and
        the others).
        """
        m = self.m
        position = {j: i + 1 for i, j in enumerate(order)}  # the suffix of parents after j
        state = [IN if p else OPEN for p in self.pinned]
        h_left, l_left = pinned_h, pinned_l  # rows not yet walked in parents in use
        taken_h = taken_l = used = 0
        taken: list[int] = []
        for r in rows:
            j, low = self.parent[r], self.low[r]
            if state[j] == DEAD:
                continue
            if state[j] == OPEN:
                budget = m - used - 1
                h_need = h_target - taken_h - h_left - highs[j]
                if l_target:
                    ok = tables.exact(position[j], budget, h_need, l_target - taken_l - l_left - lows[j])
                else:
                    ok = tables.at_least(position[j], budget, h_need)
                if not ok:
                    state[j] = DEAD
                    continue
                state[j] = IN
                used += 1
                h_left += highs[j]
                l_left += lows[j]
            if low:
                l_left -= 1
                if taken_l < l_target:
                    taken.append(r)
                    taken_l += 1
            else:
                h_left -= 1
                if taken_h < h_target:
                    taken.append(r)
                    taken_h += 1
            if taken_h + taken_l == self.need:
                return taken
        raise AssertionError(f"preferred allocation: the walk took {len(taken)} of {self.need}")

    # --- parents sharing a topology order prefix (null and -1 ids) ---------------------------
    def _exhaustive(self) -> list[Group]:
        """Today's exhaustive search, for the rare tables whose parents are not runs in topology order."""
        fixed = [(g.key[:-1], len(g.cores), _has_low(g), g.order) for g in self.fixed]
        rows = [(g.key[:-1], self.sizes[r], self.low[r], g.order) for r, g in enumerate(self.groups)]

        def score(extra: tuple[int, ...]) -> tuple[int, int, int, tuple[tuple[int, ...], ...]]:
            chosen = fixed + [rows[r] for r in extra]
            sizes = [s for _, s, _, _ in chosen]
            return (len({p for p, _, _, _ in chosen}), max(sizes) - min(sizes), sum(lw for _, _, lw, _ in chosen),
                    tuple(sorted(o for _, _, _, o in chosen)))

        best = min(combinations(range(len(rows)), self.need), key=score)
        return [self.groups[r] for r in best]
