"""``json.dumps(value, indent=2)`` for the plain values the reports make, without importing :mod:`json`.

:mod:`json` imports :mod:`re` (and with it ``enum``, ``functools``, ``collections``): 3 ms of a
``topology-agent discover``, which is compared with lscpu (issue 23). The reports are dicts with string keys,
lists, tuples, strings, ints, booleans and None; such a value is written here, character for character as
``json.dumps(value, indent=2)`` writes it (``tests/test_jsontext.py`` compares the two). Anything else (a
float, a subclass, a string that needs an escape, a key that is not a string) is left to :mod:`json` itself.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: discover starts without importing typing
if TYPE_CHECKING:
    from typing import Any


class _NotPlain(Exception):
    """A value this module does not write: json.dumps writes the whole value instead."""


def json_text(value: Any, indent: int = 2) -> str:
    """``json.dumps(value, indent=indent)``, byte for byte."""
    out: list[str] = []
    try:
        _write(value, out, "\n", " " * indent)
    except (_NotPlain, RecursionError):
        import json

        return json.dumps(value, indent=indent)
    return "".join(out)


def _string(text: str) -> str:
    # Printable ASCII without a quote or a backslash is written as it is (json's ensure_ascii escapes the rest).
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    raise _NotPlain


def _write(value: Any, out: list[str], newline: str, step: str) -> None:
    kind = type(value)
    if kind is str:
        out.append(_string(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif kind is int:
        out.append(int.__repr__(value))
    elif kind is list or kind is tuple:
        if not value:
            out.append("[]")
            return
        inner = newline + step
        separator = "[" + inner
        for item in value:
            out.append(separator)
            _write(item, out, inner, step)
            separator = "," + inner
        out.append(newline + "]")
    elif kind is dict:
        if not value:
            out.append("{}")
            return
        inner = newline + step
        separator = "{" + inner
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            out.append(separator + _string(key) + ": ")
            _write(item, out, inner, step)
            separator = "," + inner
        out.append(newline + "}")
    else:
        raise _NotPlain
