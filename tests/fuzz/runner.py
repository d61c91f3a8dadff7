"""Run every door's fuzz target for a time budget: ``make fuzz`` (FUZZ_SECONDS each), .ci/run (a short fixed budget).

    python -m tests.fuzz.runner [--seconds N] [--only NAME ...] [--engine hypothesis|atheris|both] [--json FILE]

Each target runs in a process of its own, killed at its budget plus a margin (reported as a hang). The hypothesis
engine runs it in batches of fresh random examples until its seconds are spent, then shrinks a failure to a small
input; the atheris engine (coverage-guided, where atheris has a wheel for this Python) drives the same test through
hypothesis's ``fuzz_one_input``, and keeps its corpus in CORPUS/<target>. One line per target: door, inputs tried,
result; exit 1 when any target failed (its input printed, to be kept as a regression case in the unit tests).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings

from tests.fuzz.common import BOUND, SKIPPED, TARGETS, Target

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CORPUS = Path(os.environ.get("FUZZ_CORPUS") or Path.home() / ".cache" / "s390x-topology-agent" / "fuzz-corpus")
BATCH = 50  # examples per hypothesis run: the clock is looked at between runs (a helm call takes 0.1 s)
COUNT_FILE = "/tmp/fuzz-{name}.count"  # the atheris child's executed inputs, for the parent
ATHERIS = "atheris==2.3.0"  # pinned: it has a cp311 manylinux wheel (pip download --only-binary=:all:)


def load_targets() -> dict[str, Target]:
    for path in sorted(HERE.glob("fuzz_*.py")):
        importlib.import_module(f"tests.fuzz.{path.stem}")
    return TARGETS


# --- in the target's own process ------------------------------------------------------------------

def run_hypothesis(target: Target, seconds: float) -> dict[str, Any]:
    """Batches of BATCH fresh random examples (no seed: each batch draws anew) until ``seconds`` are spent."""
    deadline = time.monotonic() + seconds
    batch, failure = 0, ""
    test = settings(max_examples=BATCH, deadline=None, database=None, suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.generate, Phase.shrink])(target.test)
    while time.monotonic() < deadline:
        try:
            test()
        except Exception:
            failure = traceback.format_exc()
            break
        batch += 1
    return {"inputs": target.calls[0], "failure": failure}


def run_atheris(target: Target, seconds: float) -> None:
    atheris = importlib.import_module("atheris")  # not a dependency: installed by make fuzz where it has a wheel

    BOUND["on"] = False
    corpus = CORPUS / target.name
    corpus.mkdir(parents=True, exist_ok=True)
    test = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))(target.test)
    inner = test.hypothesis.fuzz_one_input  # type: ignore[attr-defined]
    # libFuzzer's run count includes buffers hypothesis discards before the target runs: count the target's calls,
    # written down as they go (libFuzzer ends the process with exit(), past any Python clean-up).
    count = os.open(COUNT_FILE.format(name=target.name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def fuzz_one(data: bytes) -> None:
        try:
            inner(data)
        finally:
            os.pwrite(count, f"{target.calls[0]:>12}".encode(), 0)

    # libFuzzer writes a failing input to the working directory (the checkout) unless told where: beside the corpus
    found = CORPUS / f"{target.name}-found"
    found.mkdir(parents=True, exist_ok=True)
    atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={int(seconds)}", "-timeout=10",
                   "-rss_limit_mb=3072", "-print_final_stats=1", f"-artifact_prefix={found}/"], fuzz_one)
    atheris.Fuzz()


def child(name: str, engine: str, seconds: float) -> int:
    if engine == "atheris":
        atheris = importlib.import_module("atheris")

        with atheris.instrument_imports(include=["agent"]):
            targets = load_targets()
        run_atheris(targets[name], seconds)
        return 0
    result = run_hypothesis(load_targets()[name], seconds)
    print(json.dumps(result))
    return 0


# --- the parent: one process per target ------------------------------------------------------------

def atheris_available() -> str | None:
    """None when atheris imports; else why not (one line)."""
    probe = subprocess.run([sys.executable, "-c", "import atheris"], capture_output=True, text=True, check=False)
    if probe.returncode == 0:
        return None
    return (f"atheris is not installed ({ATHERIS} has wheels for CPython 3.8-3.11 on x86_64 Linux only; "
            f"make fuzz installs it where pip finds one)")


def run_one(target: Target, engine: str, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tests.fuzz.runner", "--child", target.name, "--engine", engine,
           "--seconds", str(seconds)]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=seconds + 120, check=False)
    except subprocess.TimeoutExpired:
        return {"target": target.name, "door": target.door, "engine": engine, "inputs": None,
                "seconds": round(time.monotonic() - started, 1), "result": "HANG", "failure": "killed at the bound"}
    elapsed = round(time.monotonic() - started, 1)
    row: dict[str, Any] = {"target": target.name, "door": target.door, "engine": engine,
                              "seconds": elapsed}
    if engine == "atheris":
        try:
            inputs: int | None = int(Path(COUNT_FILE.format(name=target.name)).read_text())
        except (OSError, ValueError):
            inputs = None
        crashed = done.returncode != 0
        row |= {"inputs": inputs, "result": "FAIL" if crashed else "ok",
                "failure": done.stderr[-3000:] if crashed else "",
                "corpus": len(list((CORPUS / target.name).glob("*")))}
        return row
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return row | {"inputs": None, "result": "FAIL", "failure": (done.stdout + done.stderr)[-3000:]}
    return row | {"inputs": result["inputs"], "result": "FAIL" if result["failure"] else "ok",
                  "failure": result["failure"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per target and engine (default 60)")
    parser.add_argument("--only", nargs="*", default=[], metavar="NAME", help="targets or doors to run")
    parser.add_argument("--engine", choices=("hypothesis", "atheris", "both"), default="hypothesis")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.engine, args.seconds)
    targets = [t for t in load_targets().values() if not args.only or t.name in args.only or t.door in args.only]
    if args.list:
        for t in targets:
            print(f"{t.door:<16} {t.name}")
        return 0
    if not targets:
        print(f"no target named {' '.join(args.only)} (--list names them)", file=sys.stderr)
        return 2
    engines = ["hypothesis", "atheris"] if args.engine == "both" else [args.engine]
    if "atheris" in engines:
        why = atheris_available()
        if why is not None:
            print(f"fuzz: skipping the atheris engine: {why}", file=sys.stderr)
            engines.remove("atheris")
    rows = []
    for name, why in SKIPPED.items():
        print(f"fuzz: skipping {name}: {why}", file=sys.stderr)
    print(f"fuzz: {len(targets)} targets x {', '.join(engines) or 'no engine'}, {args.seconds:g} s each")
    for target in targets:
        for engine in engines:
            row = run_one(target, engine, args.seconds)
            rows.append(row)
            print(f"{row['door']:<16} {row['target']:<34} {engine:<10} {row['inputs']!s:>9} inputs "
                  f"{row['seconds']:>6} s  {row['result']}", flush=True)
            if row["result"] != "ok":
                print(str(row["failure"]), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    failed = [r for r in rows if r["result"] != "ok"]
    print(f"fuzz: {sum(int(r['inputs'] or 0) for r in rows)} inputs, {len(failed)} of {len(rows)} runs failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
