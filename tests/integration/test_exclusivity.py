"""Book/socket exclusivity through pod-resources, health from CPU changes, state after restarts,
all through the kubelet emulator and its pod-resources server."""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import grpc
import pytest

from agent.app.build import build_agent
from agent.policy.device_states import overlaps
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.embedded import load_embedded
from agent.topology.model import Topology
from agent.topology.sysfs import read_sysfs, sysfs_fingerprint
from tests.support.env import BOOK, SOCKET
from tests.support.harness import running_node, short_tmpdir
from topology_devkit.kubelet_emulator import AdmissionError, Container, KubeletEmulator
from topology_devkit.sysfs_writer import write_sysfs_tree


def test_a_book_pod_blocks_its_sockets_until_deleted() -> None:
    with running_node() as node:
        k = node.kubelet
        pod = k.admit_pod("default", "book", [Container("c", {BOOK: 1})])
        (book,) = pod.devices("c", BOOK)
        inside = {s for s in k.devices(SOCKET) if s.startswith(book + "-")}
        k.wait_for(lambda: k.unhealthy_devices(SOCKET) == inside, what="sockets of the held book blocked")
        assert k.allocatable(SOCKET) == 16 - len(inside) and k.capacity(SOCKET) == 16
        assert k.unhealthy_devices(BOOK) == set()  # the held book itself is never marked
        k.wait_for(lambda: node.agent.devices.holders().get((BOOK, book)) == ["default/book/c"], what="listed")
        k.delete_pod("default", "book")
        k.wait_for(lambda: k.unhealthy_devices(SOCKET) == set(), what="sockets healthy after the pod is gone")


def test_a_socket_pod_blocks_its_book_and_allocate_rechecks() -> None:
    with running_node() as node:
        k = node.kubelet
        pod = k.admit_pod("default", "sock", [Container("c", {SOCKET: 1})])
        (socket_id,) = pod.devices("c", SOCKET)
        book = socket_id.rsplit("-", 1)[0]
        k.wait_for(lambda: k.unhealthy_devices(BOOK) == {book}, what="the socket's book blocked")
        k.wait_for(lambda: node.agent.devices.holders().get((SOCKET, socket_id)) == ["default/sock/c"], what="listed")
        # A conflict that slips through (kubelet acting on an older snapshot) is refused by Allocate itself.
        with pytest.raises(grpc.RpcError) as err:
            node.allocate(BOOK, [book])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "held by default/sock/c" in err.value.details()


def test_cpu_offline_turns_its_groups_unhealthy_within_one_rescan_and_back() -> None:
    base = load_embedded("z16-lpar")
    root = short_tmpdir() / "host"
    write_sysfs_tree(base, root)

    def rewrite(topology: Topology) -> None:
        shutil.rmtree(root)
        write_sysfs_tree(topology, root)

    with running_node(topology=read_sysfs(root), loader=lambda: read_sysfs(root)) as node:
        k = node.kubelet
        rewrite(Topology(machine=base.machine, cpus=tuple(
            dataclasses.replace(c, online=c.cpu != 13) for c in base.cpus)))
        node.agent.rescan()  # one rescan period, driven by the test
        k.wait_for(lambda: k.unhealthy_devices(BOOK) == {"drawer0-book1"} and
                   k.unhealthy_devices(SOCKET) == {"drawer0-book1-socket0"}, what="groups of cpu 13 unhealthy")
        assert set(k.devices(BOOK)) == {g.id for g in node.agent.grouping.by_resource(BOOK)}  # no id dropped
        rewrite(base)
        node.agent.rescan()
        k.wait_for(lambda: not k.unhealthy_devices(BOOK) and not k.unhealthy_devices(SOCKET), what="whole again")


def test_steady_state_makes_pod_resources_calls_only_from_its_loop() -> None:
    with running_node(pod_resources_interval=0.05) as node:
        k = node.kubelet
        k.admit_pod("default", "p", [Container("c", {BOOK: 1})])
        loop = node.agent.pod_resources_loop
        started, runs_before = time.monotonic(), loop.runs
        k.wait_for(lambda: loop.runs >= runs_before + 10, what="ten polls")
        loop.stop()
        elapsed = time.monotonic() - started
        # Every List kubelet served came from the loop (none from Allocate or elsewhere), at its rate,
        # but the one read before serving.
        assert k.pod_resources_calls == loop.runs + 1
        assert loop.runs - runs_before <= elapsed / 0.05 + 2
        assert k.pod_resources_rejected == 0


