"""``topology-agent seccomp-profile``: print or install the seccomp profile vLLM pods need."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "print or install the seccomp profile vLLM pods need (RuntimeDefault plus the NUMA calls)"


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", metavar="ARCH", help="s390x, amd64 or arm64 (default: this machine's)")
    p.add_argument("--install", metavar="DIR",
                   help="write DIR/vllm-numa.json (kubelet's <root>/seccomp/profiles), only when it differs")


def run(args: argparse.Namespace) -> int:
    from agent.node import seccomp

    arch = args.arch or seccomp.node_arch()
    if args.install is None:
        sys.stdout.buffer.write(seccomp.profile(arch))
        return 0
    changed = seccomp.install(Path(args.install), arch)
    where = Path(args.install) / seccomp.PROFILE_NAME
    print(f"{'installed' if changed else 'unchanged'}: {where} ({arch})", file=sys.stderr)
    return 0
