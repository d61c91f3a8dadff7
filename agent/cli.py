"""The ``topology-agent`` command line: flags -> settings -> wiring, nothing else.

Every flag has an environment twin ``TOPOLOGY_AGENT_<FLAG>`` (``--kubelet-dir`` ->
``TOPOLOGY_AGENT_KUBELET_DIR``) so the Helm chart can set them; a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from agent import __version__
from agent.app.paths import (
    CRI_SOCKETS,
    DEFAULT_CPU_MANAGER_STATE,
    DEFAULT_KUBELET_CONFIG,
    DEFAULT_KUBELET_DIR,
    DEFAULT_NRI_SOCKET,
    DEFAULT_POD_RESOURCES_SOCKET,
)
from agent.errors import CpuListError, StartupError, UsageError, UserError
from agent.policy.grouping import DEFAULT_PREFIX, Grouping, GroupingSettings, group_topology
from agent.topology.cpulist import parse_cpulist
from agent.topology.model import POLARIZATIONS, Topology, normalize_polarization
from agent.topology.source import TopologySource

if TYPE_CHECKING:  # what serve, explain and DRA mode import when they run: discover does without them
    from agent.app.config import AgentConfig
    from agent.policy.allocation import AllocationSettings
    from agent.policy.dra import PoolPlan

ENV_PREFIX = "TOPOLOGY_AGENT_"


def env_name(flag: str) -> str:
    """The environment variable a flag also reads: ``--cpuset-interval`` -> ``TOPOLOGY_AGENT_CPUSET_INTERVAL``."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def env_default(flag: str, default: str | None = None) -> str | None:
    return os.environ.get(env_name(flag), default)


def _add(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, default: str | None = None,
         **kwargs: object) -> None:
    env = env_name(flag)
    help_text = str(kwargs.pop("help", ""))
    shown = f" (default: {default})" if default else ""
    parser.add_argument(flag, default=env_default(flag, default), help=f"{help_text}{shown} [env {env}]",
                        **kwargs)  # type: ignore[arg-type]


def add_topology_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("topology source")
    _add(group, "--host-root", "/", metavar="DIR", help="root holding the node's sys/ and proc/ trees")
    _add(group, "--proc-root", None, metavar="DIR",
         help="where proc/sysinfo and proc/cpuinfo are read (default: HOST_ROOT/proc)")
    _add(group, "--topology-file", None, metavar="FILE",
         help="read a topology snapshot instead (a directory: <NODE_NAME>.json, else default.json; "
              "embedded:NAME for a bundled one)")
    _add(group, "--source", "sysfs", choices=("sysfs", "lscpu"), help="read sysfs directly, or run lscpu")


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("grouping policy")
    _add(group, "--levels", "auto", metavar="LIST",
         help="auto (book if more than one book, else socket) or a list of drawer,book,socket")
    _add(group, "--resource-prefix", DEFAULT_PREFIX, metavar="PREFIX",
         help="extended resource prefix: resources are PREFIX/book, PREFIX/socket")
    _add(group, "--reserved-cpus", "", metavar="CPULIST", help="CPUs kept for system daemons, never advertised")
    _add(group, "--exclude-polarization", "", metavar="LIST",
         help=f"leave out CPUs of these polarizations ({', '.join(POLARIZATIONS)})")
    _add(group, "--min-group-cores", "auto", metavar="N",
         help="groups with fewer cores are not advertised (kubelet counts devices, it does not size them); "
              "auto: half the cores of the median group of the level, at least 1; 0 advertises every group")
    group.add_argument("--uniform-groups", action=argparse.BooleanOptionalAction, default=None,
                       help="advertise only groups of one size (CPUs) per resource, so one pod spec fits whichever "
                            "group kubelet picks: the most common size, a tie going to the larger; discover and "
                            "explain name the others (default: off) [env TOPOLOGY_AGENT_UNIFORM_GROUPS=true|false]")
    group.add_argument("--allow-non-s390x", action=argparse.BooleanOptionalAction, default=None,
                       help="group the CPUs of a machine that is not IBM Z too (tests, demos); without it such a "
                            "machine advertises nothing and says why. A --topology-file snapshot is always "
                            "grouped (default: off) [env TOPOLOGY_AGENT_ALLOW_NON_S390X=true|false]")


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
        uniform_groups=(_bool_env("--uniform-groups", False) if getattr(args, "uniform_groups", None) is None
                        else args.uniform_groups),
        # A snapshot was asked for explicitly: group it whatever machine it describes.
        allow_non_s390x=bool(getattr(args, "topology_file", None)) or (
            _bool_env("--allow-non-s390x", False) if getattr(args, "allow_non_s390x", None) is None
            else args.allow_non_s390x),
    ).validated()


