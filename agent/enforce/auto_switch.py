"""``--cpuset-enforcement auto`` for as long as the agent runs, not only at its start: NRI while the runtime's NRI
socket answers, else CRI while a CRI socket exists, else none. NRI unregistered for ``patience`` seconds (the
runtime restarted without it) switches to the CRI loop; while on CRI or none, the NRI socket is dialed again when its
file changed and every ``reprobe`` seconds, and NRI is taken back when it answers.

Must hold: each switch stops one engine before the next starts (never two writing cpusets), both share one set of
counters (the metrics stay monotonic), and a switch is said (a warning, ``/readyz``, the mode metric).
Design: docs/contributing/design/cpuset-enforcement.md."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.enforce.cri_loop import CpusetEnforcement
from agent.enforce.engine import EnforcementCounters, EnforcementEngine
from agent.enforce.nri_hooks import NriEnforcement
from agent.policy.keys import DeviceKey
from agent.worker import Worker

log = logging.getLogger("topology-agent.cpuset")

PATIENCE = 30.0  # seconds without an NRI registration before falling back to CRI
REPROBE = 300.0  # seconds between dials of an unchanged NRI socket while on CRI or none
LOOK = 2.0  # seconds between looks at the sockets' files


class AutoEnforcement(Worker):
    def __init__(self, first: str, *, make_nri: Callable[[EnforcementCounters], NriEnforcement],
                 make_cri: Callable[[EnforcementCounters], CpusetEnforcement], nri_socket: Path, cri_socket: Path,
                 nri_answers: Callable[[Path], bool], patience: float = PATIENCE, reprobe: float = REPROBE,
                 look: float = LOOK) -> None:
        super().__init__(thread_name="cpuset-auto")
        self.counters = EnforcementCounters(updates={})
        self.make_nri = make_nri
        self.make_cri = make_cri
        self.nri_socket = nri_socket
        self.cri_socket = cri_socket
        self.nri_answers = nri_answers
        self.patience = patience
        self.reprobe = reprobe
        self.look = look
        self.switches = 0
        self.why = ""  # why the current mode, when a switch chose it
        self._engine: EnforcementEngine | None = self._make(first)
        self._lock = threading.Lock()
        self._unregistered_since: float | None = None
        self._nri_file: object = self._identity(nri_socket)
        self._probed_at = time.monotonic()

    def _make(self, mode: str) -> EnforcementEngine | None:
        if mode == "nri":
            return self.make_nri(self.counters)
        if mode == "cri":
            return self.make_cri(self.counters)
        return None

    # --- what the agent sees ----------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        engine = self._engine
        return engine.mode if engine is not None else "none"

    @property
    def failing(self) -> bool:
        engine = self._engine
        return engine.failing if engine is not None else False

    def readiness_note(self) -> str | None:
        engine = self._engine
        note = engine.readiness_note() if engine is not None else None
        if self.why:
            note = f"{note or f'cpuset enforcement: {self.mode}'} (auto: {self.why})"
        return note

    def enforced(self) -> dict[DeviceKey, list[str]]:
        engine = self._engine
        return engine.enforced() if engine is not None else {}

    def changed(self) -> None:
        engine = self._engine
        if engine is not None:
            engine.changed()

    # --- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._engine is not None:
            self._engine.start()
        super().start()

    def stop(self) -> None:
        super().stop()
        with self._lock:
            if self._engine is not None:
                self._engine.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.look):
            try:
                self.step(time.monotonic())
            except Exception:  # the watch goes on whatever one look does
                log.exception("cpuset enforcement (auto): the look at the runtime's sockets failed")

    def step(self, now: float) -> str | None:
        """One look; the mode switched to, or None."""
        engine = self._engine
        if isinstance(engine, NriEnforcement):
            if engine.plugin.state.registered:
                self._unregistered_since = None
                return None
            if self._unregistered_since is None:
                self._unregistered_since = now
                return None
            if now - self._unregistered_since < self.patience:
                return None
            if not self.cri_socket.exists():
                return None  # nothing better to switch to: the plugin keeps dialing
            return self._switch("cri", f"the NRI socket {self.nri_socket} has not registered the agent for "
                                       f"{self.patience:.0f} s ({engine.plugin.state.last_error or 'no answer'}): "
                                       "the runtime restarted without NRI?")
        identity = self._identity(self.nri_socket)
        renewed = identity is not None and identity != self._nri_file
        self._nri_file = identity
        if identity is not None and (renewed or now - self._probed_at >= self.reprobe):
            self._probed_at = now
            if self.nri_answers(self.nri_socket):
                return self._switch("nri", f"the NRI socket {self.nri_socket} answers again")
        if engine is None and self.cri_socket.exists():
            return self._switch("cri", f"a CRI socket exists now ({self.cri_socket})")
        return None

    def _switch(self, mode: str, why: str) -> str:
        with self._lock:
            if self._stop.is_set():
                return mode
            old = self._engine
            log.warning("cpuset enforcement (auto): switching from %s to %s: %s", self.mode, mode, why,
                        extra={"reason": why})
            if old is not None:
                old.stop()
            self._engine = self._make(mode)
            self.why = why
            self.switches += 1
            self._unregistered_since = None
            if self._engine is not None:
                self._engine.start()
        return mode

    @staticmethod
    def _identity(path: Path) -> object:
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns)
