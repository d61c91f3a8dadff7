"""``topology-agent demo``: the agent on a bundled z16-shaped snapshot against an emulated kubelet (the
development kit's, found through an entry point)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from agent.cli.flags import add_allocation_flags, add_policy_flags, add_topology_flags
from agent.cli.settings import allocation_settings, grouping_settings, topology_from
from agent.errors import UsageError

HELP = "run the agent on a bundled z16-shaped snapshot against an emulated kubelet"


def add_flags(p: argparse.ArgumentParser) -> None:
    add_topology_flags(p)
    add_policy_flags(p)
    add_allocation_flags(p)


def run(args: argparse.Namespace) -> int:
    from importlib.metadata import entry_points

    found = entry_points(group="topology_agent.demo", name="demo")
    if not found:
        raise UsageError("the demo is part of the development kit, which is not installed here: run `make demo`, "
                         "or pip install ./devkit")
    from agent.observe.logs import setup_logging

    setup_logging("warning", "text")
    if not args.topology_file and args.host_root == "/":
        args.topology_file = "embedded:z16-lpar"
    run_demo: Callable[..., int] = next(iter(found)).load()
    return run_demo(topology_from(args), grouping_settings(args), allocation_settings(args))
