"""``topology-agent snapshot``: this node's topology as a snapshot (JSON), for --topology-file."""

from __future__ import annotations

import argparse
import sys

from agent.cli.flags import add_topology_flags
from agent.cli.settings import topology_from
from agent.errors import UsageError

HELP = "write this node's topology as a snapshot (JSON)"


def add_flags(p: argparse.ArgumentParser) -> None:
    add_topology_flags(p)
    p.add_argument("-o", "--output", metavar="FILE", help="file to write (default: standard output)")


def run(args: argparse.Namespace) -> int:
    from agent.topology import snapshot_format as snapshot

    topology = topology_from(args, details=True)
    if args.output in (None, "-"):
        sys.stdout.write(snapshot.dumps(topology))
    else:
        try:
            snapshot.dump(topology, args.output)
        except OSError as exc:
            raise UsageError(f"cannot write the snapshot to {args.output}: {exc.strerror or exc}") from None
        print(f"wrote {len(topology.cpus)} CPUs to {args.output}", file=sys.stderr)
    return 0
