"""Who holds which device, and the admission rule that keeps books and sockets exclusive. Pure."""

from __future__ import annotations

from agent.policy.device_states import overlap_map
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.keys import Holder
from agent.policy.ledger import PENDING, AllocationLedger, ListedDevice
from agent.topology.embedded import load_embedded
from tests.support.env import BOOK, SOCKET

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


def test_an_empty_list_right_after_a_kubelet_restart_releases_nothing() -> None:
    # kubelet answers List from its pod manager, empty until the API server sends the pods again.
    ledger = AllocationLedger(frozenset({BOOK, SOCKET}), visibility_grace=2, restart_settle=10)
    ledger.apply_list([], started=90.0, now=90.1)
    ledger.admit(BOOK, [["drawer0-book0"]], 100.0, OVERLAP)
    ledger.admit(SOCKET, [["drawer1-book4-socket0"]], 100.0, OVERLAP)
    ledger.apply_list([ListedDevice("ml", "llm", "c", BOOK, ("drawer0-book0",))], started=103.0, now=103.1)
    assert set(ledger.held()) == {(BOOK, "drawer0-book0")}  # the socket was rolled back; the book listed
    ledger.admit(SOCKET, [["drawer1-book5-socket0"]], 104.0, OVERLAP)  # just before kubelet went down
    ledger.kubelet_restarted(105.0)
    for t in (105.5, 107.0, 112.0):  # empty while kubelet's pod manager fills again, and before the settle
        ledger.apply_list([], started=t, now=t + 0.1)
        assert set(ledger.held()) == {(BOOK, "drawer0-book0"), (SOCKET, "drawer1-book5-socket0")}
    assert ledger.admit(SOCKET, [["drawer0-book0-socket1"]], 112.5, OVERLAP).refused is not None
    # The cpuset enforcement still knows the book's container meanwhile.
    assert ledger.containers() == {(BOOK, "drawer0-book0"): frozenset({Holder("ml", "llm", "c")})}
    # kubelet has its pods again: the book is listed, the socket pod is gone for good.
    ledger.apply_list([ListedDevice("ml", "llm", "c", BOOK, ("drawer0-book0",))], started=115.0, now=115.1)
    ledger.apply_list([ListedDevice("ml", "llm", "c", BOOK, ("drawer0-book0",))], started=116.0, now=116.1)
    assert ledger.held() == {(BOOK, "drawer0-book0"): frozenset({Holder("ml", "llm", "c")})}
    ledger.apply_list([], started=120.0, now=120.1)  # settled: an empty List is a release again
    assert ledger.held() == {}


def test_after_a_kubelet_restart_a_list_that_still_changes_releases_nothing() -> None:
    ledger = AllocationLedger(frozenset({BOOK, SOCKET}), visibility_grace=2, restart_settle=10)
    book = ListedDevice("ml", "llm", "c", BOOK, ("drawer0-book0",))
    ledger.apply_list([book], started=100.0, now=100.1)
    ledger.kubelet_restarted(105.0)
    other = ListedDevice("ml", "other", "c", SOCKET, ("drawer1-book4-socket0",))
    ledger.apply_list([other], started=116.0, now=116.1)  # past the settle time, but the first answer since
    assert (BOOK, "drawer0-book0") in ledger.held() and (SOCKET, "drawer1-book4-socket0") in ledger.held()
    ledger.apply_list([other], started=117.0, now=117.1)  # the same answer twice: kubelet's view has settled
    assert set(ledger.held()) == {(SOCKET, "drawer1-book4-socket0")}


def test_a_book_held_by_a_plain_init_container_lasts_while_its_pod_is_listed() -> None:
    # kubelet's List leaves out plain init containers, but kubelet keeps their devices allocated to the pod.
    ledger = AllocationLedger(frozenset({BOOK, SOCKET}), visibility_grace=2)
    ledger.apply_list([ListedDevice("ml", "old", "c", "other/thing", ("x",))], started=90.0, now=90.1)
    ledger.admit(BOOK, [["drawer0-book0"]], 100.0, OVERLAP)
    app = ListedDevice("ml", "warm", "app", "other/thing", ())  # the pod's app container: none of our devices
    for t in (103.0, 200.0, 5000.0):
        ledger.apply_list([app], started=t, now=t + 0.1)
        assert set(ledger.held()) == {(BOOK, "drawer0-book0")}
        assert ledger.admit(SOCKET, [["drawer0-book0-socket0"]], t + 0.2, OVERLAP).refused is not None
    assert "ml/warm" in str(min(ledger.held()[(BOOK, "drawer0-book0")]))
    ledger.apply_list([], started=6000.0, now=6000.1)  # the pod is gone
    assert ledger.held() == {}


def test_a_rolled_back_allocation_is_forgotten_when_no_new_pod_appeared() -> None:
    ledger = AllocationLedger(frozenset({BOOK}), visibility_grace=2)
    running = ListedDevice("ml", "old", "c", "other/thing", ("x",))
    ledger.apply_list([running], started=90.0, now=90.1)
    ledger.admit(BOOK, [["drawer0-book0"]], 100.0, OVERLAP)
    ledger.apply_list([running], started=103.0, now=103.1)  # no pod came: kubelet rolled the Allocate back
    assert ledger.held() == {}


def test_every_hold_is_exported_for_saving_and_restored_with_its_pod() -> None:
    ledger = AllocationLedger(frozenset({BOOK, SOCKET}), visibility_grace=2)
    ledger.apply_list([], started=90.0, now=90.1)
    ledger.admit(BOOK, [["drawer0-book0"]], 100.0, OVERLAP)
    ledger.apply_list([ListedDevice("ml", "warm", "app", "other/thing", ())], started=103.0, now=103.1)
    ledger.admit(SOCKET, [["drawer1-book4-socket0"]], 104.0, OVERLAP)
    ledger.apply_list([ListedDevice("ml", "warm", "app", "other/thing", ()),
                       ListedDevice("ml", "llm", "c", SOCKET, ("drawer1-book4-socket0",))], started=105.0, now=105.1)
    saved = ledger.saved()
    assert saved.keys == frozenset({(BOOK, "drawer0-book0"), (SOCKET, "drawer1-book4-socket0")})
    assert saved.pods == {(BOOK, "drawer0-book0"): frozenset({("ml", "warm")})}
    again = AllocationLedger(frozenset({BOOK, SOCKET}), visibility_grace=2)
    again.restore(saved.keys, now=10.0, pods=saved.pods)
    again.apply_list([ListedDevice("ml", "warm", "app", "other/thing", ())], started=10.0, now=10.1)
    assert set(again.held()) == {(BOOK, "drawer0-book0")}  # the socket's pod is gone; the init pod is not
