"""``topology-agent demo``: the agent on a bundled z16-shaped snapshot against the kubelet
emulator, two inference pods, one kubelet restart. Everything runs in this process, in a
temporary directory, in a few seconds."""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agent.app.build import build_agent
from agent.app.config import AgentConfig
from agent.plugin.timing import Timing
from agent.policy.allocation import ENV_KEYS, AllocationSettings
from agent.policy.grouping import GroupingSettings
from agent.topology.model import Topology
from topology_devkit.kubelet_emulator import Container, KubeletEmulator

SHOWN_ENV = ENV_KEYS


def _machine_summary(topology: Topology) -> str:
    m = topology.machine
    usable = [c for c in topology.cpus if c.online and c.configured]
    drawers = {c.drawer for c in usable}
    books = {c.book_key for c in usable}
    sockets = {c.socket_key for c in usable}
    name = f"{m.generation} ({m.machine_type})" if m.generation else (m.machine_type or m.arch)
    return (f"{name} {m.environment}, SMT-{m.smt_threads}, {len(usable)} CPUs in {len(drawers)} drawer(s), "
            f"{len(books)} books, {len(sockets)} sockets, memory node(s) {','.join(map(str, m.memory_nodes))}")


def _registered_again(kubelet: KubeletEmulator, resource: str) -> bool:
    return kubelet.registrations(resource) >= 2 and kubelet.allocatable(resource) > 0


def run_demo(topology: Topology, grouping: GroupingSettings, allocation: AllocationSettings,
             out: Callable[[str], None] = print) -> int:
    # The narrative below says what happens; the agent's own log lines would only interleave.
    logging.getLogger().setLevel(logging.ERROR)
    logging.getLogger("kubelet-emulator").setLevel(logging.CRITICAL)
    root = Path(tempfile.mkdtemp(prefix="tpa-demo-", dir="/tmp"))
    kubelet = KubeletEmulator(root)
    config = AgentConfig(kubelet_dir=kubelet.device_plugin_dir, grouping=grouping, allocation=allocation,
                         pod_resources_socket=kubelet.pod_resources_socket,
                         timing=Timing(poll=0.02, backoff_min=0.02, backoff_max=0.5))
    kubelet.start()
    agent = build_agent(topology, config)
    try:
        out(f"1. The node: {_machine_summary(topology)}")
        out(f"   grouping: {agent.grouping.level_reason}")
        for skipped in agent.grouping.skipped:
            if " not advertised: " in skipped.reason:
                out(f"   {skipped.reason.split(';')[0]}: it stays unadvertised, so no pod is handed it")
        started = time.monotonic()
        agent.start()
        resources = agent.grouping.resources()
        if not resources:
            out("   nothing to advertise on this topology: " + "; ".join(s.reason for s in agent.grouping.skipped))
            return 0
        for resource in resources:
            kubelet.wait_registered(resource, timeout=10)
        out(f"2. The agent served and registered with the (emulated) kubelet in "
            f"{(time.monotonic() - started) * 1000:.0f} ms. kubelet now sees:")
        for resource in resources:
            out(f"   {resource}: capacity {kubelet.capacity(resource)}, allocatable {kubelet.allocatable(resource)}")
            for g in agent.grouping.by_resource(resource):
                out(f"     {g.id:<24} cpus {g.cpulist:<12} {len(g.cores)} cores x {g.threads_per_core} threads")
        resource = resources[0]
        step = 3
        for pod, count in (("vllm-tp1", 1), ("vllm-tp2", 2)):
            free = kubelet.allocatable(resource) - len(kubelet.allocated(resource))
            if count > free:
                out(f"{step}. Pod {pod} asks for {resource}: {count}; {free} free, so kubelet would not admit it.")
                step += 1
                continue
            admitted = kubelet.admit_pod("default", pod, [Container("vllm", {resource: count})])
            env = kubelet.start_container("default", pod, "vllm")
            out(f"{step}. Pod {pod} asks for {resource}: {count} and gets "
                f"{', '.join(admitted.devices('vllm', resource))}. Its container starts with:")
            for key in SHOWN_ENV:
                out(f"     {key}={env[key]}")
            out(f"   vLLM runs one rank per list of VLLM_CPU_OMP_THREADS_BIND: start it with tensor-parallel size "
                f"x pipeline-parallel size = {env['TOPOLOGY_RANKS']}.")
            step += 1
        kubelet.restart(down_for=0.2, block=False)
        kubelet.wait_for(lambda: kubelet.is_running, timeout=10, what="kubelet back up")
        back = time.monotonic()
        for r in resources:
            kubelet.wait_for(functools.partial(_registered_again, kubelet, r), timeout=10,
                             what=f"re-registration of {r}")
        out(f"{step}. kubelet restarted (deleted every socket, back after 200 ms): the agent noticed, served "
            f"again and re-registered {(time.monotonic() - back) * 1000:.0f} ms after kubelet.sock came back.")
        for r in resources:
            out(f"   {r}: allocatable {kubelet.allocatable(r)}, in use {len(kubelet.allocated(r))} "
                "(allocations survive the restart)")
        env = kubelet.start_container("default", "vllm-tp1", "vllm")
        out(f"{step + 1}. Restarting vllm-tp1's container replays the same environment "
            f"(TOPOLOGY_CPUS={env['TOPOLOGY_CPUS']}). Done.")
        return 0
    finally:
        kubelet.stop()
        agent.stop()
        shutil.rmtree(root, ignore_errors=True)
