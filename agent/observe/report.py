"""Render a grouping for people (a table) and for machines (JSON-ready dicts). Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.policy.grouping import Grouping, group_sizes, uniform_size
from agent.topology.cpulist import format_cpulist
from agent.topology.model import Machine, Topology
from agent.topology.snapshot_format import to_dict

if TYPE_CHECKING:  # explain's: discover, which imports this module, does not plan
    from agent.policy.allocation import AllocationSettings


def machine_dict(machine: Machine) -> dict[str, Any]:
    return dict(to_dict(Topology(machine=machine))["machine"])


def grouping_dict(topology: Topology, grouping: Grouping) -> dict[str, Any]:
    return {
        "machine": machine_dict(topology.machine),
        "fidelity": grouping.fidelity,
        "levels": list(grouping.levels),
        "level_reason": grouping.level_reason,
        "memory_nodes": list(topology.machine.memory_nodes),
        "groups": [
            {
                "resource": g.resource,
                "id": g.id,
                "level": g.level,
                "cpus": list(g.cpus),
                "cpulist": g.cpulist,
                "cores": len(g.cores),
                "threads_per_core": g.threads_per_core,
                "polarization": dict(g.polarization),
                "memory_node": g.memory_node,
                "memory_nodes": list(g.memory_nodes),
            }
            for g in grouping.groups
        ],
        "skipped": [{"cpus": list(s.cpus), "cpulist": format_cpulist(s.cpus), "reason": s.reason}
                    for s in grouping.skipped],
        "warnings": list(grouping.warnings),
        # The exact cpu request for one group of each resource; null where the groups differ in size.
        "cpu_request": {r: (sizes[0] if len(sizes) == 1 else None) for r, sizes in group_sizes(grouping).items()},
        "uniform": [{"resource": u.resource, "cpus": u.cpus, "left_out": list(u.left_out)} for u in grouping.uniform],
    }


def machine_line(m: Machine) -> str:
    """One line saying what the machine is (the log at start, ``discover`` and ``explain``)."""
    what = m.generation or (f"type {m.machine_type}" if m.machine_type else m.arch)
    if m.machine_type and m.generation:
        what = f"{m.generation} ({m.machine_type})"
    facility = {True: "yes", False: "no", None: "n/a" if not m.is_s390 else "unknown"}[m.topology_facility]
    return (f"machine: {what}, environment {m.environment}, topology facility {facility}, "
            f"dispatching {m.dispatching}, SMT {m.smt_threads}, memory nodes "
            f"{','.join(map(str, m.memory_nodes))}")


def request_lines(grouping: Grouping) -> list[str]:
    """What a pod asking for one group of each resource must request as ``cpu`` on this node."""
    lines = []
    kept = {u.resource: u for u in grouping.uniform}
    for resource, sizes in group_sizes(grouping).items():
        if len(sizes) == 1:
            how = (f" (--uniform-groups left out {len(kept[resource].left_out)} of another size)"
                   if kept.get(resource) and kept[resource].left_out else "")
            lines.append(f'pod spec: {resource}: N needs cpu: N x {sizes[0]} (every {resource} has {sizes[0]} '
                         f'CPUs; for N = 1: cpu: "{sizes[0]}", no cpu limit){how}')
        else:
            counts = [len(g.cpus) for g in grouping.by_resource(resource)]
            lines.append(f"pod spec: {resource} groups differ in size ({', '.join(map(str, sizes))} CPUs): no one "
                         f"cpu request is right for every group kubelet may pick; --uniform-groups advertises only "
                         f"the {uniform_size(counts)}-CPU ones")
    return lines


def _where(c: object) -> str:
    """drawer/book/socket/core of a CPU, leaving out what the kernel does not report."""
    parts = [f"{name} {getattr(c, name)}" for name in ("drawer", "book", "socket", "core")
             if getattr(c, name) is not None]
    return " ".join(parts) or "no topology ids"


def table(topology: Topology, grouping: Grouping) -> str:
    header = ("RESOURCE", "DEVICE", "CPUS", "CORES", "THREADS/CORE", "POLARIZATION", "MEMORY NODE")
    rows = [header] + [
        (g.resource, g.id, g.cpulist, str(len(g.cores)), str(g.threads_per_core), g.polarization_summary,
         ",".join(map(str, g.memory_nodes)))
        for g in grouping.groups
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [machine_line(topology.machine),
             f"levels: {','.join(grouping.levels) or 'none'} ({grouping.level_reason})", ""]
    if grouping.groups:
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines += ["", *request_lines(grouping)]
    else:
        lines.append("no groups advertised")
    if grouping.skipped:
        lines += ["", "not advertised:"]
        lines += [f"  cpus {format_cpulist(s.cpus)}: {s.reason}" for s in grouping.skipped]
    if grouping.warnings:
        lines += ["", "warnings:"] + [f"  {w}" for w in grouping.warnings]
    return "\n".join(lines) + "\n"


GONE = ("offline", "standby (deconfigured)")  # grouping's reasons for CPUs that cannot run anything now
OFFLINE_HOLDERS = ("a pod still holding a group these CPUs were in (advertised before they went away) keeps it, "
                   "Unhealthy; with cpuset enforcement its containers run on the CPUs no other pod holds, never on "
                   "another pod's (when none is left their creation is refused, and the pod is evicted with "
                   "--stranded-policy evict): metric topology_agent_cpuset_holders_offline, Warning Event "
                   "TopologyHolderOffline on the Node")


def explain(topology: Topology, grouping: Grouping, settings: AllocationSettings) -> str:
    """Per group: why each CPU is in it and what it does there, then the exact environment
    Allocate returns for that group alone; then every CPU left out, with the reason."""
    from agent.policy.allocation import plan_allocation

    by_number = topology.by_number()
    lines = [machine_line(topology.machine),
             f"levels: {','.join(grouping.levels) or 'none'} ({grouping.level_reason})"]
    if grouping.groups:
        lines.append("vLLM: a container holding N groups gets N CPU lists in VLLM_CPU_OMP_THREADS_BIND (and "
                     "TOPOLOGY_RANKS=N): run it with tensor-parallel size x pipeline-parallel size = N, or vLLM "
                     "stops at start-up")
        lines += request_lines(grouping)
    for g in grouping.groups:
        plan = plan_allocation([g], settings)
        omp = set(plan.ranks[0])
        kept_cores = {core for core in g.cores if set(core) & omp}
        lines += ["", f"{g.resource} {g.id}: cpus {g.cpulist}, {len(g.cores)} cores x {g.threads_per_core} threads, "
                      f"memory node {','.join(map(str, g.memory_nodes))}"]
        for core in g.cores:
            for cpu in core:
                c = by_number[cpu]
                where = _where(c)
                if cpu in omp:
                    role = "OpenMP place"
                elif core in kept_cores:
                    role = "sibling thread: in TOPOLOGY_CPUS, not an OpenMP place (--omp-threads-per-core 1)"
                else:
                    role = "reserved core: in TOPOLOGY_CPUS, left to the serving process (--reserve-cores-per-group)"
                lines.append(f"  cpu {cpu:>4}  {where}, {c.polarization}: {role}")
        lines.append(f"  Allocate returns, for {g.resource}: 1 (run vLLM with TP x PP = 1):")
        lines += [f"    {key}={value}" for key, value in plan.envs.items()]
        lines += [f"    annotation {key}={value}" for key, value in plan.annotations.items()]
    if grouping.skipped:
        lines += ["", "left out:"]
        for s in grouping.skipped:
            lines.append(f"  cpus {format_cpulist(s.cpus)}: {s.reason}")
            if s.reason in GONE:
                lines.append(f"    {OFFLINE_HOLDERS}")
    if grouping.warnings:
        lines += ["", "warnings:"] + [f"  {w}" for w in grouping.warnings]
    return "\n".join(lines) + "\n"
