"""tests/e2e/run.sh (make kind-test) driven end to end against fake docker, kind, kubectl and helm that record
their calls: what it runs, in which order, and how the image reaches the nodes. Not a ``kind`` test: it needs no
cluster, so it runs everywhere; its last step is pytest's collection of the kind tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

FAKE = '''#!{python}
import json, os, sys
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
record = {{"tool": tool, "args": args}}
def out(text):
    print(text)
if tool == "docker":
    if args[:1] == ["version"]:
        out(os.environ["FAKE_API"])
    elif args[:1] == ["save"]:
        path = args[args.index("--output") + 1]
        platform = args[args.index("--platform") + 1] if "--platform" in args else "?"
        with open(path, "w") as f:
            f.write("archive of " + args[-1] + " for " + platform)
elif tool == "kind":
    if args[:2] == ["load", "image-archive"]:
        path = args[2]
        record["archive"] = open(path).read() if os.path.isfile(path) else None
    elif args[:2] == ["get", "clusters"]:
        out("")
elif tool == "helm":  # by now the image archive must be gone (the trap at exit would remove it anyway)
    calls = [json.loads(line) for line in open(os.environ["FAKE_LOG"])]
    saved = [c["args"][c["args"].index("--output") + 1] for c in calls
             if c["tool"] == "docker" and c["args"][:1] == ["save"]]
    record["archives_left"] = [path for path in saved if os.path.exists(path)]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
'''


def run_lane(tmp_path: Path, api: str) -> list[dict[str, object]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("docker", "kind", "kubectl", "helm"):
        path = bin_dir / tool
        path.write_text(FAKE.format(python=sys.executable))
        path.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log), "FAKE_API": api,
           "HELM": str(bin_dir / "helm"), "PYTHON": sys.executable, "KIND_CLUSTER_NAME": "lane-test",
           "PYTEST_ARGS": "--collect-only -q -p no:randomly"}
    result = subprocess.run(["bash", str(REPO / "tests" / "e2e" / "run.sh")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "kind-test: passed" in result.stdout
    return [json.loads(line) for line in log.read_text().splitlines()]


def commands(calls: list[dict[str, object]]) -> list[str]:
    return [f"{c['tool']} {' '.join(c['args'])}" for c in calls]  # type: ignore[arg-type]


@pytest.mark.parametrize(("api", "platform"), [("1.52", "linux/amd64"), ("1.47", "?")])
def test_the_lane_loads_a_single_platform_archive_through_a_file(tmp_path: Path, api: str, platform: str) -> None:
    calls = run_lane(tmp_path, api)
    lines = commands(calls)
    assert not [line for line in lines if line.startswith("kind load docker-image")], lines
    saves = [c for c in calls if c["tool"] == "docker" and c["args"][:1] == ["save"]]  # type: ignore[index]
    loads = [c for c in calls if c["tool"] == "kind" and c["args"][:2] == ["load", "image-archive"]]  # type: ignore[index]
    assert len(saves) == len(loads) == 1, lines
    save_args: list[str] = saves[0]["args"]  # type: ignore[assignment]
    assert ("--platform" in save_args) == (platform != "?"), save_args
    if platform != "?":
        assert save_args[save_args.index("--platform") + 1] == "linux/amd64"
    archive = save_args[save_args.index("--output") + 1]
    load_args: list[str] = loads[0]["args"]  # type: ignore[assignment]
    assert load_args == ["load", "image-archive", archive, "--name", "lane-test"]
    assert archive != "/dev/stdin" and loads[0]["archive"] == f"archive of s390x-topology-agent:e2e for {platform}"
    order = [i for i, line in enumerate(lines) if line.startswith(("docker build", "docker save", "kind load",
                                                                    "helm upgrade"))]
    assert [lines[i].split()[:2] for i in order] == [["docker", "build"], ["docker", "save"], ["kind", "load"],
                                                     ["helm", "upgrade"]]
    helm = [c for c in calls if c["tool"] == "helm" and c["args"][:1] == ["upgrade"]]  # type: ignore[index]
    assert helm and helm[0]["archives_left"] == [], "the archive is removed right after loading"
    assert lines[-1] == "kind delete cluster --name lane-test", "a cluster the lane created is deleted"
