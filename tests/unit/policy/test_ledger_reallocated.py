"""A device kubelet Allocates again after the List that named its holder: the listed holder is gone (kubelet hands
out only devices no active pod holds), so it is not named as the holder any more while the device stays held.

Seen on the real cluster with CRI-O (``make e2e RUNTIME=crio``, tests/e2e/test_nri_real.py): a book pod deleted at
once (grace 0) is removed from kubelet at once while its container is still being killed; kubelet gave its book to the
next pod 1.6 s after the List that still named the first, and the agent, believing that List, did not believe the new
container's Allocate annotations ("another container holds those CPUs") and created it on the shared pool, moving it
to its book 0.7 s later at the next List."""

from __future__ import annotations

from agent.policy.keys import Holder
from agent.policy.ledger import AllocationLedger, ListedDevice
from tests.support.env import BOOK

KEY = (BOOK, "drawer0-book0")


def row(pod: str) -> ListedDevice:
    return ListedDevice("topology-e2e-pods", pod, "main", BOOK, ("drawer0-book0",))


def test_an_allocate_after_the_list_unnames_the_listed_holder_until_the_next_list() -> None:
    ledger = AllocationLedger(frozenset({BOOK}), visibility_grace=2)
    ledger.admit(BOOK, [["drawer0-book0"]], now=1.0, overlap={})
    ledger.apply_list([row("first")], started=2.0, now=2.1)
    first = Holder("topology-e2e-pods", "first", "main")
    assert ledger.containers()[KEY] == frozenset({first})
    ledger.admit(BOOK, [["drawer0-book0"]], now=3.6, overlap={})  # the first pod is gone; kubelet hands it on
    assert KEY not in ledger.containers()  # nobody named: the new holder's annotations are believed
    assert KEY in ledger.held() and KEY in ledger.pending  # still held: nothing is released by it
    ledger.apply_list([row("second")], started=4.0, now=4.1)
    assert ledger.containers()[KEY] == frozenset({Holder("topology-e2e-pods", "second", "main")})


def test_a_list_begun_after_the_allocate_is_believed_as_it_is() -> None:
    ledger = AllocationLedger(frozenset({BOOK}), visibility_grace=2)
    ledger.admit(BOOK, [["drawer0-book0"]], now=1.0, overlap={})
    ledger.apply_list([row("first")], started=1.5, now=1.6)
    assert ledger.containers()[KEY] == frozenset({Holder("topology-e2e-pods", "first", "main")})
