"""``discover`` with the defaults (device-plugin mode, --cpuset-enforcement none) imports only what it needs:
not the agent's configuration, the NRI probe (a socket), the cpuset planners or DRA mode. A fresh
interpreter checks it; how long discover takes is bench/bench_discovery.py's business."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.topology.embedded import load_embedded
from tests.support.env import REPO
from topology_devkit.sysfs_writer import write_sysfs_tree

NOT_NEEDED = ("agent.app.config", "agent.enforce.engine_choice", "agent.nri.probe", "agent.policy.creation_cpuset",
              "agent.policy.cpuset", "agent.policy.allocation", "agent.policy.resource_slices", "socket", "hashlib")


def _discover(tree: Path, *flags: str) -> dict[str, Any]:
    code = ("import contextlib, io, json, sys\n"
            "from agent.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            f"    rc = main(['discover', '--format', 'json', '--host-root', {str(tree)!r}, *{list(flags)!r}])\n"
            "print(json.dumps({'rc': rc, 'out': json.loads(out.getvalue()), 'modules': sorted(sys.modules)}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          cwd=REPO, env={"PATH": "/usr/bin:/bin"})
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_discover_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    write_sysfs_tree(load_embedded("z16-lpar"), tmp_path)
    result = _discover(tmp_path)
    assert result["rc"] == 0
    modules = set(result["modules"])
    assert not modules & set(NOT_NEEDED), sorted(modules & set(NOT_NEEDED))
    out = result["out"]
    assert isinstance(out, dict)
    assert out["cpuset_enforcement"] == {"requested": "none", "mode": "none", "reason": "--cpuset-enforcement none"}
    assert "dra" not in out


def test_discover_with_auto_enforcement_still_looks_at_the_node(tmp_path: Path) -> None:
    write_sysfs_tree(load_embedded("z16-lpar"), tmp_path)
    result = _discover(tmp_path, "--cpuset-enforcement", "auto", "--nri-socket", str(tmp_path / "no-nri.sock"),
                       "--cri-socket", str(tmp_path / "no-cri.sock"))
    out = result["out"]
    assert isinstance(out, dict)
    assert out["cpuset_enforcement"] == {"requested": "auto", "mode": "none",
                                         "reason": "auto: neither an NRI socket answers nor a CRI socket exists"}
