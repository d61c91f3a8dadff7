"""ResourceClaims as the API server hands them to the DRA kubelet plugin, and the groups they name: the DRA plugin's
tests build their claims from these."""

from __future__ import annotations

from typing import Any

from agent.errors import KubeApiError
from agent.policy.grouping import Group, GroupingSettings, group_topology
from agent.policy.resource_slices import DRIVER
from agent.topology.embedded import load_embedded


def groups() -> dict[str, Group]:
    topology = load_embedded("pr40714")
    return {g.id: g for g in group_topology(topology, GroupingSettings(levels=("book", "socket"))).groups}


def claim(uid: str, *devices: tuple[str, str], namespace: str = "ns", name: str = "c",
          driver: str = DRIVER, pool: str = "node-a") -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"request": req, "driver": driver, "pool": pool, "device": dev} for req, dev in devices]}}}}


class Claims:
    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def read(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        try:
            return self.items[(namespace, name)]
        except KeyError:
            raise KubeApiError(404, f'resourceclaims.resource.k8s.io "{name}" not found') from None
