"""Wake a waiter when entries of kubelet's device-plugin directory come or go (Linux inotify,
through ctypes). An idle agent then sleeps instead of polling; where inotify is unavailable, or
the directory itself goes away (the watch ends with it), the caller polls."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import struct
import threading
from pathlib import Path

log = logging.getLogger("topology-agent.plugin")

IN_CREATE = 0x100
IN_DELETE = 0x200
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_IGNORED = 0x8000  # the watch was removed: the directory is gone
IN_CLOSED = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
EVENT = struct.Struct("iIII")  # struct inotify_event without its name: wd, mask, cookie, len
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
        self.lost = threading.Event()  # the directory was deleted or moved: this watch sees nothing more

    @property
    def active(self) -> bool:
        return self._thread is not None and not self.lost.is_set()

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
        self.lost.clear()
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="dirwatch", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        poller = select.poll()  # not select(): descriptors past 1023 (a busy agent has many) are fine
        poller.register(self._fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            try:
                data = os.read(self._fd, 65536)  # which entry changed does not matter: something did
            except BlockingIOError:
                continue
            except OSError:
                self.lost.set()
                self.wake.set()
                return
            if closed(data):
                log.info("%s was deleted or moved: polling it until it is watched again", self.path)
                self.lost.set()
                self.wake.set()
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


def closed(data: bytes) -> bool:
    """Whether a read of inotify events says the watched directory itself went away."""
    offset = 0
    while offset + EVENT.size <= len(data):
        _wd, mask, _cookie, length = EVENT.unpack_from(data, offset)
        if mask & IN_CLOSED:
            return True
        offset += EVENT.size + length
    return False
