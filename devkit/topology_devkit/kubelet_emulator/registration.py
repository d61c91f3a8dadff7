"""Kubelet's `v1beta1.Registration` service (`plugin/v1beta1/server.go: Register`).

See ../shared/docs/kubelet-device-plugin.md §2.2.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc

from agent._proto.deviceplugin.v1beta1 import api_pb2 as dp
from agent._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

from .constants import LOGGER_NAME, SUPPORTED_VERSIONS
from .devicemanager import DeviceManager
from .errors import PluginConnectError, go_quote
from .names import is_extended_resource_name

log = logging.getLogger(LOGGER_NAME)


def unsupported_version_message(version: str) -> str:
    supported = " ".join(SUPPORTED_VERSIONS)
    return (
        f'requested API version {go_quote(version)} is not supported by kubelet. Supported version is "[{supported}]"'
    )


def invalid_resource_name_message(name: str) -> str:
    return f"the ResourceName {go_quote(name)} is invalid"


class RegistrationServicer(dp_grpc.RegistrationServicer):
    """Validates, then dials the plugin and asks GetDevicePluginOptions *before* answering.

    ``RegisterRequest.options`` is ignored (kubelet >= 1.25). Errors are returned the way a Go handler
    returning a plain error does: status UNKNOWN with the error text as details. ListAndWatch starts
    when the Register RPC has terminated.
    """

    def __init__(self, manager: DeviceManager, plugin_dir: Path) -> None:
        self._manager = manager
        self._plugin_dir = plugin_dir

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        resource = request.resource_name
        epoch = self._manager.epoch
        log.info(
            "Got registration request from device plugin with resource: resource=%s endpoint=%s version=%s",
            resource,
            request.endpoint,
            request.version,
        )
        self._manager.count_registration_request(resource)

        if request.version not in SUPPORTED_VERSIONS:
            message = unsupported_version_message(request.version)
            log.warning("Bad registration request from device plugin with resource %s: %s", resource, message)
            context.abort(grpc.StatusCode.UNKNOWN, message)
        if not is_extended_resource_name(resource):
            message = invalid_resource_name_message(resource)
            log.warning("Bad registration request from device plugin: %s", message)
            context.abort(grpc.StatusCode.UNKNOWN, message)

        socket_path = self._plugin_dir / request.endpoint
        try:
            endpoint = self._manager.connect_plugin(resource, socket_path, context.time_remaining(), epoch)
        except PluginConnectError as err:
            log.warning("Error connecting to device plugin client for %s: %s", resource, err)
            context.abort(grpc.StatusCode.UNKNOWN, str(err))

        if not context.add_callback(endpoint.start_list_and_watch):
            endpoint.start_list_and_watch()
        return dp.Empty()
