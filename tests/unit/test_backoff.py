"""agent/backoff.py: doubling from the first delay to the cap, jitter that only shortens, reset on success, and a
wait that an event ends at once."""

from __future__ import annotations

import threading
import time

import pytest

from agent.backoff import Backoff


def test_doubles_from_first_to_cap_and_resets() -> None:
    backoff = Backoff(0.1, 1.0, jitter=0)
    assert [backoff.next() for _ in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    backoff.reset()
    assert backoff.next() == pytest.approx(0.1)
    assert Backoff(1.0, 30.0).nominal(10**6) == 30.0  # no overflow on a long outage


def test_jitter_shortens_by_at_most_its_fraction_never_lengthens() -> None:
    low, high = Backoff(1.0, 8.0, jitter=0.25, rand=lambda: 0.999999), Backoff(1.0, 8.0, jitter=0.25, rand=lambda: 0.0)
    assert [round(low.next(), 3) for _ in range(5)] == [0.75, 1.5, 3.0, 6.0, 6.0]
    assert [high.next() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    spread = {round(Backoff(1.0, 1.0).next(), 6) for _ in range(50)}  # the default: random, within [0.8, 1.0]
    assert len(spread) > 1 and all(0.8 <= d <= 1.0 for d in spread)


def test_a_cap_below_first_is_first_and_a_bad_jitter_is_refused() -> None:
    assert Backoff(2.0, 1.0, jitter=0).next() == 2.0
    with pytest.raises(ValueError):
        Backoff(1.0, 2.0, jitter=1.0)


def test_wait_ends_when_the_event_is_set() -> None:
    event = threading.Event()
    backoff = Backoff(30.0, 30.0)
    threading.Timer(0.05, event.set).start()
    started = time.monotonic()
    assert backoff.wait(event)
    assert time.monotonic() - started < 10
    assert not Backoff(0.01, 0.01).wait(threading.Event())  # the delay ran out
