"""A kubelet-like device-manager checkpoint file (`kubelet_internal_checkpoint`).

The layout follows kubelet's v2 checkpoint (``Data.PodDeviceEntries`` / ``Data.RegisteredDevices``) so
that tools which peek at it see something familiar, but the ``Checksum`` is not kubelet's and the
emulator never reads the file back: allocations survive `restart()` in memory. Its purpose is to be
present (and survive socket clean-up) the way the real one is.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from .model import Pod


def write_checkpoint(path: Path, pods: Iterable[Pod], registered: Mapping[str, Iterable[str]]) -> None:
    entries: list[dict[str, object]] = []
    for pod in pods:
        for container in pod.containers:
            for resource, alloc in pod.allocations(container.name).items():
                entries.append(
                    {
                        "PodUID": pod.uid,
                        "ContainerName": container.name,
                        "ResourceName": resource,
                        "DeviceIDs": {str(node): list(ids) for node, ids in alloc.numa.items()},
                        "AllocResp": base64.b64encode(alloc.response.SerializeToString()).decode("ascii"),
                    }
                )
    data = {
        "Data": {
            "PodDeviceEntries": entries,
            "RegisteredDevices": {res: sorted(ids) for res, ids in sorted(registered.items())},
        },
        "Checksum": 0,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
