"""A stranded holder's pod is evicted through the API server (agent/enforce/evictions.py), never blocking the
caller; once per pod; a PodDisruptionBudget's 429 is retried with backoff; a pod the plan no longer names is not
asked again. And the loops hand the plan's evictions over (CRI and NRI), or keep the holder (--stranded-policy keep).
"""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import pytest

from agent.cri.client import ContainerStatusInfo, CriClient
from agent.devices.table import NodeDevices
from agent.enforce.cri_loop import CpusetEnforcement
from agent.enforce.evictions import Evictions
from agent.errors import KubeApiError, NodeLabelerError
from agent.node.kubeapi import KubeApi
from agent.plugin.servicer import render
from agent.policy.allocation import AllocationSettings
from agent.policy.cpuset import Eviction
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.embedded import load_embedded
from tests.support.enforcement import OfflineHolderRuntime
from topology_devkit.testing.wait import wait_until

STRANDED = Eviction("ns", "llm", "stranded", "container c holds groups whose CPUs are all offline")
OTHER = Eviction("ns", "other", "stranded", "container c holds groups whose CPUs are all offline")


class FakeApi:
    """Answers evictions from a script per pod (an exception to raise, or None: accepted); records every call."""

    def __init__(self, script: dict[str, list[BaseException | None]] | None = None) -> None:
        self.script = script or {}
        self.calls: list[tuple[str, str, float]] = []
        self.release = threading.Event()
        self.release.set()

    def evict_pod(self, namespace: str, name: str, timeout: float) -> None:
        self.calls.append((namespace, name, timeout))
        self.release.wait()
        answers = self.script.get(name) or [None]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if answer is not None:
            raise answer


@pytest.fixture
def evictions() -> Any:
    made: list[Evictions] = []

    def make(api: Any, **kw: Any) -> Evictions:
        e = Evictions(lambda: api, first=0.05, cap=0.2, **{"settle": 0.0, **kw})
        made.append(e)
        return e

    yield make
    for e in made:
        e.stop()


def test_the_eviction_subresource_is_posted_with_a_policy_v1_body() -> None:
    sent: list[tuple[str, str, Any]] = []

    class Api(KubeApi):
        def _send(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, str, bytes]:
            sent.append((method, path, body))
            return 201, "Created", b'{"kind": "Status", "status": "Success"}'

    Api().evict_pod("team-a", "llm-0", 10.0)
    assert sent == [("POST", "/api/v1/namespaces/team-a/pods/llm-0/eviction",
                     {"apiVersion": "policy/v1", "kind": "Eviction",
                      "metadata": {"name": "llm-0", "namespace": "team-a"}})]


def test_a_pod_is_evicted_once_and_asked_again_only_once_it_is_named_anew(evictions: Any) -> None:
    api = FakeApi()
    e = evictions(api)
    e.want([STRANDED])
    wait_until("one eviction counted", lambda: e.counts() == {("stranded", "evicted"): 1}, 5, every=0.01)
    for _ in range(5):  # every plan names it while it terminates: never asked again
        e.want([STRANDED])
    time.sleep(0.1)  # nothing to wait for: no call may come
    assert api.calls == [("ns", "llm", 10.0)] and e.pending == 0
    e.want([])  # gone from the plan (terminated): forgotten
    e.want([STRANDED])  # a pod of that name stranded again later is asked again
    wait_until("two eviction calls", lambda: len(api.calls) == 2, 5, every=0.01)


def test_a_disruption_budgets_429_is_retried_with_backoff_and_said_once(evictions: Any,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    budget = KubeApiError(429, "Cannot evict pod as it would violate the pod's disruption budget.")
    api = FakeApi({"llm": [budget, budget, budget, None]})
    e = evictions(api)
    e.want([STRANDED])
    wait_until("one eviction counted", lambda: e.counts().get(("stranded", "evicted")) == 1, 5, every=0.01)
    assert e.counts() == {("stranded", "blocked"): 3, ("stranded", "evicted"): 1} and len(api.calls) == 4
    said = [r.getMessage() for r in caplog.records if "cannot evict pod ns/llm" in r.getMessage()]
    assert len(said) == 1 and "PodDisruptionBudget" in said[0]
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("evicted pod ns/llm (stranded)")]


