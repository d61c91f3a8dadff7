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
    return any(p == LOW for p, _ in g.polarization)


def _top_sum(values: list[int], m: int) -> int:
    """The sum of the ``m`` largest values."""
    return sum(sorted(values, reverse=True)[:m]) if m > 0 else 0


class _Tables:
    """Suffix tables over a sequence of parents: ``at(i, j, h, l)``: can at most ``j`` of the
    parents ``i..`` add exactly ``h`` non-low and ``l`` low groups? One big int per suffix, bit
    ``j * S + h * W + l``; adding a parent shifts a whole table by one layer plus its counts."""

    def __init__(self, weights: Sequence[tuple[int, int]], layers: int) -> None:
        self.h_total = sum(h for h, _ in weights)
        self.l_total = sum(l_ for _, l_ in weights)
        self.width = self.l_total + 1
        self.layer = (self.h_total + 1) * self.width
        full = (1 << ((layers + 1) * self.layer)) - 1
        table = full // ((1 << self.layer) - 1)  # the empty set, in every layer ("at most j")
        self.suffix = [table] * (len(weights) + 1)
        for i in range(len(weights) - 1, -1, -1):
            h, l_ = weights[i]
            table = (table | (table << (self.layer + h * self.width + l_))) & full
            self.suffix[i] = table

    def exact(self, i: int, j: int, h: int, low_at_least: int) -> bool:
        """At most ``j`` of parents ``i..`` add exactly ``h`` non-low and ``low_at_least`` or more low groups."""
        if j < 0 or h < 0 or h > self.h_total or low_at_least > self.l_total:
            return False
        low = max(low_at_least, 0)
        return (self.suffix[i] >> (j * self.layer + h * self.width + low)) & ((1 << (self.width - low)) - 1) != 0

    def at_least(self, i: int, j: int, h: int) -> bool:
        """At most ``j`` of parents ``i..`` add ``h`` or more groups (tables built without lows)."""
        if j < 0 or h > self.h_total:
            return False
        h = max(h, 0)
        return (self.suffix[i] >> (j * self.layer + h)) & ((1 << (self.layer - h)) - 1) != 0


