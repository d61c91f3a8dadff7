"""Which cpuset each running container should have (pure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.policy.cpuset import RunningContainer, plan_cpusets
from agent.policy.grouping import Group, GroupingSettings, group_topology
from agent.policy.keys import DeviceKey
from agent.topology.embedded import load_embedded
from tests.support.env import BOOK

GROUPING = group_topology(load_embedded("z16-lpar"), GroupingSettings(levels=("book",)))
GROUPS = {(g.resource, g.id): g for g in GROUPING.groups}
ONLINE = frozenset(range(82))
BOOK0, BOOK1 = (BOOK, "drawer0-book0"), (BOOK, "drawer0-book1")


def container(name: str, cpus: frozenset[int] = frozenset(), **kw: object) -> RunningContainer:
    return RunningContainer(id=f"id-{name}", identity=("ns", name, "c"), cpus=cpus, **kw)  # type: ignore[arg-type]


def test_a_holder_is_pinned_to_its_groups_and_only_what_differs_is_sent() -> None:
    holders = {("ns", "llm", "c"): {BOOK0}}
    plan = plan_cpusets([container("llm")], holders, {BOOK0}, GROUPS, ONLINE)
    (update,) = plan.updates
    assert (update.container, update.cpus, update.mems, update.kind) == ("id-llm", "0-11", "0", "topology")
    again = plan_cpusets([container("llm", frozenset(range(12)), mems="0")], holders, {BOOK0}, GROUPS, ONLINE)
    assert again.updates == () and again.pinned == again.topology_containers == 1


def test_a_new_container_is_known_by_its_annotations_before_pod_resources_lists_it() -> None:
    new = container("llm", annotated_groups=("drawer0-book0", "drawer0-book1"), annotated_resource=BOOK)
    (update,) = plan_cpusets([new], {}, {BOOK0, BOOK1}, GROUPS, ONLINE).updates
    assert update.cpus == "0-21"
    forged = container("x", annotated_groups=("drawer9-book9",), annotated_resource=BOOK)
    assert plan_cpusets([forged], {}, set(), GROUPS, ONLINE).updates == ()  # unknown ids pin nothing


def test_without_the_shared_pool_other_containers_are_never_touched() -> None:
    others = [container("web", frozenset(range(82))), container("db")]
    assert plan_cpusets(others, {}, {BOOK0}, GROUPS, ONLINE).updates == ()


def test_the_shared_pool_excludes_held_groups_keeps_reserved_cpus_and_widens_when_freed() -> None:
    web = container("web")
    plan = plan_cpusets([web], {}, {BOOK0}, GROUPS, ONLINE, reserved={0, 1}, shared_pool=True)
    (update,) = plan.updates
    assert (update.cpus, update.kind, update.mems) == ("0-1,12-81", "shrink", "")
    confined = container("web", frozenset({0, 1, *range(12, 82)}))
    (widen,) = plan_cpusets([confined], {}, set(), GROUPS, ONLINE, reserved={0, 1}, shared_pool=True).updates
    assert (widen.cpus, widen.kind) == ("0-81", "widen")


def test_an_empty_pool_shrinks_nobody() -> None:
    only_book0 = frozenset(range(12))  # every online CPU is in the held group
    plan = plan_cpusets([container("web")], {}, {BOOK0}, GROUPS, only_book0, shared_pool=True)
    assert plan.pool_empty and plan.updates == ()
    with_reserved = plan_cpusets([container("web")], {}, {BOOK0}, GROUPS, only_book0, reserved={0}, shared_pool=True)
    assert not with_reserved.pool_empty and with_reserved.updates[0].cpus == "0"


def test_offline_cpus_are_never_pinned() -> None:
    holders = {("ns", "llm", "c"): {BOOK0}}
    (update,) = plan_cpusets([container("llm")], holders, {BOOK0}, GROUPS, ONLINE - {10, 11}).updates
    assert update.cpus == "0-9"


@settings(max_examples=200, deadline=None)
@given(st.sets(st.sampled_from(sorted(GROUPS)), max_size=8), st.sets(st.integers(0, 81), max_size=4),
       st.lists(st.tuples(st.booleans(), st.sets(st.integers(0, 81), max_size=20)), max_size=6))
def test_no_container_is_ever_left_without_cpus_and_holders_never_share(
        held: set[DeviceKey], reserved: set[int], specs: list[tuple[bool, set[int]]]) -> None:
    holders: dict[tuple[str, str, str], set[DeviceKey]] = {}
    containers = []
    free = sorted(held)
    for i, (holds, cpus) in enumerate(specs):
        identity = ("ns", f"p{i}", "c")
        if holds and free:
            holders[identity] = {free.pop()}
        containers.append(RunningContainer(f"id{i}", identity, frozenset(cpus)))
    plan = plan_cpusets(containers, holders, held, GROUPS, ONLINE, reserved, shared_pool=True)
    by_container = {u.container: u for u in plan.updates}
    pinned: dict[str, set[int]] = {}
    for c in containers:
        update = by_container.get(c.id)
        cpus = {int(x) for part in update.cpus.split(",") for x in _expand(part)} if update else set(c.cpus or ONLINE)
        assert cpus, "a container without CPUs"
        if c.identity in holders:
            pinned[c.id] = cpus
        elif update is not None:  # a pool container: no held group's CPU, every reserved CPU
            assert not cpus & {x for k in held for x in GROUPS[k].cpus} - reserved
            assert reserved <= cpus
    ids = list(pinned)
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            assert not pinned[a] & pinned[b]


def _expand(part: str) -> range:
    lo, _, hi = part.partition("-")
    return range(int(lo), int(hi or lo) + 1)


# --- claims, an empty pool, offline and stranded holders ---------------------------------------------------

BOTH = group_topology(load_embedded("z16-lpar"), GroupingSettings(levels=("book", "socket")))
BOTH_GROUPS = {(g.resource, g.id): g for g in BOTH.groups}
SOCKET_OF_BOOK1 = ("topology/socket", "drawer0-book1-socket0")


def test_a_running_holder_the_ledger_lost_still_counts_as_taken() -> None:
    """The ledger lacks llm's book (a kubelet restart with the API server away, an agent restart without
    pod-resources), but llm runs pinned by its annotations: nobody else is widened onto its book."""
    llm = container("llm", frozenset(range(12)), mems="0", annotated_groups=("drawer0-book0",),
                    annotated_resource=BOOK)
    web = container("web", frozenset(range(12, 82)))
    plan = plan_cpusets([llm, web], {}, set(), GROUPS, ONLINE, shared_pool=True)
    assert plan.updates == () and plan.pool == tuple(range(12, 82))
    listed = plan_cpusets([container("llm", frozenset(range(12)), mems="0"), web], {("ns", "llm", "c"): {BOOK0}},
                          set(), GROUPS, ONLINE, shared_pool=True)  # listed, but no longer held in the ledger
    assert listed.updates == () and listed.pool == tuple(range(12, 82))


def test_a_new_plain_container_is_created_off_a_running_holders_book_the_ledger_lost() -> None:
    from agent.policy.creation_cpuset import plan_creation

    llm = container("llm", frozenset(range(12)), mems="0", annotated_groups=("drawer0-book0",),
                    annotated_resource=BOOK)
    new = container("new")
    plan = plan_creation(new, [llm, new], {}, (), GROUPS, ONLINE, shared_pool=True)
    assert plan.adjust is not None and plan.adjust.cpus == "12-81" and plan.others == ()


def test_a_holder_whose_groups_are_all_offline_is_confined_to_the_pool_and_reported() -> None:
    """Nothing of its book is online: it never runs on another holder's CPUs."""
    holders = {("ns", "llm", "c"): {BOOK0}, ("ns", "other", "c"): {BOOK1}}
    online = ONLINE - set(range(12))
    llm, other = container("llm"), container("other", frozenset(range(12, 22)), mems="0")
    plan = plan_cpusets([llm, other], holders, {BOOK0, BOOK1}, GROUPS, online)
    (update,) = plan.updates
    assert (update.container, update.cpus, update.kind, update.mems) == ("id-llm", "22-81", "offline", "")
    assert plan.offline == (("ns", "llm", "c"),) and plan.topology_containers == 2 and plan.pinned == 1
    again = plan_cpusets([container("llm", frozenset(range(22, 82))), other], holders, {BOOK0, BOOK1}, GROUPS, online)
    assert again.updates == () and again.offline == (("ns", "llm", "c"),)
    back = plan_cpusets([container("llm", frozenset(range(22, 82))), other], holders, {BOOK0, BOOK1}, GROUPS, ONLINE)
    assert [(u.cpus, u.kind) for u in back.updates] == [("0-11", "topology")] and back.offline == ()


