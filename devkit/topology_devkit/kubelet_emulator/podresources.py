"""Kubelet's pod-resources v1 service (`pkg/kubelet/apis/podresources/server_v1.go`).

See ../shared/docs/kubelet-device-plugin.md §3.3.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from agent._proto.podresources.v1 import api_pb2 as pr
from agent._proto.podresources.v1 import api_pb2_grpc as pr_grpc

from .constants import LOGGER_NAME
from .devicemanager import DeviceManager

log = logging.getLogger(LOGGER_NAME)

GET_DISABLED_MESSAGE = "PodResources API Get method disabled"


class PodResourcesServicer(pr_grpc.PodResourcesListerServicer):
    """List / GetAllocatableResources / Get over the device manager's state.

    CPU and memory managers are emulated with policy ``none``: every ``cpu_ids`` and ``memory`` is empty.
    Errors are plain Go errors on the wire (status UNKNOWN), as in kubelet.
    """

    def __init__(self, manager: DeviceManager, on_served: Callable[[str], None], *, get_enabled: bool = True,
                 pods_synced: Callable[[], bool] = lambda: True,
                 claim_pods: Callable[[], list[pr.PodResources]] = list) -> None:
        self._manager = manager
        self._on_served = on_served
        self._get_enabled = get_enabled
        self._pods_synced = pods_synced
        self._claim_pods = claim_pods

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        """Empty until the pods are synced again after a restart: kubelet's List walks its pod manager
        (``server_v1.go``: ``p.podsProvider.GetPods()``, ``GetActivePods()`` from 1.34), which is
        filled from the API server after a restart, while the device manager's allocations come
        back from the checkpoint at once (``devicemanager/manager.go`` ``readCheckpoint``)."""
        self._on_served("List")
        if not self._pods_synced():
            return pr.ListPodResourcesResponse()
        return pr.ListPodResourcesResponse(pod_resources=[*self._manager.list_pod_resources(), *self._claim_pods()])

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        self._on_served("GetAllocatableResources")
        return pr.AllocatableResourcesResponse(devices=self._manager.allocatable_devices())

    def Get(self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext) -> pr.GetPodResourcesResponse:
        self._on_served("Get")
        if not self._get_enabled:
            context.abort(grpc.StatusCode.UNKNOWN, GET_DISABLED_MESSAGE)
        pod = self._manager.find_pod(request.pod_namespace, request.pod_name) if self._pods_synced() else None
        if pod is None:
            context.abort(
                grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
            )
        assert pod is not None  # abort raised
        return pr.GetPodResourcesResponse(pod_resources=self._manager.pod_resources(pod))
