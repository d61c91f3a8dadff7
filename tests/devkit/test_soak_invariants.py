"""The soak's pure checker (bench/cluster/soak/invariants.py): each violation kind is found in a snapshot that shows
it, a clean snapshot gives none; and the seeded plan (bench/cluster/soak/plan.py) is the same for the same seed."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

from bench.cluster.soak.invariants import (
    KINDS,
    AgentProc,
    Allowances,
    Checker,
    Container,
    Failure,
    Fault,
    Hold,
    Snapshot,
    Terminating,
    free_now,
)
from bench.cluster.soak.plan import FAULT_KINDS, POD_KINDS, make_plan
from bench.cluster.soak.truth import agent_hold_groups, cdi_files, checkpoint_holds

GROUPS = {"drawer0-book0": frozenset({0}), "drawer0-book0-socket0": frozenset({0}),
          "drawer0-book1": frozenset({1}), "drawer0-book1-socket0": frozenset({1})}
T0 = 1000.0


def box(cpus: set[int], threads: int = 2) -> tuple[frozenset[int], ...]:
    return tuple(frozenset(cpus) for _ in range(threads))


def clean(t: float = T0 + 100, **changes: object) -> Snapshot:
    """Two book holders on their own books, a plain container beside them, everything else in order."""
    snap = Snapshot(
        t=t, groups=GROUPS, online=frozenset({0, 1}),
        containers=(Container("uid-a", "a", "main", T0, box({0})), Container("uid-b", "b", "main", T0, box({1})),
                    Container("uid-p", "p", "main", T0, box({0, 1})),
                    Container("uid-agent", "agent", "agent", T0, box({0, 1}))),
        holds=(Hold("drawer0-book0", "uid-a", "main", "pod-resources"), Hold("drawer0-book1", "uid-b", "main",
                                                                             "checkpoint")),
        pods=frozenset({"uid-a", "uid-b", "uid-p", "uid-agent"}), claims=frozenset({"claim-1"}),
        agent_holds=frozenset({"drawer0-book0"}), agent_claims=frozenset({"claim-1"}),
        cdi_files={"topology.s390x.ibm.com-book_claim-1.json": "claim-1"}, slices=0,
        agent=AgentProc(42, 60_000, 20))
    return dataclasses.replace(snap, **changes)  # type: ignore[arg-type]


def kinds(checker: Checker, *snaps: Snapshot) -> list[str]:
    found = []
    for snap in snaps:
        found += [v.kind for v in checker.check(snap)]
    return found


def test_a_clean_snapshot_gives_no_violation_over_time() -> None:
    checker = Checker()
    assert kinds(checker, *(clean(T0 + 100 + s) for s in range(0, 200, 10))) == []


def test_shared_held_cpu() -> None:
    snap = clean(containers=(Container("uid-a", "a", "main", T0, box({0})),
                             Container("uid-b", "b", "main", T0, (frozenset({1}), frozenset({0, 1})))))
    found = kinds(Checker(), snap)
    assert "shared-held-cpu" in found and "holder-outside-group" in found


def test_non_holder_on_held_cpu_only_with_the_shared_pool_and_a_pool_left() -> None:
    plain = Container("uid-p", "p", "main", T0, box({0, 1}))
    one_held = clean(containers=(Container("uid-a", "a", "main", T0, box({0})), plain),
                     holds=(Hold("drawer0-book0", "uid-a", "main"),))
    assert kinds(Checker(), one_held) == []  # shared pool off: others may run anywhere
    checker = Checker()
    on = [dataclasses.replace(one_held, shared_pool=True, t=one_held.t + s) for s in range(0, 20, 5)]
    assert kinds(checker, *on) == ["non-holder-on-held-cpu"]
    both_held = dataclasses.replace(on[-1], holds=clean().holds)  # no pool left: the agent shrinks nobody
    assert kinds(Checker(), *(dataclasses.replace(both_held, t=both_held.t + s) for s in range(0, 20, 5))) == []


def test_a_non_holder_may_run_on_what_its_own_pod_holds() -> None:
    """An init container's book stays the pod's for its lifetime: the pod's plain main container is no other pod."""
    main = Container("uid-i", "i", "main", T0, box({0}))
    snap = clean(shared_pool=True, containers=(main,), holds=(Hold("drawer0-book0", "uid-i", "hold", "checkpoint"),))
    assert kinds(Checker(), *(dataclasses.replace(snap, t=snap.t + s) for s in range(0, 30, 5))) == []