def test_a_pod_no_longer_named_is_not_asked_again_and_a_gone_pod_is_done(evictions: Any) -> None:
    refused = KubeApiError(403, 'pods "llm" is forbidden: cannot create resource "pods/eviction"')
    api = FakeApi({"llm": [refused], "other": [KubeApiError(404, 'pods "other" not found')]})
    e = evictions(api)
    e.want([STRANDED, OTHER])
    wait_until("two failed evictions counted", lambda: e.counts().get(("stranded", "failed"), 0) >= 2, 5,
               every=0.01)
    assert e.counts().get(("stranded", "gone")) == 1 and e.pending == 1
    e.want([])  # a CPU came back: the holder is pinned again, nobody to evict
    calls = len(api.calls)
    time.sleep(0.5)  # longer than the backoff's cap: a retry would have come
    assert len(api.calls) <= calls + 1 and e.pending == 0  # at most the call under way when it was dropped


def test_a_pod_is_asked_for_only_once_the_plans_named_it_for_the_settle_time(evictions: Any) -> None:
    """A pod stranded between two updates of the plan's sources (a holder that ended but is still listed, a CPU back
    but not yet rescanned) is not evicted; one the plans keep naming is, once the settle time is over."""
    now = [100.0]
    api = FakeApi()
    e = evictions(api, settle=10.0, clock=lambda: now[0], thread=False)
    e.want([STRANDED])
    now[0] += 9.0
    e.want([STRANDED])
    e.want([])  # gone from the plan before it settled
    now[0] += 5.0
    e.want([STRANDED])  # named anew: its settle time starts again
    assert e.run_once() == (True, 10.0) and api.calls == []
    now[0] += 10.0
    e.want([STRANDED])
    assert e.run_once() == (True, None) and api.calls == [("ns", "llm", 10.0)]


def test_want_never_blocks_on_the_api_server(evictions: Any) -> None:
    api = FakeApi()
    api.release.clear()  # the API server does not answer
    e = evictions(api)
    started = time.monotonic()
    e.want([STRANDED])
    wait_until("one eviction call", lambda: len(api.calls) == 1, 5, every=0.01)
    e.want([STRANDED, OTHER])
    e.want([STRANDED, OTHER])
    assert time.monotonic() - started < 1.0 and e.pending == 2
    api.release.set()
    wait_until("no eviction pending", lambda: e.pending == 0, 5, every=0.01)


def test_no_api_configuration_is_a_failure_retried_not_a_crash(evictions: Any) -> None:
    def no_api() -> Any:
        raise NodeLabelerError("no Kubernetes API configuration")

    e = Evictions(no_api, first=0.05, cap=0.1, settle=0.0)
    try:
        e.want([STRANDED])
        wait_until("two failed evictions counted", lambda: e.counts().get(("stranded", "failed"), 0) >= 2, 5,
                   every=0.01)
        assert e.pending == 1
    finally:
        e.stop()


class StrandedRuntime(OfflineHolderRuntime):
    """llm holds book 0, whose CPUs are all offline; other holds book 1, the only one online: llm is stranded."""

    def container_status(self, container: str) -> ContainerStatusInfo:
        cpus = "12-21" if container in ("llm", "other") else ""  # llm was moved to the pool before other came
        return ContainerStatusInfo(id=container, pod_sandbox_id=f"s-{container}", name=container, attempt=0,
                                   state="CONTAINER_RUNNING", created_at=0, cpuset_cpus=cpus)


def cri_loop(evict: Any, notices: list[tuple[str, str]]) -> tuple[CpusetEnforcement, StrandedRuntime]:
    settings = GroupingSettings(levels=("book",))
    grouping = group_topology(load_embedded("z16-lpar"), settings)
    devices = NodeDevices(grouping, settings, AllocationSettings(), render)
    runtime = StrandedRuntime()
    loop = CpusetEnforcement(cast(CriClient, runtime), devices, {(g.resource, g.id): g for g in grouping.groups},
                             "topology.s390x.ibm.com", online=lambda: frozenset(range(12, 22)), reserved=frozenset(),
                             shared_pool=False, cpu_manager_policy=lambda: None, interval=2.0,
                             notify=lambda reason, message: notices.append((reason, message)), evict=evict)
    return loop, runtime


def test_the_cri_loop_hands_a_stranded_holders_pod_over_for_eviction() -> None:
    asked: list[list[Eviction]] = []
    notices: list[tuple[str, str]] = []
    loop, runtime = cri_loop(lambda e: asked.append(list(e)), notices)
    loop.step()
    assert loop.counters.stranded == 1 and runtime.updates == [("other", "12-21")]  # llm is left, other keeps book 1
    assert [(e.namespace, e.pod, e.reason) for e in asked[-1]] == [("ns", "llm", "stranded")]
    assert [r for r, _ in notices] == ["TopologyHolderOffline"] and "its pod is evicted" in notices[0][1]
    loop.step()
    assert len(asked) == 2 and len(notices) == 1  # every plan is handed over (the adapter asks once); said once


