"""``topology-agent discover``: the groups this node would advertise, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys

from agent.cli.flags import add_enforcement_flags, add_mode_flag, add_policy_flags, add_topology_flags
from agent.cli.settings import dra_plan, dra_text, enforcement_here, enforcement_line, grouping_settings, topology_from
from agent.policy.grouping import group_topology

HELP = "show the groups this node would advertise"


def add_flags(p: argparse.ArgumentParser) -> None:
    add_topology_flags(p)
    add_policy_flags(p)
    p.add_argument("--format", choices=("table", "json"), default="table", help="table (default) or json")
    add_enforcement_flags(p)
    add_mode_flag(p)


def run(args: argparse.Namespace) -> int:
    from agent.observe.report import grouping_dict, table

    settings = grouping_settings(args)
    topology = topology_from(args)
    grouping = group_topology(topology, settings)
    enforcement = enforcement_here(args)
    plan = dra_plan(args, topology, grouping)
    if args.format == "json":
        dra: dict[str, object] = {}
        if plan is not None:  # DRA mode only
            from agent.policy.resource_slices import pool_dict

            dra = {"dra": pool_dict(plan)}
        sys.stdout.write(json.dumps({**grouping_dict(topology, grouping), "cpuset_enforcement": enforcement, **dra},
                                    indent=2) + "\n")
    else:
        sys.stdout.write(table(topology, grouping) + enforcement_line(enforcement) + dra_text(plan))
    return 0
