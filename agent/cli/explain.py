"""``topology-agent explain``: why each CPU is in a group or left out, and what Allocate returns per group."""

from __future__ import annotations

import argparse
import sys

from agent.cli.flags import (
    add_allocation_flags,
    add_enforcement_flags,
    add_mode_flag,
    add_policy_flags,
    add_topology_flags,
)
from agent.cli.settings import (
    allocation_settings,
    dra_plan,
    dra_text,
    enforcement_here,
    enforcement_line,
    grouping_settings,
    topology_from,
)
from agent.policy.grouping import group_topology

HELP = "why each CPU is in a group or left out, and what Allocate returns per group"


def add_flags(p: argparse.ArgumentParser) -> None:
    add_topology_flags(p)
    add_policy_flags(p)
    add_allocation_flags(p)
    add_enforcement_flags(p)
    add_mode_flag(p)


def run(args: argparse.Namespace) -> int:
    from agent.node.labels import not_advertised
    from agent.observe.report import explain
    from agent.policy.troubleshoot import pending_text

    settings = grouping_settings(args)
    allocation = allocation_settings(args)
    topology = topology_from(args)
    grouping = group_topology(topology, settings)
    plan = dra_plan(args, topology, grouping)
    sys.stdout.write(explain(topology, grouping, allocation) + enforcement_line(enforcement_here(args))
                     + dra_text(plan) + pending_text(grouping, settings.resource_prefix,
                                                     not_advertised(topology, grouping)))
    return 0
