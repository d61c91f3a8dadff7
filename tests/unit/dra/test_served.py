"""DRA mode reads what the API server serves before it publishes: the resource.k8s.io version it writes, or one line
naming the Kubernetes minor it needs (agent/dra/served.py). ``GROUP_134`` and ``V134`` are the real Kubernetes 1.34.2
API server's answers to ``GET /apis/resource.k8s.io`` and ``/version`` (the CRI-O lane's, ``make cluster-up
RUNTIME=crio``: 1.34 serves v1 alone by default); the others are shaped like them."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from agent.dra.served import NEEDS, Served, check_served, choose_version
from agent.errors import KubeApiError, StartupError
from agent.node.kubeapi import KubeApi

# GET /version of the lane's API servers (devkit/cluster/build.sh stamps gitVersion, major and minor).
V134 = {"major": "1", "minor": "34", "emulationMajor": "1", "emulationMinor": "34", "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "33", "gitVersion": "v1.34.2", "gitCommit": "$Format:%H$", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.26.8", "compiler": "gc", "platform": "linux/amd64"}
V137 = {"major": "1", "minor": "37", "gitVersion": "v1.37.2"}
GROUP_134 = {"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io",
             "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
             "preferredVersion": {"groupVersion": "resource.k8s.io/v1", "version": "v1"}}


class FakeServer(KubeApi):
    """The agent's own client over canned answers: path -> (status, JSON body)."""

    def __init__(self, answers: dict[str, tuple[int, Any]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def _send(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, str, bytes]:
        import json

        self.asked.append(path)
        status, document = self.answers.get(path, (404, {"kind": "Status", "message": "the server could not find "
                                                              "the requested resource"}))
        return status, "", json.dumps(document).encode()


def group(*versions: str) -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io",
            "versions": [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"resource.k8s.io/{versions[0]}", "version": versions[0]}}


def test_an_api_server_of_1_37_serving_v1_gets_v1() -> None:
    api = FakeServer({"/apis/resource.k8s.io": (200, group("v1", "v1beta2", "v1beta1")), "/version": (200, V137)})
    assert check_served(api) == "v1"
    assert api.asked == ["/apis/resource.k8s.io", "/version"]


def test_1_34_serves_v1_but_its_counter_layout_is_refused_in_one_line_naming_the_minor_needed() -> None:
    api = FakeServer({"/apis/resource.k8s.io": (200, GROUP_134), "/version": (200, V134)})
    with pytest.raises(StartupError) as refused:
        check_served(api)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"--mode dra needs {NEEDS}: the API server is v1.34.2")
    assert "use mode deviceplugin" in message


def test_a_server_without_v1_or_without_the_group_is_refused() -> None:
    only_beta = Served.of(["v1beta2", "v1beta1"], {"major": "1", "minor": "33", "gitVersion": "v1.33.5"})
    with pytest.raises(StartupError, match=r"serves resource.k8s.io v1beta2, v1beta1, not v1"):
        choose_version(only_beta)
    api = FakeServer({"/version": (200, {"major": "1", "minor": "30", "gitVersion": "v1.30.1"})})
    with pytest.raises(StartupError, match=r"\(v1.30.1\) serves no resource.k8s.io API"):
        check_served(api)


def test_managed_minors_with_a_plus_and_1_35_with_its_gate_warning(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(StartupError):
        choose_version(Served.of(["v1"], {"major": "1", "minor": "34+", "gitVersion": "v1.34.3-eks-1234"}))
    with caplog.at_level(logging.WARNING, logger="topology-agent.dra"):
        assert choose_version(Served.of(["v1", "v1beta2"], {"major": "1", "minor": "35",
                                                            "gitVersion": "v1.35.0"})) == "v1"
    assert "DRAPartitionableDevices" in caplog.text


def test_the_version_from_git_version_when_major_and_minor_are_empty() -> None:
    served = Served.of(["v1"], {"major": "", "minor": "", "gitVersion": "v1.34.2+rhcos"})
    assert (served.major, served.minor) == (1, 34)
    with pytest.raises(StartupError):
        choose_version(served)


def test_a_server_that_does_not_say_is_let_through_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    class Unreachable(FakeServer):
        def _send(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, str, bytes]:
            raise TimeoutError("timed out")

    with caplog.at_level(logging.WARNING, logger="topology-agent.dra"):
        assert check_served(Unreachable({})) == "v1"
    assert "could not read which resource.k8s.io versions" in caplog.text
    forbidden = FakeServer({"/apis/resource.k8s.io": (403, {"message": "forbidden"})})
    assert check_served(forbidden) == "v1"
    with pytest.raises(KubeApiError):
        forbidden.server_version()
