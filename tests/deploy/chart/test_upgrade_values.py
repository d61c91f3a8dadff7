"""Chart values across releases: `helm upgrade --reuse-values` from the last recorded release renders with the real
helm, against a fake API server that holds that release (its Chart.yaml and values.yaml as it shipped them:
tests/fixtures/release-<version>/chart/), and compat.yaml lists every value added, renamed or removed since."""

from __future__ import annotations

import base64
import gzip
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, PRIVILEGED, Doc, Installed, chart_install
from tests.support.env import REPO

RELEASES = json.loads((REPO / "releases.json").read_text())["releases"]
LAST = RELEASES[-1]["version"]
OLD = REPO / "tests" / "fixtures" / f"release-{LAST}" / "chart"
COMPAT = yaml.safe_load((CHART / "compat.yaml").read_text())
NS = {"topo": PRIVILEGED}


def release_secret(values: Doc, config: Doc, name: str = "t", namespace: str = "topo") -> Doc:
    """The Secret Helm keeps a deployed release in (pkg/storage/driver/secrets.go: the release as JSON, gzipped and
    base64-encoded), for a release of the last recorded chart installed with ``config``."""
    metadata = yaml.safe_load((OLD / "Chart.yaml").read_text())
    release = {"name": name, "namespace": namespace, "version": 1, "manifest": "", "config": config,
               "info": {"status": "deployed", "description": "Install complete",
                        "first_deployed": "2026-12-05T00:00:00Z", "last_deployed": "2026-12-05T00:00:00Z"},
               "chart": {"metadata": metadata, "templates": [], "values": values, "files": []}}
    encoded = base64.b64encode(gzip.compress(json.dumps(release).encode())).decode()
    return {"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
            "metadata": {"name": f"sh.helm.release.v1.{name}.v1", "namespace": namespace,
                         "labels": {"name": name, "owner": "helm", "status": "deployed", "version": "1"}},
            "data": {"release": base64.b64encode(encoded.encode()).decode()}}


