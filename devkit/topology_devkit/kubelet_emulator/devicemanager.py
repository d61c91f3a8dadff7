"""The emulated kubelet device manager: plugin state, capacity, admission-time allocation, run options.

Mirrors `pkg/kubelet/cm/devicemanager/manager.go` (../shared/docs/kubelet-device-plugin.md §2.2-§2.7,
§2.10) for a node with the Topology Manager policy ``none`` (no NUMA hints, so GetPreferredAllocation
always sees the whole free set).

Locking: ``self._lock`` guards every piece of state and is never held across an RPC. Admissions are
serialised by ``self._admit_lock`` (kubelet admits pods one at a time); that lock may be held across RPCs
but protects no state.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format

from agent._proto.deviceplugin.v1beta1 import api_pb2 as dp
from agent._proto.podresources.v1 import api_pb2 as pr

from .calls import CallLog
from .checkpoint import write_checkpoint
from .constants import (
    CHECKPOINT_FILE,
    HEALTHY,
    LOGGER_NAME,
    NODE_WITHOUT_TOPOLOGY,
    PRE_START_CONTAINER_TIMEOUT,
    UNHEALTHY,
)
from .endpoint import PluginEndpoint
from .errors import (
    AdmissionError,
    ContainerStartError,
    DeviceManagerError,
    PluginCallError,
    PluginConnectError,
)
from .model import Container, ContainerAllocation, Pod
from .names import is_extended_resource_name

log = logging.getLogger(LOGGER_NAME)


def natural_key(value: str) -> list[object]:
    """Sort key that orders ``dev-2`` before ``dev-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", value)]


@dataclass
class ResourceState:
    """What kubelet knows about one resource name."""

    name: str
    endpoint: PluginEndpoint | None = None
    options: dp.DevicePluginOptions | None = None
    all_devices: dict[str, dp.Device] = field(default_factory=dict)
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)
    stop_time: float | None = None  # monotonic time the endpoint stopped (stream end / kubelet restart)
    present: bool = True  # False once the stop grace period expired (resource removed)
    registrations: int = 0  # accepted Register calls
    registration_requests: int = 0  # all Register calls (kubelet_device_plugin_registration_total)
    snapshots: int = 0  # ListAndWatch messages received, all endpoints together

    @property
    def serving(self) -> bool:
        return self.endpoint is not None and not self.endpoint.stopped


class _Picker:
    """`allocateRemainingFrom`: takes ids until `needed` is reached, marking them allocated at once."""

    def __init__(self, needed: int, marked: set[str]) -> None:
        self.needed = needed
        self.allocated: list[str] = []
        self._marked = marked

    def take(self, candidates: Iterable[str]) -> bool:
        if self.needed <= 0:
            return True
        for device in candidates:
            if device in self.allocated:
                continue
            self._marked.add(device)
            self.allocated.append(device)
            self.needed -= 1
            if self.needed == 0:
                return True
        return False


