"""The agent's Kubernetes API client, over the standard library: the Node (GET, a merge PATCH of its metadata, one
Event, its extended resources' allocatable taken to zero on a hand-over), DRA mode's ResourceSlices (list with
pagination, create, replace with the resourceVersion read, delete) and ResourceClaims (get), a pod's eviction (the
policy/v1 Eviction subresource), and an uninstall's DaemonSet and node list. Raw JSON in and out: the ``kubernetes``
package's API models cost 0.7 s of import and about 35 MiB kept for the life of the agent.

:class:`KubeApi` holds the calls; a transport sends them: :class:`LeanKubeApi` (HTTP/1.1 with the in-cluster service
account, its token read again for every request: bound tokens rotate) or, outside a cluster, :func:`kubeconfig_api`
(the ``kubernetes`` package's authenticated client, imported only then). Must hold: a failure is a
:class:`~agent.errors.KubeApiError` (the API server answered with an error), ``TimeoutError`` or another ``OSError``."""

from __future__ import annotations

import http.client
import json
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlencode, urlsplit

from agent.errors import KubeApiError, NodeLabelerError

MERGE_PATCH = "application/merge-patch+json"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_BODY = 32 * 1024 * 1024  # a page of nodes or slices is at most a few MiB; anything larger is not one
FIELD_MANAGER = "topology-agent"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DRA_TIMEOUT = 10.0  # seconds for DRA mode's calls
JSON = dict[str, Any]
NodeRow = tuple[str, dict[str, str], dict[str, str]]


