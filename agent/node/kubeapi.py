"""The Node requests the agent makes (GET, a JSON merge PATCH of metadata, and one Event when the node
advertises nothing; on a hand-over to the other mode, its extended resources' allocatable taken to zero with a
merge PATCH of the status, :mod:`agent.policy.handover`), over the standard library: node labels need two calls
an hour, not the ``kubernetes`` package's 35 MiB of API models kept in memory for the life of the agent.

:class:`LeanNodeApi` speaks HTTP/1.1 to the API server with the in-cluster service account (the
token is read again for every request: bound tokens rotate). Outside a cluster (a kubeconfig, local
runs), :func:`kubeconfig_api` falls back on the ``kubernetes`` package, imported only then.
Failures are :class:`~agent.errors.KubeApiError` (the API server answered with an error),
``TimeoutError`` or another ``OSError`` (it could not be reached).
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from agent.errors import KubeApiError, NodeLabelerError

MERGE_PATCH = "application/merge-patch+json"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_BODY = 4 * 1024 * 1024  # a Node object is a few KiB; anything larger is not one


class NodeApi(Protocol):
    def node_metadata(self, name: str, timeout: float) -> tuple[dict[str, str], dict[str, str]]:
        """The Node's labels and annotations."""

    def patch_node(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        """A JSON merge patch of the Node."""

    def create_event(self, namespace: str, body: Mapping[str, Any], timeout: float) -> None:
        """POST a core/v1 Event (the Node's "nothing advertised" warning)."""


class NodeStatusApi(Protocol):
    """What a hand-over to the other mode needs of the Node (:mod:`agent.node.handover`)."""

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


class LeanNodeApi:
    """GET and merge-PATCH ``/api/v1/nodes/<name>`` with a bearer token, one connection per request."""

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
    def in_cluster(cls, service_account: Path = SERVICE_ACCOUNT) -> LeanNodeApi:
        """The API server and credentials a pod gets; NodeLabelerError when not in a pod."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise NodeLabelerError("KUBERNETES_SERVICE_HOST/PORT are not set (not running in a pod)")
        token, ca = service_account / "token", service_account / "ca.crt"
        if not token.is_file():
            raise NodeLabelerError(f"no service account token at {token} (automountServiceAccountToken off?)")
        netloc = f"[{host}]" if ":" in host else host
        return cls(f"https://{netloc}:{port}", token_file=token, ca_file=ca if ca.is_file() else None)

    def node_metadata(self, name: str, timeout: float) -> tuple[dict[str, str], dict[str, str]]:
        node = self._request("GET", f"/api/v1/nodes/{quote(name, safe='')}", None, timeout)
        meta = node.get("metadata") if isinstance(node, dict) else None
        if not isinstance(meta, dict):
            raise KubeApiError(0, "the API server's answer is not a Node")
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        return ({str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
                {str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {})

    def patch_node(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        self._request("PATCH", f"/api/v1/nodes/{quote(name, safe='')}", json.dumps(body).encode(), timeout)

    def node_allocatable(self, name: str, timeout: float) -> dict[str, str]:
        node = self._request("GET", f"/api/v1/nodes/{quote(name, safe='')}", None, timeout)
        status = node.get("status") if isinstance(node, dict) else None
        allocatable = status.get("allocatable") if isinstance(status, dict) else None
        return {str(k): str(v) for k, v in allocatable.items()} if isinstance(allocatable, dict) else {}

    def patch_node_status(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        self._request("PATCH", f"/api/v1/nodes/{quote(name, safe='')}/status", json.dumps(body).encode(), timeout)

    def create_event(self, namespace: str, body: Mapping[str, Any], timeout: float) -> None:
        self._request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", json.dumps(body).encode(),
                      timeout)

    def _request(self, method: str, path: str, body: bytes | None, timeout: float) -> Any:
        headers = {"Accept": "application/json", "User-Agent": "s390x-topology-agent"}
        if body is not None:
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
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read(MAX_BODY)
                status, reason = response.status, response.reason
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
            if status >= 400:
                raise KubeApiError(status, _status_message(status, reason, data))
            try:
                return json.loads(data) if data else None
            except ValueError:
                raise KubeApiError(status, "the API server's answer is not JSON") from None
        raise AssertionError("not reached")


class _ClientNodeApi:
    """The ``kubernetes`` package for a kubeconfig (local runs): its exec plugins, its auth providers."""

    def __init__(self, core_v1: Any) -> None:
        self.core_v1 = core_v1

    def node_metadata(self, name: str, timeout: float) -> tuple[dict[str, str], dict[str, str]]:
        node = self._call(lambda: self.core_v1.read_node(name, _request_timeout=timeout))
        meta = node.metadata
        return dict((meta.labels if meta else None) or {}), dict((meta.annotations if meta else None) or {})

    def patch_node(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        self._call(lambda: self.core_v1.patch_node(name, dict(body), _content_type=MERGE_PATCH,
                                                   _request_timeout=timeout))

    def create_event(self, namespace: str, body: Mapping[str, Any], timeout: float) -> None:
        self._call(lambda: self.core_v1.create_namespaced_event(namespace, dict(body), _request_timeout=timeout))

    def node_allocatable(self, name: str, timeout: float) -> dict[str, str]:
        node = self._call(lambda: self.core_v1.read_node(name, _request_timeout=timeout))
        allocatable = node.status.allocatable if node.status else None
        return {str(k): str(v) for k, v in (allocatable or {}).items()}

    def patch_node_status(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        self._call(lambda: self.core_v1.patch_node_status(name, dict(body), _content_type=MERGE_PATCH,
                                                          _request_timeout=timeout))

    @staticmethod
    def _call(call: Any) -> Any:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            return call()
        except ApiException as exc:
            if not exc.status:
                raise ConnectionError(str(exc.reason)) from None
            raise KubeApiError(exc.status, _status_message(exc.status, str(exc.reason or ""),
                                                          exc.body.encode() if isinstance(exc.body, str)
                                                          else exc.body or b"")) from None
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


def kubeconfig_api() -> NodeApi:
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
    return _ClientNodeApi(client.CoreV1Api(client.ApiClient(configuration)))


def node_status_api_from_environment() -> NodeStatusApi:
    """:func:`node_api_from_environment` for a hand-over (both clients have the status calls)."""
    api = node_api_from_environment()
    assert isinstance(api, LeanNodeApi | _ClientNodeApi)
    return api


def node_api_from_environment() -> NodeApi:
    """In a pod: the lean client with the service account; else the kubeconfig. NodeLabelerError when
    neither is available (nothing is contacted here)."""
    try:
        return LeanNodeApi.in_cluster()
    except NodeLabelerError as in_cluster:
        try:
            return kubeconfig_api()
        except NodeLabelerError as kubeconfig:
            raise NodeLabelerError(f"no Kubernetes API configuration: not running in a cluster ({in_cluster}) "
                                   f"and {kubeconfig}") from None
