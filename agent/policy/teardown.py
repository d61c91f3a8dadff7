"""What an uninstall removes, and when, and whether a stopping agent hands its node over: pure decisions over API
objects and paths (no I/O).

Must hold: a stopping agent keeps everything (a rolling update, a restart, a node shutdown: the next agent needs its
holds) unless its DaemonSet is being deleted (``helm uninstall``'s pre-delete hook deletes it in the foreground
first); then it removes its state files, the seccomp profile it installed and its node's labels and annotations, in
that order (a node that still carries the labels is one whose agent did not finish: the hook names it). It hands over
only when it is the last of its mode on its node. Why: docs/contributing/design/mode-handover.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import PurePath
from typing import Any


def release_deleted(daemonset: Mapping[str, Any] | None) -> bool:
    """Whether the agent's DaemonSet is going away: gone (None, a 404) or marked for deletion. Anything else,
    including an answer that is not a DaemonSet, keeps everything."""
    if daemonset is None:
        return True
    meta = daemonset.get("metadata")
    return isinstance(meta, Mapping) and bool(meta.get("deletionTimestamp"))


def removal_patch(labels: Mapping[str, str], annotations: Mapping[str, str], prefix: str) -> dict[str, Any] | None:
    """The JSON merge patch that removes every ``prefix`` label and annotation (None: there are none)."""
    body: dict[str, Any] = {}
    ours_labels = {k: None for k in sorted(labels) if k.startswith(prefix)}
    ours_annotations = {k: None for k in sorted(annotations) if k.startswith(prefix)}
    if ours_labels:
        body["labels"] = ours_labels
    if ours_annotations:
        body["annotations"] = ours_annotations
    return {"metadata": body} if body else None


def state_paths(state_root: PurePath, prefix_dir: str, dra: bool, groups_file: str) -> tuple[PurePath, ...]:
    """The agent's own entries under ``state_root`` (``<kubelet dir>/s390x-topology-agent``): its prefix's
    directory, DRA mode's claims directory, the pre-release top-level groups file. Another instance's prefix is
    not among them."""
    paths: list[PurePath] = [state_root / prefix_dir]
    if dra:
        paths.append(state_root / "dra")
    paths.append(state_root / groups_file)
    return tuple(paths)


def label_selector(node_selector: Mapping[str, str]) -> str:
    """A node selector (key: value) as a label selector string (``k=v,k2=v2``)."""
    return ",".join(f"{k}={v}" for k, v in sorted(node_selector.items()))


def parse_label_selector(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` back to a mapping; ValueError naming the item that is not ``key=value``."""
    selector: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or "=" in value:
            raise ValueError(f"{item!r} is not key=value")
        selector[key.strip()] = value.strip()
    return selector


def leftover_nodes(nodes: Iterable[tuple[str, Mapping[str, str], Mapping[str, str]]],
                   prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """(node name, removal patch) for every node that still carries ``prefix`` keys, by name."""
    left = []
    for name, node_labels, node_annotations in nodes:
        patch = removal_patch(node_labels, node_annotations, prefix)
        if patch is not None:
            left.append((name, patch))
    return sorted(left, key=lambda item: item[0])


def template_mode(daemonset: Mapping[str, Any] | None) -> str | None:
    """The mode (``TOPOLOGY_AGENT_MODE``, ``deviceplugin`` when unset) the DaemonSet's pod template runs; None when
    the answer is not a DaemonSet with an agent container."""
    spec = daemonset.get("spec") if isinstance(daemonset, Mapping) else None
    template = spec.get("template") if isinstance(spec, Mapping) else None
    pod = template.get("spec") if isinstance(template, Mapping) else None
    containers = pod.get("containers") if isinstance(pod, Mapping) else None
    if not isinstance(containers, list):
        return None
    for container in containers:
        env = container.get("env") if isinstance(container, Mapping) else None
        if not isinstance(env, list) or not any(isinstance(e, Mapping) and str(e.get("name", "")).startswith(
                "TOPOLOGY_AGENT_") for e in env):
            continue  # not the agent's container
        mode = next((e.get("value") for e in env if isinstance(e, Mapping) and e.get("name") == "TOPOLOGY_AGENT_MODE"),
                    None)
        return str(mode) if mode else "deviceplugin"
    return None


def handing_over(daemonset: Mapping[str, Any] | None, mode: str) -> str | None:
    """Why the agent that stops now, running ``mode``, is the last of its mode on its node: the release is being
    uninstalled, or its DaemonSet's template now runs the other mode (``helm upgrade --set mode=...``, a rolling
    update under way). None for a restart or a rolling update in the same mode (and for any doubt): the next agent
    serves the same resources."""
    if release_deleted(daemonset):
        return "the release is being uninstalled"
    after = template_mode(daemonset)
    if after is not None and after != mode:
        return f"its DaemonSet now runs {after} mode"
    return None
