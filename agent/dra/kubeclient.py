"""The API calls DRA mode makes, through the ``kubernetes`` package (the ``dra`` extra), imported only here.

ResourceSlices of the agent's own node (list by field selector with pagination, create, replace with the
resourceVersion read, delete), the Node's uid (for the slices' ownerReference) and ResourceClaims (get).
Reads come back as plain JSON (``_preload_content=False``): the publisher compares annotations and specs,
not models. Errors are :class:`ApiError` with the HTTP status (409: a conflict, 404: gone).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from agent.errors import AgentError, StartupError

JSON = dict[str, Any]
FIELD_MANAGER = "topology-agent"


class ApiError(AgentError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404


class DraApi(Protocol):
    def list_slices(self, node: str, driver: str) -> list[JSON]: ...
    def create_slice(self, body: JSON) -> JSON: ...
    def replace_slice(self, name: str, body: JSON) -> JSON: ...
    def delete_slice(self, name: str, resource_version: str | None = None) -> None: ...
    def node_uid(self, node: str) -> str: ...
    def read_claim(self, namespace: str, name: str) -> JSON: ...


def _message(exc: Exception) -> tuple[int, str]:
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None)
    try:
        doc = json.loads(body) if body else None
    except (TypeError, ValueError):
        doc = None
    message = doc.get("message") if isinstance(doc, dict) else None
    text = str(message or getattr(exc, "reason", None) or exc)
    return status, text if len(text) <= 600 else text[:597] + "..."


class KubernetesDraApi:
    """:class:`DraApi` over the ``kubernetes`` client: in a pod its service account, else the kubeconfig."""

    def __init__(self, timeout: float = 10.0, kubeconfig: str | None = None) -> None:
        try:
            from kubernetes import client, config
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise StartupError("--mode dra needs the kubernetes package: pip install "
                               "'s390x-topology-agent[dra]'") from exc
        try:
            config.load_incluster_config()
        except config.ConfigException:
            try:
                config.load_kube_config(config_file=kubeconfig)
            except (config.ConfigException, OSError) as exc:
                raise StartupError(f"--mode dra needs the API server: not in a pod, and no kubeconfig ({exc})"
                                   ) from None
        self._client = client
        self.api_client = client.ApiClient()
        self.resource = client.ResourceV1Api(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.timeout = timeout

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> JSON:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            status, text = _message(exc)
            raise ApiError(status, text) from None
        data = resp.data if hasattr(resp, "data") else resp.read()
        return json.loads(data) if data else {}

    def list_slices(self, node: str, driver: str) -> list[JSON]:
        items: list[JSON] = []
        token: str | None = None
        while True:
            page = self._call(self.resource.list_resource_slice,
                              field_selector=f"spec.nodeName={node},spec.driver={driver}", limit=100,
                              **({"_continue": token} if token else {}))
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def _model(self, body: JSON) -> Any:
        return self._client.V1ResourceSlice.from_dict(body)

    def create_slice(self, body: JSON) -> JSON:
        return self._call(self.resource.create_resource_slice, self._model(body), field_manager=FIELD_MANAGER)

    def replace_slice(self, name: str, body: JSON) -> JSON:
        return self._call(self.resource.replace_resource_slice, name, self._model(body), field_manager=FIELD_MANAGER)

    def delete_slice(self, name: str, resource_version: str | None = None) -> None:
        options = None
        if resource_version:
            options = self._client.V1DeleteOptions(preconditions=self._client.V1Preconditions(
                resource_version=resource_version))
        self._call(self.resource.delete_resource_slice, name, body=options)

    def node_uid(self, node: str) -> str:
        return str(self._call(self.core.read_node, node)["metadata"]["uid"])

    def read_claim(self, namespace: str, name: str) -> JSON:
        return self._call(self.resource.read_namespaced_resource_claim, name, namespace)
