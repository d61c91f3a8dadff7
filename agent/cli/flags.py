"""The flag and environment table: the shared flags and serve's, each with its environment twin
``TOPOLOGY_AGENT_<FLAG>`` (``--kubelet-dir`` -> ``TOPOLOGY_AGENT_KUBELET_DIR``) so the Helm chart can set them; a
flag on the command line wins. The one-shot commands' own few flags (``discover --format``, ``snapshot -o``, ...)
are plain argparse flags without one (docs/admin/configuration.md)."""

from __future__ import annotations

import argparse
import os

from agent.app.paths import (
    CRI_SOCKETS,
    DEFAULT_CDI_DIR,
    DEFAULT_CPU_MANAGER_STATE,
    DEFAULT_DRA_PLUGIN_DIR,
    DEFAULT_DRA_REGISTRY_DIR,
    DEFAULT_KUBELET_CONFIG,
    DEFAULT_KUBELET_DIR,
    DEFAULT_NRI_SOCKET,
    DEFAULT_POD_RESOURCES_SOCKET,
)
from agent.errors import UsageError
from agent.policy.grouping import DEFAULT_PREFIX
from agent.topology.model import POLARIZATIONS

ENV_PREFIX = "TOPOLOGY_AGENT_"


def env_name(flag: str) -> str:
    """The environment variable a flag also reads: ``--cpuset-interval`` -> ``TOPOLOGY_AGENT_CPUSET_INTERVAL``."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def env_default(flag: str, default: str | None = None) -> str | None:
    return os.environ.get(env_name(flag), default)


def bool_env(flag: str, default: bool) -> bool:
    value = env_default(flag)
    if value is None:
        return default
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"{env_name(flag)}: expected true or false, got {value!r}")


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


def add_service_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("kubelet")
    _add(group, "--kubelet-dir", DEFAULT_KUBELET_DIR, metavar="DIR",
         help="kubelet's device-plugin directory (the same whatever kubelet's --root-dir, on k3s, microk8s "
              "and k0s too)")
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
    _add(group, "--stranded-policy", "evict", choices=("evict", "keep"),
         help="with --cpuset-enforcement cri, nri or auto, a container holding groups whose CPUs are all offline while "
              "every online CPU is in other pods' groups (stranded: no cpuset keeps it off them): evict asks the API "
              "server to evict its pod (the Eviction subresource: PodDisruptionBudgets are honoured; needs RBAC "
              "create on pods/eviction), keep leaves it where it is and only reports it")
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
    group = parser.add_argument_group("uninstall (docs/admin/upgrade-uninstall.md)")
    _add(group, "--release-daemonset", "", metavar="NAME",
         help="the agent's DaemonSet (namespace: POD_NAMESPACE): after a signal, when it is being deleted (helm "
              "uninstall's hook), remove the state files, the seccomp profile and the node labels; otherwise, and "
              "without it, keep them all (a rolling update keeps every hold)")
    _add(group, "--seccomp-profile-dir", "", metavar="DIR",
         help="where the seccomp profile was installed (removed with the rest when the DaemonSet is deleted)")
    group = parser.add_argument_group("logging")
    _add(group, "--log-level", "info", choices=("debug", "info", "warning", "error"), help="log level")
    _add(group, "--log-format", "text", choices=("text", "json"), help="log format")


def add_mode_flag(parser: argparse.ArgumentParser) -> None:
    _add(parser, "--mode", "deviceplugin", choices=("deviceplugin", "dra"),
         help="deviceplugin: advertise groups over kubelet's device-plugin API; dra: publish them as Dynamic "
              "Resource Allocation devices (ResourceSlices, a kubelet DRA plugin; docs/admin/modes/dra.md). One "
              "node serves its resource names by one of them only")


def add_dra_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("DRA mode (--mode dra)")
    _add(group, "--dra-registry-dir", DEFAULT_DRA_REGISTRY_DIR, metavar="DIR",
         help="kubelet's plugin registration directory (the agent serves <driver>-reg.sock there)")
    _add(group, "--dra-plugin-dir", DEFAULT_DRA_PLUGIN_DIR, metavar="DIR",
         help="where dra.sock is served; mount it at the host's path: kubelet dials the path the agent gives")
    _add(group, "--cdi-dir", DEFAULT_CDI_DIR, metavar="DIR", help="where prepared claims' CDI spec files go")
    _add(group, "--dra-interval", "60", metavar="SECONDS",
         help="seconds between looks at the node's ResourceSlices (one List; a write only when they differ)")


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