def test_non_holder_is_given_the_pin_bound_after_the_pool_changes() -> None:
    plain = Container("uid-p", "p", "main", T0, box({1}))
    book0 = Hold("drawer0-book0", "uid-a", "main")
    book1 = Hold("drawer0-book1", "uid-b", "main")
    checker = Checker()
    base = clean(shared_pool=True, containers=(plain,), holds=(book0,))
    steady = [dataclasses.replace(base, t=base.t + s) for s in range(0, 30, 5)]
    both = dataclasses.replace(base, t=base.t + 30, holds=(book0, book1))  # pool empty: nobody shrunk
    freed = dataclasses.replace(base, t=base.t + 40, holds=(book1,))  # pool {0}: plain is still on 1
    assert kinds(checker, *steady, both, freed) == []
    assert kinds(checker, dataclasses.replace(freed, t=freed.t + 3)) == ["non-holder-on-held-cpu"]


def test_holder_outside_group_after_the_pin_bound_only() -> None:
    start = T0 + 100
    late = Container("uid-a", "a", "main", start, box({0, 1}))
    snap = clean(t=start + 1, containers=(late,))
    assert kinds(Checker(), snap) == []  # CRI: 2 s to pin
    assert kinds(Checker(), dataclasses.replace(snap, enforcement="nri")) == ["holder-outside-group"]  # NRI: 0 s
    assert kinds(Checker(), dataclasses.replace(snap, t=start + 3)) == ["holder-outside-group"]


def test_recovery_after_a_fault_and_after_a_cpu_comes_back() -> None:
    start = T0 + 100
    snap = clean(t=start + 10, containers=(Container("uid-a", "a", "main", start, box({0, 1})),))
    checker = Checker()
    checker.fault(Fault("agent-kill", start - 0.5, start + 2))
    assert kinds(checker, snap) == []
    assert kinds(checker, dataclasses.replace(snap, t=start + 18)) == ["holder-outside-group"]
    old = Container("uid-a", "a", "main", T0, box({0, 1}))
    checker = Checker()
    checker.fault(Fault("cpu-offline", start, start + 20, cpu=0))
    snap = clean(t=start + 100, containers=(old,))
    assert kinds(checker, snap) == []
    assert kinds(checker, dataclasses.replace(snap, t=start + 171)) == ["holder-outside-group"]


def test_admission_failure_while_free_but_not_while_held() -> None:
    failed = Failure("c", "uid-c", "UnexpectedAdmissionError", "Allocate failed", "topology/book")
    checker = Checker()
    one_free = clean(holds=(Hold("drawer0-book0", "uid-a", "main"),), agent_holds=frozenset())
    assert kinds(checker, one_free, dataclasses.replace(one_free, t=one_free.t + 1, failures=(failed,))) == [
        "admission-failure-while-free"]
    checker = Checker()
    assert kinds(checker, clean(), clean(t=T0 + 101, failures=(failed,))) == []  # both books held
    checker = Checker()
    checker.fault(Fault("kubelet-kill", T0 + 95, T0 + 97))
    assert kinds(checker, one_free, dataclasses.replace(one_free, t=one_free.t + 1, failures=(failed,))) == []


def leaked(kind: str, **changes: object) -> None:
    checker = Checker(Allowances(leak_grace=60))
    snaps = [clean(t=T0 + 100 + s, **changes) for s in (0, 30, 59)]
    assert kinds(checker, *snaps) == []  # within the grace
    assert kinds(checker, clean(t=T0 + 161, **changes), clean(t=T0 + 170, **changes)) == [kind]  # once


def test_leaked_hold_of_kubelet_for_a_gone_pod() -> None:
    leaked("leaked-hold", pods=frozenset({"uid-a", "uid-p", "uid-agent"}))


def test_leaked_hold_in_the_agents_hold_file() -> None:
    leaked("leaked-hold", agent_holds=frozenset({"drawer0-book0-socket0"}))


def test_leaked_claim_checkpoint_entry() -> None:
    leaked("leaked-claim-checkpoint", agent_claims=frozenset({"claim-1", "claim-gone"}))


def test_leaked_cdi_file() -> None:
    leaked("leaked-cdi-file", cdi_files={"topology.s390x.ibm.com-book_claim-gone.json": "claim-gone"})


def test_leaked_slice_outside_dra_mode() -> None:
    leaked("leaked-slice", slices=2)
    assert kinds(Checker(), *(clean(t=T0 + s, slices=2, mode="dra") for s in range(0, 200, 50))) == []


