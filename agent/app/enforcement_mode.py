"""Which cpuset enforcement is in force (``--cpuset-enforcement none|cri|nri|auto``): the composition
root's choice, also shown by discover and explain. The rule is :func:`agent.policy.creation.enforcement_mode`;
this adds the two looks it needs (an NRI socket that answers, a CRI socket that exists)."""

from __future__ import annotations

from pathlib import Path

from agent.app.config import AgentConfig
from agent.app.paths import CRI_SOCKETS
from agent.nri.probe import socket_answers
from agent.policy.creation import enforcement_mode


def cri_socket_of(config: AgentConfig) -> Path:
    """The CRI socket given, else the first usual one that exists, else the first usual one."""
    return config.cri_socket or next((Path(p) for p in CRI_SOCKETS if Path(p).exists()), Path(CRI_SOCKETS[0]))


def choose_enforcement(config: AgentConfig) -> tuple[str, str]:
    """The enforcement in force (none, cri, nri) and why: for auto, the NRI socket is dialed once."""
    nri = config.cpuset_enforcement == "auto" and socket_answers(config.nri_socket)
    cri = config.cpuset_enforcement == "auto" and cri_socket_of(config).exists()
    return enforcement_mode(config.cpuset_enforcement, nri, cri)