def topology_source(args: argparse.Namespace, details: bool = False) -> TopologySource:
    """Where the topology comes from; ``details`` also reads what grouping does not need (each CPU's
    address and dedication, for snapshots)."""
    return TopologySource(args.host_root, args.topology_file, args.source, proc_root=args.proc_root,
                          details=details)


def topology_from(args: argparse.Namespace, details: bool = False) -> Topology:
    return topology_source(args, details).load()


def enforcement_here(args: argparse.Namespace) -> dict[str, str]:
    """The cpuset enforcement serve would run with these flags on this node (auto dials the NRI socket)."""
    if args.cpuset_enforcement != "auto":  # nothing to look at: no config, no socket (~10 ms a discover)
        from agent.policy.enforcement_choice import enforcement_mode

        mode, why = enforcement_mode(args.cpuset_enforcement, False, False)
        return {"requested": args.cpuset_enforcement, "mode": mode, "reason": why}
    from agent.app.config import AgentConfig
    from agent.app.enforcement_mode import choose_enforcement

    config = AgentConfig(kubelet_dir=Path(DEFAULT_KUBELET_DIR), cpuset_enforcement=args.cpuset_enforcement,
                         cri_socket=cri_socket(args.cri_socket), nri_socket=Path(args.nri_socket or DEFAULT_NRI_SOCKET))
    mode, why = choose_enforcement(config)
    return {"requested": args.cpuset_enforcement, "mode": mode, "reason": why}


def enforcement_line(enforcement: dict[str, str]) -> str:
    return f"cpuset enforcement: {enforcement['mode']} ({enforcement['reason']})\n"


def add_mode_flag(parser: argparse.ArgumentParser) -> None:
    _add(parser, "--mode", "deviceplugin", choices=("deviceplugin", "dra"),
         help="deviceplugin: advertise groups over kubelet's device-plugin API; dra: publish them as Dynamic "
              "Resource Allocation devices (ResourceSlices, a kubelet DRA plugin; README \"DRA mode\"). One "
              "node serves its resource names by one of them only")


def add_dra_flags(parser: argparse.ArgumentParser) -> None:
    from agent.app.paths import DEFAULT_CDI_DIR, DEFAULT_DRA_PLUGIN_DIR, DEFAULT_DRA_REGISTRY_DIR

    group = parser.add_argument_group("DRA mode (--mode dra)")
    _add(group, "--dra-registry-dir", DEFAULT_DRA_REGISTRY_DIR, metavar="DIR",
         help="kubelet's plugin registration directory (the agent serves <driver>-reg.sock there)")
    _add(group, "--dra-plugin-dir", DEFAULT_DRA_PLUGIN_DIR, metavar="DIR",
         help="where dra.sock is served; mount it at the host's path: kubelet dials the path the agent gives")
    _add(group, "--cdi-dir", DEFAULT_CDI_DIR, metavar="DIR", help="where prepared claims' CDI spec files go")
    _add(group, "--dra-interval", "60", metavar="SECONDS",
         help="seconds between looks at the node's ResourceSlices (one List; a write only when they differ)")


def dra_text(plan: PoolPlan | None) -> str:
    if plan is None:
        return ""
    from agent.policy.dra import describe

    return describe(plan)