def test_a_leak_that_clears_within_the_grace_is_none() -> None:
    checker = Checker()
    gone = frozenset({"uid-a", "uid-p", "uid-agent"})
    assert kinds(checker, clean(pods=gone), clean(t=T0 + 150), clean(t=T0 + 200, pods=gone)) == []


def test_agent_rss_and_fd_growth_per_process_after_warmup() -> None:
    checker = Checker()
    grown = [clean(t=T0 + s, agent=AgentProc(42, 60_000 + s * 1000, 20 + s)) for s in range(0, 300, 60)]
    assert sorted(kinds(checker, *grown)) == ["agent-fd-growth", "agent-rss-growth"]
    restarted = [clean(t=T0 + s, agent=AgentProc(42 + s, 60_000, 20)) for s in range(0, 300, 60)]
    assert kinds(Checker(), *restarted) == []  # a new process starts a new baseline


def test_every_kind_is_tested() -> None:
    tested = {"shared-held-cpu", "non-holder-on-held-cpu", "holder-outside-group", "admission-failure-while-free",
              "leaked-hold", "leaked-claim-checkpoint", "leaked-cdi-file", "leaked-slice", "terminating-too-long",
              "advertised-fewer-than-free", "agent-rss-growth", "agent-fd-growth"}
    assert tested == set(KINDS)


def test_a_fault_under_way_suspends_judgement_until_it_ends() -> None:
    """While a fault is under way (a CPU offline) its holder may sit outside its group: it is judged only a while
    after the fault ended, so the runner tells the checker of a fault when it starts, not only when it ends."""
    checker = Checker()
    i = checker.fault_started("cpu-offline", T0 + 90, cpu=0)
    moved = clean(t=T0 + 100, containers=(Container("uid-a", "a", "main", T0, box({0, 1})),))
    assert kinds(checker, moved) == []
    checker.fault_ended(i, T0 + 110)
    assert kinds(checker, dataclasses.replace(moved, t=T0 + 200)) == []
    assert kinds(checker, dataclasses.replace(moved, t=T0 + 261)) == ["holder-outside-group"]


def test_violation_names_the_faults_before_it() -> None:
    checker = Checker()
    checker.fault(Fault("containerd-kill", T0 + 50, T0 + 52))
    (v,) = checker.check(clean(containers=(Container("uid-a", "a", "main", T0, box({0, 1})),)))
    assert v.faults == ("containerd-kill@50s",) and "containerd-kill@50s" in v.line()


def test_plan_is_the_same_for_the_same_seed_and_prints_its_kinds() -> None:
    a, b = make_plan(34, 600), make_plan(34, 600)
    assert a == b
    assert make_plan(35, 600) != a
    short = make_plan(34, 90)
    assert a.pods[:len(short.pods)] == short.pods and a.faults[:len(short.faults)] == short.faults
    long = make_plan(34, 1800)
    assert {p.kind for p in long.pods} == set(POD_KINDS)
    assert {f.kind for f in long.faults} == set(FAULT_KINDS)
    assert short.faults, "the CI soak (90 s, seed 34) injects faults"
    modes = [f.mode for f in long.faults if f.kind == "mode-switch"]
    assert all(m != n for m, n in itertools.pairwise(modes))  # each switch changes the mode


def test_truth_reads_kubelets_checkpoint_cdi_names_and_the_agents_state(tmp_path: Path) -> None:
    checkpoint = {"Data": {"PodDeviceEntries": [
        {"PodUID": "u1", "ContainerName": "hold", "ResourceName": "topology/book",
         "DeviceIDs": {"0": ["drawer0-book1"]}},
        {"PodUID": "u2", "ContainerName": "gpu", "ResourceName": "vendor/gpu", "DeviceIDs": {"0": ["g0"]}},
        {"PodUID": "u3", "ContainerName": "main", "ResourceName": "topology/socket",
         "DeviceIDs": ["drawer0-book0-socket0"]},
    ], "RegisteredDevices": {}}, "Checksum": 1}
    assert checkpoint_holds(json.dumps(checkpoint), {}) == [
        Hold("drawer0-book1", "u1", "hold", "checkpoint"), Hold("drawer0-book0-socket0", "u3", "main", "checkpoint")]
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "topology.s390x.ibm.com-book_5f1e-77.json").write_text("{}")
    (cdi / "vendor.example.com-gpu_1.json").write_text("{}")
    assert cdi_files(cdi) == {"topology.s390x.ibm.com-book_5f1e-77.json": "5f1e-77"}
    state = tmp_path / "state"
    (state / "topology").mkdir(parents=True)
    (state / "dra").mkdir()
    (state / "topology" / "holds.json").write_text(json.dumps({
        "version": 1, "holds": [["topology/book", "drawer0-book0"]],
        "pods": [["topology/book", "drawer0-book1", "ns", "p"]]}))
    (state / "dra" / "claims.json").write_text(json.dumps({"version": 1, "claims": [{"uid": "c1"}]}))
    assert agent_hold_groups(state) == (frozenset({"drawer0-book0", "drawer0-book1"}), frozenset({"c1"}))
    assert agent_hold_groups(tmp_path / "none") == (frozenset(), frozenset())


