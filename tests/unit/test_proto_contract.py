"""The vendored kubelet and CRI protos: regeneration is reproducible and descriptors match upstream.

The kubelet field tables below are the ones in docs/kubelet-device-plugin.md sections 1.3 and 3.2;
the CRI table lists the runtime.v1 messages and fields the agent and its test harness use, with the
numbers of upstream k8s.io/cri-api pkg/apis/runtime/v1/api.proto. Every row is checked against the
generated descriptors (name, number, and where useful label/type).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor

from agent._proto.deviceplugin.v1beta1 import api_pb2 as dp
from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent._proto.podresources.v1 import api_pb2 as pr
from agent._proto.runtime.v1 import api_pb2 as cri
from tests.support.env import REPO

PROTO_DIR = REPO / "proto"


def _load_generate_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("proto_generate", PROTO_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("proto_generate", module)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------
# (a) regeneration is byte-identical to the committed files


def test_regeneration_is_byte_identical() -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpc_tools (grpcio-tools) is not installed; cannot regenerate")
    gen = _load_generate_module()
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        out_root = Path(tmp)
        produced = gen.generate(out_root)
        assert len(produced) == 29  # eight gRPC protos, three files each; NRI's messages, one file; ttrpc's, two each
        for path in produced:
            rel = path.relative_to(out_root)
            committed = REPO / rel
            assert committed.is_file(), f"{rel} is generated but not committed"
            assert path.read_bytes() == committed.read_bytes(), (
                f"{rel} differs from a fresh generation: run `python proto/generate.py`"
            )


def test_generated_imports_use_agent_package_path() -> None:
    for rel in (
        "agent/_proto/deviceplugin/v1beta1/api_pb2_grpc.py",
        "agent/_proto/podresources/v1/api_pb2_grpc.py",
        "agent/_proto/runtime/v1/api_pb2_grpc.py",
        "agent/_proto/pluginregistration/v1/api_pb2_grpc.py",
        "agent/_proto/dra/v1/api_pb2_grpc.py",
        "agent/_proto/dra/v1beta1/api_pb2_grpc.py",
        "agent/_proto/dra_health/v1/api_pb2_grpc.py",
        "agent/_proto/dra_health/v1alpha1/api_pb2_grpc.py",
    ):
        text = (REPO / rel).read_text()
        package = rel.rsplit("/", 1)[0].replace("/", ".")
        assert f"from {package} import api_pb2" in text


def test_vendored_protos_have_no_gogo() -> None:
    for proto in PROTO_DIR.rglob("*.proto"):
        text = proto.read_text()
        assert not re.search(r'^\s*import\s+".*gogo\.proto"', text, re.MULTILINE), proto
        assert not re.search(r"^\s*option\s*\(gogoproto\.", text, re.MULTILINE), proto
        assert "[(gogoproto." not in text, proto
        assert "go_package" in text, proto


# ---------------------------------------------------------------------------------------------
# (b) descriptor facts that match upstream


def _file(module: ModuleType) -> FileDescriptor:
    return module.DESCRIPTOR


def test_packages() -> None:
    assert _file(dp).package == "v1beta1"
    assert _file(pr).package == "v1"
    assert _file(dp).GetOptions().go_package == "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
    assert _file(pr).GetOptions().go_package == "k8s.io/kubelet/pkg/apis/podresources/v1"
    assert _file(cri).package == "runtime.v1"
    assert _file(cri).GetOptions().go_package == "k8s.io/cri-api/pkg/apis/runtime/v1"


def _methods(file: FileDescriptor, service: str) -> dict[str, tuple[str, str, bool, bool]]:
    svc = file.services_by_name[service]
    return {
        m.name: (m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming)
        for m in svc.methods
    }


def test_registration_service() -> None:
    svc = _file(dp).services_by_name["Registration"]
    assert svc.full_name == "v1beta1.Registration"
    assert _methods(_file(dp), "Registration") == {
        "Register": ("v1beta1.RegisterRequest", "v1beta1.Empty", False, False),
    }


def test_device_plugin_service() -> None:
    svc = _file(dp).services_by_name["DevicePlugin"]
    assert svc.full_name == "v1beta1.DevicePlugin"
    assert _methods(_file(dp), "DevicePlugin") == {
        "GetDevicePluginOptions": ("v1beta1.Empty", "v1beta1.DevicePluginOptions", False, False),
        "ListAndWatch": ("v1beta1.Empty", "v1beta1.ListAndWatchResponse", False, True),
        "GetPreferredAllocation": (
            "v1beta1.PreferredAllocationRequest",
            "v1beta1.PreferredAllocationResponse",
            False,
            False,
        ),
        "Allocate": ("v1beta1.AllocateRequest", "v1beta1.AllocateResponse", False, False),
        "PreStartContainer": (
            "v1beta1.PreStartContainerRequest",
            "v1beta1.PreStartContainerResponse",
            False,
            False,
        ),
    }


def test_pod_resources_service() -> None:
    svc = _file(pr).services_by_name["PodResourcesLister"]
    assert svc.full_name == "v1.PodResourcesLister"
    assert _methods(_file(pr), "PodResourcesLister") == {
        "List": ("v1.ListPodResourcesRequest", "v1.ListPodResourcesResponse", False, False),
        "GetAllocatableResources": (
            "v1.AllocatableResourcesRequest",
            "v1.AllocatableResourcesResponse",
            False,
            False,
        ),
        "Get": ("v1.GetPodResourcesRequest", "v1.GetPodResourcesResponse", False, False),
    }


def test_cri_services() -> None:
    assert set(_file(cri).services_by_name) == {"RuntimeService", "ImageService"}
    runtime = _methods(_file(cri), "RuntimeService")
    # The calls of agent/cri/client.py, then those of the test harness (devkit containerd.py).
    used = {
        "Version": ("runtime.v1.VersionRequest", "runtime.v1.VersionResponse", False, False),
        "ListContainers": ("runtime.v1.ListContainersRequest", "runtime.v1.ListContainersResponse", False, False),
        "ContainerStatus": ("runtime.v1.ContainerStatusRequest", "runtime.v1.ContainerStatusResponse", False, False),
        "UpdateContainerResources": (
            "runtime.v1.UpdateContainerResourcesRequest",
            "runtime.v1.UpdateContainerResourcesResponse",
            False,
            False,
        ),
        "RunPodSandbox": ("runtime.v1.RunPodSandboxRequest", "runtime.v1.RunPodSandboxResponse", False, False),
        "StopPodSandbox": ("runtime.v1.StopPodSandboxRequest", "runtime.v1.StopPodSandboxResponse", False, False),
        "RemovePodSandbox": (
            "runtime.v1.RemovePodSandboxRequest", "runtime.v1.RemovePodSandboxResponse", False, False),
        "ListPodSandbox": ("runtime.v1.ListPodSandboxRequest", "runtime.v1.ListPodSandboxResponse", False, False),
        "CreateContainer": ("runtime.v1.CreateContainerRequest", "runtime.v1.CreateContainerResponse", False, False),
        "StartContainer": ("runtime.v1.StartContainerRequest", "runtime.v1.StartContainerResponse", False, False),
        "StopContainer": ("runtime.v1.StopContainerRequest", "runtime.v1.StopContainerResponse", False, False),
        "RemoveContainer": ("runtime.v1.RemoveContainerRequest", "runtime.v1.RemoveContainerResponse", False, False),
    }
    assert {name: runtime.get(name) for name in used} == used


def test_grpc_method_paths() -> None:
    from agent._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
    from agent._proto.podresources.v1 import api_pb2_grpc as pr_grpc
    from agent._proto.runtime.v1 import api_pb2_grpc as cri_grpc

    dp_text = Path(dp_grpc.__file__).read_text()
    pr_text = Path(pr_grpc.__file__).read_text()
    cri_text = Path(cri_grpc.__file__).read_text()
    for path in (
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    ):
        assert f"'{path}'" in dp_text, path
    for path in (
        "/v1.PodResourcesLister/List",
        "/v1.PodResourcesLister/GetAllocatableResources",
        "/v1.PodResourcesLister/Get",
    ):
        assert f"'{path}'" in pr_text, path
    for path in (
        "/runtime.v1.RuntimeService/Version",
        "/runtime.v1.RuntimeService/ListContainers",
        "/runtime.v1.RuntimeService/ContainerStatus",
        "/runtime.v1.RuntimeService/UpdateContainerResources",
        "/runtime.v1.ImageService/ListImages",
    ):
        assert f"'{path}'" in cri_text, path


_T = FieldDescriptor
REPEATED = "repeated"
SINGLE = "single"

# (message, field, number, label, type) from kubelet-device-plugin.md §1.3 (device plugin v1beta1)
DEVICE_PLUGIN_FIELDS: list[tuple[str, str, int, str, int]] = [
    ("DevicePluginOptions", "pre_start_required", 1, SINGLE, _T.TYPE_BOOL),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2, SINGLE, _T.TYPE_BOOL),
    ("RegisterRequest", "version", 1, SINGLE, _T.TYPE_STRING),
    ("RegisterRequest", "endpoint", 2, SINGLE, _T.TYPE_STRING),
    ("RegisterRequest", "resource_name", 3, SINGLE, _T.TYPE_STRING),
    ("RegisterRequest", "options", 4, SINGLE, _T.TYPE_MESSAGE),
    ("ListAndWatchResponse", "devices", 1, REPEATED, _T.TYPE_MESSAGE),
    ("Device", "ID", 1, SINGLE, _T.TYPE_STRING),
    ("Device", "health", 2, SINGLE, _T.TYPE_STRING),
    ("Device", "topology", 3, SINGLE, _T.TYPE_MESSAGE),
    ("TopologyInfo", "nodes", 1, REPEATED, _T.TYPE_MESSAGE),
    ("NUMANode", "ID", 1, SINGLE, _T.TYPE_INT64),
    ("PreferredAllocationRequest", "container_requests", 1, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1, REPEATED, _T.TYPE_STRING),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2, REPEATED, _T.TYPE_STRING),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3, SINGLE, _T.TYPE_INT32),
    ("PreferredAllocationResponse", "container_responses", 1, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1, REPEATED, _T.TYPE_STRING),
    ("AllocateRequest", "container_requests", 1, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerAllocateRequest", "devices_ids", 1, REPEATED, _T.TYPE_STRING),
    ("AllocateResponse", "container_responses", 1, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerAllocateResponse", "envs", 1, REPEATED, _T.TYPE_MESSAGE),  # map<string,string>
    ("ContainerAllocateResponse", "mounts", 2, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerAllocateResponse", "devices", 3, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerAllocateResponse", "annotations", 4, REPEATED, _T.TYPE_MESSAGE),  # map<string,string>
    ("ContainerAllocateResponse", "cdi_devices", 5, REPEATED, _T.TYPE_MESSAGE),
    ("Mount", "container_path", 1, SINGLE, _T.TYPE_STRING),
    ("Mount", "host_path", 2, SINGLE, _T.TYPE_STRING),
    ("Mount", "read_only", 3, SINGLE, _T.TYPE_BOOL),
    ("DeviceSpec", "container_path", 1, SINGLE, _T.TYPE_STRING),
    ("DeviceSpec", "host_path", 2, SINGLE, _T.TYPE_STRING),
    ("DeviceSpec", "permissions", 3, SINGLE, _T.TYPE_STRING),
    ("CDIDevice", "name", 1, SINGLE, _T.TYPE_STRING),
    ("PreStartContainerRequest", "devices_ids", 1, REPEATED, _T.TYPE_STRING),
]

# (message, field, number, label, type) from kubelet-device-plugin.md §3.2 (podresources v1)
POD_RESOURCES_FIELDS: list[tuple[str, str, int, str, int]] = [
    ("ListPodResourcesResponse", "pod_resources", 1, REPEATED, _T.TYPE_MESSAGE),
    ("PodResources", "name", 1, SINGLE, _T.TYPE_STRING),
    ("PodResources", "namespace", 2, SINGLE, _T.TYPE_STRING),
    ("PodResources", "containers", 3, REPEATED, _T.TYPE_MESSAGE),
    ("PodResources", "cpu_ids", 4, REPEATED, _T.TYPE_INT64),
    ("PodResources", "memory", 5, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerResources", "name", 1, SINGLE, _T.TYPE_STRING),
    ("ContainerResources", "devices", 2, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerResources", "cpu_ids", 3, REPEATED, _T.TYPE_INT64),
    ("ContainerResources", "memory", 4, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerResources", "dynamic_resources", 5, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerDevices", "resource_name", 1, SINGLE, _T.TYPE_STRING),
    ("ContainerDevices", "device_ids", 2, REPEATED, _T.TYPE_STRING),
    ("ContainerDevices", "topology", 3, SINGLE, _T.TYPE_MESSAGE),
    ("ContainerMemory", "memory_type", 1, SINGLE, _T.TYPE_STRING),
    ("ContainerMemory", "size", 2, SINGLE, _T.TYPE_UINT64),
    ("ContainerMemory", "topology", 3, SINGLE, _T.TYPE_MESSAGE),
    ("TopologyInfo", "nodes", 1, REPEATED, _T.TYPE_MESSAGE),
    ("NUMANode", "ID", 1, SINGLE, _T.TYPE_INT64),
    ("AllocatableResourcesResponse", "devices", 1, REPEATED, _T.TYPE_MESSAGE),
    ("AllocatableResourcesResponse", "cpu_ids", 2, REPEATED, _T.TYPE_INT64),
    ("AllocatableResourcesResponse", "memory", 3, REPEATED, _T.TYPE_MESSAGE),
    ("GetPodResourcesRequest", "pod_name", 1, SINGLE, _T.TYPE_STRING),
    ("GetPodResourcesRequest", "pod_namespace", 2, SINGLE, _T.TYPE_STRING),
    ("GetPodResourcesResponse", "pod_resources", 1, SINGLE, _T.TYPE_MESSAGE),
    ("DynamicResource", "claim_name", 2, SINGLE, _T.TYPE_STRING),
    ("DynamicResource", "claim_namespace", 3, SINGLE, _T.TYPE_STRING),
    ("DynamicResource", "claim_resources", 4, REPEATED, _T.TYPE_MESSAGE),
    ("ClaimResource", "cdi_devices", 1, REPEATED, _T.TYPE_MESSAGE),
    ("ClaimResource", "driver_name", 2, SINGLE, _T.TYPE_STRING),
    ("ClaimResource", "pool_name", 3, SINGLE, _T.TYPE_STRING),
    ("ClaimResource", "device_name", 4, SINGLE, _T.TYPE_STRING),
    ("ClaimResource", "share_id", 5, SINGLE, _T.TYPE_STRING),
    ("CDIDevice", "name", 1, SINGLE, _T.TYPE_STRING),
]


# (message, field, number, label, type): the runtime.v1 fields we use, numbered as upstream's
# k8s.io/cri-api pkg/apis/runtime/v1/api.proto.
CRI_FIELDS: list[tuple[str, str, int, str, int]] = [
    ("VersionRequest", "version", 1, SINGLE, _T.TYPE_STRING),
    ("VersionResponse", "version", 1, SINGLE, _T.TYPE_STRING),
    ("VersionResponse", "runtime_name", 2, SINGLE, _T.TYPE_STRING),
    ("VersionResponse", "runtime_version", 3, SINGLE, _T.TYPE_STRING),
    ("VersionResponse", "runtime_api_version", 4, SINGLE, _T.TYPE_STRING),
    ("ListContainersRequest", "filter", 1, SINGLE, _T.TYPE_MESSAGE),
    ("ListContainersResponse", "containers", 1, REPEATED, _T.TYPE_MESSAGE),
    ("ContainerFilter", "id", 1, SINGLE, _T.TYPE_STRING),
    ("ContainerFilter", "state", 2, SINGLE, _T.TYPE_MESSAGE),
    ("ContainerFilter", "pod_sandbox_id", 3, SINGLE, _T.TYPE_STRING),
    ("ContainerFilter", "label_selector", 4, REPEATED, _T.TYPE_MESSAGE),  # map<string,string>
    ("ContainerStateValue", "state", 1, SINGLE, _T.TYPE_ENUM),
    ("Container", "id", 1, SINGLE, _T.TYPE_STRING),
    ("Container", "pod_sandbox_id", 2, SINGLE, _T.TYPE_STRING),
    ("Container", "metadata", 3, SINGLE, _T.TYPE_MESSAGE),
    ("Container", "image", 4, SINGLE, _T.TYPE_MESSAGE),
    ("Container", "state", 6, SINGLE, _T.TYPE_ENUM),
    ("Container", "created_at", 7, SINGLE, _T.TYPE_INT64),
    ("Container", "labels", 8, REPEATED, _T.TYPE_MESSAGE),  # map<string,string>
    ("Container", "annotations", 9, REPEATED, _T.TYPE_MESSAGE),  # map<string,string>
    ("ContainerMetadata", "name", 1, SINGLE, _T.TYPE_STRING),
    ("ContainerMetadata", "attempt", 2, SINGLE, _T.TYPE_UINT32),
    ("ContainerStatusRequest", "container_id", 1, SINGLE, _T.TYPE_STRING),
    ("ContainerStatusRequest", "verbose", 2, SINGLE, _T.TYPE_BOOL),
    ("ContainerStatusResponse", "status", 1, SINGLE, _T.TYPE_MESSAGE),
    ("ContainerStatusResponse", "info", 2, REPEATED, _T.TYPE_MESSAGE),  # map<string,string>
    ("ContainerStatus", "id", 1, SINGLE, _T.TYPE_STRING),
    ("ContainerStatus", "metadata", 2, SINGLE, _T.TYPE_MESSAGE),
    ("ContainerStatus", "state", 3, SINGLE, _T.TYPE_ENUM),
    ("ContainerStatus", "created_at", 4, SINGLE, _T.TYPE_INT64),
    ("ContainerStatus", "started_at", 5, SINGLE, _T.TYPE_INT64),
    ("ContainerStatus", "labels", 12, REPEATED, _T.TYPE_MESSAGE),  # map<string,string>
    ("ContainerStatus", "resources", 16, SINGLE, _T.TYPE_MESSAGE),
    ("ContainerResources", "linux", 1, SINGLE, _T.TYPE_MESSAGE),
    ("LinuxContainerResources", "cpu_period", 1, SINGLE, _T.TYPE_INT64),
    ("LinuxContainerResources", "cpu_quota", 2, SINGLE, _T.TYPE_INT64),
    ("LinuxContainerResources", "cpu_shares", 3, SINGLE, _T.TYPE_INT64),
    ("LinuxContainerResources", "memory_limit_in_bytes", 4, SINGLE, _T.TYPE_INT64),
    ("LinuxContainerResources", "oom_score_adj", 5, SINGLE, _T.TYPE_INT64),
    ("LinuxContainerResources", "cpuset_cpus", 6, SINGLE, _T.TYPE_STRING),
    ("LinuxContainerResources", "cpuset_mems", 7, SINGLE, _T.TYPE_STRING),
    ("LinuxContainerResources", "hugepage_limits", 8, REPEATED, _T.TYPE_MESSAGE),
    ("LinuxContainerResources", "unified", 9, REPEATED, _T.TYPE_MESSAGE),  # map<string,string>
    ("LinuxContainerResources", "memory_swap_limit_in_bytes", 10, SINGLE, _T.TYPE_INT64),
    ("UpdateContainerResourcesRequest", "container_id", 1, SINGLE, _T.TYPE_STRING),
    ("UpdateContainerResourcesRequest", "linux", 2, SINGLE, _T.TYPE_MESSAGE),
]


def _check_field(module: ModuleType, message: str, field: str, number: int, label: str, ftype: int) -> None:
    msg = _file(module).message_types_by_name[message]
    assert field in msg.fields_by_name, f"{msg.full_name} has no field {field!r}"
    fd = msg.fields_by_name[field]
    assert fd.number == number, f"{msg.full_name}.{field}: number {fd.number} != {number}"
    is_repeated = fd.is_repeated
    assert is_repeated == (label == REPEATED), f"{msg.full_name}.{field}: repeated={is_repeated}"
    assert fd.type == ftype, f"{msg.full_name}.{field}: type {fd.type} != {ftype}"


@pytest.mark.parametrize(("message", "field", "number", "label", "ftype"), DEVICE_PLUGIN_FIELDS)
def test_device_plugin_field(message: str, field: str, number: int, label: str, ftype: int) -> None:
    _check_field(dp, message, field, number, label, ftype)


@pytest.mark.parametrize(("message", "field", "number", "label", "ftype"), POD_RESOURCES_FIELDS)
def test_pod_resources_field(message: str, field: str, number: int, label: str, ftype: int) -> None:
    _check_field(pr, message, field, number, label, ftype)


@pytest.mark.parametrize(("message", "field", "number", "label", "ftype"), CRI_FIELDS)
def test_cri_field(message: str, field: str, number: int, label: str, ftype: int) -> None:
    _check_field(cri, message, field, number, label, ftype)


def test_cri_message_types_of_the_fields_we_follow() -> None:
    def target(message: str, field: str) -> str:
        fd = _file(cri).message_types_by_name[message].fields_by_name[field]
        kind = fd.message_type if fd.message_type is not None else fd.enum_type
        assert kind is not None
        return kind.full_name

    assert target("ListContainersRequest", "filter") == "runtime.v1.ContainerFilter"
    assert target("ContainerFilter", "state") == "runtime.v1.ContainerStateValue"
    assert target("ContainerStateValue", "state") == "runtime.v1.ContainerState"
    assert target("Container", "state") == "runtime.v1.ContainerState"
    assert target("ContainerStatus", "state") == "runtime.v1.ContainerState"
    assert target("ContainerStatusResponse", "status") == "runtime.v1.ContainerStatus"
    assert target("ContainerStatus", "resources") == "runtime.v1.ContainerResources"
    assert target("ContainerResources", "linux") == "runtime.v1.LinuxContainerResources"
    assert target("UpdateContainerResourcesRequest", "linux") == "runtime.v1.LinuxContainerResources"
    for message, field in (("ContainerFilter", "label_selector"), ("Container", "labels"),
                           ("ContainerStatus", "labels"), ("ContainerStatusResponse", "info")):
        entry = _file(cri).message_types_by_name[message].fields_by_name[field].message_type
        assert entry is not None and entry.GetOptions().map_entry, (message, field)
        assert entry.fields_by_name["key"].type == _T.TYPE_STRING
        assert entry.fields_by_name["value"].type == _T.TYPE_STRING


def test_cri_container_states() -> None:
    states = _file(cri).enum_types_by_name["ContainerState"]
    assert {v.name: v.number for v in states.values} == {
        "CONTAINER_CREATED": 0, "CONTAINER_RUNNING": 1, "CONTAINER_EXITED": 2, "CONTAINER_UNKNOWN": 3,
    }


def test_cri_update_with_only_the_cpuset_leaves_the_other_limits_unset() -> None:
    """Proto3 zero values are not sent: an update naming only the cpuset carries nothing else."""
    request = cri.UpdateContainerResourcesRequest(
        container_id="c1", linux=cri.LinuxContainerResources(cpuset_cpus="1", cpuset_mems="0"))
    again = cri.UpdateContainerResourcesRequest.FromString(request.SerializeToString())
    assert [fd.name for fd, _ in again.linux.ListFields()] == ["cpuset_cpus", "cpuset_mems"]


def test_empty_messages_are_empty() -> None:
    for name in ("Empty", "PreStartContainerResponse"):
        assert not _file(dp).message_types_by_name[name].fields, name
    for name in ("ListPodResourcesRequest", "AllocatableResourcesRequest"):
        assert not _file(pr).message_types_by_name[name].fields, name


def test_maps_are_string_to_string() -> None:
    resp = _file(dp).message_types_by_name["ContainerAllocateResponse"]
    for name in ("envs", "annotations"):
        entry = resp.fields_by_name[name].message_type
        assert entry is not None
        assert entry.GetOptions().map_entry, name
        assert entry.fields_by_name["key"].type == _T.TYPE_STRING
        assert entry.fields_by_name["value"].type == _T.TYPE_STRING


def test_field_numbers_complete() -> None:
    """No message carries fields beyond the documented tables (catches silent additions)."""
    documented_dp = {(m, f) for m, f, *_ in DEVICE_PLUGIN_FIELDS}
    for msg in _file(dp).message_types_by_name.values():
        for fd in msg.fields:
            assert (msg.name, fd.name) in documented_dp, f"undocumented {msg.full_name}.{fd.name}"
    documented_pr = {(m, f) for m, f, *_ in POD_RESOURCES_FIELDS}
    for msg in _file(pr).message_types_by_name.values():
        for fd in msg.fields:
            assert (msg.name, fd.name) in documented_pr, f"undocumented {msg.full_name}.{fd.name}"


def test_dynamic_resource_field_one_is_reserved_gap() -> None:
    """`class_name = 1` was removed upstream in 1.31: nothing may reuse number 1."""
    msg = _file(pr).message_types_by_name["DynamicResource"]
    assert 1 not in msg.fields_by_number


def test_share_id_has_presence() -> None:
    cr = pr.ClaimResource()
    assert not cr.HasField("share_id")
    cr.share_id = ""
    assert cr.HasField("share_id")


def test_wire_round_trip_of_python_attribute_names() -> None:
    req = dp.ContainerPreferredAllocationRequest(
        available_deviceIDs=["a", "b"], must_include_deviceIDs=["a"], allocation_size=2
    )
    again = dp.ContainerPreferredAllocationRequest.FromString(req.SerializeToString())
    assert list(again.available_deviceIDs) == ["a", "b"]
    assert list(again.must_include_deviceIDs) == ["a"]
    assert again.allocation_size == 2
    dev = dp.Device(ID="book-0", health="Healthy")
    assert dp.Device.FromString(dev.SerializeToString()).ID == "book-0"


def test_the_plugin_registers_exactly_the_generated_device_plugin_methods() -> None:
    """agent/plugin/servicer.py registers the service by hand (Allocate answers ready bytes): the same
    service, methods and message types as the generated registration."""
    from agent._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
    from agent.plugin import servicer as ours

    class Capture:
        def __init__(self) -> None:
            self.handlers: dict[str, dict[str, object]] = {}

        def add_generic_rpc_handlers(self, handlers: object) -> None:
            pass

        def add_registered_method_handlers(self, service: str, handlers: dict[str, object]) -> None:
            self.handlers[service] = handlers

    generated, mine = Capture(), Capture()
    stub_servicer = dp_grpc.DevicePluginServicer()
    dp_grpc.add_DevicePluginServicer_to_server(stub_servicer, generated)
    ours.add_to_server(stub_servicer, mine)  # type: ignore[arg-type]
    assert mine.handlers.keys() == generated.handlers.keys() == {"v1beta1.DevicePlugin"}
    g, m = generated.handlers["v1beta1.DevicePlugin"], mine.handlers["v1beta1.DevicePlugin"]
    assert m.keys() == g.keys()
    for name in g:
        assert m[name].request_deserializer == g[name].request_deserializer, name  # type: ignore[attr-defined]
        assert (m[name].request_streaming, m[name].response_streaming) == (  # type: ignore[attr-defined]
            g[name].request_streaming, g[name].response_streaming), name  # type: ignore[attr-defined]
    answer = dp.AllocateResponse(container_responses=[dp.ContainerAllocateResponse(envs={"A": "b"})])
    assert m["Allocate"].response_serializer(answer.SerializeToString()) == answer.SerializeToString()  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# NRI (containerd/nri v0.12.3, the version containerd v2.4.2's go.mod requires): vendored byte
# for byte, so its digest is upstream's file's.

NRI_API_SHA256 = "b0dd9ea3b722e6e4a8d626a5164d4dfc1e72ffd176e7633cff3a70fd061cbc09"


def test_nri_proto_is_upstreams_file_byte_for_byte() -> None:
    import hashlib

    data = (PROTO_DIR / "nri" / "v1alpha1" / "api.proto").read_bytes()
    assert hashlib.sha256(data).hexdigest() == NRI_API_SHA256
    assert not (REPO / "agent/_proto/nri/v1alpha1/api_pb2_grpc.py").exists()  # ttrpc: messages only


TTRPC_SHA256 = {"ttrpc/request.proto": "6e634a90a5ecc654b85c9bd492ae8d3e2458ce3141f6aade8302b501a18fe7db",
                "googleapis/google/rpc/status.proto":
                    "f5bfd262e6705c7ae73f32e0ad8ee20ce8c0a2578df8c4f76ebf76b572f295ed"}


def test_ttrpc_protos_are_upstreams_files_byte_for_byte() -> None:
    """proto/ttrpc/README.md: containerd/ttrpc's request.proto and googleapis' google/rpc/status.proto."""
    import hashlib

    for rel, digest in TTRPC_SHA256.items():
        assert hashlib.sha256((PROTO_DIR / rel).read_bytes()).hexdigest() == digest, rel
    generated = (REPO / "agent/_proto/ttrpc/request_pb2.py").read_text()
    assert "from agent._proto.googleapis.google.rpc import status_pb2" in generated
    assert "from google.rpc" not in generated


def test_ttrpc_envelope_fields() -> None:
    from agent._proto.googleapis.google.rpc import status_pb2
    from agent._proto.ttrpc import request_pb2

    fields = {m: {f.name: f.number for f in request_pb2.DESCRIPTOR.message_types_by_name[m].fields}
              for m in ("Request", "Response", "KeyValue")}
    assert fields == {"Request": {"service": 1, "method": 2, "payload": 3, "timeout_nano": 4, "metadata": 5},
                      "Response": {"status": 1, "payload": 2}, "KeyValue": {"key": 1, "value": 2}}
    assert {f.name: f.number for f in status_pb2.Status.DESCRIPTOR.fields} == {"code": 1, "message": 2, "details": 3}
    assert request_pb2.DESCRIPTOR.package == "ttrpc" and status_pb2.DESCRIPTOR.package == "google.rpc"


def test_nri_package_and_services() -> None:
    assert _file(nri).package == "nri.pkg.api.v1alpha1"
    assert set(_file(nri).services_by_name) >= {"Runtime", "Plugin"}
    assert _methods(_file(nri), "Runtime") == {
        "RegisterPlugin": ("nri.pkg.api.v1alpha1.RegisterPluginRequest", "nri.pkg.api.v1alpha1.Empty", False, False),
        "UpdateContainers": ("nri.pkg.api.v1alpha1.UpdateContainersRequest",
                             "nri.pkg.api.v1alpha1.UpdateContainersResponse", False, False),
    }
    plugin = _methods(_file(nri), "Plugin")
    for method, request, response in (
            ("Configure", "ConfigureRequest", "ConfigureResponse"),
            ("Synchronize", "SynchronizeRequest", "SynchronizeResponse"),
            ("CreateContainer", "CreateContainerRequest", "CreateContainerResponse"),
            ("UpdateContainer", "UpdateContainerRequest", "UpdateContainerResponse"),
            ("StopContainer", "StopContainerRequest", "StopContainerResponse"),
            ("StateChange", "StateChangeEvent", "Empty"),
            ("Shutdown", "Empty", "Empty")):
        assert plugin[method] == (f"nri.pkg.api.v1alpha1.{request}", f"nri.pkg.api.v1alpha1.{response}",
                                  False, False), method


# (message, field, number, label, type): what agent/nri reads and writes, numbered as docs/nri.md §3.
NRI_FIELDS: list[tuple[str, str, int, str, int]] = [
    ("RegisterPluginRequest", "plugin_name", 1, SINGLE, _T.TYPE_STRING),
    ("RegisterPluginRequest", "plugin_idx", 2, SINGLE, _T.TYPE_STRING),
    ("ConfigureRequest", "runtime_name", 2, SINGLE, _T.TYPE_STRING),
    ("ConfigureRequest", "runtime_version", 3, SINGLE, _T.TYPE_STRING),
    ("ConfigureRequest", "registration_timeout", 4, SINGLE, _T.TYPE_INT64),
    ("ConfigureRequest", "request_timeout", 5, SINGLE, _T.TYPE_INT64),
    ("ConfigureResponse", "events", 2, SINGLE, _T.TYPE_INT32),
    ("SynchronizeRequest", "pods", 1, REPEATED, _T.TYPE_MESSAGE),
    ("SynchronizeRequest", "containers", 2, REPEATED, _T.TYPE_MESSAGE),
    ("SynchronizeRequest", "more", 3, SINGLE, _T.TYPE_BOOL),
    ("SynchronizeResponse", "update", 1, REPEATED, _T.TYPE_MESSAGE),
    ("SynchronizeResponse", "more", 2, SINGLE, _T.TYPE_BOOL),
    ("CreateContainerRequest", "pod", 1, SINGLE, _T.TYPE_MESSAGE),
    ("CreateContainerRequest", "container", 2, SINGLE, _T.TYPE_MESSAGE),
    ("CreateContainerResponse", "adjust", 1, SINGLE, _T.TYPE_MESSAGE),
    ("CreateContainerResponse", "update", 2, REPEATED, _T.TYPE_MESSAGE),
    ("UpdateContainerResponse", "update", 1, REPEATED, _T.TYPE_MESSAGE),
    ("StopContainerResponse", "update", 1, REPEATED, _T.TYPE_MESSAGE),
    ("PodSandbox", "name", 2, SINGLE, _T.TYPE_STRING),
    ("PodSandbox", "uid", 3, SINGLE, _T.TYPE_STRING),
    ("PodSandbox", "namespace", 4, SINGLE, _T.TYPE_STRING),
    ("Container", "id", 1, SINGLE, _T.TYPE_STRING),
    ("Container", "pod_sandbox_id", 2, SINGLE, _T.TYPE_STRING),
    ("Container", "name", 3, SINGLE, _T.TYPE_STRING),
    ("Container", "state", 4, SINGLE, _T.TYPE_ENUM),
    ("Container", "annotations", 6, REPEATED, _T.TYPE_MESSAGE),  # map<string,string>
    ("Container", "linux", 11, SINGLE, _T.TYPE_MESSAGE),
    ("LinuxContainer", "resources", 3, SINGLE, _T.TYPE_MESSAGE),
    ("LinuxResources", "cpu", 2, SINGLE, _T.TYPE_MESSAGE),
    ("LinuxCPU", "cpus", 6, SINGLE, _T.TYPE_STRING),
    ("LinuxCPU", "mems", 7, SINGLE, _T.TYPE_STRING),
    ("ContainerAdjustment", "linux", 6, SINGLE, _T.TYPE_MESSAGE),
    ("LinuxContainerAdjustment", "resources", 2, SINGLE, _T.TYPE_MESSAGE),
    ("ContainerUpdate", "container_id", 1, SINGLE, _T.TYPE_STRING),
    ("ContainerUpdate", "linux", 2, SINGLE, _T.TYPE_MESSAGE),
    ("ContainerUpdate", "ignore_failure", 3, SINGLE, _T.TYPE_BOOL),
    ("LinuxContainerUpdate", "resources", 1, SINGLE, _T.TYPE_MESSAGE),
    ("StateChangeEvent", "event", 1, SINGLE, _T.TYPE_ENUM),
]


@pytest.mark.parametrize(("message", "field", "number", "label", "ftype"), NRI_FIELDS)
def test_nri_field(message: str, field: str, number: int, label: str, ftype: int) -> None:
    _check_field(nri, message, field, number, label, ftype)


def test_nri_events() -> None:
    events = {v.name: v.number for v in _file(nri).enum_types_by_name["Event"].values}
    assert {name: events[name] for name in ("CREATE_CONTAINER", "UPDATE_CONTAINER", "STOP_CONTAINER",
                                            "REMOVE_CONTAINER")} == {
        "CREATE_CONTAINER": 4, "UPDATE_CONTAINER": 8, "STOP_CONTAINER": 10, "REMOVE_CONTAINER": 11}


# ---------------------------------------------------------------------------------------------
# DRA mode: pluginregistration v1 and the DRA plugin v1/v1beta1, k8s.io/kubelet v0.37.2 byte for byte

KUBELET_MODULE = Path("/root/.cache/s390x-topology-agent/cluster/gomod/k8s.io/kubelet@v0.37.2/pkg/apis")
DRA_PROTOS = {  # vendored path -> sha256 of k8s.io/kubelet v0.37.2's file
    "pluginregistration/v1/api.proto": "7a67a0000a1a167c155286834bc9ccb489f8bcdb394e006daba270189c272afa",
    "dra/v1/api.proto": "b3066ad7f6abcfd0003c47b06ceb801d76997d78d6be505597478d3905b9cc57",
    "dra/v1beta1/api.proto": "7900b11793ad897d0375d67b3bbae675869b574e21dfb1bf5334cc1556138c42",
    # pkg/apis/dra-health/ upstream (a Python package name cannot hold the hyphen)
    "dra_health/v1/api.proto": "a088e44962719a5184f183ef2fff4b017585434ff4f0cbad13ef8f8c782bc004",
    "dra_health/v1alpha1/api.proto": "75f8c523ec546ceb83bd63f3b7a38c23d979494e7015db12d146e2f39dd4528e",
}
UPSTREAM_PATH = {"dra_health/v1/api.proto": "dra-health/v1/api.proto",
                 "dra_health/v1alpha1/api.proto": "dra-health/v1alpha1/api.proto"}


def test_dra_protos_are_upstream_bytes() -> None:
    import hashlib

    for rel, digest in DRA_PROTOS.items():
        assert hashlib.sha256((PROTO_DIR / rel).read_bytes()).hexdigest() == digest, rel
        upstream = KUBELET_MODULE / UPSTREAM_PATH.get(rel, rel)
        if upstream.is_file():  # the real-cluster lane's Go module cache
            assert upstream.read_bytes() == (PROTO_DIR / rel).read_bytes(), rel


def test_dra_services() -> None:
    from agent._proto.dra.v1 import api_pb2 as dra1
    from agent._proto.dra.v1beta1 import api_pb2 as dra1b
    from agent._proto.pluginregistration.v1 import api_pb2 as reg

    assert _file(reg).package == "pluginregistration"
    assert _methods(_file(reg), "Registration") == {
        "GetInfo": ("pluginregistration.InfoRequest", "pluginregistration.PluginInfo", False, False),
        "NotifyRegistrationStatus": ("pluginregistration.RegistrationStatus",
                                     "pluginregistration.RegistrationStatusResponse", False, False),
    }
    info = _file(reg).message_types_by_name["PluginInfo"]
    assert [(f.name, f.number) for f in info.fields] == [
        ("type", 1), ("name", 2), ("endpoint", 3), ("supported_versions", 4)]
    for module, package in ((dra1, "k8s.io.kubelet.pkg.apis.dra.v1"), (dra1b, "k8s.io.kubelet.pkg.apis.dra.v1beta1")):
        assert _file(module).package == package
        assert _methods(_file(module), "DRAPlugin") == {
            "NodePrepareResources": (f"{package}.NodePrepareResourcesRequest",
                                     f"{package}.NodePrepareResourcesResponse", False, False),
            "NodeUnprepareResources": (f"{package}.NodeUnprepareResourcesRequest",
                                       f"{package}.NodeUnprepareResourcesResponse", False, False),
        }
        claim = _file(module).message_types_by_name["Claim"]
        assert [(f.name, f.number) for f in claim.fields] == [("namespace", 1), ("uid", 2), ("name", 3)]
        device = _file(module).message_types_by_name["Device"]
        assert [(f.name, f.number) for f in device.fields][:4] == [
            ("request_names", 1), ("pool_name", 2), ("device_name", 3), ("cdi_device_ids", 4)]


def test_dra_health_services() -> None:
    """DRAResourceHealth v1 and v1alpha1 (kubelet 1.37's healthServicesSupportedByKubelet, newest first): the
    service names kubelet reads from supported_versions, the one server-streaming call, the fields."""
    from agent._proto.dra_health.v1 import api_pb2 as h1
    from agent._proto.dra_health.v1alpha1 import api_pb2 as h1a

    for module, package in ((h1, "v1"), (h1a, "v1alpha1")):
        file = _file(module)
        assert file.package == package
        assert file.GetOptions().go_package == f"k8s.io/kubelet/pkg/apis/dra-health/{package}"
        assert file.services_by_name["DRAResourceHealth"].full_name == f"{package}.DRAResourceHealth"
        assert _methods(file, "DRAResourceHealth") == {
            "NodeWatchResources": (f"{package}.NodeWatchResourcesRequest", f"{package}.NodeWatchResourcesResponse",
                                   False, True)}
        assert not file.message_types_by_name["NodeWatchResourcesRequest"].fields
        assert {v.name: v.number for v in file.enum_types_by_name["HealthStatus"].values} == {
            "UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
        health = file.message_types_by_name["DeviceHealth"]
        assert [(f.name, f.number, f.type) for f in health.fields] == [
            ("device", 1, _T.TYPE_MESSAGE), ("health", 2, _T.TYPE_ENUM), ("last_updated_time", 3, _T.TYPE_INT64),
            ("health_check_timeout_seconds", 4, _T.TYPE_INT64), ("message", 5, _T.TYPE_STRING)]
        ident = file.message_types_by_name["DeviceIdentifier"]
        assert [(f.name, f.number) for f in ident.fields] == [("pool_name", 1), ("device_name", 2)]
        response = file.message_types_by_name["NodeWatchResourcesResponse"].fields_by_name["devices"]
        assert response.message_type is not None
        assert (response.number, response.is_repeated, response.message_type.full_name) == (
            1, True, f"{package}.DeviceHealth")
