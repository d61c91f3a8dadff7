"""``discover``, ``explain`` and ``snapshot`` print exactly what they printed before issue 23's start-up work
(commit 1159e2e: argparse for every flag, dataclasses for the model, ``json.dumps``), byte for byte, on every
bundled shape (as a sysfs tree, as ``embedded:NAME`` and through lscpu), the generated ``z17-382`` and the real
dumps under ../shared/fixtures, with the flags that change what is printed.

``tests/golden/discover-sha256.json`` holds the SHA-256 of each case's output as the code of commit 1159e2e
printed it (2.3 MB of text: the digests stand for it). To see a difference, write the outputs of both versions
and diff them: ``python tests/test_discover_golden.py --write DIR`` writes ``DIR/<case>.out`` and
``DIR/digests.json`` (run it in a worktree of 1159e2e for the old ones). A change meant to alter the output
replaces the digest file with the new ``digests.json`` and says why in its commit. The lscpu cases count only
with the util-linux version the digests were made with (lscpu's output is its own).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script (--write)
    sys.path.insert(0, str(REPO))

from bench.shapes import Z17_382  # noqa: E402
from tests.conftest import REAL_DUMPS, REAL_FIXTURES, missing  # noqa: E402
from topology_devkit.synthetic import SHAPES, build_topology  # noqa: E402
from topology_devkit.sysfs_writer import write_sysfs_tree  # noqa: E402

GOLDEN = REPO / "tests" / "golden" / "discover-sha256.json"
NODE = "golden-node"  # NODE_NAME for --mode dra
TREES = {**{name: shape for name, shape in SHAPES.items()}, Z17_382.name: Z17_382}

# Flag sets run on every source: each case's name is <source>.<variant>.
VARIANTS: dict[str, tuple[str, ...]] = {
    "json": ("discover", "--format", "json"),
    "table": ("discover",),
    "levels-json": ("discover", "--format", "json", "--levels", "drawer,book,socket", "--min-group-cores", "0"),
    "uniform-json": ("discover", "--format=json", "--uniform-groups", "--levels", "book,socket"),
    "reserved-json": ("discover", "--format", "json", "--reserved-cpus", "0-3,9", "--exclude-polarization",
                      "vertical:low", "--no-allow-non-s390x"),
    "dra-json": ("discover", "--format", "json", "--mode", "dra", "--resource-prefix", "example.com"),
    "dra-table": ("discover", "--mode", "dra", "--levels", "socket"),
    "explain": ("explain",),
    "snapshot": ("snapshot",),
}
# Run on the z16-400 tree only: what the environment twins and argparse's other spellings do.
EXTRA: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "env-json": (("discover", "--format", "json"), {"TOPOLOGY_AGENT_LEVELS": "book,socket",
                                                  "TOPOLOGY_AGENT_UNIFORM_GROUPS": "true",
                                                  "TOPOLOGY_AGENT_RESERVED_CPUS": "4-7"}),
    "env-flag-wins-json": (("discover", "--format", "json", "--levels", "drawer", "--no-uniform-groups"),
                           {"TOPOLOGY_AGENT_LEVELS": "book", "TOPOLOGY_AGENT_UNIFORM_GROUPS": "true"}),
    "abbreviated-json": (("discover", "--form", "json", "--lev", "socket", "--min-group", "2"), {}),
    "repeated-json": (("discover", "--format", "table", "--format", "json", "--levels=book", "--levels", "socket"),
                      {}),
    "sources-json": (("discover", "--format", "json", "--source", "sysfs", "--cpuset-enforcement", "none",
                      "--nri-socket", "/nonexistent/nri.sock", "--cri-socket", ""), {}),
}


def _sources(tmp: Path) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(source name, the flags that read it): trees of every shape, the embedded snapshots, the real dumps."""
    from agent.topology.embedded import embedded_snapshot_names

    for name, shape in TREES.items():
        tree = tmp / name
        if not tree.is_dir():
            write_sysfs_tree(build_topology(shape), tree)
        yield f"tree-{name}", ("--host-root", str(tree), "--proc-root", str(tree / "proc"))
    for name in embedded_snapshot_names():
        yield f"embedded-{name}", ("--topology-file", f"embedded:{name}")
    if REAL_FIXTURES.is_dir():
        for name, (_, root) in REAL_DUMPS.items():
            yield f"real-{name}", ("--host-root", str(REAL_FIXTURES / root))


def cases(tmp: Path) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    for source, flags in _sources(tmp):
        for variant, argv in VARIANTS.items():
            yield f"{source}.{variant}", [*argv, *flags], {}
    tree = tmp / "z16-400"
    for name, (argv, env) in EXTRA.items():
        yield f"tree-z16-400.{name}", [*argv, "--host-root", str(tree), "--proc-root", str(tree / "proc")], env
    if lscpu_version() is not None:  # util-linux reads the tree itself: lscpu's view, parsed by the agent
        for name in ("z16-400", "z17-382", "z16-lpar", "pr40714"):
            tree = tmp / name
            yield f"lscpu-{name}.json", ["discover", "--format", "json", "--source", "lscpu", "--host-root",
                                         str(tree)], {}


def lscpu_version() -> str | None:
    lscpu = shutil.which("lscpu")
    if lscpu is None:
        return None
    done = subprocess.run([lscpu, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def run(argv: list[str], env: dict[str, str], tmp: Path) -> str:
    """What the command prints (standard output, then ``exit N`` when not 0), paths made relative to ``tmp``."""
    from agent.cli import main

    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("TOPOLOGY_AGENT_")]:
        del os.environ[key]
    os.environ.update(env, NODE_NAME=NODE)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    text = out.getvalue() + (f"exit {code}\n" if code else "")
    return text.replace(str(REAL_FIXTURES), "<fixtures>").replace(str(tmp), "<tmp>")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("golden")


@pytest.fixture(scope="module")
def golden() -> dict[str, str]:
    if not REAL_FIXTURES.is_dir():
        missing(f"real s390x dumps at {REAL_FIXTURES}", "they live in ../shared/fixtures, or set S390X_FIXTURES")
    recorded = json.loads(GOLDEN.read_text(encoding="utf-8"))
    want: dict[str, str] = recorded["cases"]
    if lscpu_version() != recorded["lscpu"]:  # another util-linux: its lscpu cases are not ours to compare
        want = {name: d for name, d in want.items() if not name.startswith("lscpu-")}
    return want


def test_every_case_prints_what_it_printed_before(trees: Path, golden: dict[str, str]) -> None:
    wrong, seen = [], set()
    for name, argv, env in cases(trees):
        if name not in golden and name.startswith("lscpu-"):
            continue
        seen.add(name)
        got = run(argv, env, trees)
        if digest(got) != golden.get(name):
            wrong.append(f"{name}: {len(got)} characters, starting {got[:80]!r}")
    assert wrong == []
    assert set(golden) == seen  # no recorded case left unchecked


def write(target: Path) -> None:
    import tempfile

    target.mkdir(parents=True, exist_ok=True)
    digests = {}
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp_name:
        tmp = Path(tmp_name)
        for name, argv, env in cases(tmp):
            text = run(argv, env, tmp)
            (target / f"{name}.out").write_text(text, encoding="utf-8")
            digests[name] = digest(text)
    (target / "digests.json").write_text(json.dumps({"lscpu": lscpu_version(), "cases": digests}, indent=1,
                                                    sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"] or len(sys.argv) != 3:
        raise SystemExit("usage: python tests/test_discover_golden.py --write DIR")
    write(Path(sys.argv[2]))