def serve(kubelet: KubeletEmulator) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "serve", "--topology-file", "embedded:z16-lpar", "--levels", "book,socket",
         "--kubelet-dir", str(kubelet.device_plugin_dir), "--pod-resources-socket", str(kubelet.pod_resources_socket),
         "--pod-resources-interval", "0.1", "--rescan-interval", "0", "--metrics-port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_agent_killed_and_restarted_publishes_the_blocked_set_before_serving() -> None:
    with KubeletEmulator(short_tmpdir()) as k:
        first = serve(k)
        try:
            k.wait_registered(BOOK, timeout=20)
            k.wait_registered(SOCKET, timeout=20)
            pod = k.admit_pod("default", "held", [Container("c", {BOOK: 1})])
            (book,) = pod.devices("c", BOOK)
            inside = {s for s in k.devices(SOCKET) if s.startswith(book + "-")}
            k.wait_for(lambda: k.unhealthy_devices(SOCKET) == inside, timeout=10)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        k.restart()  # the new instance's registration is watched from a clean start
        before = k.snapshots(SOCKET)
        second = serve(k)
        try:
            k.wait_for(lambda: k.registrations(SOCKET) >= 2 and k.snapshots(SOCKET) > before, timeout=20)
            # The very first snapshot of the new instance already holds the blocked set.
            assert k.snapshots(SOCKET) == before + 1
            assert k.unhealthy_devices(SOCKET) == inside
        finally:
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=20)
        assert second.returncode == 0


def held_sets(kubelet: KubeletEmulator) -> list[tuple[str, str]]:
    return [(resource, device) for pod in kubelet.pods() for c in pod.containers
            for resource in (BOOK, SOCKET) for device in pod.devices(c.name, resource)]


def test_random_walk_never_hands_out_an_id_twice() -> None:
    rnd = random.Random(40714)
    topology = load_embedded("z16-lpar")
    grouping = group_topology(topology, GroupingSettings(levels=("book", "socket")))
    groups = {(g.resource, g.id): g for g in grouping.groups}
    live: list[str] = []
    admitted = refused = 0
    with running_node(topology=topology) as node:
        k = node.kubelet
        for step in range(200):
            if step in (60, 100, 130):
                before = {r: k.registrations(r) for r in (BOOK, SOCKET)}
                if step == 100:  # the agent restarts: it must relearn what is held before serving
                    node.agent.stop()
                    node.agent = build_agent(topology, node.agent.config)
                    node.agent.start()
                else:
                    k.restart(down_for=0.02)
                for r in (BOOK, SOCKET):
                    k.wait_for(functools.partial(registered_since, k, r, before[r]), timeout=10,
                               what=f"{r} registered again at step {step}")
                # Until kubelet has its pods back a deleted pod keeps its devices (the emulator models it as kubelet
                # does): the walk goes on once they are synced, so that its admissions measure the agent.
                k.wait_for(k.pods_synced, timeout=10, what=f"the pods synced again at step {step}")
            if live and rnd.random() < 0.45:
                name = live.pop(rnd.randrange(len(live)))
                k.delete_pod("default", name)
            else:
                resource = rnd.choice([BOOK, SOCKET])
                name = f"p{step}"
                try:
                    k.admit_pod("default", name, [Container("c", {resource: rnd.choice([1, 1, 2])})])
                    live.append(name)
                    admitted += 1
                except AdmissionError:
                    refused += 1
            held = held_sets(k)
            assert len(held) == len(set(held)), f"step {step}: an id is held twice"
            for i, a in enumerate(held):
                for b in held[i + 1:]:
                    assert not overlaps(groups[a], groups[b]), f"step {step}: {a} and {b} overlap"
    assert admitted > 60 and refused < admitted


def test_two_topology_resources_in_one_container_are_called_out(caplog: pytest.LogCaptureFixture) -> None:
    with running_node() as node:
        k = node.kubelet
        with caplog.at_level("WARNING"):
            try:
                k.admit_pod("default", "both", [Container("c", {BOOK: 1, SOCKET: 1})])
            except AdmissionError as err:  # the socket lay inside the book: Allocate refused it, saying why
                assert "a container must request only one topology resource" in str(err)
        assert any("a container must request only one topology resource" in r.getMessage() for r in caplog.records)


def test_quick_rescans_read_everything_only_when_the_fingerprint_moves() -> None:
    base = load_embedded("z16-lpar")
    root = short_tmpdir() / "host"
    write_sysfs_tree(base, root)
    reads: list[int] = []

    def load() -> Topology:
        reads.append(1)
        return read_sysfs(root)

    with running_node(topology=read_sysfs(root), loader=load, fingerprint=lambda: sysfs_fingerprint(root),
                      full_rescan_every=3) as node:
        node.agent.rescan()
        node.agent.rescan()
        assert len(reads) == 0  # nothing moved: two cheap rescans
        node.agent.rescan()
        assert len(reads) == 1  # every third rescan reads everything anyway
        shutil.rmtree(root)
        write_sysfs_tree(Topology(machine=base.machine, cpus=tuple(
            dataclasses.replace(c, online=c.cpu != 40) for c in base.cpus)), root)
        node.agent.rescan()
        assert len(reads) == 2  # the online list changed: read now
        node.kubelet.wait_for(lambda: node.kubelet.unhealthy_devices(BOOK) == {"drawer0-book3"})
        node.agent.rescan(full=True)
        assert len(reads) == 3


