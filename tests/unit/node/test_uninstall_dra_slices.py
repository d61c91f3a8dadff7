"""The agent's half of an uninstall in DRA mode (agent/node/cleanup.py): its node's ResourceSlices go first, only
when the DaemonSet is being deleted, and a failure to delete them is one warning (the kubelet deletes them after its
grace period) that does not stop the rest of the cleanup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.dra.publisher import SlicePublisher
from agent.errors import KubeApiError
from agent.node.cleanup import cleanup_if_released
from tests.support.kubeapi import UninstallApi, uninstall_node, write_state_files


def _clean(api: UninstallApi, kubelet_dir: Path, dra: bool, remove: Any) -> bool:
    return cleanup_if_released(api, namespace="topology-system", daemonset="agent", node_name="n1",
                               kubelet_dir=kubelet_dir, resource_prefix="topology", dra=dra, seccomp_dir=None,
                               node_labels=True, remove_slices=remove)


class Remover:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[str] = []
        self.error = error

    def __call__(self, node: str) -> int:
        self.calls.append(node)
        if self.error is not None:
            raise self.error
        return 2


def test_a_deleted_daemonset_in_dra_mode_deletes_the_nodes_slices(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    write_state_files(tmp_path)
    remover = Remover()
    caplog.set_level("INFO")
    api = UninstallApi({"metadata": {"name": "agent", "deletionTimestamp": "now"}}, uninstall_node())
    assert _clean(api, tmp_path, True, remover)
    assert remover.calls == ["n1"]
    assert "uninstall: deleted 2 ResourceSlice(s) of node n1" in caplog.text


@pytest.mark.parametrize("daemonset, dra", [({"metadata": {"name": "agent"}}, True),  # a rolling update
                                            (None, False)])  # device-plugin mode: no slices
def test_slices_stay_on_a_rolling_update_and_in_device_plugin_mode(tmp_path: Path, daemonset: Any, dra: bool) -> None:
    write_state_files(tmp_path)
    remover = Remover()
    _clean(UninstallApi(daemonset, uninstall_node()), tmp_path, dra, remover)
    assert remover.calls == []


def test_a_refused_delete_is_one_warning_and_the_rest_is_cleaned(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    write_state_files(tmp_path)
    api = UninstallApi(None, uninstall_node())
    assert _clean(api, tmp_path, True, Remover(KubeApiError(403, "forbidden")))
    assert "cannot delete the ResourceSlices of node n1" in caplog.text
    assert not (tmp_path / "s390x-topology-agent").exists()
    assert api.patches  # the labels went too


class SliceApi:
    """remove_all's calls: a List by node and driver, then a delete per slice (one already gone)."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        assert (node, driver) == ("n1", "topology.s390x.ibm.com")
        return [{"metadata": {"name": n}} for n in ("n1-topology-counters-0", "n1-topology-devices-0")]

    def delete_slice(self, name: str, resource_version: str | None = None) -> None:
        if name.endswith("counters-0"):
            raise KubeApiError(404, "gone")
        self.deleted.append(name)


def test_remove_all_deletes_what_the_list_shows_and_ignores_404() -> None:
    api = SliceApi()
    assert SlicePublisher(api, "n1", "topology.s390x.ibm.com").remove_all() == 1  # type: ignore[arg-type]
    assert api.deleted == ["n1-topology-devices-0"]


def test_serve_hands_the_slice_remover_to_the_cleanup_in_dra_mode_only() -> None:
    from types import SimpleNamespace

    from agent.app.build_dra import remove_node_slices
    from agent.cli.serve import node_slice_remover

    assert node_slice_remover(SimpleNamespace(mode="dra")) is remove_node_slices  # type: ignore[arg-type]
    assert node_slice_remover(SimpleNamespace(mode="deviceplugin")) is None  # type: ignore[arg-type]