def test_a_claim_is_held_by_the_containers_that_use_it_not_by_the_whole_pod() -> None:
    """kubelet hands a claim's devices only to the containers that use it: the request mappings of the
    extended-resource claim, or `resources.claims`. In DRA mode an init container that asked for `topology/book`
    (the scheduler's claim for the extended resource) and ended leaves pod-resources listing nobody for the claim:
    the pod's plain main container is no holder, so neither `holder-outside-group` nor `shared-held-cpu`."""
    from kubernetes.client import CoreV1ResourceClaim as V1ResourceClaim
    from kubernetes.client import (
        V1Container,
        V1ObjectMeta,
        V1Pod,
        V1PodExtendedResourceClaimStatus,
        V1PodResourceClaim,
        V1PodResourceClaimStatus,
        V1PodSpec,
        V1PodStatus,
        V1ResourceRequirements,
    )
    from kubernetes.client import V1ContainerExtendedResourceRequest as Mapping

    from bench.cluster.soak.truth import claim_containers

    init_holder = V1Pod(
        metadata=V1ObjectMeta(name="soak-713-0153-init", uid="uid-i"),
        spec=V1PodSpec(init_containers=[V1Container(name="hold")], containers=[V1Container(name="main")]),
        status=V1PodStatus(extended_resource_claim_status=V1PodExtendedResourceClaimStatus(
            resource_claim_name="soak-713-0153-init-extended-resources-x7k2p",
            request_mappings=[Mapping(container_name="hold", resource_name="topology/book",
                                      request_name="container-0-request-0")])))
    assert claim_containers(init_holder, "soak-713-0153-init-extended-resources-x7k2p") == ("hold",)
    assert claim_containers(init_holder, "another") == ()
    uses = V1ResourceRequirements(claims=[V1ResourceClaim(name="c")])
    claim_pod = V1Pod(
        metadata=V1ObjectMeta(name="p", uid="uid-c"),
        spec=V1PodSpec(containers=[V1Container(name="main", resources=uses), V1Container(name="side")],
                       resource_claims=[V1PodResourceClaim(name="c", resource_claim_template_name="t")]),
        status=V1PodStatus(resource_claim_statuses=[V1PodResourceClaimStatus(name="c", resource_claim_name="p-c-9x")]))
    assert claim_containers(claim_pod, "p-c-9x") == ("main",)

    # what the checker then sees: main is no holder; on its own pod's book or the pool it is in order
    snap = clean(holds=(Hold("drawer0-book1", "uid-b", "main", "pod-resources"),
                        Hold("drawer0-book0", "uid-i", "hold", "claim")),
                 containers=(Container("uid-b", "b", "main", T0, box({1})),
                             Container("uid-i", "soak-713-0153-init", "main", T0, box({0}))),
                 shared_pool=True)
    assert kinds(Checker(), snap) == []
    pod_wide = dataclasses.replace(snap, holds=(snap.holds[0], Hold("drawer0-book0", "uid-i", "", "claim")),
                                   containers=(snap.containers[0],
                                               Container("uid-i", "soak-713-0153-init", "main", T0, box({1}))))
    assert "holder-outside-group" in kinds(Checker(), pod_wide)  # the old reading of the same pod on CPU 1


# --- a pod that stays Terminating, a node that offers fewer groups than are free ---------------------------------
BOOK, SOCKET = "topology/book", "topology/socket"
EVERYTHING = {BOOK: 2, SOCKET: 2}


