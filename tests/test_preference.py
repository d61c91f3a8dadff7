"""GetPreferredAllocation policy: keep multi-group requests close, balanced and deterministic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import PreferenceError
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.preference import preferred_allocation
from agent.topology.embedded import load_embedded

Z16 = group_topology(load_embedded("z16-lpar"), GroupingSettings(levels=("book", "socket")))
BOOKS = Z16.by_id("topology/book")
SOCKETS = Z16.by_id("topology/socket")
PR = group_topology(load_embedded("pr40714")).by_id("topology/book")
VERTICAL = group_topology(load_embedded("z16-vertical"), GroupingSettings(levels=("socket",))).by_id("topology/socket")


def test_two_books_come_from_one_drawer() -> None:
    available = ["drawer0-book0", "drawer1-book4", "drawer1-book6"]
    assert preferred_allocation(BOOKS, available, [], 2) == ["drawer1-book4", "drawer1-book6"]


def test_must_include_pulls_the_rest_into_its_drawer() -> None:
    got = preferred_allocation(BOOKS, list(BOOKS), ["drawer1-book5"], 2)
    assert got[0] == "drawer1-book5" and got[1].startswith("drawer1-")


def test_two_sockets_come_from_one_book() -> None:
    got = preferred_allocation(SOCKETS, list(SOCKETS), [], 2)
    assert got == ["drawer0-book0-socket0", "drawer0-book0-socket1"]


def test_balanced_ranks_on_the_pr40714_machine() -> None:
    # Books of 12, 12 and 1 cores: two ranks take the two big books, not the 1-core one.
    assert preferred_allocation(PR, list(PR), [], 2) == ["drawer0-book0", "drawer0-book1"]
    assert preferred_allocation(PR, ["drawer0-book2", "drawer0-book1", "drawer0-book0"], [], 1) == ["drawer0-book0"]


def test_vertical_low_groups_come_last_among_equals() -> None:
    free = ["drawer0-book1-socket0", "drawer0-book1-socket1", "drawer0-book0-socket0"]
    assert preferred_allocation(VERTICAL, free, [], 1) == ["drawer0-book0-socket0"]


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        (["drawer0-book0"], ["nope"], 1, "unknown must-include"),
        (["drawer0-book0"], [], 2, "exceeds"),
        (["drawer0-book0", "drawer0-book1"], ["drawer0-book0", "drawer0-book1"], 1, "smaller"),
    ],
)
def test_impossible_requests_are_errors(available: list[str], must: list[str], size: int, message: str) -> None:
    with pytest.raises(PreferenceError, match=message):
        preferred_allocation(BOOKS, available, must, size)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_answer_is_exact_contains_must_and_is_deterministic(data: st.DataObject) -> None:
    table = data.draw(st.sampled_from([BOOKS, SOCKETS, PR, VERTICAL]))
    ids = list(table)
    available = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=len(available)))
    size = data.draw(st.integers(min_value=len(must), max_value=len(available)))
    got = preferred_allocation(table, available, must, size)
    assert len(got) == size and len(set(got)) == size
    assert set(must) <= set(got) <= set(available)
    assert got == preferred_allocation(table, list(reversed(available)), must, size)