def test_a_restart_on_a_changed_topology_keeps_the_held_groups() -> None:
    topology = load_embedded("pr40714")  # books of 12, 12 and 1 cores: auto picks books
    with running_node(topology=topology, levels=None) as node:
        k = node.kubelet
        pod = k.admit_pod("default", "tp1", [Container("c", {BOOK: 1})])
        (book,) = pod.devices("c", BOOK)
        k.wait_for(lambda: node.agent.devices.holders().get((BOOK, book)) == ["default/tp1/c"], what="listed")
        config = node.agent.config
        node.agent.stop()
        # While the agent is down, books 1 and 2 go offline: found afresh, one book is left and the
        # automatic choice would switch to sockets, inside the held book.
        shrunk = Topology(machine=topology.machine, cpus=tuple(
            dataclasses.replace(c, online=c.cpu < 24) for c in topology.cpus))
        assert group_topology(shrunk).levels == ("socket",)
        before, snapshots = k.registrations(BOOK), k.snapshots(BOOK)
        node.agent = build_agent(shrunk, config)
        node.agent.start()
        k.wait_for(lambda: k.registrations(BOOK) > before and k.snapshots(BOOK) > snapshots, what="registered")
        assert k.resources() == [BOOK]  # no socket resource inside the held book
        assert k.devices(BOOK) == {"drawer0-book0": "Healthy", "drawer0-book1": "Unhealthy"}
        env = k.start_container("default", "tp1", "c")
        assert env["TOPOLOGY_CPUS"] == "0-23"


def registered_since(kubelet: KubeletEmulator, resource: str, before: int) -> bool:
    return kubelet.registrations(resource) > before and bool(kubelet.devices(resource))


def test_an_empty_list_right_after_a_kubelet_restart_releases_no_hold() -> None:
    with running_node() as node:
        k = node.kubelet
        pod = k.admit_pod("default", "book", [Container("c", {BOOK: 1})])
        (book,) = pod.devices("c", BOOK)
        inside = {s for s in k.devices(SOCKET) if s.startswith(book + "-")}
        k.wait_for(lambda: node.agent.devices.holders().get((BOOK, book)) == ["default/book/c"], what="listed")
        k.pods_resync = 30.0  # kubelet's pod manager stays empty until the test says the API server answered
        k.restart()
        calls = k.pod_resources_calls
        k.wait_for(lambda: k.pod_resources_calls >= calls + 10, timeout=10, what="ten empty Lists")
        assert (BOOK, book) in node.agent.devices.held_keys()
        k.wait_registered(SOCKET, timeout=10)
        k.wait_for(lambda: k.unhealthy_devices(SOCKET) == inside, what="the book's sockets still blocked")
        with pytest.raises(grpc.RpcError) as refused:
            node.allocate(SOCKET, [sorted(inside)[0]])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        k._pods_synced_at = 0.0  # the API server sent the pods back
        k.wait_for(lambda: node.agent.devices.holders().get((BOOK, book)) == ["default/book/c"], timeout=20,
                   what="listed again, and only by the pod")


def test_a_book_held_by_a_plain_init_container_stays_held_for_the_pods_lifetime() -> None:
    with running_node() as node:
        k = node.kubelet
        pod = k.admit_pod("default", "warm", [Container("fetch", {BOOK: 1}, init=True), Container("app", {})])
        (book,) = pod.devices("fetch", BOOK)
        inside = {s for s in k.devices(SOCKET) if s.startswith(book + "-")}
        # Past the visibility grace (and the settle time of a kubelet that started with the agent), the
        # hold is the pod's, although List shows no container holding the book.
        k.wait_for(lambda: node.agent.devices.holders().get((BOOK, book)) == ["default/warm/(init container)"],
                   timeout=30, what="the hold taken to be the pod's")
        runs = node.agent.pod_resources_loop.runs
        k.wait_for(lambda: node.agent.pod_resources_loop.runs >= runs + 3, what="Lists after that")
        assert k.unhealthy_devices(SOCKET) == inside
        k.delete_pod("default", "warm")
        k.wait_for(lambda: not k.unhealthy_devices(SOCKET), timeout=10, what="released with the pod")



def test_mixed_book_and_socket_pods_admitted_back_to_back_all_fit() -> None:
    # Each admission comes right after the one before: kubelet's available list may still hold the devices
    # the last Allocate blocked (it learns of them from the next ListAndWatch message), and the preference
    # must not offer them (before, 6 of 100 such pods failed with UnexpectedAdmissionError).
    with running_node(topology="z16-400") as node:
        k = node.kubelet
        failures = []
        order = random.Random(20)
        for r in range(5):
            kinds = [BOOK] * 6 + [SOCKET] * 14  # 13 of the 16 books at most
            order.shuffle(kinds)
            for n, resource in enumerate(kinds):
                try:
                    k.admit_pod("default", f"r{r}-p{n}", [Container("c", {resource: 1})])
                except AdmissionError as err:
                    failures.append(f"{resource}: {err}")
            for pod in k.pods():
                k.delete_pod(pod.namespace, pod.name)
            k.wait_for(lambda: not k.unhealthy_devices(BOOK) and not k.unhealthy_devices(SOCKET), timeout=20,
                       what="the node free again")
        assert failures == []