def dra_plan(args: argparse.Namespace, topology: Topology, grouping: Grouping) -> PoolPlan | None:
    """What DRA mode would publish for this node (None in device-plugin mode)."""
    if getattr(args, "mode", "deviceplugin") != "dra":
        return None
    import socket

    from agent.policy.dra import SliceSettings, build_pool

    node = os.environ.get("NODE_NAME") or socket.gethostname().lower()
    try:
        return build_pool(grouping, topology, SliceSettings(node))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_discover(args: argparse.Namespace) -> int:
    from agent.observe.report import grouping_dict, table

    settings = grouping_settings(args)
    topology = topology_from(args)
    grouping = group_topology(topology, settings)
    enforcement = enforcement_here(args)
    plan = dra_plan(args, topology, grouping)
    if args.format == "json":
        dra: dict[str, object] = {}
        if plan is not None:  # agent.policy.dra (and typing, hashlib) only in DRA mode: ~4 ms a discover
            from agent.policy.dra import pool_dict

            dra = {"dra": pool_dict(plan)}
        sys.stdout.write(json.dumps({**grouping_dict(topology, grouping), "cpuset_enforcement": enforcement, **dra},
                                    indent=2) + "\n")
    else:
        sys.stdout.write(table(topology, grouping) + enforcement_line(enforcement) + dra_text(plan))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from agent.observe.report import explain

    settings = grouping_settings(args)
    allocation = allocation_settings(args)
    topology = topology_from(args)
    grouping = group_topology(topology, settings)
    plan = dra_plan(args, topology, grouping)
    from agent.node.labels import not_advertised
    from agent.policy.troubleshoot import pending_text

    sys.stdout.write(explain(topology, grouping, allocation) + enforcement_line(enforcement_here(args))
                     + dra_text(plan) + pending_text(grouping, settings.resource_prefix,
                                                     not_advertised(topology, grouping)))
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    from agent.topology import snapshot

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


def cmd_seccomp_profile(args: argparse.Namespace) -> int:
    from agent.node import seccomp

    arch = args.arch or seccomp.node_arch()
    if args.install is None:
        sys.stdout.buffer.write(seccomp.profile(arch))
        return 0
    changed = seccomp.install(Path(args.install), arch)
    where = Path(args.install) / seccomp.PROFILE_NAME
    print(f"{'installed' if changed else 'unchanged'}: {where} ({arch})", file=sys.stderr)
    return 0


def add_allocation_flags(parser: argparse.ArgumentParser) -> None:
    from agent.policy.allocation import DEFAULT_RESERVE_CORES_PER_GROUP

    group = parser.add_argument_group("what a container gets")
    _add(group, "--omp-threads-per-core", "1", metavar="N", choices=("1", "2"),
         help="OpenMP threads per core: 1 (the highest SMT thread, as vLLM picks) or 2")
    _add(group, "--reserve-cores-per-group", str(DEFAULT_RESERVE_CORES_PER_GROUP), metavar="N",
         help="cores of each group left out of the OpenMP lists (kept in TOPOLOGY_CPUS) for the serving "
              "process's own threads, as vLLM's auto binding keeps one CPU back")
    group.add_argument("--openmp-env", action=argparse.BooleanOptionalAction, default=None,
                       help="also set OMP_PLACES and OMP_PROC_BIND for the whole container. Off by default: "
                            "libgomp pins the main thread of every process that loads it to the first place, so "
                            "a multi-process program such as vLLM ends up on one CPU; turn it on only where "
                            "every topology pod is a single OpenMP process (the places are always in "
                            "TOPOLOGY_OMP_PLACES) (default: off) [env TOPOLOGY_AGENT_OPENMP_ENV=true|false]")


