"""The uninstall, both halves (docs/admin/upgrade-uninstall.md; the decisions are :mod:`agent.policy.teardown`, this
module does the requests and the file removals):

* :func:`cleanup_if_released`, run by ``serve`` after it stopped on a signal: while the agent's DaemonSet is being
  deleted, its node's ResourceSlices (DRA mode), state files, seccomp profile and ``topology.s390x.ibm.com/`` labels;
* :func:`run_uninstall_hook`, the chart's pre-delete hook: deletes the DaemonSet in the foreground, waits for it to be
  gone, then removes the labels of nodes whose agent did not, and names them.

Must hold: a rolling update, a restart, a node shutdown and every doubt (the API server away, RBAC denying the look)
keep everything: holds must survive. Design: docs/contributing/design/mode-handover.md."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from agent.devices.persist import GROUPS_FILE, STATE_DIR, StateFiles
from agent.errors import KubeApiError
from agent.node.kubeapi import NodeRow
from agent.node.labels import KEY_PREFIX
from agent.node.seccomp import PROFILE_NAME, node_arch, profile
from agent.policy.grouping import GroupingSettings
from agent.policy.teardown import label_selector, leftover_nodes, release_deleted, removal_patch, state_paths

log = logging.getLogger("topology-agent.uninstall")

REQUEST_TIMEOUT = 5.0


class ReleaseApi(Protocol):
    def node_metadata(self, name: str, timeout: float) -> tuple[dict[str, str], dict[str, str]]: ...

    def patch_node(self, name: str, body: Mapping[str, Any], timeout: float) -> None: ...

    def get_daemonset(self, namespace: str, name: str, timeout: float) -> dict[str, Any] | None:
        """The DaemonSet, or None when there is none (404)."""

    def delete_daemonset_foreground(self, namespace: str, name: str, timeout: float) -> bool:
        """Delete it with propagationPolicy Foreground; False when there was none (404)."""

    def list_nodes(self, selector: str, timeout: float) -> list[NodeRow]:
        """(name, labels, annotations) of every node the label selector matches."""


def _why(exc: Exception) -> str:
    if isinstance(exc, KubeApiError):
        return f"the API server answered {exc.status}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------------------- the agent's half
def remove_state_files(kubelet_dir: Path, resource_prefix: str, dra: bool) -> list[str]:
    """Remove the agent's state under ``kubelet_dir`` (its prefix's files, DRA claims, the pre-release top-level
    groups file), and the state directory itself once empty. Returns what was removed; OSError for what could not be."""
    root = Path(kubelet_dir) / STATE_DIR
    prefix_dir = StateFiles(Path(kubelet_dir), GroupingSettings(resource_prefix=resource_prefix)).directory.name
    removed = []
    for path in map(Path, state_paths(root, prefix_dir, dra, GROUPS_FILE)):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(str(path))
    try:
        root.rmdir()  # only when empty: another instance (another prefix) keeps its own
        removed.append(str(root))
    except FileNotFoundError:
        pass
    except OSError:
        pass  # not empty
    return removed


def remove_seccomp_profile(directory: Path, arch: str | None = None) -> bool:
    """Remove ``directory/vllm-numa.json`` when it is the profile this agent installs for the node's architecture
    (an administrator's own file of that name is left, and said); False when there was none to remove."""
    target = Path(directory) / PROFILE_NAME
    try:
        content = target.read_bytes()
    except FileNotFoundError:
        return False
    if content != profile(arch or node_arch()):
        log.warning("uninstall: left %s: it is not the profile this agent installs (changed by hand?)", target)
        return False
    target.unlink()
    return True


def cleanup_if_released(api: ReleaseApi, *, namespace: str, daemonset: str, node_name: str | None,
                        kubelet_dir: Path, resource_prefix: str, dra: bool, seccomp_dir: Path | None,
                        node_labels: bool, timeout: float = REQUEST_TIMEOUT,
                        remove_slices: Callable[[str], int] | None = None) -> bool:
    """After the agent stopped: clean the node up when its DaemonSet is being deleted, else keep everything.
    True when it cleaned up. Never raises: every failure is one log line. ``remove_slices`` (DRA mode: the node's
    ResourceSlices, :func:`agent.app.build_dra.remove_node_slices`, handed in by the shell) deletes and counts them."""
    try:
        found = api.get_daemonset(namespace, daemonset, timeout)
    except Exception as exc:  # any doubt keeps the holds
        log.warning("kept the state files, holds, labels and seccomp profile: cannot tell whether DaemonSet %s/%s "
                    "is being deleted (%s)", namespace, daemonset, _why(exc))
        return False
    if not release_deleted(found):
        log.info("kept the state files, holds, labels and seccomp profile for the next agent: DaemonSet %s/%s is "
                 "not being deleted (a rolling update or a restart)", namespace, daemonset)
        return False
    log.info("DaemonSet %s/%s is being deleted: removing what the agent left on this node", namespace, daemonset)
    if dra and node_name and remove_slices is not None:  # first: the scheduler must stop allocating devices
        # nobody will prepare
        try:
            log.info("uninstall: deleted %d ResourceSlice(s) of node %s", remove_slices(node_name), node_name)
        except Exception as exc:
            log.warning("uninstall: cannot delete the ResourceSlices of node %s (the kubelet deletes them after its "
                        "grace period for a deregistered plugin): %s", node_name, _why(exc))
    try:
        for path in remove_state_files(kubelet_dir, resource_prefix, dra):
            log.info("uninstall: removed %s", path)
    except OSError as exc:
        log.warning("uninstall: cannot remove the state files under %s: %s", kubelet_dir, exc.strerror or exc)
    if seccomp_dir is not None:
        try:
            if remove_seccomp_profile(seccomp_dir):
                log.info("uninstall: removed %s", Path(seccomp_dir) / PROFILE_NAME)
        except Exception as exc:
            log.warning("uninstall: cannot remove the seccomp profile in %s: %s", seccomp_dir, exc)
    if node_labels and node_name:  # last: a node that still carries them is one whose agent did not finish
        try:
            labels, annotations = api.node_metadata(node_name, timeout)
            patch = removal_patch(labels, annotations, KEY_PREFIX)
            if patch is not None:
                api.patch_node(node_name, patch, timeout)
                log.info("uninstall: removed the %s labels and annotations of node %s", KEY_PREFIX, node_name)
        except Exception as exc:
            log.warning("uninstall: cannot remove the labels of node %s (the hook removes them): %s", node_name,
                        _why(exc))
    return True


# ---------------------------------------------------------------------------------------- the hook's half
def run_uninstall_hook(api: ReleaseApi, *, namespace: str, daemonset: str, node_selector: Mapping[str, str],
                       timeout: float, say: Callable[[str], None], interval: float = 1.0,
                       clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                       ) -> int:
    """The pre-delete hook: delete the DaemonSet in the foreground, wait up to ``timeout`` for it to be gone, then
    remove the labels every node still carries. 0 whatever was left (an uninstall is never blocked by a node that is
    down: what is left is said); 1 when the API server could not be used at all."""
    where = f"DaemonSet {namespace}/{daemonset}"
    try:
        deleted = api.delete_daemonset_foreground(namespace, daemonset, REQUEST_TIMEOUT)
    except Exception as exc:
        say(f"uninstall: cannot delete {where}: {_why(exc)}")
        return 1
    say(f"uninstall: {where} deleted (foreground): each agent cleans its node up as it stops" if deleted
        else f"uninstall: {where} is already gone")
    deadline = clock() + timeout
    gone = not deleted
    while not gone:
        try:
            gone = api.get_daemonset(namespace, daemonset, REQUEST_TIMEOUT) is None
        except Exception as exc:
            say(f"uninstall: cannot look at {where}: {_why(exc)}")
        if gone:
            break
        if clock() >= deadline:
            say(f"uninstall: {where} still has pods after {timeout:g} s (a node down?): going on")
            break
        sleep(interval)
    if gone and deleted:
        say(f"uninstall: {where} and all its pods are gone")
    selector = label_selector(node_selector)
    try:
        nodes = api.list_nodes(selector, REQUEST_TIMEOUT)
    except Exception as exc:
        say(f"uninstall: cannot list the nodes ({selector or 'all'}): {_why(exc)}")
        return 1
    left = leftover_nodes(nodes, KEY_PREFIX)
    for name, patch in left:
        try:
            api.patch_node(name, patch, REQUEST_TIMEOUT)
        except Exception as exc:
            say(f"uninstall: node {name}: cannot remove the {KEY_PREFIX} labels: {_why(exc)}")
            continue
        say(f"uninstall: node {name}: its agent did not clean up (not running there?): removed its {KEY_PREFIX} "
            f"labels; its state files (<kubelet root>/device-plugins/{STATE_DIR}) and seccomp profile "
            f"(<kubelet root>/seccomp/profiles/{PROFILE_NAME}) may remain: remove them by hand")
    say(f"uninstall: done: {len(nodes)} node(s) looked at, {len(left)} cleaned by the hook")
    return 0
