"""What the agent tells and warns about its node: kubelet's CPU manager findings (logged once
each) and the node labels and annotation (patched only when they change). The device plugin
never waits for any of this: it runs in its own loop, and failures are warnings."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import CpuManagerStateError, KubeletConfigError
from agent.node.cpu_manager import cpu_manager_findings, read_cpu_manager_state, read_reserved_system_cpus
from agent.node.labels import node_annotations, node_event, node_labels, not_advertised, warning_event
from agent.policy.grouping import Grouping
from agent.topology.model import Topology

if TYPE_CHECKING:
    from agent.node.labeler import NodeLabeler

log = logging.getLogger("topology-agent.node")

LabelerFactory = Callable[[str], "NodeLabeler"]
RELOOK_EVERY = 120  # label syncs between reads of the Node (one hour at the default 30 s)
EVENTS_KEPT = 20  # Warning Events waiting to be posted (the oldest go first when more come)


def _file_identity(path: Path | None) -> object:
    """Which version of a file this is, by stat (kubelet replaces its files by rename): None if absent."""
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def default_labeler(node_name: str) -> NodeLabeler:
    from agent.node.labeler import NodeLabeler  # http.client and ssl: only when labels are on

    return NodeLabeler.from_environment(node_name)


class NodeReporter:
    def __init__(self, topology: Topology, grouping: Grouping, *, node_name: str | None, labels_enabled: bool,
                 cpu_manager_state: Path | None, kubelet_config: Path | None,
                 labeler_factory: LabelerFactory = default_labeler,
                 exclusivity: Callable[[], bool] | None = None) -> None:
        self.topology = topology
        self.exclusivity = exclusivity
        self.grouping = grouping
        self.node_name = node_name
        self.labels_enabled = labels_enabled
        self.cpu_manager_state = cpu_manager_state
        self.kubelet_config = kubelet_config
        self.labeler_factory = labeler_factory
        self.cpu_manager_policy: str | None = None
        self.findings: list[str] = []
        self._labeler: NodeLabeler | None = None
        self._labeler_broken = False
        self._said_missing = False
        self._syncs = 0
        self.failed_syncs = 0  # label syncs failed in a row (the loop backs off on them)
        self._event_posted = False  # the "nothing advertised" Event, once per start
        self._events: deque[tuple[str, str]] = deque(maxlen=EVENTS_KEPT)  # (reason, message) to post
        self._events_lock = threading.Lock()
        self.on_event: Callable[[], None] | None = None  # wakes the label loop (set by the agent)
        self._read_identity: tuple[object, object] | None = None  # the files as last read

    # --- kubelet's CPU manager ---------------------------------------------------------
    def check_cpu_manager(self) -> None:
        if self.cpu_manager_state is not None and not self._said_missing and not self.cpu_manager_state.exists():
            self._said_missing = True
            log.info("kubelet's CPU manager state %s is not visible: the static-policy check is skipped "
                     "(the chart mounts kubelet's root read-only with kubelet.readState=true)", self.cpu_manager_state)
        identity = (_file_identity(self.cpu_manager_state), _file_identity(self.kubelet_config))
        if identity == self._read_identity:  # neither file changed since the last read (a stat each)
            return
        self._read_identity = identity
        state = None
        reserved: tuple[int, ...] = ()
        try:
            if self.cpu_manager_state is not None:
                state = read_cpu_manager_state(self.cpu_manager_state)
            if self.kubelet_config is not None:
                reserved = read_reserved_system_cpus(self.kubelet_config)
        except (CpuManagerStateError, KubeletConfigError, OSError) as exc:
            log.warning("cannot read kubelet's CPU manager state: %s", exc, extra={"reason": str(exc)})
        self.cpu_manager_policy = state.policy if state is not None else None
        findings = cpu_manager_findings(state, self.grouping, reserved)
        for finding in findings:
            if finding not in self.findings:
                log.warning("%s", finding, extra={"reason": "cpu-manager"})
        self.findings = findings

    # --- node labels ---------------------------------------------------------------------
    def labels(self) -> dict[str, str]:
        return node_labels(self.topology, self.grouping, self.cpu_manager_policy)

    def sync_labels(self) -> bool:
        """Patch the node when our labels changed; False when skipped or failed (logged)."""
        if not self.labels_enabled or self._labeler_broken:
            return False
        if not self.node_name:
            log.warning("node labels disabled: NODE_NAME is not set (give it from the downward API, spec.nodeName)")
            self._labeler_broken = True
            return False
        if self._labeler is None:
            try:
                self._labeler = self.labeler_factory(self.node_name)
            except Exception as exc:  # no configuration at all: keep serving devices
                log.warning("node labels disabled: %s", exc, extra={"reason": str(exc)})
                self._labeler_broken = True
                return False
        self._syncs += 1
        if self._syncs % RELOOK_EVERY == 0:
            self._labeler.invalidate()  # labels removed by hand come back: re-read the node now and then
        exclusivity = None
        if self.exclusivity is not None:
            exclusivity = "confirmed" if self.exclusivity() else "unconfirmed"
        synced = self._labeler.sync(self.labels(), node_annotations(self.topology, self.grouping, exclusivity))
        self.failed_syncs = 0 if synced else self.failed_syncs + 1
        nothing = not_advertised(self.topology, self.grouping)
        if synced and nothing is not None and not self._event_posted:
            from datetime import UTC, datetime

            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._labeler.post_event(node_event(self.node_name, *nothing, now))
            self._event_posted = True  # once: a refusal (RBAC) would only repeat; a failure is one warning
        if synced:
            self._post_events()
        return synced

    def warn(self, reason: str, message: str) -> None:
        """A Warning Event on the Node, posted by the label loop (never blocks: any thread may call it; without
        node labels, hence no API access, it is only logged by the caller)."""
        with self._events_lock:
            self._events.append((reason, message))
        if self.on_event is not None:
            self.on_event()

    def _post_events(self) -> None:
        from datetime import UTC, datetime

        with self._events_lock:
            waiting, self._events = list(self._events), deque(maxlen=EVENTS_KEPT)
        if waiting and self._labeler is not None and self.node_name:
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            for reason, message in waiting:
                self._labeler.post_event(warning_event(self.node_name, reason, message, now))

    @property
    def patches(self) -> int:
        return self._labeler.patches if self._labeler is not None else 0

    @property
    def failures(self) -> int:
        return self._labeler.failures if self._labeler is not None else 0
