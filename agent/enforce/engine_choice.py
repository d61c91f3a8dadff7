"""Which cpuset enforcement is in force at start (``--cpuset-enforcement none|cri|nri|auto``), from plain values:
the composition root's choice, also shown by discover and explain. The rule is
:func:`agent.policy.enforcement_choice.enforcement_mode`; this adds the two looks it needs (an NRI socket that
answers, a CRI socket that exists). Only auto dials a socket."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agent.policy.enforcement_choice import enforcement_mode


def cri_socket_of(given: Path | None, usual: Sequence[str]) -> Path:
    """The CRI socket given, else the first usual one that exists, else the first usual one."""
    return given or next((Path(p) for p in usual if Path(p).exists()), Path(usual[0]))


def choose_enforcement(requested: str, nri_socket: Path, cri_socket: Path) -> tuple[str, str]:
    """The enforcement in force (none, cri, nri) and why: for auto, the NRI socket is dialed once."""
    if requested != "auto":
        return enforcement_mode(requested, False, False)
    from agent.nri.probe import socket_answers  # a socket: only auto dials one

    nri = socket_answers(nri_socket)
    return enforcement_mode(requested, nri, cri_socket.exists())