def test_with_stranded_policy_keep_the_holder_is_only_reported() -> None:
    notices: list[tuple[str, str]] = []
    loop, _ = cri_loop(None, notices)
    loop.step()
    assert loop.counters.stranded == 1
    assert "--stranded-policy keep" in notices[0][1] and "evicted" not in notices[0][1]


def test_under_nri_a_new_book_pod_is_created_at_once_and_the_stranded_pod_on_its_cpu_is_evicted(
        evictions: Any) -> None:
    """Under NRI, CPU 0 went offline, so llm (book 0) runs on the pool, CPU 1; then a pod is allocated book 1 and
    created. Its creation answers at once (the API server hangs) and pins it to CPU 1; llm's pod, which no cpuset
    now keeps off CPU 1, is asked to be evicted."""
    from agent.enforce.nri_hooks import NriEnforcement
    from agent.plugin.servicer import render as render_wire
    from tests.support.enforcement import DOMAIN, annotated, container, pod, two_books
    from tests.support.harness import short_tmpdir

    settings = GroupingSettings(levels=("book",))
    grouping = group_topology(two_books(), settings)
    devices = NodeDevices(grouping, settings, AllocationSettings(), render_wire)
    api = FakeApi()
    api.release.clear()
    evict = evictions(api)
    enforcement = NriEnforcement(devices, {(g.resource, g.id): g for g in grouping.groups}, DOMAIN,
                                 online=lambda: frozenset({1}), reserved=frozenset(), shared_pool=True,
                                 cpu_manager_policy=lambda: None, socket_path=short_tmpdir() / "absent.sock",
                                 evict=evict.want)
    table = devices.table(grouping.groups[0].resource)
    table.admit([[grouping.groups[0].id]])
    llm = enforcement.create_container(pod("llm"), container("c-llm", "llm", annotated(grouping, 0)))
    assert llm.adjust.linux.resources.cpu.cpus == "1" and evict.pending == 0  # the pool: not stranded yet
    table.admit([[grouping.groups[1].id]])
    started = time.monotonic()
    book = enforcement.create_container(pod("book"), container("c-book", "book", annotated(grouping, 1)))
    assert time.monotonic() - started < 1.0
    assert book.adjust.linux.resources.cpu.cpus == "1" and not book.update  # pinned; llm is not moved anywhere
    assert enforcement.counters.stranded == 1 and evict.pending == 1
    wait_until("the eviction of llm asked", lambda: api.calls == [("default", "llm", 10.0)], 5, every=0.01)
    api.release.set()
    wait_until("llm evicted and nothing pending",
               lambda: evict.counts() == {("stranded", "evicted"): 1} and evict.pending == 0, 5, every=0.01)


@pytest.mark.parametrize("policy", ["evict", "keep"])
def test_the_composition_root_wires_the_evictions_into_the_enforcement_and_the_metrics(policy: str) -> None:
    """--stranded-policy evict: one Evictions, fed by the enforcement's plans and read by the metrics; keep: none
    (nothing is made, no API client, no thread)."""
    from prometheus_client import generate_latest

    from agent.app.build import build_agent
    from agent.app.config import AgentConfig
    from agent.enforce.nri_hooks import NriEnforcement
    from tests.support.enforcement import two_books
    from tests.support.harness import short_tmpdir

    root = short_tmpdir()
    config = AgentConfig(kubelet_dir=root / "kubelet", grouping=GroupingSettings(levels=("book",)),
                         cpuset_enforcement="nri", stranded_policy=policy, pod_resources_interval=0,
                         pod_resources_socket=root / "no-pod-resources.sock", nri_socket=root / "nri.sock",
                         cpu_manager_state=root / "no-cpu-manager-state")
    (root / "kubelet").mkdir()
    agent = build_agent(two_books(), config)
    enforcement = agent.enforcement
    assert isinstance(enforcement, NriEnforcement)
    if policy == "keep":
        assert agent.evictions is None and enforcement.offline.evict is None
        return
    assert agent.evictions is not None and enforcement.offline.evict == agent.evictions.want
    assert agent.evictions._thread is None  # no thread before a pod is to be evicted
    agent.evictions._counts[("stranded", "blocked")] = 2
    text = generate_latest(agent.metrics.registry).decode()
    assert 'topology_agent_cpuset_evictions_total{reason="stranded",result="blocked"} 2.0' in text
    assert "topology_agent_cpuset_evictions_pending 0.0" in text
