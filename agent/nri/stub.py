"""An external NRI plugin: dial the runtime's socket, register, answer its events, dial again when it goes away
(../shared/docs/nri.md §3). The handshake serves the Plugin service on conn 1, then ``RegisterPlugin`` on conn 2;
``Configure`` and ``Synchronize`` follow, then the container events, whose replies carry the changes.

Must hold: every answer comes from :class:`Handlers`, deciding from memory; a handler that raises gets an empty answer
(the container is created unadjusted, never failed by the agent's bug), except :class:`Refused`, which fails the
creation without closing the plugin (kubelet retries it); :meth:`NriPlugin.update_containers` (unsolicited) refuses
runtimes before NRI v0.12.1 (it can deadlock containerd) and is never called from inside an event handler; a runtime
that closes the plugin (an answer past its request timeout) is dialed again with backoff, and the next
``Synchronize`` repairs what was created meanwhile. Design: docs/contributing/design/nri-protocol.md."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.backoff import Backoff
from agent.nri.ttrpc import CallTimeout, Trunk, TrunkClosed
from agent.nri.wire import INVALID_ARGUMENT, OK, RESOURCE_EXHAUSTED, UNIMPLEMENTED, Request, Response
from agent.worker import Worker

log = logging.getLogger("topology-agent.nri")

T = TypeVar("T")

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"


def event_mask(*events: int) -> int:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


# CreateContainer, UpdateContainer, StopContainer, RemoveContainer: 0x0688, inside what every
# runtime since NRI v0.3 accepts (0x07FF).
EVENTS = event_mask(nri.CREATE_CONTAINER, nri.UPDATE_CONTAINER, nri.STOP_CONTAINER, nri.REMOVE_CONTAINER)


class Refused(Exception):
    """A handler's refusal of a CreateContainer: the runtime fails the creation with this text."""


class UpdatesFailed(RuntimeError):
    """The runtime answered UpdateContainers with an error: some of the updates were not applied. containerd says
    which only through its log: its ``domainTable.updateContainers`` returns the failed updates *and* an error
    (https://github.com/containerd/containerd/blob/v2.4.2/internal/nri/domain.go), and a ttrpc server marshals no
    payload with an error (https://github.com/containerd/ttrpc/blob/v1.2.9/services.go ``unaryCall``)."""


class Handlers(Protocol):
    """What the plugin answers; each call decides from memory, quickly."""

    def synchronize(self, pods: list[nri.PodSandbox], containers: list[nri.Container]) -> list[nri.ContainerUpdate]:
        ...

    def create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.CreateContainerResponse:
        ...

    def update_container(self, pod: nri.PodSandbox, container: nri.Container,
                         resources: nri.LinuxResources) -> list[nri.ContainerUpdate]:
        ...

    def stop_container(self, pod: nri.PodSandbox, container: nri.Container) -> list[nri.ContainerUpdate]:
        ...

    def remove_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        ...


@dataclass
class PluginState:
    """What the plugin reports: its connection, and counts of what it did."""
    registered: bool = False  # registered, configured and synchronized with the runtime now
    runtime: str = ""  # "containerd 2.4.2", from Configure
    connections: int = 0  # successful registrations
    synchronizations: int = 0
    request_timeout: float = 2.0  # the runtime's, from Configure
    last_error: str = ""
    nri_version: str = ""  # the runtime's NRI module version, from Configure (NRI v0.12+)
    events: dict[str, int] = field(default_factory=dict)  # method -> count
    slowest: float = 0.0  # seconds: the slowest answer so far
    refusals: int = 0  # CreateContainer requests refused (Refused)


