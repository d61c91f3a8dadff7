"""``topology-agent serve``: the DaemonSet's job (advertise the groups to kubelet and stay registered)."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agent.app.paths import (
    DEFAULT_CDI_DIR,
    DEFAULT_DRA_PLUGIN_DIR,
    DEFAULT_DRA_REGISTRY_DIR,
    DEFAULT_KUBELET_DIR,
    DEFAULT_NRI_SOCKET,
)
from agent.cli.flags import (
    add_allocation_flags,
    add_dra_flags,
    add_mode_flag,
    add_policy_flags,
    add_service_flags,
    add_topology_flags,
    bool_env,
)
from agent.cli.settings import (
    allocation_settings,
    cri_socket,
    grouping_settings,
    port,
    positive_seconds,
    seconds,
    topology_source,
)
from agent.errors import NodeLabelerError, StartupError

if TYPE_CHECKING:  # serve's wiring is imported when it runs: the other commands start without it
    from agent.app.agent import Agent
    from agent.app.config import AgentConfig

HELP = "advertise the groups to kubelet and stay registered (the DaemonSet's job)"


def add_flags(p: argparse.ArgumentParser) -> None:
    add_topology_flags(p)
    add_policy_flags(p)
    add_allocation_flags(p)
    add_service_flags(p)
    add_mode_flag(p)
    add_dra_flags(p)


def run(args: argparse.Namespace) -> int:
    from agent.app.agent import run_until_signalled
    from agent.app.build import build_agent
    from agent.observe.logs import setup_logging

    config = agent_config(args)
    if not config.kubelet_dir.is_dir():  # kubelet makes it; the agent never invents one (nor writes state there)
        why = "it is a file, not a directory" if config.kubelet_dir.exists() else "it does not exist"
        raise StartupError(f"cannot use kubelet's directory {config.kubelet_dir} (--kubelet-dir): {why}; give "
                           f"kubelet's device-plugin directory (usually {DEFAULT_KUBELET_DIR}, whatever kubelet's "
                           "--root-dir: k3s and microk8s too)")
    setup_logging(args.log_level, args.log_format)
    # `kill -USR1 <pid>`: every thread's stack to stderr, from a C signal handler (so even when the interpreter is
    # stuck), the agent running on; for the process's whole life (a hang at exit too). docs/admin/troubleshooting.md
    # (to fd 2: sys.stderr may be no file, as under a test's capture)
    faulthandler.register(signal.SIGUSR1, file=2, all_threads=True)
    source = topology_source(args)
    agent = build_agent(source.load(), config, loader=source.load, fingerprint=source.fingerprint)
    if args.release_daemonset and os.environ.get("POD_NAMESPACE"):
        agent.before_stop = lambda: hand_over(agent, args.release_daemonset, os.environ["POD_NAMESPACE"])
    code = run_until_signalled(agent)
    if args.release_daemonset:
        cleanup_after_stop(args, config)
    return code


def hand_over(agent: Agent, daemonset: str, namespace: str) -> None:
    """On a signal, before stopping: hand the node's resources over when this is the last agent of its mode there."""
    from agent.app.handover_on_stop import hand_over_if_last
    from agent.node.kubeapi import LeanKubeApi

    hand_over_if_last(agent, LeanKubeApi.in_cluster, namespace=namespace, daemonset=daemonset)


def agent_config(args: argparse.Namespace) -> AgentConfig:
    from agent.app.config import AgentConfig

    return AgentConfig(kubelet_dir=Path(args.kubelet_dir), grouping=grouping_settings(args),
                       allocation=allocation_settings(args), pod_resources_socket=Path(args.pod_resources_socket),
                       rescan_interval=seconds("--rescan-interval", args.rescan_interval),
                       pod_resources_interval=seconds("--pod-resources-interval", args.pod_resources_interval),
                       node_name=os.environ.get("NODE_NAME") or None,
                       node_labels=bool_env("--node-labels", True) if args.node_labels is None else args.node_labels,
                       cpu_manager_state=Path(args.cpu_manager_state) if args.cpu_manager_state else None,
                       kubelet_config=Path(args.kubelet_config) if args.kubelet_config else None,
                       metrics_port=port(args.metrics_port) or None, metrics_address=args.metrics_address,
                       allocations_pod_names=(bool_env("--allocations-pod-names", False)
                                              if args.allocations_pod_names is None else args.allocations_pod_names),
                       cpuset_enforcement=args.cpuset_enforcement, cri_socket=cri_socket(args.cri_socket),
                       nri_socket=Path(args.nri_socket or DEFAULT_NRI_SOCKET),
                       shared_pool=bool_env("--shared-pool", False) if args.shared_pool is None else args.shared_pool,
                       stranded_policy=args.stranded_policy,
                       cpuset_interval=positive_seconds("--cpuset-interval", args.cpuset_interval),
                       mode=getattr(args, "mode", None) or "deviceplugin",
                       dra_registry_dir=Path(getattr(args, "dra_registry_dir", None) or DEFAULT_DRA_REGISTRY_DIR),
                       dra_plugin_dir=Path(getattr(args, "dra_plugin_dir", None) or DEFAULT_DRA_PLUGIN_DIR),
                       cdi_dir=Path(getattr(args, "cdi_dir", None) or DEFAULT_CDI_DIR),
                       dra_interval=positive_seconds("--dra-interval", getattr(args, "dra_interval", None) or "60"))


def cleanup_after_stop(args: argparse.Namespace, config: AgentConfig) -> None:
    """After serve stopped: clean the node up only if the agent's DaemonSet is being deleted (agent/node/uninstall)."""
    from agent.node.cleanup import cleanup_if_released, log
    from agent.node.kubeapi import LeanKubeApi

    namespace = os.environ.get("POD_NAMESPACE")
    if not namespace:
        log.warning("kept everything: --release-daemonset needs POD_NAMESPACE (the downward API's metadata.namespace)")
        return
    try:
        api = LeanKubeApi.in_cluster()
    except NodeLabelerError as exc:
        log.warning("kept everything: cannot reach the API server to look at DaemonSet %s: %s",
                    args.release_daemonset, exc)
        return
    cleanup_if_released(api, namespace=namespace, daemonset=args.release_daemonset, node_name=config.node_name,
                        kubelet_dir=config.kubelet_dir, resource_prefix=config.grouping.resource_prefix,
                        dra=config.mode == "dra", node_labels=config.node_labels,
                        seccomp_dir=Path(args.seccomp_profile_dir) if args.seccomp_profile_dir else None,
                        remove_slices=node_slice_remover(config))


def node_slice_remover(config: AgentConfig) -> Callable[[str], int] | None:
    if config.mode != "dra":
        return None
    from agent.app.build_dra import remove_node_slices

    return remove_node_slices
