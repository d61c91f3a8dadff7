"""Which cpuset a container gets when the runtime creates it (``--cpuset-enforcement nri``), and
what the others need at that moment. Pure, and the same rules as :mod:`agent.policy.cpuset`:

* a container whose groups are known (pod-resources names its holder, Allocate's annotations name
  its groups, or in DRA mode its CDI environment names a claim request the agent prepared for its
  namespace: :func:`agent.policy.claims.with_claims` adds those to ``holders``, and
  :func:`agent.policy.claims.prepared_keys` every prepared claim's devices to ``held``) is created on
  its groups' CPUs and memory nodes;
* with the shared pool, every other container is created inside the pool, and the containers
  already running are confined to the pool the new holder leaves (the updates in the reply);
* a container with nothing to say about is created as it was asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.policy.cpuset import Identity, RunningContainer, Update, desired_topology, plan_cpusets
from agent.policy.enforcement_choice import enforcement_mode as enforcement_mode  # its home before
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
