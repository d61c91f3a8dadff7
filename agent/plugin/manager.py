"""Keeps every resource served and registered with kubelet for the life of the node.

A kubelet restart shows as any of: our socket deleted (kubelet deletes every socket in its
directory), ``kubelet.sock`` recreated (new inode), or a ListAndWatch stream that ends with no
new one (kubelet never reconnects). The answer is blunt and well tested: stop every server,
serve again on fresh sockets, and register again with backoff until kubelet answers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.backoff import Backoff
from agent.devices.table import DeviceTable
from agent.errors import RegistrationAbandoned, RegistrationError, SocketPathError, StartupError
from agent.plugin.dirwatch import DirectoryWatch
from agent.plugin.registration import KUBELET_SOCKET, PendingRegistration
from agent.plugin.server import PluginServer
from agent.plugin.servicer import Observer, Wire
from agent.plugin.timing import Timing
from agent.worker import Worker

log = logging.getLogger("topology-agent.plugin")

# kubelet listens on a constant path whatever its --root-dir (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1
# DevicePluginPath; docs/admin/kubelet-roots.md).
USUAL_DIRS = ("/var/lib/kubelet/device-plugins, whatever kubelet's --root-dir (kubeadm, OpenShift, k3s, microk8s, "
              "k0s)")


class PluginManager(Worker):
    def __init__(self, kubelet_dir: Path, tables: Sequence[DeviceTable[Wire]], observer: Observer | None = None,
                 timing: Timing | None = None, on_kubelet_restart: Callable[[], None] | None = None) -> None:
        super().__init__(thread_name="plugin-manager")  # woken by the directory watch, by stop(), when a stream ends
        self.kubelet_dir = Path(kubelet_dir)
        self.on_kubelet_restart = on_kubelet_restart  # told at once, before serving again
        self.kubelet_socket = self.kubelet_dir / KUBELET_SOCKET
        self.tables = list(tables)
        self.observer = observer
        self.timing = timing or Timing()
        self.servers: dict[str, PluginServer] = {}
        self.registered = threading.Event()
        self.registrations: dict[str, int] = {t.resource: 0 for t in self.tables}
        self.last_registered: dict[str, float] = {}  # resource -> time.monotonic() of its last registration
        self.restarts = 0
        self.registration_failures = 0
        self._watch = DirectoryWatch(self.kubelet_dir, self._wake)
        self._interval = self.timing.poll
        self._kubelet_inode: tuple[int, int, int] | None = None
        self._registered_at = 0.0

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Serve and start keeping registered. SocketInUseError when another instance serves our
        sockets and StartupError for an unusable directory: reasons to exit at start. Anything else
        (a directory left at a socket path, descriptors exhausted) is retried with backoff."""
        try:
            self._serve()  # fail fast (and loudly) when another instance owns the sockets
        except SocketPathError as exc:
            log.warning("cannot serve yet, retrying with backoff: %s", exc, extra={"reason": str(exc)})
        if self._watch.start():  # woken by kubelet's directory: a slow safety poll is enough
            self._interval = self.timing.idle_poll
        super().start()

    def stop(self) -> None:
        super().stop()
        self._watch.stop()  # after the thread: it may be re-arming the watch until then
        self._stop_servers()

    @property
    def watching(self) -> bool:
        """Whether kubelet's directory is watched (changes wake the manager) rather than polled."""
        return self._watch.active

    def wait_registered(self, timeout: float) -> bool:
        return self.registered.wait(timeout)

    def alive(self) -> bool:
        """The watcher thread runs (or was never needed)."""
        return self._thread is None or self._thread.is_alive() or self._stop.is_set()

    def streams_open(self, resource: str) -> int:
        """ListAndWatch streams kubelet holds open for ``resource`` right now."""
        server = self.servers.get(resource)
        return server.servicer.streams.open if server is not None else 0

    def seconds_since_registration(self, resource: str) -> float | None:
        at = self.last_registered.get(resource)
        return None if at is None else time.monotonic() - at

    def ready(self) -> bool:
        """Registered, and kubelet holds a ListAndWatch stream for every resource."""
        return self.registered.is_set() and all(s.servicer.streams.open > 0 for s in self.servers.values())

    # --- internals ----------------------------------------------------------------------
    def _serve(self) -> None:
        """Serve every resource, or none: a failure part-way stops what was started."""
        try:
            self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = exc.strerror or exc
            if self.kubelet_dir.exists() and not self.kubelet_dir.is_dir():
                why = "it is a file, not a directory"
            raise StartupError(f"cannot use kubelet's directory {self.kubelet_dir}: {why}") from None
        try:
            for table in self.tables:
                server = PluginServer(table, self.kubelet_dir, self.observer)
                server.servicer.streams.on_none_open = self._wake.set  # kubelet never reopens: look at once
                server.start()
                self.servers[table.resource] = server
        except BaseException:
            self._stop_servers()
            raise

    def _stop_servers(self) -> None:
        stopping = [(server, server.begin_stop()) for server in self.servers.values()]
        for server, done in stopping:
            if done is not None:
                done.wait(timeout=3)
            server.remove_socket()
        self.servers.clear()

    def _sleep(self, seconds: float) -> bool:
        """Wait until woken or ``seconds`` pass; True when stopping."""
        if self._stop.is_set():  # stop() may have set (and an earlier sleep cleared) the wake-up already
            return True
        self._pause(seconds)
        self._keep_watching()
        return self._stop.is_set()

    def _kubelet_inode_now(self) -> tuple[int, int, int] | None:
        """Identity of kubelet.sock: inode numbers are reused, so the creation time counts too."""
        try:
            st = os.stat(self.kubelet_socket)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_ctime_ns)

    def _kubelet_moved_on(self, inode: tuple[int, int, int] | None) -> str | None:
        """Why a registration (under way or done) is stale: kubelet restarted since ``inode`` was
        its socket, or deleted ours."""
        now = self._kubelet_inode_now()
        if now is not None and now != inode:
            return "kubelet.sock was recreated"
        for resource, server in self.servers.items():
            if not server.socket_present():
                return f"socket {server.path.name} of {resource} was deleted"
        return None

    def _register_all(self, inode: tuple[int, int, int] | None) -> None:
        """Register every resource; a Register to a kubelet that restarted meanwhile is abandoned at
        once (kubelet deleted the endpoint it would dial back), not left to run into its timeout."""
        for resource, server in self.servers.items():
            server.servicer.streams.registered()  # kubelet opens the next stream: it is never evicted
            pending = PendingRegistration(self.kubelet_socket, server.endpoint, resource,
                                          self.timing.register_timeout)
            pending.future.add_done_callback(lambda _f: self._wake.set())
            while not pending.done():
                self._pause(self._interval)
                stale = self._kubelet_moved_on(inode) if not pending.done() else None
                if stale is not None or self._stop.is_set():
                    pending.abandon()
                    raise RegistrationAbandoned(f"registration of {resource} abandoned: {stale or 'stopping'}")
            pending.result()
            self.registrations[resource] += 1
            self.last_registered[resource] = time.monotonic()
            log.info("registered %s with kubelet (endpoint %s)", resource, server.endpoint,
                     extra={"resource": resource})

    def _poll_wait(self) -> float:
        """The safety poll's interval, but no later than just after the stream grace ends: a
        resource kubelet never opened a stream for is noticed on time without a fast poll."""
        until_grace = self._registered_at + self.timing.stream_grace - time.monotonic()
        return min(self._interval, until_grace + 0.01) if until_grace >= 0 else self._interval

    def _keep_watching(self) -> None:
        """After kubelet's directory itself went away (its watch ends with it): poll fast, and watch
        again once the directory is back (serving again recreates it)."""
        if not self._watch.lost.is_set() or self._stop.is_set():
            return
        self._watch.stop()
        self._interval = self.timing.poll
        if self.kubelet_dir.is_dir() and self._watch.start():
            self._interval = self.timing.idle_poll

    def _restart_reason(self) -> str | None:
        moved_on = self._kubelet_moved_on(self._kubelet_inode)
        if moved_on is not None:
            return moved_on
        if time.monotonic() - self._registered_at > self.timing.stream_grace:
            for resource, server in self.servers.items():
                if server.servicer.streams.open == 0:
                    return f"no ListAndWatch stream open for {resource}"
        return None

    def _wait_for_kubelet(self) -> bool:
        """Until kubelet.sock exists; False when stopping. Said at once, warned when it lasts."""
        started = time.monotonic()
        warn_at = started + self.timing.kubelet_missing_warning
        announced = False
        while not self._stop.is_set():
            if self._kubelet_inode_now() is not None:
                return True
            if not announced:
                log.info("waiting for %s", self.kubelet_socket)
                announced = True
            now = time.monotonic()
            if now >= warn_at:
                log.warning("no kubelet.sock in %s for %.0f s: is --kubelet-dir kubelet's device-plugin directory? "
                            "Usual ones: %s", self.kubelet_dir, now - started, USUAL_DIRS,
                            extra={"reason": "no kubelet.sock"})
                warn_at = now + 30 * self.timing.kubelet_missing_warning
            self._sleep(min(self._interval, max(warn_at - now, 0.01)))
        return False

    def _connect(self) -> None:
        """Serve (if not serving) and register everything, retrying with backoff until done."""
        backoff = Backoff(self.timing.backoff_min, self.timing.backoff_max)
        while not self._stop.is_set():
            if not self._wait_for_kubelet():
                return
            inode = self._kubelet_inode_now()
            if any(not server.socket_present() for server in self.servers.values()):
                # kubelet deletes every socket in its directory when it starts: serve afresh.
                self._stop_servers()
            try:
                if not self.servers:
                    self._serve()
                self._register_all(inode)
            except (RegistrationError, StartupError, SocketPathError, OSError, RuntimeError) as exc:
                # Everything here is transient once serving: kubelet restarting (again), a socket path
                # taken by a leftover directory or another instance, descriptors exhausted. Retry.
                self.registration_failures += 1
                if isinstance(exc, RegistrationAbandoned):
                    log.info("%s: serving and registering again", exc, extra={"reason": str(exc)})
                    continue
                delay = backoff.next()
                log.warning("registration failed, retrying in %.2fs: %s", delay, exc, extra={"reason": str(exc)})
                # Wake early when kubelet.sock is recreated.
                deadline = time.monotonic() + delay
                while time.monotonic() < deadline and not self._stop.is_set():
                    if self._kubelet_inode_now() not in (inode, None):
                        break
                    self._sleep(min(self._interval, max(deadline - time.monotonic(), 0.001)))
                continue
            self._kubelet_inode = inode
            self._registered_at = time.monotonic()
            self.registered.set()
            return

    def _run(self) -> None:
        backoff = Backoff(self.timing.backoff_min, self.timing.backoff_max)
        reconnect = True
        while not self._stop.is_set():
            try:  # the thread must never die: the node would lose its devices for good
                if reconnect:
                    self._connect()
                    reconnect = False
                if self._sleep(self._poll_wait()):
                    return
                reason = self._restart_reason()
                if reason is None:
                    backoff.reset()
                    continue
                self.registered.clear()
                self.restarts += 1
                log.warning("kubelet restart detected (%s): serving and registering again", reason,
                            extra={"reason": reason})
                if self.on_kubelet_restart is not None:
                    self.on_kubelet_restart()
                self._stop_servers()
                reconnect = True
            except Exception:
                delay = backoff.next()
                log.exception("plugin manager step failed; serving and registering again in %.2fs", delay)
                self.registered.clear()
                with contextlib.suppress(Exception):
                    self._stop_servers()
                reconnect = True
                self._sleep(delay)
