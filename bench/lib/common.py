"""What every bench shares: a result row, the one table, the command line and small measuring helpers.

A bench module has ``run(quick: bool) -> list[Row]`` and ``main()``; ``main`` is :func:`bench_main`, which
parses ``--quick`` (and ``--json-out FILE``, used by ``bench/run_all.py``), prints the machine's load
before and after, and prints the rows as one table. Timings are never asserted: the exit status is 1
only when the thing under test is broken (a wrong answer, an agent that never registers): a
:class:`BenchError`, shown as a ``BROKEN`` row.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MET, MISSED, INFO, SKIPPED, BROKEN = "met", "MISSED", "info", "skipped", "BROKEN"
VERDICTS = (MET, MISSED, INFO, SKIPPED, BROKEN)


class BenchError(Exception):
    """The thing under test is broken (a wrong answer, never registers, a server that does not start)."""


@dataclass
class Row:
    """One line of the table: what was measured, the number the verdict is about, the target."""

    bench: str  # the script, e.g. "allocate"
    name: str  # what the row measures
    measured: str  # the measurement as text (with its reference and spread)
    value: float | None  # the number the verdict compares (None: nothing to compare)
    target: str  # e.g. "p50 ratio <= 1.3"; "" for info rows
    verdict: str  # met / MISSED / info / skipped / BROKEN
    reason: str = ""  # why skipped or broken; a note otherwise
    raw: dict[str, Any] = field(default_factory=dict)  # the raw numbers, for the JSON dump

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")


def at_most(value: float, limit: float) -> str:
    return MET if value <= limit else MISSED


def quiet_emulator() -> None:
    """The kubelet emulator's own log lines (e.g. a stream ending when an agent stops) stay out of the output."""
    import logging

    from topology_devkit.kubelet_emulator.constants import LOGGER_NAME

    emulator_log = logging.getLogger(LOGGER_NAME)
    emulator_log.addHandler(logging.NullHandler())
    emulator_log.propagate = False


def skipped(bench: str, name: str, target: str, reason: str) -> Row:
    return Row(bench, name, "-", None, target, SKIPPED, reason)


# --------------------------------------------------------------------------- numbers

def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def median(values: Iterable[float]) -> float:
    items = list(values)
    return statistics.median(items) if items else math.nan


def spread(ratios: Sequence[float]) -> str:
    """``min-median-max`` of a few ratios (the noise of one row)."""
    if not ratios:
        return "-"
    return f"{min(ratios):.2f}/{median(ratios):.2f}/{max(ratios):.2f}"


def fmt_time(seconds: float) -> str:
    if math.isnan(seconds):
        return "nan"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def loadavg() -> tuple[float, float, float]:
    with open("/proc/loadavg", encoding="ascii") as f:
        one, five, fifteen = f.read().split()[:3]
    return float(one), float(five), float(fifteen)


def busy_cores_since(before: tuple[int, int] | None = None) -> tuple[tuple[int, int], float]:
    """The machine's busy share (in cores) since ``before`` (a previous return's first item), from
    ``/proc/stat``: how much else was running. Returns (counter, cores)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])
    now = (total - idle, total)
    if before is None or now[1] == before[1]:
        return now, math.nan
    cores = os.cpu_count() or 1
    return now, cores * (now[0] - before[0]) / (now[1] - before[1])


# --------------------------------------------------------------------------- processes

def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL after 10 s: only the process the bench started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def run_timed(command: Sequence[str], **kwargs: Any) -> float:
    """Wall seconds from spawning ``command`` to its exit (output discarded); BenchError on failure."""
    started = time.perf_counter()
    done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          check=False, **kwargs)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise BenchError(f"{' '.join(command[:3])}... exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return took


# --------------------------------------------------------------------------- the table

COLUMNS = ("bench", "row", "measured", "target", "verdict")


def format_table(rows: Sequence[Row]) -> str:
    cells = [(r.bench, r.name, r.measured, r.target or "-",
              r.verdict + (f": {r.reason}" if r.reason and r.verdict in (SKIPPED, BROKEN) else ""))
             for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(COLUMNS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(COLUMNS, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for c in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
    notes = [f"  {r.bench}/{r.name}: {r.reason}" for r in rows if r.reason and r.verdict not in (SKIPPED, BROKEN)]
    if notes:
        lines += ["", "notes:", *notes]
    counts = {v: sum(1 for r in rows if r.verdict == v) for v in VERDICTS}
    lines += ["", "verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)]
    return "\n".join(lines)


def machine_line() -> str:
    import grpc

    return (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"grpcio {grpc.__version__}")


def rows_to_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


def bench_main(name: str, run: Callable[[bool], list[Row]], doc: str | None,
               argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(doc or name).strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--json-out", type=Path, help="also write the rows as JSON here (bench/run_all.py)")
    args = parser.parse_args(argv)
    quiet_emulator()
    load_before = loadavg()
    counter, _ = busy_cores_since()
    started = time.monotonic()
    try:
        rows = run(args.quick)
    except BenchError as exc:
        rows = [Row(name, "whole bench", "-", None, "-", BROKEN, str(exc))]
    _, busy = busy_cores_since(counter)
    took = time.monotonic() - started
    load_after = loadavg()
    print(f"\n== {name}{' --quick' if args.quick else ''}: {took:.0f} s; {machine_line()}; load average "
          f"{load_before[0]:.2f} -> {load_after[0]:.2f}; machine busy {busy:.2f} cores on average (this bench "
          f"included)")
    print(format_table(rows))
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({
            "bench": name, "quick": args.quick, "seconds": took, "load_before": load_before,
            "load_after": load_after, "busy_cores": busy, "rows": rows_to_json(rows)}, indent=1))
    return 1 if any(r.verdict == BROKEN for r in rows) else 0
