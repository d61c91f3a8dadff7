"""Door: what any user who can create a pod writes: its annotations and labels (the agent's own annotation keys
among them, with any value: ids of groups others hold, lists of thousands, garbage), and the environment its
containers carry (``TOPOLOGY_DRA_CLAIM`` naming claims of other namespaces, unknown ones, garbage). They reach the
NRI hooks (agent/enforce/nri_hooks.py) as create, update, stop, remove and synchronize events in any order, here in
DRA mode with one claim prepared for pod ``owner`` of namespace ``default`` (its book, CPU 1, is held). Right answer:
the owner's container runs on CPU 1 and no other container is ever given it; refusal: Refused, one line. Never
another exception, never a cpuset outside the online CPUs.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from hypothesis import strategies as st

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.devices.table import NodeDevices
from agent.enforce.nri_hooks import NriEnforcement
from agent.nri.stub import Refused
from agent.plugin.servicer import render as render_wire
from agent.policy.allocation import AllocationSettings
from agent.policy.container_claims import CLAIM_ENV, PreparedRequest
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.cpulist import parse_cpulist
from tests.fuzz.common import door, refused
from tests.support.enforcement import DOMAIN, three_books

SETTINGS = GroupingSettings(levels=("book",))
GROUPING = group_topology(three_books(), SETTINGS)
OWNED = GROUPING.groups[1]  # CPU 1: the prepared claim's book
PREPARED = {"uid-1/book": PreparedRequest("default", "claim", ((OWNED.resource, OWNED.id),))}
ONLINE = frozenset({0, 1, 2})

texts = st.text(max_size=12) | st.sampled_from(["", ",", ",,,", OWNED.id, OWNED.resource, "uid-1/book", "\x00"])
group_lists = st.lists(st.sampled_from([g.id for g in GROUPING.groups] + ["nope", ""]), max_size=5).map(",".join) \
    | st.just(",".join([OWNED.id] * 5000)) | texts
our_keys = st.sampled_from([f"{DOMAIN}/groups", f"{DOMAIN}/resource", f"{DOMAIN}/cpus", f"{DOMAIN}/x", "other/k"])
annotation_maps = st.dictionaries(our_keys | st.text(max_size=10), group_lists, max_size=5)
labels = st.dictionaries(st.text(max_size=10), texts, max_size=3)
claim_env = st.lists(st.sampled_from(["uid-1/book", "uid-2/book", "uid-1/", "/book", "", "x" * 5000]).map(
    lambda v: f"{CLAIM_ENV}={v}") | st.text(max_size=20), max_size=3)


PODS = [(namespace, name) for namespace in ("default", "other", "") for name in ("mallory", "eve")]


@st.composite
def event(draw: st.DrawFn, pod_notes: dict[tuple[str, str], dict[str, str]]) -> tuple[str, nri.PodSandbox,
                                                                                      nri.Container]:
    """One event of a pod; a pod's annotations are its own, the same in every event (the sandbox keeps them)."""
    owner = draw(st.integers(0, 4)) == 0
    namespace, name = ("default", "owner") if owner else draw(st.sampled_from(PODS))
    notes = pod_notes.get((namespace, name), {})
    pod = nri.PodSandbox(id=f"pod-{namespace}-{name}", name=name, namespace=namespace, uid=f"u-{namespace}-{name}",
                         annotations=notes, labels=draw(labels))
    env = [f"{CLAIM_ENV}=uid-1/book"] if owner else draw(claim_env)
    if namespace == "default" and not owner:  # a claim of the pod's own namespace is its to name: not an attack
        env = [e for e in env if not e.startswith(f"{CLAIM_ENV}=uid-1/book")]
    container = nri.Container(id=f"c-{name}-{namespace}-{draw(st.integers(0, 2))}", pod_sandbox_id=pod.id, name="c",
                              state=draw(st.sampled_from([nri.CONTAINER_RUNNING, nri.CONTAINER_CREATED])),
                              annotations=notes, labels=draw(labels), env=env)
    cpus = draw(st.sampled_from(["", "0-2", "1", "0,2", "x"]))
    if cpus:
        container.linux.resources.cpu.cpus = cpus
    kind = draw(st.sampled_from(["create", "create", "create", "update", "stop", "remove", "synchronize"]))
    return kind, pod, container


def cpus_of(update: Any) -> set[int]:
    text = update.linux.resources.cpu.cpus
    return set(parse_cpulist(text)) if text else set()


@door("pod-annotations", "pods", st.fixed_dictionaries({p: annotation_maps for p in PODS}).flatmap(
    lambda notes: st.lists(event(notes), min_size=1, max_size=10)), st.booleans())
def pod_annotations(events: list[tuple[str, nri.PodSandbox, nri.Container]], shared_pool: bool) -> None:
    devices = NodeDevices(GROUPING, SETTINGS, AllocationSettings(), render_wire, mode="dra")
    groups = {(g.resource, g.id): g for g in GROUPING.groups}
    hooks = NriEnforcement(devices, groups, DOMAIN, online=lambda: ONLINE, reserved=frozenset(),
                           shared_pool=shared_pool, cpu_manager_policy=lambda: None, claims=lambda: PREPARED)
    seen: list[tuple[str, nri.PodSandbox, nri.Container]] = []
    for kind, pod, container in events:
        seen.append((kind, pod, container))
        given: dict[str, set[int]] = {}  # container id -> CPUs the answer gives it
        if kind == "create":
            answer = refused(partial(hooks.create_container, pod, container), Refused)
            if isinstance(answer, nri.CreateContainerResponse):
                if answer.adjust.linux.resources.cpu.cpus:
                    given[container.id] = cpus_of(answer.adjust)
                given |= {u.container_id: cpus_of(u) for u in answer.update}
        elif kind == "update":
            updates = hooks.update_container(pod, container, container.linux.resources)
            given |= {u.container_id: cpus_of(u) for u in updates}
        elif kind == "stop":
            given |= {u.container_id: cpus_of(u) for u in hooks.stop_container(pod, container)}
        elif kind == "remove":
            hooks.remove_container(pod, container)
        else:
            pods = [p for _, p, _ in seen]
            given |= {u.container_id: cpus_of(u) for u in hooks.synchronize(pods, [c for _, _, c in seen])}
        for cid, cpus in given.items():
            assert cpus <= ONLINE, (cid, cpus)
            if not cid.startswith("c-owner-"):
                assert not cpus & set(OWNED.cpus), f"{cid} was given the owner's CPUs {sorted(cpus)}"
        if kind == "create" and pod.name == "owner" and container.id in given:
            assert given[container.id] == set(OWNED.cpus)  # the right answer: the claim's book