class _Search:
    """One call's search: the features of every free group, computed once, in topology order."""

    def __init__(self, fixed: list[Group], free: list[Group], need: int) -> None:
        self.need = need
        orders = [g.order for g in free]
        rank = sorted(range(len(free)), key=lambda i: (orders[i], free[i].id))
        self.groups = [free[i] for i in rank]
        self.orders = [orders[i] for i in rank]
        self.sizes = [len(g.cores) for g in self.groups]
        self.low = [_has_low(g) for g in self.groups]
        fixed_parents = {g.key[:-1] for g in fixed}
        index: dict[tuple[int | None, ...], int] = {}
        self.parent = [index.setdefault(g.key[:-1], len(index)) for g in self.groups]
        self.n_parents = len(index)
        self.pinned = [False] * self.n_parents  # a must-include parent: costs nothing
        for p, j in index.items():
            self.pinned[j] = p in fixed_parents
        self.fixed_sizes = [len(g.cores) for g in fixed]
        self.fixed = fixed
        counts = [0] * self.n_parents
        for j in self.parent:
            counts[j] += 1
        free_in_pinned = sum(c for j, c in enumerate(counts) if self.pinned[j])
        others = sorted((c for j, c in enumerate(counts) if not self.pinned[j]), reverse=True)
        self.m = 0  # the fewest extra parents
        while free_in_pinned < need:
            free_in_pinned += others[self.m]
            self.m += 1

    # --- the walk -------------------------------------------------------------------------
    def run(self) -> list[Group]:
        if len(set(self.orders)) < len(self.orders) and comb(len(self.groups), self.need) <= \
                TIED_ORDERS_EXHAUSTIVE_LIMIT:
            return self._exhaustive()
        best: tuple[int, list[tuple[tuple[int, ...], str]], list[int]] | None = None
        for lo, hi in self._windows():
            lows, rows = self._solve(lo, hi)
            key = (lows, [(self.orders[r], self.groups[r].id) for r in rows], rows)
            if best is None or key[:2] < best[:2]:
                best = key
        assert best is not None, "a feasible request has a window"
        return [self.groups[r] for r in best[2]]

    def _eligible_counts(self, lo: int, hi: int) -> tuple[list[int], list[int]]:
        """Per parent, the free groups with lo <= size <= hi: (non-low, low)."""
        highs = [0] * self.n_parents
        lows = [0] * self.n_parents
        for j, s, low in zip(self.parent, self.sizes, self.low, strict=True):
            if lo <= s <= hi:
                if low:
                    lows[j] += 1
                else:
                    highs[j] += 1
        return highs, lows

    def _fits(self, lo: int, hi: int) -> bool:
        """Can the groups sized lo..hi fill the request from the pinned parents and m others?"""
        highs, lows = self._eligible_counts(lo, hi)
        pinned = sum(highs[j] + lows[j] for j in range(self.n_parents) if self.pinned[j])
        others = [highs[j] + lows[j] for j in range(self.n_parents) if not self.pinned[j]]
        return pinned + _top_sum(others, self.m) >= self.need

    def _windows(self) -> list[tuple[int, int]]:
        """Every narrowest size window [lo, lo + D] that holds must_include and can fill the request."""
        values = sorted(set(self.sizes) | set(self.fixed_sizes))
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

    def _solve(self, lo: int, hi: int) -> tuple[int, list[int]]:
        """(low groups, the lowest-ordered optimal answer's rows) inside the size window lo..hi."""
        need, m = self.need, self.m
        highs, lows = self._eligible_counts(lo, hi)
        pinned_h = sum(highs[j] for j in range(self.n_parents) if self.pinned[j])
        pinned_l = sum(lows[j] for j in range(self.n_parents) if self.pinned[j])
        rows = [r for r in range(len(self.groups)) if lo <= self.sizes[r] <= hi]
        if pinned_h + _top_sum([highs[j] for j in range(self.n_parents) if not self.pinned[j]], m) >= need:
            # No low group needed: only the others take part.
            return 0, self._walk([r for r in rows if not self.low[r]], highs, lows, need, 0, pinned_h, 0, None)
        first = self._by_first_row(rows, set(range(self.n_parents)))
        tables = _Tables([(highs[j], lows[j]) for j in first], m)
        best_h = next(h for h in range(tables.h_total, -1, -1)
                      if tables.exact(0, m, h, need - pinned_h - pinned_l - h))
        h_target = pinned_h + best_h
        walk = self._walk(rows, highs, lows, h_target, need - h_target, pinned_h, pinned_l, (first, tables))
        return need - h_target, walk

    def _by_first_row(self, rows: Sequence[int], among: set[int]) -> list[int]:
        """The unpinned parents in ``among`` in the order of their first row in ``rows``."""
        seen: dict[int, None] = {}
        for r in rows:
            j = self.parent[r]
            if j in among and not self.pinned[j]:
                seen.setdefault(j, None)
        return list(seen)

    def _walk(self, rows: list[int], highs: list[int], lows: list[int], h_target: int, l_target: int,
              pinned_h: int, pinned_l: int, mixed: tuple[list[int], _Tables] | None) -> list[int]:
        """Take rows in topology order whenever an optimal answer still contains what is taken.

        Every parent in use gives all its non-low rows (up to ``h_target``) and low rows while
        fewer than ``l_target`` are taken; an unused parent is decided at its first row that could
        be taken. With ``mixed`` (low rows needed), the lookups first use the (non-low, low) tables;
        once the low rows are all taken, tables of non-low rows only over the parents still open.
        """
        m = self.m
        state = [IN if p else OPEN for p in self.pinned]
        h_left, l_left = pinned_h, pinned_l  # rows not yet walked in parents in use
        taken_h = taken_l = used = 0
        taken: list[int] = []
        position: dict[int, int] = {}
        tables: _Tables | None = None
        with_lows = mixed is not None
        if mixed is not None:
            order, tables = mixed
            position = {j: i + 1 for i, j in enumerate(order)}

        def highs_only(after: int) -> tuple[dict[int, int], _Tables]:
            open_ = {j for j in range(self.n_parents) if state[j] == OPEN}
            order = self._by_first_row([r for r in rows[after:] if not self.low[r]], open_)
            return {j: i + 1 for i, j in enumerate(order)}, _Tables([(highs[j], 0) for j in order], m)

        if not with_lows:
            position, tables = highs_only(0)
        assert tables is not None
        for at, r in enumerate(rows):
            j, low = self.parent[r], self.low[r]
            if state[j] == DEAD:
                continue
            if state[j] == OPEN:
                if low and not with_lows:
                    continue  # low rows are all taken: this parent can only join through a non-low row
                budget = m - used - 1
                h_need = h_target - taken_h - h_left - highs[j]
                if with_lows:
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
                    if taken_l == l_target and with_lows:
                        with_lows = False
                        position, tables = highs_only(at + 1)
            else:
                h_left -= 1
                if taken_h < h_target:
                    taken.append(r)
                    taken_h += 1
            if taken_h + taken_l == self.need:
                break
        if len(taken) != self.need:
            raise AssertionError(f"preferred allocation walk took {len(taken)} of {self.need}")
        return taken

    # --- tied topology orders only -----------------------------------------------------------
    def _exhaustive(self) -> list[Group]:
        """Today's exhaustive search, for the rare tables whose topology orders tie."""
        fixed = [(g.key[:-1], len(g.cores), _has_low(g), g.order) for g in self.fixed]
        rows = [(g.key[:-1], self.sizes[r], self.low[r], self.orders[r]) for r, g in enumerate(self.groups)]

        def score(extra: tuple[int, ...]) -> tuple[int, int, int, tuple[tuple[int, ...], ...]]:
            chosen = fixed + [rows[r] for r in extra]
            sizes = [s for _, s, _, _ in chosen]
            return (len({p for p, _, _, _ in chosen}), max(sizes) - min(sizes), sum(lw for _, _, lw, _ in chosen),
                    tuple(sorted(o for _, _, _, o in chosen)))

        best = min(combinations(range(len(rows)), self.need), key=score)
        return [self.groups[r] for r in best]
