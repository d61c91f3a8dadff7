"""An API server that is away costs next to nothing: the label loop backs off (doubling, capped at 10
intervals), the labeler warns once, and a kubeconfig's client does not add a warning per retry."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import pytest

from agent.node.kubeapi import kubeconfig_api
from agent.node.labeler import NodeLabeler
from agent.node.reporter import NodeReporter
from agent.periodic import backoff_delay
from agent.policy.grouping import group_topology
from agent.topology.embedded import load_embedded


def test_backoff_doubles_from_the_interval_and_stops_at_ten_intervals() -> None:
    assert [backoff_delay(30.0, n) for n in range(7)] == [30.0, 60.0, 120.0, 240.0, 300.0, 300.0, 300.0]
    assert backoff_delay(0.02, 100) == pytest.approx(0.2)  # a short interval backs off as little
    assert backoff_delay(30.0, 10**6) == 300.0  # no overflow on a long outage


class FlakyLabeler:
    """Fails while ``down``; counts its syncs."""

    def __init__(self) -> None:
        self.down = True
        self.syncs = 0
        self.patches = 0
        self.failures = 0

    def sync(self, labels: Any, annotations: Any) -> bool:
        self.syncs += 1
        if self.down:
            self.failures += 1
        return not self.down

    def invalidate(self) -> None:
        pass

    def post_event(self, body: Any) -> bool:
        return True


def test_reporter_counts_failed_syncs_in_a_row_and_forgets_them_on_success() -> None:
    topology = load_embedded("z16-lpar")
    labeler = FlakyLabeler()
    reporter = NodeReporter(topology, group_topology(topology), node_name="n", labels_enabled=True,
                            cpu_manager_state=None, kubelet_config=None,
                            labeler_factory=lambda name: labeler)  # type: ignore[arg-type,return-value]
    assert [reporter.sync_labels() for _ in range(3)] == [False, False, False]
    assert reporter.failed_syncs == 3
    assert backoff_delay(30.0, reporter.failed_syncs) == 240.0
    labeler.down = False
    assert reporter.sync_labels() is True
    assert reporter.failed_syncs == 0


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_kubeconfig_api_server_that_refuses_is_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    kube_config = pytest.importorskip("kubernetes.config.kube_config")
    config = tmp_path / "kubeconfig"
    config.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "https://127.0.0.1:{_refused_port()}", insecure-skip-tls-verify: true}}
users:
- name: u
  user: {{token: t}}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
""")
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))  # read from $KUBECONFIG at import
    caplog.set_level(logging.DEBUG)
    labeler = NodeLabeler("n", kubeconfig_api(), request_timeout=2.0)
    assert [labeler.sync({}, {}) for _ in range(3)] == [False, False, False]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].name == "topology-agent.node" and "unreachable" in warnings[0].getMessage()
