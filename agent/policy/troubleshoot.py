"""Why a pod asking for a topology resource would stay Pending or be rejected on this node: what ``explain`` says
at its end (docs/admin/troubleshooting.md). Pure: the node's grouping -> lines."""

from __future__ import annotations

from agent.policy.grouping import LEVELS, Grouping

NODE_STATUS_LAG = "about 10 s"  # kubelet's node status update; 9.2-9.8 s measured on the real-cluster lane


def pending_causes(grouping: Grouping, prefix: str, nothing: tuple[str, str] | None) -> list[str]:
    """One line per cause that applies here, each with the symptom and the fix. ``nothing`` is the
    (code, reason) of a node that advertises nothing (agent.node.labels.not_advertised)."""
    lines: list[str] = []
    if nothing is not None:
        code, reason = nothing
        lines.append(f"nothing is advertised ({code}): every topology pod stays Pending with \"0/1 nodes are "
                     f"available: 1 Insufficient {prefix}/book\"; the Node says so in the label "
                     f"topology.s390x.ibm.com/advertised={code} and a TopologyNotAdvertised event: {reason}")
        return lines
    advertised = [level for level in LEVELS if level in grouping.levels]
    for level in ("book", "socket"):  # drawer is opt-in: its absence is no surprise
        if level not in advertised:
            lines.append(f"{prefix}/{level} is not advertised here (levels: {','.join(advertised)}): a pod asking "
                         f"for it stays Pending with \"Insufficient {prefix}/{level}\"; fix: --levels "
                         f"{','.join([*advertised, level])} (chart: agent.levels)")
    small = [s.reason for s in grouping.skipped if "fewer than" in s.reason]
    if small:
        lines.append(f"{len(small)} group(s) too small to advertise (--min-group-cores): a pod cannot get them, "
                     "and asking for more groups than are left stays Pending with \"Insufficient\"")
    if len(advertised) > 1:
        inner = advertised[-1]
        lines.append(f"{'/'.join(advertised)} overlap: while a {advertised[0]} is held its {inner}s are blocked "
                     f"(Unhealthy to kubelet): a pod asking for one stays Pending with \"Insufficient "
                     f"{prefix}/{inner}\" when none is free; the scheduler sees a block {NODE_STATUS_LAG} after the "
                     f"{advertised[0]} pod starts, and a release {NODE_STATUS_LAG} after it ends (one level per node "
                     "pool avoids both)")
    counts = {r: sum(1 for g in grouping.groups if g.resource == r) for r in grouping.resources()}
    for resource, count in counts.items():
        lines.append(f"{resource}: {count} on this node: a pod asking for more than {count} (or for more than are "
                     f"free) stays Pending with \"Insufficient {resource}\"")
    lines.append("a container asking for a topology resource without an integer cpu request, or for two of them, "
                 "is rejected at creation by the chart's admission policy; a Guaranteed pod (cpu limit = request) "
                 "is pinned elsewhere by kubelet's static CPU manager (label topology.s390x.ibm.com/"
                 "cpu-manager-policy=static, metric topology_agent_cpu_manager_static 1)")
    return lines


def pending_text(grouping: Grouping, prefix: str, nothing: tuple[str, str] | None) -> str:
    causes = pending_causes(grouping, prefix, nothing)
    return "\nwhy a topology pod would stay Pending or be rejected here (docs/admin/troubleshooting.md):\n" + \
           "".join(f"  - {line}\n" for line in causes)
