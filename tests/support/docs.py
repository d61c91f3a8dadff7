"""Reading the docs as data: a Markdown table's rows after a heading, the `names` in a cell, and the page of what a
container gets (docs/inference/what-a-container-gets.md), which the tests hold the code to."""

from __future__ import annotations

import re

from tests.support.env import REPO

CONTAINER = (REPO / "docs" / "inference" / "what-a-container-gets.md").read_text(encoding="utf-8")


def table_after(heading: str, doc: str) -> list[list[str]]:
    """The rows of the first Markdown table after ``heading`` in ``doc`` (header and rule left out)."""
    text = doc[doc.index(heading):]
    rows: list[list[str]] = []
    for line in text.splitlines()[1:]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            rows.append(cells)
        elif rows:
            break
    return rows[2:]


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)
