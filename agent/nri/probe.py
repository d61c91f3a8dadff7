"""Whether an NRI socket answers: one connect, no protocol (light: the command line uses it)."""

from __future__ import annotations

import socket
from pathlib import Path


def socket_answers(path: Path, timeout: float = 0.5) -> bool:
    """Something accepts connections on the NRI socket (a runtime with NRI enabled)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        sock.close()