def test_an_offline_holder_with_no_pool_left_is_stranded_not_spread_over_other_holders() -> None:
    holders = {("ns", "llm", "c"): {BOOK0}, ("ns", "other", "c"): {BOOK1}}
    online = frozenset(range(12, 22))  # book 0 offline, only book 1 (held by other) online
    plan = plan_cpusets([container("llm"), container("other", frozenset(range(12, 22)), mems="0")], holders,
                        {BOOK0, BOOK1}, GROUPS, online)
    assert plan.updates == () and plan.stranded == (("ns", "llm", "c"),)
    from agent.policy.creation_cpuset import plan_creation

    new = container("llm")
    created = plan_creation(new, [new], holders, {BOOK0, BOOK1}, GROUPS, online)
    assert created.refused and "offline" in created.refused


def test_a_new_plain_container_is_refused_when_the_shared_pool_is_empty() -> None:
    """Also: an empty pool; a new ordinary container must never be created on every CPU (NRI refuses it)."""
    from agent.policy.creation_cpuset import plan_creation

    only_book0 = frozenset(range(12))
    new = container("web")
    plan = plan_creation(new, [new], {}, {BOOK0}, GROUPS, only_book0, shared_pool=True)
    assert plan.adjust is None and plan.refused and "shared pool is empty" in plan.refused
    assert plan_creation(new, [new], {}, {BOOK0}, GROUPS, only_book0, shared_pool=False).refused == ""
    with_reserved = plan_creation(new, [new], {}, {BOOK0}, GROUPS, only_book0, reserved={0}, shared_pool=True)
    assert not with_reserved.refused and with_reserved.adjust is not None and with_reserved.adjust.cpus == "0"


