"""The Unix sockets the agent serves on (kubelet's device-plugin directory, the DRA plugin and registration sockets):
whether something answers on one, and a stale one cleared before serving.

Must hold: a live socket is never taken over (another instance serves it: the start fails), a directory at a socket
path is never removed, and a path longer than ``sun_path`` holds is refused before any bind.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from pathlib import Path

from agent.errors import SocketInUseError, SocketPathError

log = logging.getLogger("topology-agent.socket")

MAX_SOCKET_PATH = 107  # bytes: sun_path holds 108 with the terminating NUL


def too_long(path: Path) -> bool:
    """``path`` is longer than a Unix socket's address can hold."""
    return len(os.fsencode(path)) > MAX_SOCKET_PATH


def socket_is_live(path: Path) -> bool:
    """True when something accepts connections on the Unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def clear_stale_socket(path: Path) -> None:
    """Remove a socket left by a dead instance; refuse to take over a live one."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode) and socket_is_live(path):
        raise SocketInUseError(f"{path} is served by another running process (another topology-agent instance?); "
                               "refusing to take it over")
    if stat.S_ISDIR(st.st_mode):
        raise SocketPathError(f"{path} is a directory, not a socket: remove it")
    path.unlink()
    log.info("removed stale socket %s", path)