class NodeApi(Protocol):
    def node_metadata(self, name: str, timeout: float) -> tuple[dict[str, str], dict[str, str]]:
        """The Node's labels and annotations."""

    def patch_node(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        """A JSON merge patch of the Node."""

    def create_event(self, namespace: str, body: Mapping[str, Any], timeout: float) -> None:
        """POST a core/v1 Event (the Node's "nothing advertised" warning)."""


class EvictionApi(Protocol):
    def evict_pod(self, namespace: str, name: str, timeout: float) -> None:
        """POST a policy/v1 Eviction of the pod (the API server honours its PodDisruptionBudgets: 429)."""


class NodeStatusApi(Protocol):
    """What a hand-over to the other mode needs of the Node (:mod:`agent.node.resource_withdrawal`)."""

    def node_allocatable(self, name: str, timeout: float) -> dict[str, str]:
        """The Node's ``status.allocatable``."""

    def patch_node_status(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        """A JSON merge patch of the Node's status subresource."""


def _status_message(status: int, reason: str, body: bytes) -> str:
    """The ``message`` of the Status the API server sent, else the HTTP reason."""
    try:
        document = json.loads(body) if body else None
    except ValueError:
        document = None
    message = document.get("message") if isinstance(document, dict) else None
    text = str(message or reason or f"HTTP {status}")
    return text if len(text) <= 300 else text[:297] + "..."


def _node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"


def _daemonset_path(namespace: str, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/daemonsets/{quote(name, safe='')}"


class KubeApi:
    """Every call the agent makes; :meth:`_send` (the transport) is the subclass's."""

    def _send(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, str, bytes]:
        """(status, reason, body) of one request; ``body`` is JSON-able (a merge patch for PATCH)."""
        raise NotImplementedError

    def _request(self, method: str, path: str, body: Any, timeout: float) -> Any:
        status, reason, data = self._send(method, path, body, timeout)
        if status >= 400:
            raise KubeApiError(status, _status_message(status, reason, data))
        try:
            return json.loads(data) if data else None
        except ValueError:
            raise KubeApiError(status, "the API server's answer is not JSON") from None

    def _object(self, method: str, path: str, body: Any, timeout: float, kind: str) -> JSON:
        answer = self._request(method, path, body, timeout)
        if not isinstance(answer, dict):
            raise KubeApiError(0, f"the API server's answer is not a {kind}")
        return answer

    def _list(self, path: str, query: Mapping[str, str], timeout: float, kind: str) -> list[JSON]:
        """Every item, page by page (``continue``)."""
        items: list[JSON] = []
        token = ""
        while True:
            page = self._object("GET", f"{path}?{urlencode({**query, **({'continue': token} if token else {})})}",
                                None, timeout, kind)
            items.extend(item for item in page.get("items") or [] if isinstance(item, dict))
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    # --- the Node ---------------------------------------------------------------------------------
    def node_metadata(self, name: str, timeout: float) -> tuple[dict[str, str], dict[str, str]]:
        meta = self._object("GET", _node_path(name), None, timeout, "Node").get("metadata")
        if not isinstance(meta, dict):
            raise KubeApiError(0, "the API server's answer is not a Node")
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        return ({str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
                {str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {})

    def patch_node(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        self._request("PATCH", _node_path(name), dict(body), timeout)

    def node_allocatable(self, name: str, timeout: float) -> dict[str, str]:
        status = self._object("GET", _node_path(name), None, timeout, "Node").get("status")
        allocatable = status.get("allocatable") if isinstance(status, dict) else None
        return {str(k): str(v) for k, v in allocatable.items()} if isinstance(allocatable, dict) else {}

    def patch_node_status(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        self._request("PATCH", _node_path(name) + "/status", dict(body), timeout)

    def create_event(self, namespace: str, body: Mapping[str, Any], timeout: float) -> None:
        self._request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", dict(body), timeout)

    # --- a pod's eviction (:mod:`agent.enforce.evictions`) ----------------------------------------------
    def evict_pod(self, namespace: str, name: str, timeout: float) -> None:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        self._request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/eviction",
                      body, timeout)

    # --- an uninstall (:mod:`agent.node.cleanup`) -------------------------------------------------
    def get_daemonset(self, namespace: str, name: str, timeout: float) -> JSON | None:
        """The DaemonSet, or None when there is none (404)."""
        try:
            return self._object("GET", _daemonset_path(namespace, name), None, timeout, "DaemonSet")
        except KubeApiError as exc:
            if exc.not_found:
                return None
            raise

    def delete_daemonset_foreground(self, namespace: str, name: str, timeout: float) -> bool:
        """Delete it with propagationPolicy Foreground; False when there was none (404)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}
        try:
            self._request("DELETE", _daemonset_path(namespace, name), body, timeout)
        except KubeApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    def list_nodes(self, selector: str, timeout: float) -> list[NodeRow]:
        """(name, labels, annotations) of every node the label selector matches."""
        rows: list[NodeRow] = []
        for item in self._list("/api/v1/nodes", {"limit": "500", **({"labelSelector": selector} if selector else {})},
                               timeout, "NodeList"):
            meta = item.get("metadata") or {}
            rows.append((str(meta.get("name", "")), dict(meta.get("labels") or {}),
                         dict(meta.get("annotations") or {})))
        return rows

    # --- DRA mode ---------------------------------------------------------------------------------
    def list_slices(self, node: str, driver: str) -> list[JSON]:
        """The driver's ResourceSlices of ``node``, 100 a page."""
        return self._list(SLICES, {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}", "limit": "100"},
                          DRA_TIMEOUT, "ResourceSliceList")

    def create_slice(self, body: JSON) -> JSON:
        return self._object("POST", f"{SLICES}?fieldManager={FIELD_MANAGER}", body, DRA_TIMEOUT, "ResourceSlice")

    def replace_slice(self, name: str, body: JSON) -> JSON:
        return self._object("PUT", f"{SLICES}/{quote(name, safe='')}?fieldManager={FIELD_MANAGER}", body,
                            DRA_TIMEOUT, "ResourceSlice")

    def delete_slice(self, name: str, resource_version: str | None = None) -> None:
        """Delete it; with ``resource_version``, only that version of it (else a 409)."""
        body = ({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": resource_version}}
                if resource_version else None)
        self._request("DELETE", f"{SLICES}/{quote(name, safe='')}", body, DRA_TIMEOUT)

    def node_uid(self, node: str) -> str:
        return str(self._object("GET", _node_path(node), None, DRA_TIMEOUT, "Node")["metadata"]["uid"])

    def served_versions(self, group: str) -> list[str] | None:
        """The versions of an API group the API server serves (discovery, ``GET /apis/<group>``), preferred first;
        None when it serves no such group (404)."""
        try:
            document = self._object("GET", f"/apis/{quote(group, safe='.')}", None, DRA_TIMEOUT, "APIGroup")
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        versions = [str(v.get("version")) for v in document.get("versions") or [] if isinstance(v, dict)]
        preferred = str((document.get("preferredVersion") or {}).get("version") or "")
        return sorted(versions, key=lambda v: v != preferred)

    def server_version(self) -> JSON:
        """The API server's ``/version`` (``gitVersion``, ``major``, ``minor``)."""
        return self._object("GET", "/version", None, DRA_TIMEOUT, "version")

    def read_claim(self, namespace: str, name: str) -> JSON:
        return self._object("GET", f"/apis/resource.k8s.io/v1/namespaces/{quote(namespace, safe='')}/resourceclaims/"
                            f"{quote(name, safe='')}", None, DRA_TIMEOUT, "ResourceClaim")


class LeanKubeApi(KubeApi):
    """HTTP/1.1 with a bearer token, one connection per request."""

    def __init__(self, base_url: str, *, token_file: Path | None = None, ca_file: Path | None = None,
                 retries: int = 1) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise NodeLabelerError(f"not an API server URL: {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.token_file = token_file
        self.retries = retries
        self._context: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)

    @classmethod
    def in_cluster(cls, service_account: Path = SERVICE_ACCOUNT) -> LeanKubeApi:
        """The API server and credentials a pod gets; NodeLabelerError when not in a pod."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise NodeLabelerError("KUBERNETES_SERVICE_HOST/PORT are not set (not running in a pod)")
        token, ca = service_account / "token", service_account / "ca.crt"
        if not token.is_file():
            raise NodeLabelerError(f"no service account token at {token} (automountServiceAccountToken off?)")
        netloc = f"[{host}]" if ":" in host else host
        return cls(f"https://{netloc}:{port}", token_file=token, ca_file=ca if ca.is_file() else None)

    def _send(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, str, bytes]:
        headers = {"Accept": "application/json", "User-Agent": "s390x-topology-agent"}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = MERGE_PATCH if method == "PATCH" else "application/json"
        if self.token_file is not None:
            try:
                token = self.token_file.read_text().strip()
            except OSError as exc:  # not the API server's fault: say what is wrong
                raise NodeLabelerError(f"cannot read the service account token {self.token_file}: "
                                       f"{exc.strerror or exc}") from None
            headers["Authorization"] = f"Bearer {token}"
        for attempt in range(self.retries + 1):
            conn: http.client.HTTPConnection
            if self._context is not None:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self._context)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                return response.status, response.reason, response.read(MAX_BODY)
            except TimeoutError:
                if attempt < self.retries:
                    continue
                raise TimeoutError(f"no answer within {timeout:g}s") from None
            except (ConnectionError, http.client.HTTPException, OSError):
                if attempt < self.retries:
                    continue
                raise
            finally:
                conn.close()
        raise AssertionError("not reached")


class _KubeconfigApi(KubeApi):
    """The same calls through the ``kubernetes`` package's HTTP client (a kubeconfig: its exec plugins, its auth
    providers)."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def _send(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, str, bytes]:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json", "User-Agent": "s390x-topology-agent"}
        if body is not None:
            headers["Content-Type"] = MERGE_PATCH if method == "PATCH" else "application/json"
        try:
            request = self.api_client.param_serialize(method, path, header_params=headers, body=body,
                                                      auth_settings=["BearerToken"])
            response = self.api_client.call_api(*request, _request_timeout=timeout)
            return int(response.status), str(response.reason or ""), response.read() or b""
        except ApiException as exc:
            if not exc.status:
                raise ConnectionError(str(exc.reason)) from None
            return int(exc.status), str(exc.reason or ""), (exc.body.encode() if isinstance(exc.body, str)
                                                             else exc.body or b"")
        except urllib3.exceptions.MaxRetryError as exc:
            cause = exc.reason
            if isinstance(cause, urllib3.exceptions.NewConnectionError):
                raise ConnectionError(str(cause)) from None
            if isinstance(cause, urllib3.exceptions.TimeoutError):
                raise TimeoutError(str(cause)) from None
            raise ConnectionError(str(exc)) from None
        except urllib3.exceptions.TimeoutError as exc:
            raise TimeoutError(str(exc)) from None
        except urllib3.exceptions.HTTPError as exc:
            raise ConnectionError(str(exc)) from None


def kubeconfig_api() -> KubeApi:
    """The kubeconfig's API server, through the ``kubernetes`` package (local runs, not pods)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise NodeLabelerError("no in-cluster service account, and a kubeconfig needs the kubernetes package: "
                               "pip install 's390x-topology-agent[kubeconfig]'") from None

    configuration = client.Configuration()
    try:
        config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as exc:
        raise NodeLabelerError(f"no usable kubeconfig ({exc})") from None
    configuration.retries = 1  # one retry for a dropped connection; the default (3) stretches a timeout to 4x
    # urllib3 warns of every retry ("Retrying (Retry(total=0, ...)) after connection broken by ..."): with
    # the API server away that is a warning per sync; the labeler says it once and when it comes back.
    import logging

    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    return _KubeconfigApi(client.ApiClient(configuration))


def kube_api_from_environment() -> KubeApi:
    """In a pod: the lean client with the service account; else the kubeconfig. NodeLabelerError when
    neither is available (nothing is contacted here)."""
    try:
        return LeanKubeApi.in_cluster()
    except NodeLabelerError as in_cluster:
        try:
            return kubeconfig_api()
        except NodeLabelerError as kubeconfig:
            raise NodeLabelerError(f"no Kubernetes API configuration: not running in a cluster ({in_cluster}) "
                                   f"and {kubeconfig}") from None
