"""The agent's own state on the node: the groups it advertised, kept in a directory of its own
inside kubelet's device-plugin directory (kubelet deletes sockets there, never directories)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from agent.policy.grouping import Grouping, GroupingSettings
from agent.policy.saved import grouping_from_dict, grouping_to_dict

log = logging.getLogger("topology-agent")

STATE_DIR = "s390x-topology-agent"
STATE_FILE = "groups.json"


def state_path(kubelet_dir: Path) -> Path:
    return Path(kubelet_dir) / STATE_DIR / STATE_FILE


def load_groups(kubelet_dir: Path, settings: GroupingSettings) -> Grouping | None:
    path = state_path(kubelet_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable saved groups %s: %s", path, exc, extra={"reason": str(exc)})
        return None
    return grouping_from_dict(data, settings)


def save_groups(kubelet_dir: Path, grouping: Grouping, settings: GroupingSettings) -> None:
    """Write atomically; a failure is a warning (the groups are then chosen afresh next time)."""
    path = state_path(kubelet_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, encoding="utf-8") as tmp:
            json.dump(grouping_to_dict(grouping, settings), tmp)
        os.replace(tmp.name, path)
    except OSError as exc:
        log.warning("cannot save the advertised groups to %s: %s", path, exc, extra={"reason": str(exc)})
