"""kubelet's directory watched with inotify: an idle agent polls it only every few seconds, so every
change that matters must wake it, and the watch must come back after the directory itself went."""

from __future__ import annotations

import shutil
import struct
import time

from agent.plugin.dirwatch import IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_IGNORED, closed
from agent.plugin.timing import Timing
from tests.support.env import BOOK
from tests.support.harness import FAST, running_node

# A safety poll far longer than any wait below: what happens in time was woken, not polled.
SLOW_POLL = Timing(poll=FAST.poll, idle_poll=60.0, stream_grace=FAST.stream_grace, backoff_min=FAST.backoff_min,
                   backoff_max=FAST.backoff_max, register_timeout=FAST.register_timeout)


def event(mask: int, name: bytes = b"") -> bytes:
    padded = name + b"\0" * (-len(name) % 16 or (16 if name else 0))
    return struct.pack("iIII", 1, mask, 0, len(padded)) + padded


def test_events_that_end_the_watch_are_told_apart_from_entries_coming_and_going() -> None:
    assert not closed(event(IN_CREATE, b"kubelet.sock") + event(IN_DELETE, b"topology-book.sock"))
    assert closed(event(IN_DELETE, b"kubelet.sock") + event(IN_DELETE_SELF) + event(IN_IGNORED))
    assert closed(event(IN_CREATE, b"a-rather-long-socket-name.sock") + event(IN_IGNORED))
    assert not closed(b"")


def test_kubelet_restarts_wake_the_agent_without_the_safety_poll() -> None:
    with running_node(levels=("book",), timing=SLOW_POLL) as node:
        k = node.kubelet
        for times in (2, 3):
            k.restart()

            def registered(times: int = times) -> bool:
                return k.registrations(BOOK) == times and k.allocatable(BOOK) > 0

            k.wait_for(registered, timeout=10, what=f"registration {times} after a restart, with a 60 s safety poll")


def test_a_broken_stream_wakes_the_agent_without_the_safety_poll() -> None:
    with running_node(levels=("book",), timing=SLOW_POLL) as node:
        k = node.kubelet
        manager = node.agent.manager
        # Past the stream grace after registering: no timer of the grace wakes the agent any more.
        # The agent records its registration just after kubelet has it: the entry may not be there yet.
        k.wait_for(lambda: time.monotonic() - manager.last_registered.get(BOOK, float("inf"))  # type: ignore[attr-defined]
                   > 2 * SLOW_POLL.stream_grace, timeout=10, what="the stream grace over")
        k.break_stream(BOOK)
        k.wait_for(lambda: k.registrations(BOOK) == 2 and k.allocatable(BOOK) > 0, timeout=10,
                   what="registered again after the stream broke, with a 60 s safety poll")


def test_the_watch_comes_back_after_kubelets_directory_was_deleted_and_recreated() -> None:
    with running_node(levels=("book",), timing=SLOW_POLL) as node:
        k = node.kubelet
        k.stop()
        shutil.rmtree(k.device_plugin_dir)  # the directory itself goes: its watch ends with it
        k.start()  # kubelet makes its directory again
        k.wait_for(lambda: k.registrations(BOOK) >= 1 and k.allocatable(BOOK) > 0, timeout=10,
                   what="registered in the recreated directory")
        k.wait_for(lambda: node.agent.manager.watching, timeout=10, what="the new directory watched")  # type: ignore[attr-defined]
        before = k.registrations(BOOK)
        k.restart()  # only a working watch on the new directory notices this before the 60 s poll
        k.wait_for(lambda: k.registrations(BOOK) == before + 1 and k.allocatable(BOOK) > 0, timeout=10,
                   what="registered again after a restart in the recreated directory")
