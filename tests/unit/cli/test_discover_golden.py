"""What ``discover``, ``explain`` and ``snapshot`` print, held to readable files in ``golden/`` beside this file:
the table and the JSON people and scripts read, on the bundled shapes and the generated ``z17-382``, with the flags
that change what is printed (levels, --uniform-groups, reserved CPUs and polarizations, DRA mode, a guest without
topology).

A change meant to alter the output rewrites the files and says why in its commit:
``python tests/unit/cli/test_discover_golden.py --write``; ``git diff tests/unit/cli/golden`` then shows what
changed.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:  # run as a script (--write)
    sys.path.insert(0, str(REPO))

from bench.lib.shapes import Z17_382  # noqa: E402
from topology_devkit.synthetic import SHAPES, build_topology  # noqa: E402
from topology_devkit.sysfs_writer import write_sysfs_tree  # noqa: E402

GOLDEN = Path(__file__).resolve().with_name("golden")
NODE = "golden-node"  # NODE_NAME for --mode dra
TREE = "<tree>"  # a generated host-root tree, named by its shape: <tree>/z17-382

# case -> the command line (a bundled snapshot, or a tree written from a shape)
CASES: dict[str, tuple[str, ...]] = {
    "z16-lpar.discover-table": ("discover", "--topology-file", "embedded:z16-lpar"),
    "z16-lpar.discover-json": ("discover", "--format", "json", "--topology-file", "embedded:z16-lpar"),
    "z16-lpar.discover-dra-json": ("discover", "--format", "json", "--mode", "dra", "--resource-prefix",
                                   "example.com", "--topology-file", "embedded:z16-lpar"),
    "z15-lpar.discover-levels-json": ("discover", "--format", "json", "--levels", "drawer,book,socket",
                                      "--min-group-cores", "0", "--topology-file", "embedded:z15-lpar"),
    "z16-vertical.discover-reserved-json": ("discover", "--format", "json", "--reserved-cpus", "0-3,9",
                                            "--exclude-polarization", "vertical:low", "--topology-file",
                                            "embedded:z16-vertical"),
    "z16-guest-no-topology.discover-json": ("discover", "--format", "json", "--topology-file",
                                            "embedded:z16-guest-no-topology"),
    "pr40714.discover-uniform-json": ("discover", "--format=json", "--uniform-groups", "--levels", "book,socket",
                                      "--topology-file", "embedded:pr40714"),
    "pr40714.discover-dra-table": ("discover", "--mode", "dra", "--levels", "socket", "--topology-file",
                                   "embedded:pr40714"),
    "pr40714.explain": ("explain", "--topology-file", "embedded:pr40714"),
    "pr40714.snapshot": ("snapshot", "--host-root", f"{TREE}/pr40714"),
    "z17-382.discover-table": ("discover", "--host-root", f"{TREE}/z17-382"),
}
TREES = {"pr40714": SHAPES["pr40714"], Z17_382.name: Z17_382}


def run(argv: tuple[str, ...], trees: Path) -> str:
    """What the command prints (standard output, then ``exit N`` when not 0), in a clean environment."""
    from agent.cli import main

    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("TOPOLOGY_AGENT_")]:
        del os.environ[key]
    os.environ["NODE_NAME"] = NODE
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main([a.replace(TREE, str(trees)) for a in argv])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return out.getvalue() + (f"exit {code}\n" if code else "")


def write_trees(target: Path) -> Path:
    for name, shape in TREES.items():
        write_sysfs_tree(build_topology(shape), target / name)
    return target


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trees(tmp_path_factory.mktemp("golden-trees"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_output_is_the_recorded_one(case: str, trees: Path) -> None:
    want = (GOLDEN / f"{case}.txt").read_text(encoding="utf-8")
    assert run(CASES[case], trees) == want


def test_every_recorded_file_is_a_case() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == sorted(CASES)


def write() -> None:
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        trees = write_trees(Path(tmp))
        for case, argv in CASES.items():
            (GOLDEN / f"{case}.txt").write_text(run(argv, trees), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/unit/cli/test_discover_golden.py --write")
    write()
