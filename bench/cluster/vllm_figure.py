"""The isolation figure's statistics (bench/cluster/vllm_beside_hog.py), pure: the interleaved schedule of runs, each
mode's figures against the same round's server alone, their median and spread, and the verdicts.

A round is one run of each mode, each with a fresh server, in :data:`MODES`' order and back in the next round (alone,
enforcing, none, none, enforcing, alone, ...): every mode as often early as late, one agent switch per round. A mode's
ratio is taken per round against that round's alone run (p50 and p99 latency, tokens/s), so a drift of the machine
between rounds cancels; the verdict is about the median of those ratios and the spread beside it is their min-max.
Rounds that lack the mode or its alone run are left out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MODES = ("alone", "enforcing", "none")
BASELINE = "alone"
METRICS = ("p50", "p99", "tok_s")  # latency in seconds, tokens per second
GOAL = 1.15  # p99 enforcing / alone


@dataclass(frozen=True)
class Run:
    """One server's stream: its mode, its round (from 0) and what the client measured."""

    mode: str
    round: int
    p50: float
    p99: float
    tok_s: float
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def value(self, metric: str) -> float:
        return float(getattr(self, metric))


@dataclass(frozen=True)
class Spread:
    """The median of a few values and their range."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("a spread of no values")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def ratio_text(self) -> str:
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f})"


def schedule(rounds: int, modes: Sequence[str] = MODES) -> list[tuple[int, str]]:
    """(round, mode) in the order the runs happen: every mode once per round, odd rounds in reverse."""
    if rounds < 1:
        raise ValueError("at least one round")
    return [(r, mode) for r in range(rounds) for mode in (modes if r % 2 == 0 else modes[::-1])]


def _by_round(runs: Sequence[Run], mode: str) -> dict[int, Run]:
    return {run.round: run for run in runs if run.mode == mode}


def ratios(runs: Sequence[Run], mode: str, metric: str) -> list[float]:
    """``mode``'s ``metric`` over its round's alone run, per round that has both, in round order."""
    base, this = _by_round(runs, BASELINE), _by_round(runs, mode)
    return [this[r].value(metric) / base[r].value(metric) for r in sorted(this.keys() & base.keys())
            if base[r].value(metric) > 0]


@dataclass(frozen=True)
class ModeFigure:
    """One mode over the rounds: each metric's absolute spread and its ratio to alone's."""

    mode: str
    absolute: dict[str, Spread]
    ratio: dict[str, Spread]  # empty for alone, and for a mode no round paired with alone


def figures(runs: Sequence[Run], modes: Sequence[str] = MODES) -> dict[str, ModeFigure]:
    """Every mode that ran: its figure."""
    out: dict[str, ModeFigure] = {}
    for mode in modes:
        mine = [run for run in runs if run.mode == mode]
        if not mine:
            continue
        absolute = {m: Spread.of([run.value(m) for run in mine]) for m in METRICS}
        ratio = {} if mode == BASELINE else {m: Spread.of(r) for m in METRICS if (r := ratios(runs, mode, m))}
        out[mode] = ModeFigure(mode, absolute, ratio)
    return out


def verdict(value: float, limit: float) -> str:
    return "met" if value <= limit else "MISSED"


def verdicts(found: dict[str, ModeFigure], goal: float = GOAL) -> dict[str, str]:
    """``goal``: enforcing's median p99 ratio within the goal; ``below none``: and below none's median ratio.
    A verdict that cannot be reached (a mode missing) is absent."""
    out: dict[str, str] = {}
    enforcing = found.get("enforcing")
    if enforcing is None or "p99" not in enforcing.ratio:
        return out
    mine = enforcing.ratio["p99"].median
    out["goal"] = verdict(mine, goal)
    none = found.get("none")
    if none is not None and "p99" in none.ratio:
        out["below none"] = "met" if mine < none.ratio["p99"].median else "MISSED"
    return out


def _ms(spread: Spread) -> str:
    return f"{spread.median * 1e3:.1f} ms ({spread.low * 1e3:.1f}-{spread.high * 1e3:.1f})"


def _tok(spread: Spread) -> str:
    return f"{spread.median:.1f} ({spread.low:.1f}-{spread.high:.1f})"


def table(found: dict[str, ModeFigure], goal: float = GOAL) -> list[str]:
    """A Markdown table: per mode the median (min-max) of p50, p99 and tokens/s and of their ratios to alone, and
    the verdict on the median p99 ratio with the spread beside it."""
    said = verdicts(found, goal)
    lines = ["| mode | runs | p50 | p99 | tokens/s | p50 / alone | p99 / alone | tokens/s / alone | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode, fig in found.items():
        a = fig.absolute
        r = {m: fig.ratio[m].ratio_text() if m in fig.ratio else "-" for m in METRICS}
        if mode == BASELINE:
            r = dict.fromkeys(METRICS, "1.00x")
            note = "ceiling"
        elif mode == "enforcing" and "goal" in said:
            note = f"p99 <= {goal:.2f}x: {said['goal']}" + (
                f"; below none: {said['below none']}" if "below none" in said else "")
        else:
            note = "-"
        lines.append(f"| {mode} | {a['p99'].count} | {_ms(a['p50'])} | {_ms(a['p99'])} | {_tok(a['tok_s'])} | "
                     f"{r['p50']} | {r['p99']} | {r['tok_s']} | {note} |")
    return lines
