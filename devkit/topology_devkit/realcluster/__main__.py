"""``python -m topology_devkit.realcluster up|down|status|restart-kubelet|crash|restart|confine|release`` (the
Makefile's cluster-* targets; ``crash`` and ``restart`` of kubelet or the runtime are the soak's faults,
bench/cluster/soak; ``confine CPUS`` and ``release``: the lane's host processes on reserved CPUs and back, confine.py;
``release-image VERSION``: a recorded release's image built from its commit, cached, imported; release_image.py).

``up`` starts the node with the runtime ``RUNTIME`` names (containerd, the default, or crio; ``--runtime`` wins) and
kubelet's root at ``KUBELET_ROOT`` (``/var/lib/kubelet`` by default); every other command acts on the cluster that is
up, whichever runtime and root it has."""

from __future__ import annotations

import argparse
import os
import sys

from . import confine
from .cluster import (
    crash_component,
    down,
    dump_json,
    failure_details,
    format_status,
    import_archives,
    import_images,
    import_vllm,
    restart_component,
    restart_kubelet,
    status,
    up,
)
from .images import ImageError
from .layout import RUNTIMES, Layout, requested_runtime
from .procs import ClusterError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="realcluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start the cluster (idempotent) and wait for the Node to be Ready")
    p_up.add_argument("--cpu-manager-policy", default="none", choices=["none", "static"])
    p_up.add_argument("--no-images", action="store_true", help="do not build or import the images")
    p_up.add_argument("--runtime", choices=RUNTIMES, default=None, help="the node's runtime (default: $RUNTIME, else "
                      "containerd)")
    p_up.add_argument("--skew", action="store_true", default=os.environ.get("SKEW") == "1",
                      help="with crio: the containerd set's control plane (Kubernetes 1.37) beside CRI-O's kubelet "
                           "1.34 (default: SKEW=1)")
    sub.add_parser("images", help="build the images (cached) and import them into the cluster's runtime")
    p_release = sub.add_parser("release-image", help="build a recorded release's image from its commit (cached by "
                               "commit) and import it; prints the image and the release's chart")
    p_release.add_argument("version")
    sub.add_parser("vllm-image", help="build the vLLM image (cached by its pins) and import it into the cluster's "
                   "runtime unless it is there")
    sub.add_parser("down", help="stop everything and remove its state (keeps logs)")
    p_status = sub.add_parser("status", help="each component's pid, version and health")
    p_status.add_argument("--json", action="store_true")
    p_restart = sub.add_parser("restart-kubelet", help="stop the kubelet and start it again")
    p_restart.add_argument("--cpu-manager-policy", choices=["none", "static"])
    p_crash = sub.add_parser("crash", help="SIGKILL kubelet or containerd (a crash) and start it again")
    p_crash.add_argument("component", choices=["kubelet", "runtime", *RUNTIMES])
    p_restart_one = sub.add_parser("restart", help="stop kubelet or the runtime (SIGTERM) and start it again")
    p_restart_one.add_argument("component", choices=["kubelet", "runtime", *RUNTIMES])
    p_confine = sub.add_parser("confine", help="the lane's host processes (control plane, runtime, kubelet, shims) "
                               "onto CPUS, as reservedSystemCPUs keeps a node's daemons; release undoes it")
    p_confine.add_argument("cpus", metavar="CPUS", help="a cpulist, e.g. 0")
    p_confine.add_argument("--whole-host", action="store_true",
                           help="every user-space process of the host, as OpenShift's performance profile keeps them")
    sub.add_parser("release", help="the confined processes back on every CPU")
    args = parser.parse_args(argv)
    layout = Layout.from_env()
    try:
        requested_runtime()
        layout.kubelet_root()
    except ValueError as err:
        print(f"{args.command}: {err}", file=sys.stderr)
        return 2
    try:
        if args.command == "up":
            try:
                up(layout, args.cpu_manager_policy, images=not args.no_images, runtime=args.runtime or None,
                   skew=args.skew)
            except ClusterError:
                print(failure_details(layout), file=sys.stderr)
                raise
        elif args.command == "images":
            import_images(layout)
        elif args.command == "release-image":
            from .release_image import build

            release = build(args.version)
            import_archives(layout, [(release.image, release.archive)])
            print(f"{release.image}\t{release.chart}")
        elif args.command == "vllm-image":
            print(f"vllm-image: {import_vllm(layout)} in the cluster's {layout.runtime()}")
        elif args.command == "down":
            down(layout)
            print(f"cluster-down: stopped; logs kept in {layout.logs}")
        elif args.command == "status":
            rows = status(layout)
            print(dump_json(rows) if args.json else format_status(rows))
            return 0 if all(r["health"] == "ok" for r in rows) else 1
        elif args.command == "restart-kubelet":
            seconds = restart_kubelet(layout, args.cpu_manager_policy)
            print(f"cluster-restart-kubelet: kubelet healthy again after {seconds:.1f} s")
        elif args.command == "confine":
            pids = confine.host_pids() if args.whole_host else confine.lane_pids(layout)
            moved = confine.confine(args.cpus, pids)
            print(f"confine: {len(moved)} processes of the {'host' if args.whole_host else 'lane'} on CPUs {args.cpus}")
        elif args.command == "release":
            print(f"release: {confine.release()} processes back on every CPU")
        elif args.command in ("crash", "restart"):
            how = crash_component if args.command == "crash" else restart_component
            seconds = how(layout, args.component)
            print(f"{args.command}: {args.component} healthy again after {seconds:.1f} s")
    except ClusterError as err:
        print(f"{args.command}: {err}", file=sys.stderr)
        return 1
    except ImageError as err:
        print(f"{args.command}: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a host state the lane did not expect: one line, never a traceback
        print(f"{args.command}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