def test_annotations_that_clash_with_a_listed_holder_are_not_believed() -> None:
    """Also: annotation passthrough. A container's annotations naming a group whose CPUs pod-resources lists for
    another container are not what kubelet allocated: it is treated as any other container."""
    holders = {("ns", "llm", "c"): {SOCKET_OF_BOOK1}}
    forged = container("x", annotated_groups=("drawer0-book1",), annotated_resource=BOOK)
    plan = plan_cpusets([forged], holders, {SOCKET_OF_BOOK1}, BOTH_GROUPS, ONLINE, shared_pool=True)
    (update,) = plan.updates
    assert update.kind == "shrink" and not set(range(12, 18)) & set(_cpus(update.cpus))
    assert plan.topology_containers == 0
    mine = container("llm", annotated_groups=("drawer0-book1-socket0",), annotated_resource="topology/socket")
    assert plan_cpusets([mine], holders, {SOCKET_OF_BOOK1}, BOTH_GROUPS, ONLINE).updates[0].cpus == "12-17"


def _cpus(text: str) -> list[int]:
    return [c for part in text.split(",") for c in _expand(part)]


def test_an_offline_holder_without_a_cpuset_of_its_own_gets_the_pool_explicitly() -> None:
    """Its parent's CPUs include its groups' ones, which may come back (or, on a fake topology, never left)."""
    online = ONLINE - set(range(12))
    alone = plan_cpusets([container("llm")], {("ns", "llm", "c"): {BOOK0}}, {BOOK0}, GROUPS, online)
    assert [(u.cpus, u.kind) for u in alone.updates] == [("12-81", "offline")]  # the pool is every online CPU


def _one_cpu_books(cpus: int) -> dict[DeviceKey, Group]:
    """The soak's fake topology: ``cpus`` one-CPU books of one socket each, advertised as books and sockets."""
    groups: dict[DeviceKey, Group] = {}
    for cpu in range(cpus):
        for level, resource, gid, key in (("book", BOOK, f"drawer0-book{cpu}", (0, cpu)),
                                          ("socket", "topology/socket", f"drawer0-book{cpu}-socket0", (0, cpu, 0))):
            groups[(resource, gid)] = Group(level=level, resource=resource, id=gid, key=key, cpus=(cpu,),
                                            cores=((cpu,),), threads_per_core=1, polarization=(("horizontal", 1),),
                                            memory_nodes=(0,), recorded_nodes=())
    return groups