CONFIGS: dict[str, Doc] = {
    "defaults": {},
    "dra": {"mode": "dra"},
    "nri-profile-labels-off": {"cpusetEnforcement": "nri", "seccompProfile": {"install": True},
                               "agent": {"nodeLabels": False}},
    "monitoring": {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
                   "networkPolicy": {"enabled": True, "scraper": {
                       "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}}},
}


def objects(installed: Installed) -> dict[tuple[str, str], Doc]:
    return {(d["kind"], d["metadata"]["name"]): d for d in installed.manifest}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_helm_upgrade_reuse_values_from_the_last_release_renders_what_a_fresh_install_does(
        install: Callable[..., Installed], name: str, tmp_path: Path) -> None:
    config = CONFIGS[name]
    given = tmp_path / "values.yaml"
    given.write_text(yaml.safe_dump(config))
    old_values = yaml.safe_load((OLD / "values.yaml").read_text())
    upgraded = install("upgrade", "t", str(CHART), "-n", "topo", "--reuse-values", namespaces=NS,
                       releases=[release_secret(old_values, config)], minor=36, more_apis=True)
    fresh = install(*chart_install("-n", "topo", "-f", str(given)), namespaces=NS, minor=36, more_apis=True)
    assert objects(upgraded) == objects(fresh), "a default changed since the last release: say it in CHANGELOG.md"
    assert "DEPRECATED VALUE" not in upgraded.notes and "REMOVED VALUE" not in upgraded.notes


def paths(doc: Any, prefix: str = "") -> set[str]:
    """Every key path of a values document, e.g. agent.nodeLabels (maps whose keys are data, not settings, stop)."""
    out: set[str] = set()
    for key, value in (doc or {}).items():
        path = f"{prefix}{key}"
        out.add(path)
        if isinstance(value, dict) and value and path not in ("fakeTopology.snapshots", "nodeSelector"):
            out |= paths(value, f"{path}.")
    return out


def leaves(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a values document by its dotted path."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        out |= leaves(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}": value}
    return out


def covered(path: str, listed: set[str]) -> bool:
    return any(path == key or path.startswith(f"{key}.") for key in listed)


def test_compat_lists_every_value_added_renamed_or_removed_since_the_last_release() -> None:
    assert COMPAT["since"] == LAST
    old = paths(yaml.safe_load((OLD / "values.yaml").read_text()))
    new = paths(yaml.safe_load((CHART / "values.yaml").read_text()))
    renamed = {r["old"]: r["new"] for r in COMPAT["renamed"]}
    removed = {r["old"] for r in COMPAT["removed"]}
    gone = sorted(p for p in old - new if not covered(p, set(renamed) | removed))
    assert not gone, f"in {LAST}'s values, not in today's: list them in compat.yaml renamed or removed"
    added = set(leaves(COMPAT["added"]))
    missing = sorted(p for p in new - old if not covered(p, added | set(renamed.values())) and
                     not any(a.startswith(f"{p}.") for a in added))
    assert not missing, f"new since {LAST}: list them in compat.yaml added"
    stale = sorted(p for p in added if p in old or not covered(p, new))
    assert not stale, f"compat.yaml added lists keys {LAST} had, or today's values lack"


def test_compat_gives_added_and_renamed_keys_the_defaults_of_values_yaml() -> None:
    values = leaves(yaml.safe_load((CHART / "values.yaml").read_text()))
    assert {p: values[p] for p in leaves(COMPAT["added"])} == leaves(COMPAT["added"])
    for rename in COMPAT["renamed"]:
        assert rename["default"] == values[rename["new"]], rename


@pytest.fixture
def chart_with_a_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Today's chart as if agent.nodeLabels had been called agent.labelNodes in the last release, and
    metrics.legacyPort removed."""
    chart = tmp_path / "s390x-topology-agent"
    shutil.copytree(CHART, chart)
    compat = dict(COMPAT, renamed=[{"old": "agent.labelNodes", "new": "agent.nodeLabels", "default": True}],
                  removed=[{"old": "metrics.legacyPort", "why": "the metrics port is metrics.port"}])
    (chart / "compat.yaml").write_text(yaml.safe_dump(compat))
    schema = json.loads((chart / "values.schema.json").read_text())
    schema["properties"]["agent"]["properties"]["labelNodes"] = {"type": "boolean"}
    schema["properties"]["metrics"]["properties"]["legacyPort"] = {"type": "integer"}
    (chart / "values.schema.json").write_text(json.dumps(schema))
    yield chart


def test_a_renamed_value_keeps_working_for_a_release_and_notes_say_so(
        install: Callable[..., Installed], chart_with_a_rename: Path) -> None:
    old = install("install", "t", str(chart_with_a_rename), "-n", "topo", "--set", "agent.labelNodes=false",
                  "--set", "metrics.legacyPort=9999", namespaces=NS)
    new = install("install", "t", str(CHART), "-n", "topo", "--set", "agent.nodeLabels=false", namespaces=NS)
    assert objects(old) == objects(new), "the old name works as the new one"
    assert ("DEPRECATED VALUE: agent.labelNodes was renamed agent.nodeLabels after 0.1.0; its value (false) is used "
            "for agent.nodeLabels in this release and ignored in the next: set agent.nodeLabels instead.") in old.notes
    assert ("REMOVED VALUE: metrics.legacyPort (9999) has no effect since 0.1.0: the metrics port is "
            "metrics.port.") in old.notes
    both = install("install", "t", str(chart_with_a_rename), "-n", "topo", "--set", "agent.labelNodes=true",
                   "--set", "agent.nodeLabels=false", namespaces=NS)
    assert objects(both) == objects(new), "the new name, set to other than its default, wins"
    assert ("DEPRECATED VALUE: agent.labelNodes was renamed agent.nodeLabels after 0.1.0; its value (true) is "
            "ignored, as agent.nodeLabels is set (false): remove agent.labelNodes.") in both.notes
    plain = install("install", "t", str(chart_with_a_rename), "-n", "topo", namespaces=NS)
    assert "DEPRECATED VALUE" not in plain.notes and "REMOVED VALUE" not in plain.notes


def test_every_template_applies_compat_first() -> None:
    """The step changes .Values, shared by every template, idempotently: each one runs it before it reads a value,
    whatever order Helm renders them in."""
    templates = sorted([*(CHART / "templates").glob("*.yaml"), CHART / "templates" / "NOTES.txt"])
    late = [t.name for t in templates if t.read_text().splitlines()[0] != '{{- include "topology-agent.compat" . -}}']
    assert not late, late
