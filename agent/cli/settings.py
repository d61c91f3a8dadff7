"""Flags -> settings: the values the commands' flags give, checked (a bad one is a UsageError: one line,
exit 2), and what they say about this node (its topology, the enforcement in force, DRA mode's pool)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from agent.app.paths import CRI_SOCKETS, DEFAULT_NRI_SOCKET
from agent.cli.flags import bool_env
from agent.errors import CpuListError, UsageError
from agent.policy.grouping import Grouping, GroupingSettings
from agent.topology.cpulist import parse_cpulist
from agent.topology.model import POLARIZATIONS, Topology, normalize_polarization
from agent.topology.source import TopologySource

if TYPE_CHECKING:  # what explain and DRA mode import when they run: discover does without them
    from agent.policy.allocation import AllocationSettings
    from agent.policy.resource_slices import PoolPlan


def _int(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{flag}: expected a whole number, got {value!r}") from None


def _polarizations(text: str) -> frozenset[str]:
    result = set()
    for item in filter(None, (s.strip() for s in text.split(","))):
        value = item if item in POLARIZATIONS else normalize_polarization(item)
        if value == "unknown" and item != "unknown":
            raise UsageError(f"--exclude-polarization: unknown polarization {item!r} "
                             f"(choose from {', '.join(POLARIZATIONS)})")
        result.add(value)
    return frozenset(result)


def grouping_settings(args: argparse.Namespace) -> GroupingSettings:
    levels_text = (args.levels if args.levels is not None else "auto").strip()
    if not levels_text:
        raise UsageError("--levels: empty; give auto, or a list of drawer, book, socket")
    levels = None if levels_text == "auto" else tuple(s.strip() for s in levels_text.split(","))
    if levels is not None and (not all(levels) or len(set(levels)) != len(levels)):
        raise UsageError(f"--levels {levels_text!r}: each of drawer, book, socket at most once, no empty item")
    try:
        reserved = frozenset(parse_cpulist(args.reserved_cpus or ""))
    except CpuListError as exc:
        raise UsageError(f"--reserved-cpus: {exc}") from None
    min_cores_text = (getattr(args, "min_group_cores", None) or "auto").strip()
    min_cores = None if min_cores_text == "auto" else _int("--min-group-cores", min_cores_text)
    return GroupingSettings(
        levels=levels,
        resource_prefix=args.resource_prefix,
        reserved_cpus=reserved,
        exclude_polarization=_polarizations(args.exclude_polarization or ""),
        min_group_cores=min_cores,
        uniform_groups=(bool_env("--uniform-groups", False) if getattr(args, "uniform_groups", None) is None
                        else args.uniform_groups),
        # A snapshot was asked for explicitly: group it whatever machine it describes.
        allow_non_s390x=bool(getattr(args, "topology_file", None)) or (
            bool_env("--allow-non-s390x", False) if getattr(args, "allow_non_s390x", None) is None
            else args.allow_non_s390x),
    ).validated()


def allocation_settings(args: argparse.Namespace) -> AllocationSettings:
    from agent.policy.allocation import AllocationSettings

    openmp_env = bool_env("--openmp-env", False) if args.openmp_env is None else args.openmp_env
    settings = AllocationSettings(omp_threads_per_core=_int("--omp-threads-per-core", args.omp_threads_per_core),
                                  reserve_cores_per_group=_int("--reserve-cores-per-group",
                                                               args.reserve_cores_per_group),
                                  openmp_env=openmp_env)
    try:
        return settings.validated()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def seconds(flag: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise UsageError(f"{flag}: expected seconds, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or number > 86400:
        raise UsageError(f"{flag}: expected 0 to 86400 seconds, got {value!r}")
    return number


def positive_seconds(flag: str, value: str) -> float:
    number = seconds(flag, value)
    if number <= 0:
        raise UsageError(f"{flag}: expected more than 0 seconds, got {value!r}")
    return number


def port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"--metrics-port: expected a port number, got {value!r}") from None
    if not 0 <= number <= 65535:
        raise UsageError(f"--metrics-port: {number} is not a port number (0 disables)")
    return number


def cri_socket(text: str) -> Path | None:
    """The CRI socket given (None: the composition root picks the usual one, only when enforcing)."""
    return Path(text) if text else None


def topology_source(args: argparse.Namespace, details: bool = False) -> TopologySource:
    """Where the topology comes from; ``details`` also reads what grouping does not need (each CPU's
    address and dedication, for snapshots)."""
    return TopologySource(args.host_root, args.topology_file, args.source, proc_root=args.proc_root,
                          details=details)


def topology_from(args: argparse.Namespace, details: bool = False) -> Topology:
    return topology_source(args, details).load()


def enforcement_here(args: argparse.Namespace) -> dict[str, str]:
    """The cpuset enforcement serve would run with these flags on this node (auto dials the NRI socket)."""
    if args.cpuset_enforcement != "auto":  # nothing to look at: no config, no socket
        from agent.policy.enforcement_choice import enforcement_mode

        mode, why = enforcement_mode(args.cpuset_enforcement, False, False)
        return {"requested": args.cpuset_enforcement, "mode": mode, "reason": why}
    from agent.enforce.engine_choice import choose_enforcement, cri_socket_of

    mode, why = choose_enforcement(args.cpuset_enforcement, Path(args.nri_socket or DEFAULT_NRI_SOCKET),
                                   cri_socket_of(cri_socket(args.cri_socket), CRI_SOCKETS))
    return {"requested": args.cpuset_enforcement, "mode": mode, "reason": why}


def enforcement_line(enforcement: dict[str, str]) -> str:
    return f"cpuset enforcement: {enforcement['mode']} ({enforcement['reason']})\n"


def dra_plan(args: argparse.Namespace, topology: Topology, grouping: Grouping) -> PoolPlan | None:
    """What DRA mode would publish for this node (None in device-plugin mode)."""
    if getattr(args, "mode", "deviceplugin") != "dra":
        return None
    import socket

    from agent.policy.resource_slices import SliceSettings, build_pool

    node = os.environ.get("NODE_NAME") or socket.gethostname().lower()
    try:
        return build_pool(grouping, topology, SliceSettings(node))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def dra_text(plan: PoolPlan | None) -> str:
    if plan is None:
        return ""
    from agent.policy.resource_slices import describe

    return describe(plan)
