"""CRI-O's runc on these machines: the OCI spec's ``process.oomScoreAdj`` held at runc's own, then the real runc.

These VMs give no process CAP_SYS_RESOURCE, so nothing here can lower an ``oom_score_adj`` below its own. kubelet
asks -997 for a Guaranteed or node-critical pod's containers (``pkg/kubelet/qos/policy.go``), CRI-O writes it into
the spec as it is (``internal/factory/container/container.go``, ``SetProcessOOMScoreAdj``), and runc's init then
fails every such container ("failed to update /proc/self/oom_score_adj: Permission denied",
``libcontainer/nsenter/nsexec.c`` ``update_oom_score_adj``). containerd has ``restrict_oom_score_adj`` for this (the
containerd lane sets it: it raises a score below containerd's own to containerd's); CRI-O has no such setting. So the
lane's CRI-O runs runc through this: on ``create`` and ``run`` the bundle's ``config.json`` gets the same restriction
(a score below this process's own is raised to it), and every call goes on to the real runc unchanged
(``devkit/topology_devkit/realcluster/crio.py`` writes the small script CRI-O calls). Nothing else in the spec is
touched; a real node, where CRI-O runs with CAP_SYS_RESOURCE, needs none of this.

    python3 restrict_oom.py REAL_RUNC [runc's arguments...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

CREATING = frozenset({"create", "run"})
# runc's global options that take a value (runc v1.4 main.go), which come before the command.
GLOBAL_VALUES = frozenset({"--root", "--log", "--log-format", "--criu", "--rootless"})


def command_of(args: list[str]) -> str | None:
    """runc's command: the first argument that is neither a global option nor such an option's value."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in GLOBAL_VALUES:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def bundle_of(args: list[str]) -> Path | None:
    """The ``--bundle``/``-b`` folder of a runc create or run (the current folder when not given); None for any
    other command."""
    if command_of(args) not in CREATING:
        return None
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--bundle="):
            return Path(arg.split("=", 1)[1])
    return Path.cwd()


def restrict(spec: dict[str, object], own: int) -> bool:
    """Raise ``process.oomScoreAdj`` to ``own`` when it is below it; True when changed."""
    process = spec.get("process")
    if not isinstance(process, dict):
        return False
    score = process.get("oomScoreAdj")
    if not isinstance(score, int) or score >= own:
        return False
    process["oomScoreAdj"] = own
    return True


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: restrict_oom.py REAL_RUNC [runc arguments...]", file=sys.stderr)
        return 2
    real, args = argv[1], argv[2:]
    bundle = bundle_of(args)
    if bundle is not None:
        config = bundle / "config.json"
        spec = json.loads(config.read_text())
        if restrict(spec, int(Path("/proc/self/oom_score_adj").read_text())):
            tmp = config.with_name(config.name + ".restrict-oom")
            tmp.write_text(json.dumps(spec))
            os.chmod(tmp, config.stat().st_mode & 0o7777)
            os.replace(tmp, config)
    os.execv(real, [real, *args])
    return 127  # not reached


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