class NriPlugin(Worker):
    def __init__(self, handlers: Handlers, socket_path: Path = Path(DEFAULT_SOCKET), *, name: str = "topology-agent",
                 index: str = "10", dial_timeout: float = 1.0, backoff: tuple[float, float] = (0.1, 5.0),
                 register_timeout: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(thread_name="nri-plugin")
        self.handlers = handlers
        self.socket_path = socket_path
        self.name = name
        self.index = index
        self.dial_timeout = dial_timeout
        self.backoff = backoff
        self.register_timeout = register_timeout  # the runtime's own default registration timeout
        self.clock = clock
        self.state = PluginState()
        self._sync_parts: list[tuple[list[nri.PodSandbox], list[nri.Container]]] = []
        self._trunk: Trunk | None = None
        self._synced = threading.Event()  # set when the current connection has synchronized
        self._lock = threading.Lock()

    # --- lifecycle -------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()  # before the trunk closes: the connection loop then ends instead of dialing again
        trunk = self._trunk
        if trunk is not None:
            trunk.close()
        super().stop()

    def wait_registered(self, timeout: float) -> bool:
        """Wait until registered and synchronized (tests and the start-up log)."""
        deadline = self.clock() + timeout
        while not self._stop.is_set():
            if self.state.registered:
                return True
            if self.clock() >= deadline:
                return False
            self._synced.wait(min(0.05, max(0.0, deadline - self.clock())))
        return False

    # --- the connection loop -----------------------------------------------------------------------
    def _run(self) -> None:
        backoff = Backoff(*self.backoff)
        while not self._stop.is_set():
            try:
                synced = self.connect_once()
            except Exception as exc:  # the loop goes on whatever one attempt does
                log.exception("NRI connection attempt failed")
                self._failed(str(exc))
                synced = False
            if self._stop.is_set():
                break
            if synced:  # the trunk closed after a Synchronize: dial again soon
                backoff.reset()
            backoff.wait(self._stop)

    def connect_once(self) -> bool:
        """Dial, register, serve until the trunk closes; True when it got as far as a Synchronize."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.dial_timeout)
        try:
            sock.connect(str(self.socket_path))
        except OSError as exc:
            sock.close()
            self._failed(f"cannot connect to {self.socket_path}: {exc.strerror or exc}")
            return False
        self._synced.clear()
        self._sync_parts = []
        trunk = Trunk(sock, self.serve)
        self._trunk = trunk
        if self._stop.is_set():  # stop() came before this trunk was known to it
            trunk.close()
            return False
        trunk.start()
        try:
            request = nri.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
            answer = trunk.call(RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(),
                                timeout=self.register_timeout)
            if answer.code != OK:
                raise TrunkClosed(f"registration refused: {answer.message} (code {answer.code})")
        except (TrunkClosed, CallTimeout) as exc:
            trunk.close(str(exc))
            self._failed(f"cannot register with {self.socket_path}: {exc}")
            return False
        # Configure and Synchronize follow at once; a runtime that sends neither is dialed again, and one that goes
        # away first is dialed again at once (not after the wait).
        deadline = self.clock() + 2 * self.register_timeout
        while not self._synced.is_set() and not trunk.closed and self.clock() < deadline:
            self._synced.wait(0.05)
        if not self._synced.is_set() and not trunk.closed:
            trunk.close(f"registered, but no Synchronize within {2 * self.register_timeout:.0f} s")
        trunk.wait_closed()
        synced = self._synced.is_set()
        self.state.registered = False
        if not self._stop.is_set():
            self._failed(f"the runtime's NRI connection ended: {trunk.close_reason}")
        self._trunk = None
        trunk.join()
        return synced

    @property
    def unsolicited_safe(self) -> bool:
        """The runtime takes unsolicited UpdateContainers without the deadlock of NRI before v0.12.1
        (containerd before 2.4)."""
        return nri_version_at_least(self.state.nri_version, (0, 12, 1))

    def update_containers(self, updates: list[nri.ContainerUpdate], timeout: float = 2.0) -> list[str]:
        """Unsolicited updates (never from inside an event handler: containerd holds its NRI lock for the
        whole event); the ids the runtime failed. Raises TrunkClosed, CallTimeout (the runtime may still apply
        them later), UpdatesFailed (some were not applied) or RuntimeError (none may be sent)."""
        trunk = self._trunk
        if trunk is None or not self.state.registered:
            raise TrunkClosed("not registered")
        if not self.unsolicited_safe:
            raise RuntimeError(f"the runtime's NRI {self.state.nri_version or '(unknown)'} can deadlock on "
                               "unsolicited updates (before v0.12.1)")
        answer = trunk.call(RUNTIME_SERVICE, "UpdateContainers",
                            nri.UpdateContainersRequest(update=updates).SerializeToString(), timeout)
        if answer.code != OK:
            raise UpdatesFailed(f"UpdateContainers failed: {answer.message} (code {answer.code})")
        return [u.container_id for u in nri.UpdateContainersResponse.FromString(answer.payload).failed]

    def _failed(self, reason: str) -> None:
        if reason != self.state.last_error:
            log.warning("NRI: %s; dialing again with backoff", reason, extra={"reason": reason})
        self.state.last_error = reason

    # --- the Plugin service ------------------------------------------------------------------------
    def serve(self, request: Request) -> Response:
        """One request of the runtime on conn 1: its answer."""
        if request.service != PLUGIN_SERVICE:
            return Response(UNIMPLEMENTED, f"service {request.service} not implemented")
        started = self.clock()
        method = request.method
        try:
            payload = self._answer(method, request.payload)
        except _Unimplemented:
            return Response(UNIMPLEMENTED, f"{PLUGIN_SERVICE}/{method} not implemented")
        except _BadRequest as exc:
            return Response(INVALID_ARGUMENT, str(exc))
        except Refused as exc:
            self.state.refusals += 1
            return Response(RESOURCE_EXHAUSTED, f"{self.name}: {exc}")
        elapsed = self.clock() - started
        self.state.events[method] = self.state.events.get(method, 0) + 1
        self.state.slowest = max(self.state.slowest, elapsed)
        if elapsed > self.state.request_timeout / 2:
            log.warning("NRI %s took %.3f s (the runtime gives up at %.1f s)", method, elapsed,
                        self.state.request_timeout)
        return Response(OK, "", payload)

    def _answer(self, method: str, payload: bytes) -> bytes:
        try:
            parse = _REQUESTS[method]
        except KeyError:
            raise _Unimplemented() from None
        try:
            message = parse.FromString(payload)
        except Exception as exc:  # protobuf's DecodeError
            raise _BadRequest(f"{method}: cannot decode the request: {exc}") from None
        if method == "Configure":
            assert isinstance(message, nri.ConfigureRequest)
            return self._configure(message).SerializeToString()
        if method == "Synchronize":
            assert isinstance(message, nri.SynchronizeRequest)
            return self._synchronize(message).SerializeToString()
        if method == "CreateContainer":
            assert isinstance(message, nri.CreateContainerRequest)
            return self._guarded(method, lambda: self.handlers.create_container(message.pod, message.container),
                                 nri.CreateContainerResponse()).SerializeToString()
        if method == "UpdateContainer":
            assert isinstance(message, nri.UpdateContainerRequest)
            updates = self._guarded(method, lambda: self.handlers.update_container(
                message.pod, message.container, message.linux_resources), _NO_UPDATES)
            return nri.UpdateContainerResponse(update=updates).SerializeToString()
        if method == "StopContainer":
            assert isinstance(message, nri.StopContainerRequest)
            updates = self._guarded(method, lambda: self.handlers.stop_container(message.pod, message.container),
                                    _NO_UPDATES)
            return nri.StopContainerResponse(update=updates).SerializeToString()
        if method == "RemoveContainer":
            assert isinstance(message, nri.RemoveContainerRequest)
            self._guarded(method, lambda: self.handlers.remove_container(message.pod, message.container), None)
            return nri.RemoveContainerResponse().SerializeToString()
        if method == "StateChange":
            assert isinstance(message, nri.StateChangeEvent)
            if message.event == nri.REMOVE_CONTAINER:
                self._guarded(method, lambda: self.handlers.remove_container(message.pod, message.container), None)
            return nri.Empty().SerializeToString()
        if method == "Shutdown":
            return nri.Empty().SerializeToString()
        raise _Unimplemented()

    def _guarded(self, method: str, answer: Callable[[], T], empty: T) -> T:
        try:
            return answer()
        except Refused:
            if method != "CreateContainer":
                log.error("NRI %s: a refusal is only for CreateContainer; answering nothing", method)
                return empty
            raise
        except Exception:
            log.exception("NRI %s: the decision failed; answering nothing (the runtime goes on unadjusted)", method)
            return empty

    def _configure(self, request: nri.ConfigureRequest) -> nri.ConfigureResponse:
        self.state.runtime = f"{request.runtime_name} {request.runtime_version}".strip()
        self.state.request_timeout = request.request_timeout / 1000 if request.request_timeout > 0 else 2.0
        self.state.nri_version = request.NRI_version
        log.info("NRI: configured by %s (request timeout %.1f s)", self.state.runtime or "the runtime",
                 self.state.request_timeout)
        return nri.ConfigureResponse(events=EVENTS)

    def _synchronize(self, request: nri.SynchronizeRequest) -> nri.SynchronizeResponse:
        self._sync_parts.append((list(request.pods), list(request.containers)))
        if request.more:
            return nri.SynchronizeResponse(more=True)  # updates go in the final reply only
        pods = [p for part in self._sync_parts for p in part[0]]
        containers = [c for part in self._sync_parts for c in part[1]]
        self._sync_parts = []
        updates = self._guarded("Synchronize", lambda: self.handlers.synchronize(pods, containers), _NO_UPDATES)
        with self._lock:
            self.state.registered = True
            self.state.connections += 1
            self.state.synchronizations += 1
        if self.state.last_error:
            log.info("NRI: registered with %s again", self.state.runtime or self.socket_path)
        self.state.last_error = ""
        log.info("NRI: synchronized %d containers, %d updated", len(containers), len(updates),
                 extra={"reason": "synchronize"})
        self._synced.set()
        return nri.SynchronizeResponse(update=updates)


_NO_UPDATES: list[nri.ContainerUpdate] = []


def nri_version_at_least(text: str, wanted: tuple[int, int, int]) -> bool:
    """``v0.12.3`` (or ``v0.12.3-0.2026...`` pseudo-versions) is at least ``wanted``; unknown is not."""
    parts = text.removeprefix("v").split("-", 1)[0].split(".")
    try:
        numbers = tuple(int(p) for p in parts[:3])
    except ValueError:
        return False
    return len(numbers) == 3 and numbers >= wanted


class _Unimplemented(Exception):
    pass


class _BadRequest(Exception):
    pass


_REQUESTS: dict[str, Any] = {
    "Configure": nri.ConfigureRequest,
    "Synchronize": nri.SynchronizeRequest,
    "CreateContainer": nri.CreateContainerRequest,
    "UpdateContainer": nri.UpdateContainerRequest,
    "StopContainer": nri.StopContainerRequest,
    "RemoveContainer": nri.RemoveContainerRequest,
    "StateChange": nri.StateChangeEvent,
    "Shutdown": nri.Empty,
}

