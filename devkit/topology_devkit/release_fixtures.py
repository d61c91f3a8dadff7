"""The files a recorded release writes on a node, made by that release's own code, as test fixtures.

``python -m topology_devkit.release_fixtures 0.1.0`` unpacks the release's commit (releases.json, ``git archive``) in a
temporary folder and runs :data:`SCRIPT` there, on its own package, its kubelet emulator and its tests' helpers: a
device-plugin agent allocates a book (its state directory, the Allocate annotations kubelet hands the runtime, the
Node annotation), then a DRA agent prepares a claim (the checkpoint and the CDI file); the chart's Chart.yaml and
values.yaml beside them. The result goes to ``tests/fixtures/release-<version>/``, which
tests/integration/test_state_versions.py and tests/deploy/chart/test_upgrade_values.py read with today's code.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"

# Runs with the release's checkout first on sys.path: every name below is the release's.
SCRIPT = r'''
import json, shutil, sys, time
from pathlib import Path
from _pytest.monkeypatch import MonkeyPatch
import agent
import agent.app.dra as dra
from agent.app.build import build_agent
from agent.node.labels import node_annotations
from agent.topology.embedded import load_embedded
from tests.conftest import BOOK, SOCKET
from tests.plugin_harness import short_tmpdir
from tests.test_mode_holds import ClaimsApi, claim, config, preparer_of, started
from topology_devkit.kubelet_emulator import Container, KubeletEmulator

out = Path(sys.argv[1])
assert Path(agent.__file__).resolve().is_relative_to(Path.cwd().resolve()), agent.__file__
topology = load_embedded("z16-lpar")

def keep(k, name):
    shutil.copytree(k.device_plugin_dir / "s390x-topology-agent", out / name / "s390x-topology-agent")
    if (k.root / "cdi").exists():
        shutil.copytree(k.root / "cdi", out / name / "cdi")

def write(name, data):
    (out / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

with KubeletEmulator(short_tmpdir()) as k:
    with started(build_agent(topology, config(k))) as a:
        k.wait_registered(BOOK)
        k.wait_registered(SOCKET)
        pod = k.admit_pod("ns", "llm", [Container("main", {BOOK: 1})])
        book = pod.devices("main", BOOK)[0]
        holds = k.device_plugin_dir / "s390x-topology-agent" / "topology" / "holds.json"
        deadline = time.monotonic() + 30
        while not (holds.exists() and book in holds.read_text()):
            assert time.monotonic() < deadline, "the hold was never saved"
            time.sleep(0.05)
        write("allocate-annotations.json", {"device": book, "annotations": pod.annotations("main")})
        write("node-annotation.json", node_annotations(topology, a.grouping))
    keep(k, "deviceplugin")

patch = MonkeyPatch()
api = ClaimsApi()
patch.setattr(dra, "dra_api", lambda: api)
with KubeletEmulator(short_tmpdir()) as k:
    a = build_agent(topology, config(k, mode="dra"))
    preparer_of(a).prepare(*api.add(claim("6f1c2d3e-0000-4000-8000-000000000001", "drawer0-book1",
                                          name="llm-book", namespace="ns")))
    keep(k, "dra")
patch.undo()

(out / "chart").mkdir()
for name in ("Chart.yaml", "values.yaml"):
    shutil.copy(Path("deploy/helm/s390x-topology-agent") / name, out / "chart" / name)
'''


def generate(version: str, out: Path) -> str:
    """Make the fixtures of ``version`` into ``out`` (replaced); the line to print."""
    releases = json.loads((REPO / "releases.json").read_text())["releases"]
    commit = next((r["commit"] for r in releases if r["version"] == version), None)
    if commit is None:
        raise SystemExit(f"release_fixtures: releases.json has no {version}")
    with tempfile.TemporaryDirectory(prefix=f"rel-{version}-") as tmp:
        checkout, made = Path(tmp) / "checkout", Path(tmp) / "made"
        checkout.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, timeout=120,
                                 check=True).stdout  # the release's tree, without touching the repository
        subprocess.run(["tar", "-x", "-C", str(checkout)], input=archive, timeout=120, check=True)
        made.mkdir()
        env = {**os.environ, "PYTHONPATH": f"{checkout}{os.pathsep}{checkout / 'devkit'}"}
        subprocess.run([sys.executable, "-c", SCRIPT, str(made)], cwd=checkout, env=env, timeout=300, check=True)
        (made / "MANIFEST.json").write_text(json.dumps(
            {"release": version, "commit": commit, "made by": f"python -m topology_devkit.release_fixtures {version}",
             "shape": "z16-lpar", "levels": ["book", "socket"]}, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(made, out)
    return f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out} from {version} ({commit[:12]})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topology_devkit.release_fixtures")
    parser.add_argument("version")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    print(generate(args.version, args.out or FIXTURES / f"release-{args.version}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
