"""Which cpuset enforcement is in force (``--cpuset-enforcement none|cri|nri|auto``): the composition
root's choice, also shown by discover and explain. The rule is :func:`agent.policy.enforcement_choice.enforcement_mode`;
this adds the two looks it needs (an NRI socket that answers, a CRI socket that exists)."""

from __future__ import annotations

from pathlib import Path

from agent.app.config import AgentConfig
from agent.app.paths import CRI_SOCKETS
from agent.policy.enforcement_choice import enforcement_mode


def cri_socket_of(config: AgentConfig) -> Path:
    """The CRI socket given, else the first usual one that exists, else the first usual one."""
    return config.cri_socket or next((Path(p) for p in CRI_SOCKETS if Path(p).exists()), Path(CRI_SOCKETS[0]))


def choose_enforcement(config: AgentConfig) -> tuple[str, str]:
    """The enforcement in force (none, cri, nri) and why: for auto, the NRI socket is dialed once."""
    if config.cpuset_enforcement != "auto":
        return enforcement_mode(config.cpuset_enforcement, False, False)
    from agent.nri.probe import socket_answers  # a socket: only auto dials one

    nri = socket_answers(config.nri_socket)
    cri = cri_socket_of(config).exists()
    return enforcement_mode(config.cpuset_enforcement, nri, cri)
