"""Mutations shared by the targets: JSON documents with one value replaced, deleted or grown, text cut short or
spliced with bytes, as hypothesis strategies. Pure."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# Values a hostile or buggy writer puts where a field was: wrong types, huge numbers, deep nesting, odd text.
json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from([0, -1, 1, 2**31, 2**63])
                | st.floats(allow_nan=False, allow_infinity=False)
                | st.text(max_size=20) | st.sampled_from(["", "-", "0-3", "3-0", "0,,1", "x", "1e9", "0x10", "\x00"]))
json_values = st.recursive(json_scalars, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=10)


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document: keys of objects, indexes of arrays."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += paths(value, (*prefix, index))
    return found


def _set(doc: Any, path: tuple[Any, ...], how: str, value: Any) -> Any:
    if not path:
        return value if how != "delete" else None
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if how == "delete":
        del parent[last]
    elif how == "duplicate" and isinstance(parent, list):
        parent.insert(last, json.loads(json.dumps(parent[last])))
    else:
        parent[last] = value
    return doc


@st.composite
def mutated_json(draw: st.DrawFn, doc: Any, max_edits: int = 3) -> Any:
    """``doc`` (not changed) with up to ``max_edits`` values replaced, deleted or duplicated."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(0, max_edits))):
        where = paths(doc)
        path = draw(st.sampled_from(where))
        how = draw(st.sampled_from(["replace", "delete", "duplicate"]))
        doc = _set(doc, path, how, draw(json_values) if how == "replace" else None)
    return doc


@st.composite
def mangled_text(draw: st.DrawFn, text: str) -> str:
    """``text`` cut short, spliced with random characters, or whole."""
    how = draw(st.sampled_from(["whole", "cut", "splice", "garbage"]))
    if how == "whole":
        return text
    if how == "garbage":
        return draw(st.text(max_size=200))
    at = draw(st.integers(0, len(text)))
    if how == "cut":
        return text[:at]
    return text[:at] + draw(st.text(min_size=1, max_size=20)) + text[at + draw(st.integers(0, 20)):]
