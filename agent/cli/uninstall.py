"""``topology-agent uninstall``: the chart's pre-delete hook."""

from __future__ import annotations

import argparse
import os

from agent.cli.settings import seconds
from agent.errors import NodeLabelerError, StartupError, UsageError

HELP = "the chart's pre-delete hook: stop every agent so it cleans its node up, then remove leftover node labels"


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--daemonset", required=True, metavar="NAME", help="the agent's DaemonSet")
    p.add_argument("--namespace", default="", metavar="NAMESPACE", help="its namespace (default: POD_NAMESPACE)")
    p.add_argument("--node-selector", default="", metavar="K=V,...",
                   help="the DaemonSet's node selector: the nodes whose leftover labels are removed (default: all)")
    p.add_argument("--timeout", default="120", metavar="SECONDS",
                   help="how long to wait for the agents to stop and clean up (default: 120)")


def run(args: argparse.Namespace) -> int:
    """The chart's pre-delete hook: delete the DaemonSet in the foreground, wait, remove leftover node labels."""
    from agent.node.cleanup import run_uninstall_hook
    from agent.node.kubeapi import LeanKubeApi
    from agent.policy.teardown import parse_label_selector

    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or ""
    if not namespace:
        raise UsageError("--namespace: not given and POD_NAMESPACE is not set")
    try:
        selector = parse_label_selector(args.node_selector)
    except ValueError as exc:
        raise UsageError(f"--node-selector: {exc}") from None
    timeout = seconds("--timeout", args.timeout)
    try:
        api = LeanKubeApi.in_cluster()
    except NodeLabelerError as exc:
        raise StartupError(f"uninstall runs in a pod of the cluster: {exc}") from None
    return run_uninstall_hook(api, namespace=namespace, daemonset=args.daemonset, node_selector=selector,
                              timeout=timeout, say=lambda line: print(line, flush=True))