def switched_back(t: float, *, deleted: float, gone: float | None, offered: dict[str, int]) -> Snapshot:
    """Device-plugin mode after a switch from DRA mode: two claim pods (a socket and a book, through the
    DeviceClasses' extended resource names) deleted at ``deleted`` with a 1 s grace, gone at ``gone`` (None: never);
    until then kubelet lists their claims (pod-resources) and the claims stay reserved for them, their containers
    stopped. The Node offers ``offered``."""
    there = gone is None or t < gone
    pods = ("uid-sock", "uid-book") if there else ()
    return Snapshot(
        t=t, groups=GROUPS, online=frozenset({0, 1}), mode="deviceplugin",
        containers=(Container("uid-agent", "agent", "agent", T0, box({0, 1})),),
        holds=(Hold("drawer0-book0-socket0", "uid-sock", "main", "pod-resources"),
               Hold("drawer0-book1", "uid-book", "main", "pod-resources")) if there else (),
        pods=frozenset({"uid-agent", *pods}), claims=frozenset({"claim-s", "claim-b"}) if there else frozenset(),
        terminating=tuple(Terminating(uid, f"soak/{uid}", deleted + 1, 1.0) for uid in pods) if t >= deleted else (),
        advertised=offered)


def switch_fault(checker: Checker) -> None:
    checker.fault(Fault("mode-switch", T0 - 40, T0 - 10))  # helm upgrade --set mode=deviceplugin, over


def test_the_mode_switch_case_two_pods_stay_terminating_and_the_node_offers_no_book() -> None:
    """What the soak saw after a switch from DRA to device-plugin mode with no DRA plugin left to unprepare: two claim
    pods Terminating for more than 10 minutes, the Node offering topology/book: 0 and topology/socket: 0 although no
    container ran on any group. Each pod is named once, and each resource once."""
    checker = Checker()
    switch_fault(checker)
    stuck = {BOOK: 0, SOCKET: 0}
    found = [v for t in range(0, 660, 5) for v in checker.check(switched_back(T0 + t, deleted=T0, gone=None,
                                                                                  offered=stuck))]
    assert sorted(v.kind for v in found) == ["advertised-fewer-than-free"] * 2 + ["terminating-too-long"] * 2
    late = {v.what.split()[1] for v in found if v.kind == "terminating-too-long"}
    assert late == {"soak/uid-sock", "soak/uid-book"}
    short = sorted(v.what for v in found if v.kind == "advertised-fewer-than-free")
    assert short[0].startswith("the Node offers topology/book: 0 while 2 are free (drawer0-book0, drawer0-book1)")
    assert short[1].startswith("the Node offers topology/socket: 0 while 2 are free")
    # found as soon as the 60 s bounds passed after the switch's 15 s recovery (it ended at T0 - 10): the pods' due
    # time moves to T0 + 5; the short offer is counted from the first look after it
    assert sorted({(v.kind, v.t - T0) for v in found}) == [("advertised-fewer-than-free", 75.0),
                                                           ("terminating-too-long", 70.0)]
    assert all(v.faults == ("mode-switch@" + f"{v.t - (T0 - 40):.0f}s",) for v in found)


def test_the_same_switch_with_the_claims_unprepared_is_clean() -> None:
    """The DRA plugin, kept for unprepare only, lets kubelet finish both pods within seconds; their groups are free
    and offered again once pod-resources drops them and kubelet's status sync writes the allocatable (10 s)."""
    checker = Checker()
    switch_fault(checker)
    snaps = [switched_back(T0 + t, deleted=T0, gone=T0 + 3, offered={BOOK: 1, SOCKET: 1} if t < 15 else EVERYTHING)
             for t in range(0, 660, 5)]
    assert kinds(checker, *snaps) == []


def test_terminating_within_the_bound_or_during_a_fault_is_none() -> None:
    slow = [switched_back(T0 + t, deleted=T0, gone=T0 + 55, offered=EVERYTHING) for t in range(0, 120, 5)]
    assert kinds(Checker(), *slow) == []  # gone 54 s past its deletionTimestamp: within the 60 s bound
    checker = Checker()
    checker.fault(Fault("kubelet-kill", T0 + 10, T0 + 100))  # kubelet away while the pods end
    late = [switched_back(T0 + t, deleted=T0, gone=T0 + 150, offered=EVERYTHING) for t in range(0, 200, 5)]
    assert kinds(checker, *late) == []  # due 60 s after the fault's recovery (T0 + 175), gone before
    checker = Checker()
    i = checker.fault_started("containerd-kill", T0 + 10)
    assert kinds(checker, *late[:30]) == []  # a fault under way: not judged until it ended
    checker.fault_ended(i, T0 + 20)
    assert kinds(checker, switched_back(T0 + 300, deleted=T0, gone=None, offered=EVERYTHING)) == [
        "terminating-too-long", "terminating-too-long"]


