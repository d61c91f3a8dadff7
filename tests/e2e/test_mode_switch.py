"""Switching modes with pods running: ``helm upgrade --set mode=dra`` and back, on the real cluster.

One pod asking ``topology/book: 1`` runs through both upgrades. The moment each upgrade returns a new pod asks for a
book: it must never fail admission (docs/admin/upgrade-uninstall.md, "Switching modes": the last device-plugin agent
takes its resources' allocatable to zero before it stops, a DRA agent is Ready only once the Node offers them
through DRA only). Across
each switch, the holds of the other mode count: a book a device-plugin pod holds is tainted in the DRA slices (a
claim for the socket inside it stays Pending), a book a DRA claim holds is not handed out by the device plugin. After
each switch, every real container that holds a group is read from ``/proc/<pid>/status`` on the node (its PID from
the runtime's CRI): no CPU is pinned to two holders.

The local lane only (the node is this machine; its runtime's CRI socket is at its lane path); off unless
``TOPOLOGY_E2E_DRA=1`` like the other DRA tests (``make e2e`` sets it). The node's fake topology is one single-threaded
book (with one socket) per real CPU: two books. The module leaves the release in device-plugin mode.

After a switch back to device-plugin mode, a pod that got its book through DRA is deleted: kubelet ends it only
once its claim is unprepared, which the device-plugin agent's DRA plugin, kept for unprepare only, does; the pod is
gone within its grace period, the books are offered again, and a new book pod runs.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.cri.client import POD_NAMESPACE, CriClient
from agent.policy.resource_slices import IN_USE_TAINT_KEY
from agent.topology.cpulist import parse_cpulist
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.dra import DRA_VALUES, DRIVER, agent_ready, claim, delete, pod, slices
from tests.support.e2e.kube import apply, kjson, wait_kubectl
from tests.support.e2e.node import agent_pod as agent_pod_of
from tests.support.e2e.node import metric, metrics

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TOPOLOGY_E2E_DRA") != "1", reason="DRA mode e2e: set TOPOLOGY_E2E_DRA=1"),
]

NS = "topology-e2e-pods"
BOOK = "topology/book"


def book_pod(env: E2EEnv, name: str) -> dict[str, Any]:
    return pod(name, env.workload_image, limits={BOOK: 1}, cpu="1")


def phase(env: E2EEnv, name: str) -> tuple[str, str]:
    p = kjson(env, "-n", NS, "get", "pod", name)
    status = p["status"]
    return status.get("phase", ""), f"{status.get('reason', '')}: {status.get('message', '')}"


def never_failed(env: E2EEnv, name: str, seconds: float) -> str:
    """Watch the pod for ``seconds``: it must never be Failed (an admission refusal); its last phase."""
    deadline = time.monotonic() + seconds
    seen = ""
    while time.monotonic() < deadline:
        seen, why = phase(env, name)
        assert seen != "Failed", f"pod {name} failed: {why}"
        time.sleep(0.5)
    return seen


def running_after(env: E2EEnv, name: str, timeout: float = 120) -> None:
    """Running within ``timeout``, never Failed on the way (Pending meanwhile is fine)."""
    def check() -> bool:
        seen, why = phase(env, name)
        assert seen != "Failed", f"pod {name} failed: {why}"
        return seen == "Running"

    wait_kubectl(f"pod {name} Running (never Failed)", check, timeout=timeout, every=0.5)


def holders(socket: Path) -> dict[str, tuple[str, frozenset[int], frozenset[int]]]:
    """Every running container of the test pods that holds a group, read on the node through the runtime's CRI at
    ``socket``: pod -> (its groups, the CPUs its environment names, its ``Cpus_allowed_list`` from
    ``/proc/<pid>/status``)."""
    cri = CriClient(socket)
    try:
        found = {}
        for info in cri.list_containers({POD_NAMESPACE: NS}):
            pid = cri.container_status(info.id).pid
            if pid is None:
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:  # it ended meanwhile
                continue
            env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
            if "TOPOLOGY_GROUPS" not in env:
                continue
            allowed = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                           if line.startswith("Cpus_allowed_list:"))
            found[info.pod_name] = (env["TOPOLOGY_GROUPS"], frozenset(parse_cpulist(env["TOPOLOGY_CPUS"])),
                                    frozenset(parse_cpulist(allowed)))
        return found
    finally:
        cri.close()


def no_cpu_pinned_to_two_holders(expected: set[str], socket: Path) -> dict[str, str]:
    """Wait until the ``expected`` pods' containers run on their groups' CPUs alone, then check that no CPU is in two
    holders' cpusets; their groups by pod."""
    def pinned() -> dict[str, tuple[str, frozenset[int], frozenset[int]]] | None:
        now = holders(socket)
        ok = expected <= set(now) and all(cpus == allowed for _, cpus, allowed in now.values())
        return now if ok else None

    now = wait_kubectl(f"{sorted(expected)} pinned to their groups", pinned, timeout=60)
    for (a, (_, _, cpus_a)), (b, (_, _, cpus_b)) in itertools.combinations(now.items(), 2):
        assert not cpus_a & cpus_b, f"CPUs {sorted(cpus_a & cpus_b)} pinned to both {a} and {b}: {now}"
    print("holders (pod: groups, Cpus_allowed_list):",
          {name: (groups, sorted(allowed)) for name, (groups, _, allowed) in now.items()})
    return {name: groups for name, (groups, _, _) in now.items()}


