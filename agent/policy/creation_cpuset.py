"""Which cpuset a container gets when the runtime creates it (``--cpuset-enforcement nri``), and what the others need
at that moment. Pure, and the same rules as :mod:`agent.policy.cpuset`.

Must hold: a container whose groups are known (pod-resources, Allocate's annotations, or in DRA mode a prepared claim
its CDI environment names: :mod:`agent.policy.container_claims`) is created on its groups' CPUs and memory nodes;
with the shared pool every other container is created inside it and the running ones are confined to what the new
holder leaves; a container the pool cannot take is refused (the runtime fails its creation, kubelet retries it),
never created on every CPU. Why: docs/contributing/design/cpuset-enforcement.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.policy.cpuset import RunningContainer, Update, desired_topology, plan_cpusets
from agent.policy.grouping import Group
from agent.policy.keys import DeviceKey, Identity


@dataclass(frozen=True, slots=True)
class CreationPlan:
    adjust: Update | None  # the new container's cpuset (kind "topology", "shrink" or "offline"), None: as asked for
    others: tuple[Update, ...]  # running containers to move (never the new one)
    pool: tuple[int, ...]
    refused: str = ""  # why the container must not be created now ("": it may)


def plan_creation(new: RunningContainer, running: Iterable[RunningContainer],
                  holders: Mapping[Identity, Iterable[DeviceKey]], held: Iterable[DeviceKey],
                  groups: Mapping[DeviceKey, Group], online: Iterable[int], reserved: Iterable[int] = (),
                  shared_pool: bool = False) -> CreationPlan:
    """The new container's cpuset and the updates of the others, planned together: its groups, and those of
    every running holder, count as taken (Allocate came first, but pod-resources may not list its holder yet)."""
    others = [c for c in running if c.id != new.id]
    plan = plan_cpusets([new, *others], holders, held, groups, online, reserved, shared_pool)
    adjust = next((u for u in plan.updates if u.container == new.id), None)
    rest = tuple(u for u in plan.updates if u.container != new.id)
    refused = ""
    if new.identity in plan.stranded:
        refused = ("every CPU of its groups is offline and no CPU is left outside other holders' groups: refused "
                   "rather than created on CPUs other pods hold")
    elif plan.pool_empty and not desired_topology(new, holders, groups):
        refused = ("the shared pool is empty (every online CPU is in a held group, none reserved): refused rather "
                   "than created on CPUs other pods hold; it is created once a group is freed (or give "
                   "--reserved-cpus)")
    return CreationPlan(None if refused else adjust, rest, plan.pool, refused)