class DeviceManager:
    def __init__(
        self,
        plugin_dir: Path,
        calls: CallLog,
        notify: Callable[[], None],
        *,
        dial_timeout: float,
        stop_grace_period: float,
        allocate_timeout: float | None,
        shuffle_seed: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.checkpoint_path = plugin_dir / CHECKPOINT_FILE
        self.calls = calls
        self._notify = notify
        self.dial_timeout = dial_timeout
        self.stop_grace_period = stop_grace_period
        self.allocate_timeout = allocate_timeout
        self._rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
        self._clock = clock
        self._lock = threading.Lock()
        self._admit_lock = threading.Lock()
        self._resources: dict[str, ResourceState] = {}
        self._pods: dict[tuple[str, str], Pod] = {}
        self._admitting: Pod | None = None
        self._admitting_marked: dict[str, set[str]] = {}
        self._epoch = 0
        self._accepting = False

    # ============================================================================ helpers

    def _order(self, ids: Iterable[str]) -> list[str]:
        """Candidate order: natural sort, or a seeded shuffle (Go set iteration is arbitrary)."""
        ordered = sorted(set(ids), key=natural_key)
        if self._rng is not None:
            self._rng.shuffle(ordered)
        return ordered

    def _state(self, resource: str) -> ResourceState:
        state = self._resources.get(resource)
        if state is None:
            state = ResourceState(resource)
            self._resources[resource] = state
        return state

    def _expire_locked(self) -> None:
        """`GetCapacity` side effect: drop resources whose endpoint stopped longer than the grace period ago."""
        now = self._clock()
        for state in self._resources.values():
            if state.present and state.stop_time is not None and now - state.stop_time >= self.stop_grace_period:
                log.info(
                    "Resource %s removed: endpoint stopped for more than %.0fs", state.name, self.stop_grace_period
                )
                state.present = False
                state.endpoint = None
                state.options = None
                state.all_devices.clear()
                state.healthy.clear()
                state.unhealthy.clear()

    def _in_use_locked(self, resource: str) -> set[str]:
        used: set[str] = set()
        for pod in self._pods.values():
            used |= pod.all_device_ids(resource)
        used |= self._admitting_marked.get(resource, set())
        return used

    def _is_device_plugin_resource_locked(self, resource: str) -> bool:
        """Registered (or restored) resource, or one that some pod still holds devices of."""
        state = self._resources.get(resource)
        if state is not None and state.present:
            return True
        return any(resource in pod.resources() for pod in self._pods.values())

    def _write_checkpoint_locked(self) -> None:
        registered = {name: set(st.all_devices) for name, st in self._resources.items() if st.present}
        try:
            write_checkpoint(self.checkpoint_path, self._pods.values(), registered)
        except OSError as err:  # the directory may be gone during teardown
            log.debug("could not write checkpoint: %s", err)

    # ============================================================================ lifecycle

    @property
    def epoch(self) -> int:
        with self._lock:
            return self._epoch

    def set_accepting(self, accepting: bool) -> None:
        with self._lock:
            self._accepting = accepting

    def drop_connections(self) -> list[PluginEndpoint]:
        """Kubelet going down: forget every plugin connection, keep allocations.

        Every known resource becomes a *stopped* endpoint with empty device sets (what kubelet restores from
        its checkpoint), so it reads 0 until its plugin registers again. Returns the closed endpoints.
        """
        with self._lock:
            self._epoch += 1
            self._accepting = False
            now = self._clock()
            endpoints: list[PluginEndpoint] = []
            for state in self._resources.values():
                if state.endpoint is not None:
                    endpoints.append(state.endpoint)
                if not state.present:
                    continue
                state.endpoint = None
                state.options = None
                state.all_devices.clear()
                state.healthy.clear()
                state.unhealthy.clear()
                state.stop_time = now
            for pod in self._pods.values():
                for resource in pod.resources():
                    state = self._state(resource)
                    if state.stop_time is None:
                        state.stop_time = now
        for endpoint in endpoints:
            endpoint.close()
        self._notify()
        return endpoints

    # ============================================================================ registration

    def count_registration_request(self, resource: str) -> None:
        with self._lock:
            self._state(resource).registration_requests += 1

    def connect_plugin(
        self, resource: str, socket_path: Path, options_timeout: float | None, epoch: int
    ) -> PluginEndpoint:
        """Dial the plugin and fetch its options (inside Register), then make it the resource's endpoint.

        Raises PluginConnectError with kubelet's wording. The caller starts ListAndWatch once Register returns.
        """
        endpoint = PluginEndpoint(resource, socket_path, self.calls, self._on_snapshot, self._on_stream_end)
        try:
            endpoint.dial(self.dial_timeout)
        except PluginCallError as err:
            raise PluginConnectError(f"failed to dial device plugin: {err}") from None
        try:
            options = endpoint.fetch_options(options_timeout)
        except PluginCallError as err:
            endpoint.close()
            raise PluginConnectError(f"failed to get device plugin options: {err}") from None
        with self._lock:
            if epoch != self._epoch or not self._accepting:
                stale = True
                old = None
            else:
                stale = False
                state = self._state(resource)
                old = state.endpoint
                state.endpoint = endpoint
                state.options = options
                state.present = True
                state.stop_time = None
                state.registrations += 1
        if stale:
            endpoint.close()
            raise PluginConnectError("kubelet is restarting")
        if old is not None:
            log.info("Replacing endpoint %s with %s for resource %s", old.socket_path, socket_path, resource)
            old.close()
        log.info(
            "Registered endpoint for resource %s at %s (pre_start_required=%s, get_preferred_allocation_available=%s)",
            resource,
            socket_path,
            options.pre_start_required,
            options.get_preferred_allocation_available,
        )
        self._notify()
        return endpoint

    def _on_snapshot(self, endpoint: PluginEndpoint, response: dp.ListAndWatchResponse) -> None:
        with self._lock:
            state = self._resources.get(endpoint.resource)
            if state is None or state.endpoint is not endpoint or endpoint.closed_by_kubelet:
                return
            all_devices: dict[str, dp.Device] = {}
            healthy: set[str] = set()
            unhealthy: set[str] = set()
            for device in response.devices:
                copy = dp.Device()
                copy.CopyFrom(device)
                all_devices[device.ID] = copy
                (healthy if device.health == HEALTHY else unhealthy).add(device.ID)
            state.all_devices, state.healthy, state.unhealthy = all_devices, healthy, unhealthy
            state.snapshots += 1
            endpoint.snapshots += 1
            self._write_checkpoint_locked()
        log.info(
            "State pushed for device plugin: resource=%s devices=%d healthy=%d",
            endpoint.resource,
            len(response.devices),
            len(healthy),
        )
        self._notify()

    def _on_stream_end(self, endpoint: PluginEndpoint, error: str | None) -> None:
        with self._lock:
            state = self._resources.get(endpoint.resource)
            current = state is not None and state.endpoint is endpoint and not endpoint.closed_by_kubelet
            if current and state is not None:
                state.unhealthy |= state.healthy
                state.healthy = set()
                for device in state.all_devices.values():
                    device.health = UNHEALTHY
                state.stop_time = self._clock()
        if current:
            log.error("ListAndWatch ended unexpectedly for device plugin: resource=%s err=%s", endpoint.resource, error)
        else:
            log.debug("ListAndWatch of replaced/closed endpoint %r ended: %s", endpoint, error)
        self._notify()

    # ============================================================================ queries

    def state_view(self, resource: str) -> ResourceState | None:
        with self._lock:
            self._expire_locked()
            return self._resources.get(resource)

    def resources(self) -> list[str]:
        with self._lock:
            self._expire_locked()
            return sorted(name for name, st in self._resources.items() if st.present)

    def registrations(self, resource: str) -> int:
        with self._lock:
            state = self._resources.get(resource)
            return state.registrations if state else 0

    def registration_requests(self, resource: str) -> int:
        with self._lock:
            state = self._resources.get(resource)
            return state.registration_requests if state else 0

    def snapshots(self, resource: str) -> int:
        with self._lock:
            state = self._resources.get(resource)
            return state.snapshots if state else 0

    def is_ready(self, resource: str) -> bool:
        """Registered, stream alive, and at least one snapshot received on the current endpoint."""
        with self._lock:
            state = self._resources.get(resource)
            return bool(state and state.serving and state.endpoint and state.endpoint.snapshots > 0)

    def devices(self, resource: str) -> dict[str, str]:
        with self._lock:
            self._expire_locked()
            state = self._resources.get(resource)
            if state is None or not state.present:
                return {}
            return {dev_id: dev.health for dev_id, dev in state.all_devices.items()}

    def healthy_devices(self, resource: str) -> set[str]:
        with self._lock:
            self._expire_locked()
            state = self._resources.get(resource)
            return set(state.healthy) if state and state.present else set()

    def capacity(self, resource: str) -> int:
        with self._lock:
            self._expire_locked()
            state = self._resources.get(resource)
            if state is None or not state.present:
                return 0
            return len(state.healthy) + len(state.unhealthy)

    def allocatable(self, resource: str) -> int:
        with self._lock:
            self._expire_locked()
            state = self._resources.get(resource)
            if state is None or not state.present:
                return 0
            return len(state.healthy)

    def options(self, resource: str) -> dp.DevicePluginOptions | None:
        with self._lock:
            state = self._resources.get(resource)
            if state is None or state.options is None:
                return None
            copy = dp.DevicePluginOptions()
            copy.CopyFrom(state.options)
            return copy

    def endpoint_path(self, resource: str) -> Path | None:
        with self._lock:
            state = self._resources.get(resource)
            return state.endpoint.socket_path if state and state.endpoint else None

    def allocated(self, resource: str) -> set[str]:
        with self._lock:
            return self._in_use_locked(resource)

    def pods(self) -> list[Pod]:
        with self._lock:
            return list(self._pods.values())

    def pod(self, namespace: str, name: str) -> Pod:
        with self._lock:
            try:
                return self._pods[(namespace, name)]
            except KeyError:
                raise KeyError(f"pod {namespace}/{name} not found") from None

    def endpoints(self) -> list[PluginEndpoint]:
        with self._lock:
            return [st.endpoint for st in self._resources.values() if st.endpoint is not None]

    # ============================================================================ admission

    def admit(self, namespace: str, name: str, containers: list[Container]) -> Pod:
        pod = Pod(namespace, name, containers)
        pod_ref = f"{namespace}/{name}"
        with self._admit_lock:
            with self._lock:
                if pod.key in self._pods:
                    raise ValueError(f"pod {pod_ref} already exists")
                self._admitting = pod
                self._admitting_marked = {}
            try:
                self._allocate_pod(pod)
                self._check_predicates(pod)
            except DeviceManagerError as err:
                log.warning("Pod %s rejected: UnexpectedAdmissionError: %s", pod_ref, err)
                raise AdmissionError.unexpected(str(err), pod=pod_ref) from None
            except AdmissionError as err:
                log.warning("Pod %s rejected: %s", pod_ref, err)
                raise
            else:
                with self._lock:
                    self._pods[pod.key] = pod
                    self._write_checkpoint_locked()
                log.info("Pod %s admitted", pod_ref)
            finally:
                with self._lock:
                    self._admitting = None
                    self._admitting_marked = {}
                self._notify()
        return pod

    def _allocate_pod(self, pod: Pod) -> None:
        """`ManagerImpl.Allocate` for each container: init containers first, with device reuse."""
        reusable: dict[str, set[str]] = {}
        for container in pod.admission_order():
            self._allocate_container(pod, container, reusable)
            own = pod.allocations(container.name)
            for resource, alloc in own.items():
                pool = reusable.setdefault(resource, set())
                if container.init and not container.restartable:
                    pool.update(alloc.device_ids)  # finished init containers hand their devices on
                else:
                    pool.difference_update(alloc.device_ids)  # sidecars and app containers keep theirs

    def _allocate_container(self, pod: Pod, container: Container, reusable: dict[str, set[str]]) -> None:
        """`allocateContainerResources`."""
        for resource, required in container.requests.items():
            with self._lock:
                if not self._is_device_plugin_resource_locked(resource):
                    continue
            device_ids = self._devices_to_allocate(pod, container, resource, required, reusable.get(resource, set()))
            if not device_ids:
                continue
            with self._lock:
                state = self._resources.get(resource)
                endpoint = state.endpoint if state else None
            if endpoint is None:
                raise DeviceManagerError(f"unknown Device Plugin {resource}")
            log.info(
                "Making allocation request for device plugin: resource=%s devices=%s pod=%s/%s container=%s",
                resource,
                device_ids,
                pod.namespace,
                pod.name,
                container.name,
            )
            try:
                response = endpoint.allocate(device_ids, timeout=self.allocate_timeout)
            except PluginCallError as err:
                raise DeviceManagerError(str(err)) from None
            if not response.container_responses:
                text = text_format.MessageToString(response, as_one_line=True)
                raise DeviceManagerError(f"no containers return in allocation response &AllocateResponse{{{text}}}")
            cached = dp.ContainerAllocateResponse()
            cached.CopyFrom(response.container_responses[0])
            with self._lock:
                numa = self._numa_groups_locked(resource, device_ids)
            pod._set_allocation(container.name, ContainerAllocation(resource, tuple(device_ids), numa, cached))

    def _numa_groups_locked(self, resource: str, device_ids: list[str]) -> dict[int, tuple[str, ...]]:
        groups: dict[int, list[str]] = {}
        state = self._resources.get(resource)
        for dev_id in device_ids:
            device = state.all_devices.get(dev_id) if state else None
            nodes = [n.ID for n in device.topology.nodes] if device and device.HasField("topology") else []
            for node in nodes or [NODE_WITHOUT_TOPOLOGY]:
                groups.setdefault(node, []).append(dev_id)
        return {node: tuple(ids) for node, ids in groups.items()}

    def _devices_to_allocate(
        self, pod: Pod, container: Container, resource: str, required: int, reusable: set[str]
    ) -> list[str]:
        """`devicesToAllocate` for Topology Manager policy none (aligned = unaligned = {})."""
        with self._lock:
            existing = pod.allocations(container.name).get(resource)
            needed = required
            if existing is not None:
                needed -= len(existing.device_ids)
                if needed != 0:
                    raise DeviceManagerError(
                        f'pod "{pod.uid}" container "{container.name}" changed request for resource '
                        f'"{resource}" from {len(existing.device_ids)} to {required}'
                    )
            state = self._resources.get(resource)
            if state is None or not state.present:
                raise DeviceManagerError(f"cannot allocate unregistered device {resource}")
            if not state.healthy:
                raise DeviceManagerError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
            if existing is not None and not set(existing.device_ids) <= state.healthy:
                raise DeviceManagerError(
                    f"previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
                )
            if needed == 0:
                return []
            marked = self._admitting_marked.setdefault(resource, set())
            picker = _Picker(needed, marked)
            if picker.take(self._order(reusable)):
                return picker.allocated
            available = state.healthy - self._in_use_locked(resource)
            if len(available) < picker.needed:
                raise DeviceManagerError(
                    f"requested number of devices unavailable for {resource}. "
                    f"Requested: {picker.needed}, Available: {len(available)}"
                )
            options = state.options
            endpoint = state.endpoint
            candidates = self._order(available | set(picker.allocated))
            must_include = list(picker.allocated)

        preferred: list[str] = []
        if options is not None and options.get_preferred_allocation_available:
            if endpoint is None:
                raise DeviceManagerError(f"endpoint not found in cache for a registered resource: {resource}")
            try:
                answer = endpoint.get_preferred_allocation(candidates, must_include, required)
            except PluginCallError as err:
                raise DeviceManagerError(f"device plugin GetPreferredAllocation rpc failed with err: {err}") from None
            if answer.container_responses:
                preferred = list(answer.container_responses[0].deviceIDs)

        with self._lock:
            if picker.take(d for d in preferred if d in available):
                return picker.allocated
            if picker.take(self._order(available)):
                return picker.allocated
        raise DeviceManagerError(
            "unexpectedly allocated less resources than required. "
            f"Requested: {required}, Got: {required - picker.needed}"
        )

    def _check_predicates(self, pod: Pod) -> None:
        """Predicate admission: extended resources the device manager does not know have capacity 0."""
        requested: dict[str, int] = {}
        for container in pod.containers:
            for resource in container.requests:
                requested.setdefault(resource, 0)
        for resource in list(requested):
            long_running = sum(c.requests.get(resource, 0) for c in pod.containers if c.keeps_devices)
            init_peak = max((c.requests.get(resource, 0) for c in pod.containers if not c.keeps_devices), default=0)
            requested[resource] = max(long_running, init_peak)
        for resource, amount in requested.items():
            if amount <= 0 or not is_extended_resource_name(resource):
                continue
            with self._lock:
                known = self._is_device_plugin_resource_locked(resource)
            if not known:
                raise AdmissionError.insufficient(resource, amount, 0, 0, pod=f"{pod.namespace}/{pod.name}")

    # ============================================================================ pod lifecycle

    def delete_pod(self, namespace: str, name: str) -> Pod:
        """The pod leaves the active set: its ids go back to the free pool. The plugin is never told."""
        with self._lock:
            try:
                pod = self._pods.pop((namespace, name))
            except KeyError:
                raise KeyError(f"pod {namespace}/{name} not found") from None
            self._write_checkpoint_locked()
        log.info("Pod %s/%s deleted; its devices are free again (no plugin call)", namespace, name)
        self._notify()
        return pod

    def start_container(self, namespace: str, name: str, container_name: str) -> dict[str, str]:
        """A container (re)start: PreStartContainer where asked, env from the cached responses."""
        pod = self.pod(namespace, name)
        container = pod.container(container_name)
        for resource, quantity in container.requests.items():
            with self._lock:
                relevant = quantity > 0 and self._is_device_plugin_resource_locked(resource)
            if relevant:
                self._pre_start_if_needed(pod, container, resource)
        options = pod.run_options(container.name)
        for conflict in options.conflicts:
            log.warning("pod %s/%s container %s: %s", namespace, name, container.name, conflict)
        with self._lock:
            pod._record_start(container.name)
        self._notify()
        return options.envs

    def _pre_start_if_needed(self, pod: Pod, container: Container, resource: str) -> None:
        """`callPreStartContainerIfNeeded`."""
        with self._lock:
            state = self._resources.get(resource)
            if state is None or not state.present:
                raise ContainerStartError(f"endpoint not found in cache for a registered resource: {resource}")
            if state.options is None or not state.options.pre_start_required:
                return
            endpoint = state.endpoint
        device_ids = pod.devices(container.name, resource)
        if not device_ids:
            raise ContainerStartError(
                f"no devices found allocated in local cache for pod {pod.uid}, container {container.name}, "
                f"resource {resource}"
            )
        if endpoint is None:
            raise ContainerStartError(
                f"device plugin PreStartContainer rpc failed with err: endpoint for {resource} has been stopped"
            )
        try:
            endpoint.pre_start_container(device_ids, timeout=PRE_START_CONTAINER_TIMEOUT)
        except PluginCallError as err:
            raise ContainerStartError(f"device plugin PreStartContainer rpc failed with err: {err}") from None

    # ============================================================================ pod-resources views

    def pod_resources(self, pod: Pod) -> pr.PodResources:
        """`getPodResources`: app containers and restartable init containers, devices grouped by NUMA node."""
        out = pr.PodResources(name=pod.name, namespace=pod.namespace)
        listed = [c for c in pod.containers if c.is_sidecar] + [c for c in pod.containers if not c.init]
        for container in listed:
            entry = out.containers.add(name=container.name)
            for resource, alloc in pod.allocations(container.name).items():
                for node, ids in alloc.numa.items():
                    devices = entry.devices.add(resource_name=resource, device_ids=list(ids))
                    if node != NODE_WITHOUT_TOPOLOGY:
                        devices.topology.nodes.add(ID=node)
        return out

    def list_pod_resources(self) -> list[pr.PodResources]:
        return [self.pod_resources(pod) for pod in self.pods()]

    def find_pod(self, namespace: str, name: str) -> Pod | None:
        with self._lock:
            return self._pods.get((namespace, name))

    def allocatable_devices(self) -> list[pr.ContainerDevices]:
        """`GetAllocatableDevices`: healthy devices only, one entry per device (and NUMA node)."""
        out: list[pr.ContainerDevices] = []
        with self._lock:
            self._expire_locked()
            for name in sorted(self._resources):
                state = self._resources[name]
                if not state.present:
                    continue
                for dev_id in sorted(state.healthy, key=natural_key):
                    device = state.all_devices.get(dev_id)
                    nodes = [n.ID for n in device.topology.nodes] if device and device.HasField("topology") else []
                    if not nodes:
                        out.append(pr.ContainerDevices(resource_name=name, device_ids=[dev_id]))
                        continue
                    for node in nodes:
                        entry = pr.ContainerDevices(resource_name=name, device_ids=[dev_id])
                        entry.topology.nodes.add(ID=node)
                        out.append(entry)
        return out
