"""Merging cached AllocateResponses into container run options (`pod_devices.go: deviceRunContainerOptions`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agent._proto.deviceplugin.v1beta1 import api_pb2 as dp


@dataclass
class RunContainerOptions:
    """What kubelet hands the runtime for one container from its device-plugin responses.

    For duplicate env keys, mount/device container paths and annotation keys the first response
    wins; a differing later value is recorded in ``conflicts`` (kubelet logs "has conflicting setting").
    """

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[dp.Mount] = field(default_factory=list)
    devices: list[dp.DeviceSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


def merge_responses(responses: Iterable[tuple[str, dp.ContainerAllocateResponse]]) -> RunContainerOptions:
    """Merge (resource, response) pairs in the given order, first one wins."""
    opts = RunContainerOptions()
    mount_hosts: dict[str, str] = {}
    device_hosts: dict[str, str] = {}
    seen_cdi: set[str] = set()
    for resource, resp in responses:
        for key, value in resp.envs.items():
            if key in opts.envs:
                if opts.envs[key] != value:
                    opts.conflicts.append(
                        f"Environment variable has conflicting setting: {key}={value!r} from {resource}, "
                        f"kept {opts.envs[key]!r}"
                    )
                continue
            opts.envs[key] = value
        for dev in resp.devices:
            if dev.container_path in device_hosts:
                if device_hosts[dev.container_path] != dev.host_path:
                    opts.conflicts.append(
                        f"Container device has conflicting mapping host devices: {dev.container_path} -> "
                        f"{dev.host_path} from {resource}, kept {device_hosts[dev.container_path]}"
                    )
                continue
            device_hosts[dev.container_path] = dev.host_path
            copy = dp.DeviceSpec()
            copy.CopyFrom(dev)
            opts.devices.append(copy)
        for mount in resp.mounts:
            if mount.container_path in mount_hosts:
                if mount_hosts[mount.container_path] != mount.host_path:
                    opts.conflicts.append(
                        f"Container mount has conflicting mapping host mounts: {mount.container_path} -> "
                        f"{mount.host_path} from {resource}, kept {mount_hosts[mount.container_path]}"
                    )
                continue
            mount_hosts[mount.container_path] = mount.host_path
            copy_m = dp.Mount()
            copy_m.CopyFrom(mount)
            opts.mounts.append(copy_m)
        for key, value in resp.annotations.items():
            if key in opts.annotations:
                if opts.annotations[key] != value:
                    opts.conflicts.append(
                        f"Annotation has conflicting setting: {key}={value!r} from {resource}, "
                        f"kept {opts.annotations[key]!r}"
                    )
                continue
            opts.annotations[key] = value
        for cdi in resp.cdi_devices:
            if cdi.name not in seen_cdi:
                seen_cdi.add(cdi.name)
                opts.cdi_devices.append(cdi.name)
    return opts