def test_a_pool_socket_holder_on_a_new_book_holders_cpu_is_evicted_and_the_book_holder_untouched() -> None:
    """The holder of socket drawer0-book0-socket0 (CPU 0) was moved to the pool (CPU 1) when CPU 0 went offline;
    then a book pod took drawer0-book1 (CPU 1). No cpuset keeps the socket holder off the book pod's
    CPU: its pod is to be evicted, and the book pod keeps its CPU."""
    groups = _one_cpu_books(2)
    socket0, book1 = ("topology/socket", "drawer0-book0-socket0"), (BOOK, "drawer0-book1")
    online = frozenset({1})
    socket_pod = container("soak-34-0003-socket", mems="0")
    before = plan_cpusets([socket_pod], {socket_pod.identity: {socket0}}, {socket0}, groups, online)
    (moved,) = before.updates
    assert (moved.cpus, moved.kind) == ("1", "offline") and before.evict == ()
    on_pool = container("soak-34-0003-socket", frozenset({1}), mems="0")
    book_pod = container("soak-34-0016-book")
    holders = {on_pool.identity: {socket0}, book_pod.identity: {book1}}
    plan = plan_cpusets([on_pool, book_pod], holders, {socket0, book1}, groups, online)
    assert [(u.identity, u.cpus, u.kind) for u in plan.updates] == [(book_pod.identity, "1", "topology")]
    assert plan.stranded == (on_pool.identity,)
    (eviction,) = plan.evict
    assert (eviction.namespace, eviction.pod, eviction.reason) == ("ns", "soak-34-0003-socket", "stranded")
    assert "offline" in eviction.why
    pinned = plan_cpusets([on_pool, container("soak-34-0016-book", frozenset({1}), mems="0")], holders,
                          {socket0, book1}, groups, online)
    assert pinned.updates == () and [e.pod for e in pinned.evict] == ["soak-34-0003-socket"]
    back = plan_cpusets([on_pool, container("soak-34-0016-book", frozenset({1}), mems="0")], holders,
                        {socket0, book1}, groups, frozenset({0, 1}))
    assert back.evict == () and back.stranded == ()  # CPU 0 back: pinned to it again, nobody evicted


def test_an_offline_holder_with_a_pool_left_is_not_evicted() -> None:
    holders = {("ns", "llm", "c"): {BOOK0}, ("ns", "other", "c"): {BOOK1}}
    online = ONLINE - set(range(12))
    other = container("other", frozenset(range(12, 22)), mems="0")
    for shared_pool in (False, True):
        plan = plan_cpusets([container("llm", frozenset({0})), other], holders, {BOOK0, BOOK1}, GROUPS, online,
                            shared_pool=shared_pool)
        assert plan.offline == (("ns", "llm", "c"),) and plan.stranded == () and plan.evict == ()
    with_reserved = plan_cpusets([container("llm"), other], holders, {BOOK0, BOOK1}, GROUPS, frozenset(range(12, 22)),
                                 reserved={12})
    assert with_reserved.stranded == () and with_reserved.evict == ()  # a reserved CPU is always in the pool


def test_a_pod_is_named_once_for_eviction_whatever_its_number_of_stranded_containers() -> None:
    groups = _one_cpu_books(3)
    keys = [("topology/socket", f"drawer0-book{i}-socket0") for i in range(3)]
    a, b = RunningContainer("id-a", ("ns", "two", "a"), frozenset()), RunningContainer("id-b", ("ns", "two", "b"),
                                                                                        frozenset())
    other = RunningContainer("id-o", ("ns", "other", "c"), frozenset({2}), mems="0")
    holders = {a.identity: {keys[0]}, b.identity: {keys[1]}, other.identity: {keys[2]}}
    plan = plan_cpusets([a, b, other], holders, set(keys), groups, frozenset({2}))
    assert plan.stranded == (a.identity, b.identity)
    (eviction,) = plan.evict
    assert eviction.key == ("ns", "two") and "containers a, b hold" in eviction.why
    assert plan.updates == ()  # the other pod is untouched


def test_with_no_pool_left_an_offline_holder_runs_on_its_own_pods_groups_rather_than_be_evicted() -> None:
    """A pod's other container holds an online group: the offline holder runs there (its pod's CPUs, nobody else's),
    is not stranded, and the pod is not evicted."""
    groups = _one_cpu_books(3)
    keys = [(BOOK, f"drawer0-book{i}") for i in range(3)]
    a, b = RunningContainer("id-a", ("ns", "two", "a"), frozenset()), RunningContainer("id-b", ("ns", "two", "b"),
                                                                                        frozenset({1}), mems="0")
    other = RunningContainer("id-o", ("ns", "other", "c"), frozenset({2}), mems="0")
    holders = {a.identity: {keys[0]}, b.identity: {keys[1]}, other.identity: {keys[2]}}
    plan = plan_cpusets([a, b, other], holders, set(keys), groups, frozenset({1, 2}))
    assert [(u.identity, u.cpus, u.kind) for u in plan.updates] == [(a.identity, "1", "offline")]
    assert plan.offline == (a.identity,) and plan.stranded == () and plan.evict == ()
