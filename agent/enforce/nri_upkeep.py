"""What the NRI enforcement (:mod:`agent.enforce.nri_hooks`) does outside any event, on a thread of its own: the push
(devices changed hands outside any event: the known containers' updates go out at once with an unsolicited
``UpdateContainers``) and the re-check (every ``recheck`` seconds each known container's cpuset is read back over
CRI, and one found on another cpuset than the agent knew is counted, said once and set again).

Must hold: unsolicited updates only on runtimes whose NRI is v0.12.1 or later (older ones, CRI-O 1.34 among them, get
the same updates over their CRI socket, or the next event's reply without one), sent without ``ignore_failure`` and,
when a batch fails, again one container at a time to learn which; only what the runtime confirms is remembered; a
timed-out update leaves its container in doubt (every reply sends it again) until the runtime says which cpuset it
has. Why, with containerd's and NRI's code: docs/contributing/design/cpuset-enforcement.md."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.backoff import Backoff
from agent.cri.client import CriClient
from agent.enforce.engine import RUNTIME_DOWN, EnforcementCounters
from agent.errors import CriError
from agent.nri.stub import NriPlugin, UpdatesFailed
from agent.nri.ttrpc import CallTimeout, TrunkClosed
from agent.policy.cpuset import RunningContainer, Update
from agent.topology.cpulist import format_cpulist, parse_cpulist
from agent.worker import Worker

log = logging.getLogger("topology-agent.cpuset")

RECHECK = 60.0  # seconds between re-reads of what the runtime applied
BACKOFF = (1.0, 30.0)  # seconds before a failed push is tried again, doubling


class Kept(Protocol):
    """What the upkeep needs of the NRI enforcement (agent.enforce.nri_hooks.NriEnforcement)."""

    counters: EnforcementCounters
    plugin: NriPlugin

    def wanted(self) -> list[Update]: ...

    def confirmed(self, update: Update) -> None: ...

    def unconfirmed(self, update: Update, failed: bool) -> None: ...

    def known(self) -> list[RunningContainer]: ...

    def seen(self, expected: RunningContainer, cpus: frozenset[int]) -> bool: ...


class Upkeep(Worker):
    def __init__(self, enforcement: Kept, verifier: CriClient | None, recheck: float) -> None:
        super().__init__(thread_name="nri-upkeep")
        self.enforcement = enforcement
        self.verifier = verifier
        self.recheck_interval = recheck
        self._said: set[str] = set()  # containers said to be overridden (once each)
        self.rechecks = 0  # read-backs done
        self._failing = ""  # the last push failure said

    def start(self) -> None:
        if self.verifier is None:
            log.info("NRI: no CRI socket at hand, so what the runtime applied is not read back (a lost update is "
                     "sent again at the next event only)")
        super().start()

    def stop(self) -> None:
        super().stop()
        if self.verifier is not None:
            self.verifier.close()

    def _run(self) -> None:
        backoff = Backoff(*BACKOFF)
        retry_at = float("inf")
        check_at = time.monotonic() + self.recheck_interval
        while not self._stop.is_set():
            until = min(retry_at, check_at if self.verifier is not None else retry_at)
            self._pause(None if until == float("inf") else max(0.0, until - time.monotonic()))
            if self._stop.is_set():
                break
            plugin = self.enforcement.plugin
            if not plugin.state.registered:  # the next Synchronize says what the runtime has
                retry_at, check_at = float("inf"), time.monotonic() + self.recheck_interval
                continue
            try:
                if self.verifier is not None and time.monotonic() >= check_at:
                    check_at = time.monotonic() + self.recheck_interval
                    self.recheck()
                if not plugin.unsolicited_safe and self.verifier is None:
                    retry_at = float("inf")  # the next event's reply carries them
                    continue
                if self.push() if plugin.unsolicited_safe else self.push_over_cri():
                    backoff.reset()
                    retry_at = float("inf")
                else:
                    retry_at = time.monotonic() + backoff.next()
            except Exception:  # the thread goes on whatever one look does
                log.exception("NRI upkeep failed; the next event's reply carries the updates")
                retry_at = time.monotonic() + backoff.next()

    # --- push -------------------------------------------------------------------------------------------
    def push(self) -> bool:
        """Send what the known containers need now; True when the runtime confirmed all of it."""
        updates = self.enforcement.wanted()
        if not updates:
            return True
        plugin = self.enforcement.plugin
        try:
            failed = set(plugin.update_containers([container_update(u, ignore_failure=False) for u in updates]))
        except UpdatesFailed:
            return self._one_by_one(updates)
        except (TrunkClosed, CallTimeout, RuntimeError) as exc:
            self._lost(updates, str(exc))
            return False
        return self._settle(updates, failed)

    def push_over_cri(self) -> bool:
        """The same, over the runtime's CRI socket (an NRI too old for unsolicited updates); True when every update
        was applied. A container the runtime refuses (gone meanwhile) fails alone; a runtime that is down leaves the
        rest in doubt."""
        assert self.verifier is not None
        updates = self.enforcement.wanted()
        if not updates:
            return True
        failed: set[str] = set()
        try:
            for i, update in enumerate(updates):
                try:
                    self.verifier.update_cpuset(update.container, update.cpus, update.mems)
                except CriError as exc:
                    if exc.code in RUNTIME_DOWN or exc.code == "DEADLINE_EXCEEDED":  # down, or it may apply it later
                        self._settle(updates[:i], failed)
                        self._lost(updates[i:], str(exc))
                        return False
                    failed.add(update.container)
        finally:
            self.verifier.close()  # no connection kept open between pushes
        return self._settle(updates, failed)

    def _one_by_one(self, updates: list[Update]) -> bool:
        failed: set[str] = set()
        for i, update in enumerate(updates):
            try:
                failed.update(self.enforcement.plugin.update_containers([container_update(update,
                                                                                          ignore_failure=False)]))
            except UpdatesFailed:
                failed.add(update.container)
            except (TrunkClosed, CallTimeout, RuntimeError) as exc:
                self._settle(updates[:i], failed)
                self._lost(updates[i:], str(exc))
                return False
        return self._settle(updates, failed)

    def _settle(self, updates: list[Update], failed: set[str]) -> bool:
        for update in updates:
            if update.container in failed:
                self.enforcement.unconfirmed(update, failed=True)
            else:
                self.enforcement.confirmed(update)
        done = len(updates) - len([u for u in updates if u.container in failed])
        if done:
            log.info("updated %d containers outside an event (the runtime confirmed)", done, extra={"reason": "pool"})
        if failed:
            why = f"the runtime failed the cpuset update of {len(failed)} container(s)"
            if why != self._failing:
                log.warning("%s (its log says why); they stay as they are, tried again with backoff and sent with "
                            "every reply meanwhile", why, extra={"reason": why})
            self._failing = why
            return False
        self._failing = ""
        return True

    def _lost(self, updates: list[Update], why: str) -> None:
        for update in updates:
            self.enforcement.unconfirmed(update, failed=False)
        if why != self._failing:
            log.warning("could not update %d containers outside an event (%s): they are in doubt, sent again with "
                        "backoff and with every reply until the runtime confirms", len(updates), why,
                        extra={"reason": why})
        self._failing = why

    # --- re-check ---------------------------------------------------------------------------------------
    def recheck(self) -> int:
        """Read back every known container's cpuset; the number found overridden."""
        assert self.verifier is not None
        found = 0
        known = self.enforcement.known()
        try:
            for container in known:
                try:
                    status = self.verifier.container_status(container.id)
                except CriError as exc:
                    if exc.code in RUNTIME_DOWN:
                        raise
                    continue  # ended meanwhile, or this one cannot be read: the next look
                text = status.applied_cpus if status.applied_cpus is not None else status.cpuset_cpus
                cpus = frozenset(parse_cpulist(text)) if text else frozenset()
                if self.enforcement.seen(container, cpus):
                    found += 1
                    self.enforcement.counters.overridden += 1
                    if container.id not in self._said:
                        self._said.add(container.id)
                        log.warning("%s (container %s) runs on cpuset %s, not the %s the agent set: another NRI "
                                    "plugin, a manual update (crictl update) or a lost update changed it; setting "
                                    "it again (two plugins that manage cpusets fight: run one)",
                                    "/".join(container.identity), container.id[:13], text or "(all)",
                                    _cpus(container.cpus), extra={"reason": "overridden"})
        except CriError as exc:
            log.info("NRI: cannot read back cpusets now (%s); the next look tries again", exc)
        finally:
            self.verifier.close()  # no connection kept open between looks
            self.rechecks += 1
        alive = {c.id for c in known}
        self._said &= alive
        return found


def container_update(update: Update, ignore_failure: bool = True) -> nri.ContainerUpdate:
    """An update as NRI sends it: in a reply with ``ignore_failure`` (containerd logs a failure), unsolicited
    without (a failure comes back)."""
    return nri.ContainerUpdate(
        container_id=update.container, ignore_failure=ignore_failure,
        linux=nri.LinuxContainerUpdate(resources=nri.LinuxResources(cpu=nri.LinuxCPU(cpus=update.cpus,
                                                                                     mems=update.mems))))


def _cpus(cpus: frozenset[int]) -> str:
    return format_cpulist(sorted(cpus)) if cpus else "(all)"
