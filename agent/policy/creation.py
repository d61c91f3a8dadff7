"""Which cpuset a container gets when the runtime creates it (``--cpuset-enforcement nri``), and
what the others need at that moment. Pure, and the same rules as :mod:`agent.policy.cpuset`:

* a container whose groups are known (pod-resources names its holder, or Allocate's annotations
  name its groups) is created on its groups' CPUs and memory nodes;
* with the shared pool, every other container is created inside the pool, and the containers
  already running are confined to the pool the new holder leaves (the updates in the reply);
* a container with nothing to say about is created as it was asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.policy.cpuset import Identity, RunningContainer, Update, desired_topology, plan_cpusets
from agent.policy.grouping import Group
from agent.policy.health import DeviceKey


@dataclass(frozen=True, slots=True)
class CreationPlan:
    adjust: Update | None  # the new container's cpuset (kind "topology" or "shrink"), None: as asked for
    others: tuple[Update, ...]  # running containers to move (never the new one)
    pool: tuple[int, ...]


def plan_creation(new: RunningContainer, running: Iterable[RunningContainer],
                  holders: Mapping[Identity, Iterable[DeviceKey]], held: Iterable[DeviceKey],
                  groups: Mapping[DeviceKey, Group], online: Iterable[int], reserved: Iterable[int] = (),
                  shared_pool: bool = False) -> CreationPlan:
    """The new container's cpuset and the updates of the others, with its groups counted as held
    (Allocate came first, but pod-resources may not list its holder yet)."""
    online_set = frozenset(online)
    mine = {(g.resource, g.id) for g in desired_topology(new, holders, groups)}
    held_now = frozenset(held) | mine
    own = plan_cpusets([new], holders, held_now, groups, online_set, reserved, shared_pool)
    others = [c for c in running if c.id != new.id]
    rest = plan_cpusets(others, holders, held_now, groups, online_set, reserved, shared_pool)
    return CreationPlan(own.updates[0] if own.updates else None, rest.updates, own.pool)


def enforcement_mode(requested: str, nri_answers: bool, cri_socket_exists: bool) -> tuple[str, str]:
    """The enforcement in force for ``--cpuset-enforcement`` (none, cri, nri, auto) and why.

    auto: NRI when its socket answers (the cpuset is right at creation), else CRI when a CRI socket
    exists (pinned shortly after the start), else none."""
    if requested != "auto":
        return requested, f"--cpuset-enforcement {requested}"
    if nri_answers:
        return "nri", "auto: the NRI socket answers"
    if cri_socket_exists:
        return "cri", "auto: no NRI socket answers, a CRI socket exists"
    return "none", "auto: neither an NRI socket answers nor a CRI socket exists"
