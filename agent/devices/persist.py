"""The agent's own state on the node, in a directory of its own inside kubelet's device-plugin
directory (kubelet deletes sockets there, never directories): per resource prefix, the groups it
advertised and every hold it knows of (pod-resources may be away when it restarts). Reads are bounded and checked
(:mod:`agent.policy.state_codec`); a file that cannot be trusted is said loudly and not used, and a file of a newer
format than this agent reads stops the agent before anything is written (:meth:`StateFiles.refuse_newer`)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.atomic import write_atomically
from agent.errors import NewerStateError, SavedStateError
from agent.policy.grouping import Grouping, GroupingSettings
from agent.policy.keys import DeviceKey
from agent.policy.ledger import SavedHolds
from agent.policy.state_codec import (
    check_version,
    grouping_from_dict,
    grouping_to_dict,
    holds_from_dict,
    holds_to_dict,
    newer_refusal,
)

log = logging.getLogger("topology-agent.state")

STATE_DIR = "s390x-topology-agent"
GROUPS_FILE = "groups.json"
HOLDS_FILE = "holds.json"
MAX_STATE_BYTES = 1024 * 1024  # a saved file is a few KiB; anything larger was not written by us


def _safe(prefix: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", prefix) or "_"


class StateFiles:
    """The saved groups and holds of one resource prefix (two agents with different prefixes on one
    kubelet keep separate files)."""

    def __init__(self, kubelet_dir: Path, settings: GroupingSettings) -> None:
        self.settings = settings
        self.directory = Path(kubelet_dir) / STATE_DIR / _safe(settings.resource_prefix)
        self.legacy_groups = Path(kubelet_dir) / STATE_DIR / GROUPS_FILE  # the layout before per-prefix directories
        self._grouping: Grouping | None = None
        self._holds: dict[str, Any] | None = None  # as last written, so that tend() can put them back

    @property
    def groups_path(self) -> Path:
        return self.directory / GROUPS_FILE

    @property
    def holds_path(self) -> Path:
        return self.directory / HOLDS_FILE

    def refuse_newer(self) -> None:
        """NewerStateError, naming the file, when a saved file is of a newer format than this agent reads; run
        before anything is written, so that such a file is never replaced (a rollback past a format change)."""
        for path, what in ((self.groups_path, "saved groups"), (self.legacy_groups, "saved groups"),
                           (self.holds_path, "saved holds")):
            try:  # quietly: a file that cannot be read is said when it is loaded
                with open(path, "rb") as f:
                    data = json.loads(f.read(MAX_STATE_BYTES + 1))
            except (OSError, ValueError, RecursionError):
                continue
            try:
                check_version(data, f"the {what}")
            except SavedStateError:
                pass  # said, and not used, when it is loaded
            except NewerStateError as exc:
                raise newer_refusal(path, exc) from None

    # --- groups ---------------------------------------------------------------------------------
    def load_groups(self, present_cpus: Iterable[int]) -> Grouping | None:
        """The groups saved under the same settings, or None (absent, other settings, untrusted)."""
        path = self.groups_path if self.groups_path.exists() else self.legacy_groups
        data = self._read(path, "saved groups")
        if data is None:
            return None
        try:
            return grouping_from_dict(data, self.settings, present_cpus)
        except NewerStateError as exc:
            raise newer_refusal(path, exc) from None
        except SavedStateError as exc:
            log.warning("not trusting the saved groups %s: %s; the groups found now are advertised", path, exc,
                        extra={"reason": str(exc)})
            return None

    def save_groups(self, grouping: Grouping) -> None:
        """Write atomically; a failure is a warning (the groups are then chosen afresh next time, and
        :meth:`tend` does not retry what could not be written)."""
        saved = self._write(self.groups_path, grouping_to_dict(grouping, self.settings), "the advertised groups")
        self._grouping = grouping if saved else None

    # --- holds ----------------------------------------------------------------------------------
    def load_holds(self, known: Iterable[DeviceKey]) -> SavedHolds:
        data = self._read(self.holds_path, "saved holds")
        if data is None:
            return SavedHolds(frozenset(), {})
        try:
            return holds_from_dict(data, self.settings, known)
        except NewerStateError as exc:
            raise newer_refusal(self.holds_path, exc) from None
        except SavedStateError as exc:
            log.warning("not trusting the saved holds %s: %s", self.holds_path, exc, extra={"reason": str(exc)})
            return SavedHolds(frozenset(), {})

    def save_holds(self, holds: SavedHolds) -> None:
        data = holds_to_dict(holds, self.settings)
        self._holds = data if self._write(self.holds_path, data, "the holds") else None

    def tend(self) -> None:
        """Write the groups again when someone wiped them, and the holds when someone wiped, cut short or changed
        them (a restart would otherwise lose them: pod-resources may be away then)."""
        if self._grouping is not None and not self.groups_path.exists():
            log.warning("the saved groups %s are gone: writing them again", self.groups_path)
            self.save_groups(self._grouping)
        if self._holds is not None and self._on_disk(self.holds_path) != json.dumps(self._holds).encode():
            log.warning("the saved holds %s were wiped or changed: writing them again", self.holds_path)
            if not self._write(self.holds_path, self._holds, "the holds"):
                self._holds = None  # said once; the next change of hands writes them again

    @staticmethod
    def _on_disk(path: Path) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read(MAX_STATE_BYTES + 1)
        except OSError:
            return None

    # --- files ----------------------------------------------------------------------------------
    def _read(self, path: Path, what: str) -> Any:
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read the %s %s: %s", what, path, exc.strerror or exc, extra={"reason": str(exc)})
            return None
        if len(raw) > MAX_STATE_BYTES:
            log.warning("not trusting the %s %s: larger than %d bytes", what, path, MAX_STATE_BYTES)
            return None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
            log.warning("not trusting the %s %s: not JSON (%s)", what, path, reason, extra={"reason": reason})
            return None

    def _write(self, path: Path, data: dict[str, Any], what: str) -> bool:
        """Write atomically (a temporary file renamed over ``path``); False, with a warning, on failure,
        and no temporary file left behind."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, json.dumps(data).encode(), mode=0o600)
            return True
        except OSError as exc:
            log.warning("cannot save %s to %s: %s", what, path, exc.strerror or exc, extra={"reason": str(exc)})
            return False
