"""Wake a waiter when entries of kubelet's device-plugin directory come or go (Linux inotify,
through ctypes). An idle agent then sleeps instead of polling; where inotify is unavailable
the caller keeps polling."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import threading
from pathlib import Path

log = logging.getLogger("topology-agent.plugin")

IN_CREATE = 0x100
IN_DELETE = 0x200
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000
MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF


class DirectoryWatch:
    def __init__(self, path: Path, wake: threading.Event) -> None:
        self.path = Path(path)
        self.wake = wake
        self._fd = -1
        self._stop_r, self._stop_w = -1, -1
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start watching; False when inotify is not available here (then poll instead)."""
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1 failed")
            if libc.inotify_add_watch(fd, os.fsencode(self.path), MASK) < 0:
                err = ctypes.get_errno()
                os.close(fd)
                raise OSError(err, f"inotify_add_watch {self.path} failed")
        except (OSError, AttributeError) as exc:
            log.info("no inotify on %s (%s): polling instead", self.path, exc)
            return False
        self._fd = fd
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="dirwatch", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                os.read(self._fd, 65536)  # the events themselves do not matter: something changed
            except BlockingIOError:
                continue
            except OSError:
                return
            self.wake.set()

    def stop(self) -> None:
        if self._thread is None:
            return
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=5)
        for fd in (self._fd, self._stop_r, self._stop_w):
            os.close(fd)
        self._thread = None