def _int(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{flag}: expected a whole number, got {value!r}") from None


def allocation_settings(args: argparse.Namespace) -> AllocationSettings:
    from agent.policy.allocation import AllocationSettings

    openmp_env = _bool_env("--openmp-env", False) if args.openmp_env is None else args.openmp_env
    settings = AllocationSettings(omp_threads_per_core=_int("--omp-threads-per-core", args.omp_threads_per_core),
                                  reserve_cores_per_group=_int("--reserve-cores-per-group",
                                                               args.reserve_cores_per_group),
                                  openmp_env=openmp_env)
    try:
        return settings.validated()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_choices(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Values that came from environment twins skip argparse's own choice check: do it here."""
    for action in _all_actions(parser):
        if action.choices is None or not action.dest or action.dest == "command":
            continue
        value = getattr(args, action.dest, None)
        if value is not None and value not in action.choices:
            env = env_name(action.dest)
            raise UsageError(f"{action.option_strings[0]} (or {env}): {value!r} is not one of "
                             f"{', '.join(map(str, action.choices))}")


def _all_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    actions = list(parser._actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                actions.extend(_all_actions(sub))
    return actions


def _bool_env(flag: str, default: bool) -> bool:
    value = env_default(flag)
    if value is None:
        return default
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"{env_name(flag)}: expected true or false, got {value!r}")


def add_service_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("kubelet")
    _add(group, "--kubelet-dir", DEFAULT_KUBELET_DIR, metavar="DIR",
         help="kubelet's device-plugin directory (k3s: /var/lib/rancher/k3s/agent/kubelet/device-plugins)")
    _add(group, "--pod-resources-socket", DEFAULT_POD_RESOURCES_SOCKET, metavar="PATH",
         help="kubelet's pod-resources socket (mount its directory: kubelet recreates the socket)")
    _add(group, "--pod-resources-interval", "2", metavar="SECONDS",
         help="how often kubelet's pod-resources List is read (0 disables)")
    _add(group, "--rescan-interval", "5", metavar="SECONDS", help="how often the topology is read again (0 disables)")
    _add(group, "--cpu-manager-state", DEFAULT_CPU_MANAGER_STATE, metavar="PATH",
         help="kubelet's CPU manager checkpoint, read to warn when the static policy fights our pinning")
    _add(group, "--kubelet-config", DEFAULT_KUBELET_CONFIG, metavar="PATH",
         help="kubelet's config file, read for reservedSystemCPUs overlapping our groups")
    group = add_enforcement_flags(parser, default="auto")
    group.add_argument("--shared-pool", action=argparse.BooleanOptionalAction, default=None,
                       help="with --cpuset-enforcement cri, nri or auto: confine every other container on the node "
                            "to the CPUs of no held group (--reserved-cpus always among them), widened again when a "
                            "group is freed (default: off) [env TOPOLOGY_AGENT_SHARED_POOL=true|false]")
    _add(group, "--cpuset-interval", "2", metavar="SECONDS",
         help="seconds between looks at the runtime for new or restarted containers while a device is held (every "
              "0.1 s for 15 s after devices change hands; every 30 s while none is held)")
    group = parser.add_argument_group("node labels and metrics")
    group.add_argument("--node-labels", action=argparse.BooleanOptionalAction, default=None,
                       help="label the Node (needs NODE_NAME and RBAC get/patch on nodes) (default: on) "
                            "[env TOPOLOGY_AGENT_NODE_LABELS=true|false]")
    _add(group, "--metrics-port", "9400", metavar="PORT",
         help="port of /metrics, /healthz, /readyz and /allocations (0 disables)")
    _add(group, "--metrics-address", "", metavar="ADDRESS",
         help="address the metrics port listens on (default: every address, IPv4 and IPv6; e.g. 0.0.0.0, ::, ::1)")
    group.add_argument("--allocations-pod-names", action=argparse.BooleanOptionalAction, default=None,
                       help="name the holders (namespace/pod/container) in /allocations; off: device ids, states "
                            "and counts only, since anyone who reaches the port can read it "
                            "(default: off) [env TOPOLOGY_AGENT_ALLOCATIONS_POD_NAMES=true|false]")
    group = parser.add_argument_group("uninstall (README \"Upgrading and uninstalling\")")
    _add(group, "--release-daemonset", "", metavar="NAME",
         help="the agent's DaemonSet (namespace: POD_NAMESPACE): after a signal, when it is being deleted (helm "
              "uninstall's hook), remove the state files, the seccomp profile and the node labels; otherwise, and "
              "without it, keep them all (a rolling update keeps every hold)")
    _add(group, "--seccomp-profile-dir", "", metavar="DIR",
         help="where the seccomp profile was installed (removed with the rest when the DaemonSet is deleted)")
    group = parser.add_argument_group("logging")
    _add(group, "--log-level", "info", choices=("debug", "info", "warning", "error"), help="log level")
    _add(group, "--log-format", "text", choices=("text", "json"), help="log format")


def add_enforcement_flags(parser: argparse.ArgumentParser, default: str = "none") -> argparse._ArgumentGroup:
    """The flags that choose the cpuset enforcement (serve, default auto; and discover/explain, which say which one
    is in force on this node: default none, which looks at nothing; --cpuset-enforcement auto shows serve's choice)."""
    group = parser.add_argument_group("cpuset enforcement")
    _add(group, "--cpuset-enforcement", default, choices=("none", "cri", "nri", "auto"),
         help="cri: pin every container that holds topology devices to its groups' CPUs and memory nodes through "
              "the container runtime's CRI socket, shortly after it started, as kubelet's CPU manager does; nri: at "
              "its creation, before its first instruction, as an NRI plugin of the runtime; auto: nri when the NRI "
              "socket answers at start, else cri when a CRI socket exists, else none (refused while kubelet runs "
              "the static CPU manager policy)")
    _add(group, "--nri-socket", DEFAULT_NRI_SOCKET, metavar="PATH",
         help="the runtime's NRI socket (containerd 2.x and CRI-O 1.30+ enable NRI by default; containerd 1.7 "
              "needs [plugins.\"io.containerd.nri.v1.nri\"] disable = false)")
    _add(group, "--cri-socket", "", metavar="PATH",
         help=f"the runtime's CRI socket (default: the first that exists at start of {', '.join(CRI_SOCKETS)}; "
              "if none does, the first, dialed until it answers)")
    return group


def _seconds(flag: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise UsageError(f"{flag}: expected seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0 or seconds > 86400:
        raise UsageError(f"{flag}: expected 0 to 86400 seconds, got {value!r}")
    return seconds


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise UsageError(f"--metrics-port: expected a port number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"--metrics-port: {port} is not a port number (0 disables)")
    return port


def agent_config(args: argparse.Namespace) -> AgentConfig:
    from agent.app.config import AgentConfig
    from agent.app.paths import DEFAULT_CDI_DIR, DEFAULT_DRA_PLUGIN_DIR, DEFAULT_DRA_REGISTRY_DIR

    return AgentConfig(kubelet_dir=Path(args.kubelet_dir), grouping=grouping_settings(args),
                       allocation=allocation_settings(args), pod_resources_socket=Path(args.pod_resources_socket),
                       rescan_interval=_seconds("--rescan-interval", args.rescan_interval),
                       pod_resources_interval=_seconds("--pod-resources-interval", args.pod_resources_interval),
                       node_name=os.environ.get("NODE_NAME") or None,
                       node_labels=_bool_env("--node-labels", True) if args.node_labels is None else args.node_labels,
                       cpu_manager_state=Path(args.cpu_manager_state) if args.cpu_manager_state else None,
                       kubelet_config=Path(args.kubelet_config) if args.kubelet_config else None,
                       metrics_port=_port(args.metrics_port) or None, metrics_address=args.metrics_address,
                       allocations_pod_names=(_bool_env("--allocations-pod-names", False)
                                              if args.allocations_pod_names is None else args.allocations_pod_names),
                       cpuset_enforcement=args.cpuset_enforcement, cri_socket=cri_socket(args.cri_socket),
                       nri_socket=Path(args.nri_socket or DEFAULT_NRI_SOCKET),
                       shared_pool=_bool_env("--shared-pool", False) if args.shared_pool is None else args.shared_pool,
                       cpuset_interval=_positive_seconds("--cpuset-interval", args.cpuset_interval),
                       mode=getattr(args, "mode", None) or "deviceplugin",
                       dra_registry_dir=Path(getattr(args, "dra_registry_dir", None) or DEFAULT_DRA_REGISTRY_DIR),
                       dra_plugin_dir=Path(getattr(args, "dra_plugin_dir", None) or DEFAULT_DRA_PLUGIN_DIR),
                       cdi_dir=Path(getattr(args, "cdi_dir", None) or DEFAULT_CDI_DIR),
                       dra_interval=_positive_seconds("--dra-interval", getattr(args, "dra_interval", None) or "60"))


def cri_socket(text: str) -> Path | None:
    """The CRI socket given (None: the composition root picks the usual one, only when enforcing)."""
    return Path(text) if text else None


def _positive_seconds(flag: str, value: str) -> float:
    seconds = _seconds(flag, value)
    if seconds <= 0:
        raise UsageError(f"{flag}: expected more than 0 seconds, got {value!r}")
    return seconds


def cmd_serve(args: argparse.Namespace) -> int:
    from agent.app.agent import run_until_signalled
    from agent.app.build import build_agent
    from agent.observe.logs import setup_logging

    config = agent_config(args)
    if not config.kubelet_dir.is_dir():  # kubelet makes it; the agent never invents one (nor writes state there)
        why = "it is a file, not a directory" if config.kubelet_dir.exists() else "it does not exist"
        raise StartupError(f"cannot use kubelet's directory {config.kubelet_dir} (--kubelet-dir): {why}; give "
                           f"kubelet's device-plugin directory (usually {DEFAULT_KUBELET_DIR}; k3s and microk8s use "
                           "other roots)")
    setup_logging(args.log_level, args.log_format)
    source = topology_source(args)
    code = run_until_signalled(build_agent(source.load(), config, loader=source.load, fingerprint=source.fingerprint))
    if args.release_daemonset:
        cleanup_after_stop(args, config)
    return code


def cleanup_after_stop(args: argparse.Namespace, config: AgentConfig) -> None:
    """After serve stopped: clean the node up only if the agent's DaemonSet is being deleted (agent/node/uninstall)."""
    from agent.errors import NodeLabelerError
    from agent.node.uninstall import LeanReleaseApi, cleanup_if_released, log

    namespace = os.environ.get("POD_NAMESPACE")
    if not namespace:
        log.warning("kept everything: --release-daemonset needs POD_NAMESPACE (the downward API's metadata.namespace)")
        return
    try:
        api = LeanReleaseApi.in_cluster()
    except NodeLabelerError as exc:
        log.warning("kept everything: cannot reach the API server to look at DaemonSet %s: %s",
                    args.release_daemonset, exc)
        return
    cleanup_if_released(api, namespace=namespace, daemonset=args.release_daemonset, node_name=config.node_name,
                        kubelet_dir=config.kubelet_dir, resource_prefix=config.grouping.resource_prefix,
                        dra=config.mode == "dra", node_labels=config.node_labels,
                        seccomp_dir=Path(args.seccomp_profile_dir) if args.seccomp_profile_dir else None,
                        remove_slices=_node_slice_remover(config))


def _node_slice_remover(config: AgentConfig) -> Callable[[str], int] | None:
    if config.mode != "dra":
        return None
    from agent.dra.publisher import remove_node_slices

    return remove_node_slices


def cmd_uninstall(args: argparse.Namespace) -> int:
    """The chart's pre-delete hook: delete the DaemonSet in the foreground, wait, remove leftover node labels."""
    from agent.errors import NodeLabelerError
    from agent.node.uninstall import LeanReleaseApi, run_uninstall_hook
    from agent.policy.uninstall import parse_label_selector

    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or ""
    if not namespace:
        raise UsageError("--namespace: not given and POD_NAMESPACE is not set")
    try:
        selector = parse_label_selector(args.node_selector)
    except ValueError as exc:
        raise UsageError(f"--node-selector: {exc}") from None
    timeout = _seconds("--timeout", args.timeout)
    try:
        api = LeanReleaseApi.in_cluster()
    except NodeLabelerError as exc:
        raise StartupError(f"uninstall runs in a pod of the cluster: {exc}") from None
    return run_uninstall_hook(api, namespace=namespace, daemonset=args.daemonset, node_selector=selector,
                              timeout=timeout, say=lambda line: print(line, flush=True))


def cmd_demo(args: argparse.Namespace) -> int:
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


Command = Callable[[argparse.Namespace], int]


def _discover_flags(p: argparse.ArgumentParser) -> None:
    add_topology_flags(p)
    add_policy_flags(p)
    p.add_argument("--format", choices=("table", "json"), default="table", help="table (default) or json")
    add_enforcement_flags(p)
    add_mode_flag(p)
    p.set_defaults(func=cmd_discover)


def _explain_flags(p: argparse.ArgumentParser) -> None:
    add_topology_flags(p)
    add_policy_flags(p)
    add_allocation_flags(p)
    add_enforcement_flags(p)
    add_mode_flag(p)
    p.set_defaults(func=cmd_explain)


def _snapshot_flags(p: argparse.ArgumentParser) -> None:
    add_topology_flags(p)
    p.add_argument("-o", "--output", metavar="FILE", help="file to write (default: standard output)")
    p.set_defaults(func=cmd_snapshot)


def _serve_flags(p: argparse.ArgumentParser) -> None:
    add_topology_flags(p)
    add_policy_flags(p)
    add_allocation_flags(p)
    add_service_flags(p)
    add_mode_flag(p)
    add_dra_flags(p)
    p.set_defaults(func=cmd_serve)


def _seccomp_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", metavar="ARCH", help="s390x, amd64 or arm64 (default: this machine's)")
    p.add_argument("--install", metavar="DIR",
                   help="write DIR/vllm-numa.json (kubelet's <root>/seccomp/profiles), only when it differs")
    p.set_defaults(func=cmd_seccomp_profile)


def _uninstall_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--daemonset", required=True, metavar="NAME", help="the agent's DaemonSet")
    p.add_argument("--namespace", default="", metavar="NAMESPACE", help="its namespace (default: POD_NAMESPACE)")
    p.add_argument("--node-selector", default="", metavar="K=V,...",
                   help="the DaemonSet's node selector: the nodes whose leftover labels are removed (default: all)")
    p.add_argument("--timeout", default="120", metavar="SECONDS",
                   help="how long to wait for the agents to stop and clean up (default: 120)")
    p.set_defaults(func=cmd_uninstall)


def _demo_flags(p: argparse.ArgumentParser) -> None:
    add_topology_flags(p)
    add_policy_flags(p)
    add_allocation_flags(p)
    p.set_defaults(func=cmd_demo)


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "discover": ("show the groups this node would advertise", _discover_flags),
    "explain": ("why each CPU is in a group or left out, and what Allocate returns per group", _explain_flags),
    "snapshot": ("write this node's topology as a snapshot (JSON)", _snapshot_flags),
    "serve": ("advertise the groups to kubelet and stay registered (the DaemonSet's job)", _serve_flags),
    "seccomp-profile": ("print or install the seccomp profile vLLM pods need (RuntimeDefault plus the NUMA calls)",
                        _seccomp_flags),
    "demo": ("run the agent on a bundled z16-shaped snapshot against an emulated kubelet", _demo_flags),
    "uninstall": ("the chart's pre-delete hook: stop every agent so it cleans its node up, then remove leftover "
                  "node labels", _uninstall_flags),
}


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a bad flag or value is one line and a hint, not the whole usage first."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or, with ``only``, every command but only that one's flags (each
    command imports what its flags need: ``discover`` starts without the rest)."""
    parser = Parser(prog="topology-agent",
                    description="Makes IBM Z CPU topology (drawers, books, sockets) schedulable.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, (help_text, add_flags) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if only is None or only == name:
            add_flags(p)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if a in COMMANDS), None)


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC core's own INFO lines (e.g. "Got goaway" when kubelet restarts) would break JSON logs.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser(only=_command_in(argv))
        args = parser.parse_args(argv)
        check_choices(parser, args)
        func: Command = args.func
        return func(args)
    except UserError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a path given on the command line that the system refuses
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}")


def _fail(message: str) -> int:
    from agent.observe.logs import shutdown_logging

    shutdown_logging()  # what was logged comes first, the reason to stop last
    print(f"topology-agent: error: {message}", file=sys.stderr)
    return 2
