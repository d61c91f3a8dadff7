"""Every bench, one after another, each in a process of its own (no state carried from one to the next), then
ONE table: every row with its target and verdict, and the raw numbers as JSON.

    .venv/bin/python bench/run_all.py [--quick] [--only NAME ...] [--json FILE]
    make bench [QUICK=1]

Each bench's own output streams through as it runs; the JSON (every row's raw numbers, each bench's
duration and the machine's load before and after it) is printed before the table and written to
``build/bench-results/`` (or FILE). The exit status is 1 when a bench is broken (a BROKEN row, or a bench
that died), never for a missed target.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.common import BROKEN, ROOT, Row, busy_cores_since, format_table, loadavg, machine_line

# Cheap and pure first; the long idle window and the containerd benches last. Each is bench/GROUP/NAME.py; --only
# takes the NAMEs. Not here: cluster/vllm_beside_hog.py and cluster/agents_per_apiserver.py (run by hand, README).
BENCHES = ("node/placement", "node/cpus_per_node", "node/discovery", "node/startup", "node/preference", "node/allocate",
           "node/faults", "node/idle", "node/memory_by_mode", "runtime/cri_enforcement", "runtime/nri_enforcement",
           "cluster/pod_start", "cluster/dra")
BY_NAME = {path.rpartition("/")[2]: path for path in BENCHES}


def run_one(path: str, quick: bool, tmp: Path) -> dict[str, Any]:
    name = path.rpartition("/")[2]
    out = tmp / f"{name}.json"
    command = [sys.executable, str(ROOT / "bench" / f"{path}.py"), "--json-out", str(out)]
    if quick:
        command.append("--quick")
    print(f"\n##### bench/{path}.py{' --quick' if quick else ''}", flush=True)
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, check=False)
    if out.is_file():
        result: dict[str, Any] = json.loads(out.read_text())
        return result
    row = Row(name, "whole bench", "-", None, "-", BROKEN, f"exited {done.returncode} without results")
    return {"bench": name, "quick": quick, "seconds": time.monotonic() - started, "rows": [row.__dict__]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="every bench's short smoke run (about 2 minutes)")
    parser.add_argument("--only", nargs="+", choices=list(BY_NAME), help="run these benches only")
    parser.add_argument("--json", type=Path, help="where to write the raw numbers (default build/bench-results/)")
    args = parser.parse_args(argv)
    paths = [BY_NAME[n] for n in BY_NAME if not args.only or n in args.only]
    started = time.monotonic()
    load_before = loadavg()
    counter, _ = busy_cores_since()
    with tempfile.TemporaryDirectory(prefix="bench-all-") as tmp:
        results = [run_one(path, args.quick, Path(tmp)) for path in paths]
    _, busy = busy_cores_since(counter)
    load_after = loadavg()
    took = time.monotonic() - started
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    dump = {"when": stamp, "quick": args.quick, "machine": machine_line(), "seconds": took,
            "load_before": load_before, "load_after": load_after, "busy_cores": busy, "benches": results}
    name = f"{stamp.replace(':', '')}{'-quick' if args.quick else ''}.json"
    target = args.json or ROOT / "build" / "bench-results" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(dump, indent=1) + "\n")
    rows = [Row(**row) for result in results for row in result["rows"]]
    print("\n##### raw numbers (JSON; also in " + str(target.relative_to(ROOT) if target.is_relative_to(ROOT)
                                                   else target) + ")")
    print(json.dumps(dump))
    print(f"\n##### make bench{' QUICK=1' if args.quick else ''}: {stamp}, {took / 60:.1f} min; {machine_line()}; "
          f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}; machine busy {busy:.2f} cores on average "
          f"(the benches included)")
    for result in results:
        print(f"  {result['bench']}: {result.get('seconds', 0):.0f} s, load {result.get('load_before', ['?'])[0]}"
              f" -> {result.get('load_after', ['?'])[0]}, busy {result.get('busy_cores', float('nan')):.2f} cores")
    print()
    print(format_table(rows))
    return 1 if any(r.verdict == BROKEN for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