@pytest.fixture(scope="module")
def lane(local: E2EEnv, node: str, pod_namespace: str) -> Iterator[E2EEnv]:
    if not local.cri_socket.exists():
        pytest.skip(f"no {local.runtime} CRI socket at {local.cri_socket}: not the local lane's node")
    try:
        yield local
    finally:
        local.kubectl("delete", "pods,resourceclaims", "--all", "-n", NS, "--wait=true", "--ignore-not-found",
                      "--grace-period=0", "--force", timeout=120)
        local.helm_upgrade()
        wait_kubectl("the agent in device-plugin mode to be ready", lambda: agent_ready(local), timeout=180)


def test_deviceplugin_to_dra_and_back_with_a_pod_running_through_both(lane: E2EEnv, node: str) -> None:
    env = lane
    # Device-plugin mode (the lane's install): a pod on a book.
    apply(env, book_pod(env, "through-both"))
    running_after(env, "through-both")
    held = no_cpu_pinned_to_two_holders({"through-both"}, lane.cri_socket)["through-both"]

    # helm upgrade --set mode=dra, and a pod asking for a book the moment it returns.
    t0 = time.monotonic()
    env.helm_upgrade(*DRA_VALUES)
    apply(env, book_pod(env, "after-dra"))
    print(f"helm upgrade --set mode=dra returned after {time.monotonic() - t0:.1f} s; after-dra created")
    running_after(env, "after-dra")
    groups = no_cpu_pinned_to_two_holders({"through-both", "after-dra"}, lane.cri_socket)
    assert groups["through-both"] == held and groups["after-dra"] != held
    status = kjson(env, "-n", NS, "get", "pod", "after-dra")["status"]
    assert status.get("extendedResourceClaimStatus"), status  # served through DRA, not the device plugin

    # The book the device-plugin pod holds, and the socket inside it, are tainted; a claim for that socket waits.
    devices = {d["name"]: d for s in slices(env, node) for d in s["spec"].get("devices", [])}
    tainted = sorted(name for name, d in devices.items() if any(t["key"] == IN_USE_TAINT_KEY
                                                                for t in d.get("taints", [])))
    assert tainted == [held, f"{held}-socket0"], devices
    book = int(held.removeprefix("drawer0-book"))
    apply(env, claim("inside-held", f"socket.{DRIVER}", f'device.attributes["{DRIVER}"].book == {book}'))
    apply(env, pod("inside-held-pod", env.workload_image, "inside-held", cpu="0"))

    def unschedulable() -> Any:
        p = kjson(env, "-n", NS, "get", "pod", "inside-held-pod")
        conds = [c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return conds[0] if conds and conds[0]["status"] == "False" and conds[0].get("message") else None

    cond = wait_kubectl("the scheduler's reason for inside-held-pod", unschedulable, timeout=60)
    print(f"a claim for the socket inside the device-plugin pod's book: {cond['reason']}: {cond['message']}")
    assert "cannot allocate all claims" in cond["message"]
    delete(env, "pod/inside-held-pod", "resourceclaim/inside-held")

    # helm upgrade --set mode=deviceplugin with both running (the DRA claim's book must not be handed out), and a
    # pod asking for a book the moment it returns: no book is free, so it waits (Pending), never fails.
    t0 = time.monotonic()
    env.helm_upgrade()
    apply(env, book_pod(env, "after-dp"))
    print(f"helm upgrade --set mode=deviceplugin returned after {time.monotonic() - t0:.1f} s; after-dp created")
    groups = no_cpu_pinned_to_two_holders({"through-both", "after-dra"}, lane.cri_socket)
    assert groups["through-both"] == held
    assert never_failed(env, "after-dp", 25) == "Pending"  # beyond kubelet's status sync (10 s)
    claimed = groups["after-dra"]
    allocations = kjson(env, "get", "node", node)["status"]["allocatable"]
    print(f"after the switch back: node allocatable {BOOK}={allocations.get(BOOK)}; {claimed} held through DRA")
    # The DRA pod goes (kubelet unprepares its claim through the DRA plugin the device-plugin agent keeps for
    # that), and the waiting pod gets its book.
    env.kubectl("-n", NS, "delete", "pod", "after-dra", "--wait=true", timeout=120)
    running_after(env, "after-dp")
    groups = no_cpu_pinned_to_two_holders({"through-both", "after-dp"}, lane.cri_socket)
    assert groups["after-dp"] == claimed and groups["through-both"] == held


GRACE = 30  # the DRA pod's terminationGracePeriodSeconds; its shell exits on SIGTERM, so kubelet need not wait it out


def book_count(env: E2EEnv, node: str, field: str) -> int:
    return int(kjson(env, "get", "node", node)["status"].get(field, {}).get(BOOK, "0"))


def test_a_pod_served_through_dra_is_gone_within_its_grace_after_the_switch_back_and_its_book_offered_again(
        lane: E2EEnv, node: str, core: Any) -> None:
    env = lane
    env.kubectl("delete", "pods,resourceclaims", "--all", "-n", NS, "--wait=true", "--ignore-not-found", timeout=120)
    # 1. a pod gets its book through DRA (topology/book: 1, served through the DeviceClass's extendedResourceName)
    env.helm_upgrade(*DRA_VALUES)
    held = book_pod(env, "dra-held")
    held["spec"]["terminationGracePeriodSeconds"] = GRACE
    held["spec"]["containers"][0]["command"] = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    apply(env, held)
    running_after(env, "dra-held")
    status = kjson(env, "-n", NS, "get", "pod", "dra-held")["status"]
    assert status.get("extendedResourceClaimStatus"), status  # through DRA, not the device plugin

    # 2. helm upgrade --set mode=deviceplugin: the DRA plugin stays registered for the claim's unprepare only
    env.helm_upgrade()
    wait_kubectl("the agent in device-plugin mode to be ready", lambda: agent_ready(env), timeout=180)
    books = 2  # one per real CPU (the module's docstring)
    wait_kubectl("the device plugin's books in the Node's capacity", lambda: book_count(env, node, "capacity") == books,
                 timeout=60)
    wait_kubectl("the free book offered, the claimed one not", lambda: book_count(env, node, "allocatable") == 1,
                 timeout=60)
    gauge = "topology_agent_dra_unprepare_only_claims"
    assert metric(metrics(agent_pod_of(core, env, node)), gauge) == 1
    wait_kubectl("no ResourceSlice of the node", lambda: slices(env, node) == [], timeout=30)

    # 3. the pod deleted: gone within its grace period
    t0 = time.monotonic()
    env.kubectl("-n", NS, "delete", "pod", "dra-held", "--wait=false", timeout=60)
    gone = wait_kubectl("dra-held gone", lambda: "dra-held" not in {
        p["metadata"]["name"] for p in kjson(env, "-n", NS, "get", "pods")["items"]}, timeout=GRACE + 60, every=0.5)
    took = time.monotonic() - t0
    print(f"dra-held deleted after the switch back: gone after {took:.1f} s (grace {GRACE} s)")
    assert gone and took <= GRACE, f"dra-held took {took:.1f} s to go, more than its {GRACE} s grace"

    # 4. the books offered again, the DRA plugin unregistered, and a new book pod runs
    t1 = time.monotonic()
    wait_kubectl("both books offered again", lambda: book_count(env, node, "allocatable") == books, timeout=60)
    print(f"both books offered again {time.monotonic() - t1:.1f} s after the pod went")
    wait_kubectl("the DRA plugin unregistered", lambda: metric(metrics(agent_pod_of(core, env, node)), gauge) == 0,
                 timeout=30)
    apply(env, book_pod(env, "after-unprepare"))
    running_after(env, "after-unprepare", timeout=60)
    delete(env, "pod/after-unprepare")