def test_fewer_offered_than_free_counts_only_past_the_bound_outside_faults_and_in_device_plugin_mode() -> None:
    def one_short(t: float, **changes: object) -> Snapshot:
        snap = switched_back(T0 + t, deleted=T0 - 100, gone=T0 - 99, offered={BOOK: 1, SOCKET: 2})
        return dataclasses.replace(snap, **changes)  # type: ignore[arg-type]

    assert kinds(Checker(), *(one_short(t) for t in range(0, 60, 5))) == []  # a dip shorter than the bound
    assert kinds(Checker(), *(one_short(t) for t in range(0, 70, 5))) == ["advertised-fewer-than-free"]
    assert kinds(Checker(), *(one_short(t, mode="dra") for t in range(0, 300, 5))) == []  # DRA offers no allocatable
    assert kinds(Checker(), *(one_short(t, advertised=None) for t in range(0, 300, 5))) == []  # the Node not read
    checker = Checker()
    checker.fault(Fault("agent-kill", T0 + 10, T0 + 20))
    assert kinds(checker, *(one_short(t) for t in range(0, 90, 5))) == []  # counted again from the recovery's end
    assert kinds(checker, one_short(100)) == []  # 60 s since the first look after the recovery (T0 + 40)
    assert kinds(checker, one_short(105)) == ["advertised-fewer-than-free"]
    # a dip that recovers and comes back later is a second violation
    checker = Checker()
    again = [*(one_short(t) for t in range(0, 70, 5)),
             *(one_short(t, advertised=EVERYTHING) for t in range(70, 90, 5)),
             *(one_short(t) for t in range(90, 160, 5))]
    assert kinds(checker, *again) == ["advertised-fewer-than-free"] * 2


def test_free_means_no_running_pod_holds_it() -> None:
    """Held by a pod that exists and is not being deleted (admitted, an init container's hold): not free, container
    or not; held only by a pod being deleted whose containers stopped, or by a pod that is gone: free; a group with a
    CPU offline is never counted free (the agent offers it unhealthy)."""
    base = switched_back(T0 + 10, deleted=T0 + 100, gone=None, offered=EVERYTHING)  # not deleted yet
    assert free_now(base, "book") == [] and free_now(base, "socket") == []  # the socket holder's book is taken too
    deleted = switched_back(T0 + 10, deleted=T0, gone=None, offered=EVERYTHING)
    assert free_now(deleted, "book") == ["drawer0-book0", "drawer0-book1"]
    still_running = dataclasses.replace(deleted, containers=(Container("uid-book", "soak/uid-book", "main", T0,
                                                                       box({1})),))
    assert free_now(still_running, "book") == ["drawer0-book0"]  # its container still runs: held
    offline = dataclasses.replace(deleted, online=frozenset({1}))
    assert free_now(offline, "book") == ["drawer0-book1"]
    gone = dataclasses.replace(deleted, pods=frozenset({"uid-agent"}), terminating=())
    assert free_now(gone, "socket") == ["drawer0-book0-socket0", "drawer0-book1-socket0"]


def test_truth_reads_terminating_pods_and_the_nodes_allocatable() -> None:
    from datetime import UTC, datetime

    from kubernetes.client import V1ObjectMeta, V1Pod, V1PodSpec

    from bench.cluster.soak.truth import advertised, terminating

    at = datetime(2026, 12, 5, 2, 0, 0, tzinfo=UTC)
    meta = V1ObjectMeta(name="p", namespace="soak", uid="u", deletion_timestamp=at, deletion_grace_period_seconds=1)
    pod = V1Pod(metadata=meta, spec=V1PodSpec(containers=[], termination_grace_period_seconds=30))
    assert terminating(pod) == Terminating("u", "soak/p", at.timestamp(), 1.0)  # the grace the deletion gave
    meta.deletion_grace_period_seconds = None
    assert terminating(pod) == Terminating("u", "soak/p", at.timestamp(), 30.0)
    meta.deletion_timestamp = None
    assert terminating(pod) is None
    assert advertised({"cpu": "2", "topology/book": "0", "topology/socket": "2", "topology/x": "1k"}) == {
        "topology/book": 0, "topology/socket": 2, "topology/x": 0}
    assert advertised(None) == {}
