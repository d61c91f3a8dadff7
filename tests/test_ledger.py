"""Who holds which device, and the admission rule that keeps books and sockets exclusive. Pure."""

from __future__ import annotations

from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.health import Holder, overlap_map
from agent.policy.ledger import PENDING, AllocationLedger, ListedDevice
from agent.topology.embedded import load_embedded
from tests.conftest import BOOK, SOCKET

GROUPING = group_topology(load_embedded("z16-lpar"), GroupingSettings(levels=("book", "socket")))
OVERLAP = overlap_map(GROUPING)
POD = Holder("default", "p", "c")


def test_ledger_pending_until_listed_then_listed_until_gone() -> None:
    ledger = AllocationLedger(frozenset({BOOK, SOCKET}), visibility_grace=2)
    ledger.admit(BOOK, [["drawer0-book0"]], 100.0, OVERLAP)
    assert (BOOK, "drawer0-book0") in ledger.held()
    ledger.apply_list([], started=100.5, now=100.6)  # too early to be visible: kept
    assert (BOOK, "drawer0-book0") in ledger.held()
    row = ListedDevice("default", "p", "c", BOOK, ("drawer0-book0",))
    ledger.apply_list([row, ListedDevice("default", "q", "c", "other/thing", ("x",))], started=101.0, now=101.1)
    assert ledger.held() == {(BOOK, "drawer0-book0"): {POD}} and not ledger.pending
    ledger.apply_list([], started=200.0, now=200.1)  # pod deleted
    assert ledger.held() == {}


def test_ledger_forgets_a_rolled_back_allocation() -> None:
    ledger = AllocationLedger(frozenset({BOOK}), visibility_grace=2)
    ledger.admit(BOOK, [["drawer0-book0"]], 100.0, OVERLAP)
    ledger.apply_list([], started=103.0, now=103.1)  # a List begun well after it does not show it
    assert ledger.held() == {}


def test_without_an_answer_from_pod_resources_nothing_handed_out_is_forgotten() -> None:
    ledger = AllocationLedger(frozenset({BOOK, SOCKET}), visibility_grace=2)
    ledger.admit(BOOK, [["drawer0-book0"]], 100.0, OVERLAP)
    # An hour later, with no List answer in between, the book is still held and its sockets refused.
    refused = ledger.admit(SOCKET, [["drawer0-book0-socket0"]], 3700.0, OVERLAP)
    assert refused.refused is not None and (BOOK, "drawer0-book0") in ledger.held()


def test_restored_holds_are_decided_by_the_next_list() -> None:
    ledger = AllocationLedger(frozenset({BOOK}), visibility_grace=2)
    ledger.restore([(BOOK, "drawer0-book0"), (BOOK, "drawer0-book1"), ("other/x", "y")], now=50.0)
    assert set(ledger.held()) == {(BOOK, "drawer0-book0"), (BOOK, "drawer0-book1")}
    ledger.apply_list([ListedDevice("ml", "llm", "c", BOOK, ("drawer0-book1",))], started=50.0, now=50.1)
    assert ledger.held() == {(BOOK, "drawer0-book1"): frozenset({Holder("ml", "llm", "c")})}


def test_admit_refuses_an_overlap_and_records_nothing_of_the_whole_allocate() -> None:
    ledger = AllocationLedger(frozenset({BOOK, SOCKET}))
    assert ledger.admit(BOOK, [["drawer0-book0"]], 10.0, OVERLAP).changed
    # One Allocate with two container requests: the second overlaps the held book.
    refused = ledger.admit(SOCKET, [["drawer1-book4-socket0"], ["drawer0-book0-socket1"]], 20.0, OVERLAP)
    assert refused.refused is not None and "drawer0-book0" in refused.refused and "not yet listed" in refused.refused
    assert set(ledger.held()) == {(BOOK, "drawer0-book0")}
    assert ledger.admit(SOCKET, [["drawer1-book4-socket0"]], 30.0, OVERLAP).refused is None


def test_a_repeated_allocate_renews_the_hold_without_a_change() -> None:
    ledger = AllocationLedger(frozenset({BOOK}))
    assert ledger.admit(BOOK, [["drawer0-book0"]], 10.0, OVERLAP).changed
    again = ledger.admit(BOOK, [["drawer0-book0"]], 50.0, OVERLAP)
    assert again.refused is None and not again.changed
    assert ledger.pending == {(BOOK, "drawer0-book0"): 50.0}
    assert ledger.held() == {(BOOK, "drawer0-book0"): frozenset({PENDING})}


def test_two_resources_back_to_back_are_said_to_maybe_be_one_container() -> None:
    ledger = AllocationLedger(frozenset({BOOK, SOCKET}), same_container_window=0.5)
    ledger.admit(BOOK, [["drawer0-book0"]], 10.0, OVERLAP)
    refused = ledger.admit(SOCKET, [["drawer0-book0-socket0"]], 10.1, OVERLAP)
    assert refused.recent == (BOOK,) and "only one topology resource" in (refused.refused or "")
    later = ledger.admit(SOCKET, [["drawer1-book4-socket0"]], 11.0, OVERLAP)
    assert later.recent == () and later.refused is None
