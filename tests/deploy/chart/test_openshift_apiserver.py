"""The chart on a real API server that serves OpenShift's SecurityContextConstraints: etcd and kube-apiserver of the
real-cluster lane's builds, 1.37 and 1.34 (no node, no lane lock: topology_devkit.realcluster.lone_apiserver), with
the SCC as a CRD whose schema is written from OpenShift's API reference (tests/support/openshift-scc-crd.yaml). helm
install finds security.openshift.io/v1 in discovery, installs the SCC (openshift.scc.create=auto), the API server
takes every object and keeps every field of the SCC, and RBAC lets the agent's ServiceAccount, and no other, use
it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, Doc
from tests.support.env import REPO, missing
from topology_devkit.realcluster.lone_apiserver import LoneApiServer, start_apiserver

CRD = REPO / "tests" / "support" / "openshift-scc-crd.yaml"
NS, RELEASE = "topology-agent", "t"
NAME = "t-s390x-topology-agent"


@pytest.fixture(scope="module", params=["containerd", "crio"])
def bins(request: pytest.FixtureRequest) -> Path:
    """An API server of each minor the lanes build: 1.37 (the containerd set, which make test finds built) and 1.34,
    OpenShift 4.21's (the CRI-O set, built for its own stage: skipped until then)."""
    from topology_devkit.realcluster.cluster import bin_dir
    from topology_devkit.realcluster.procs import ClusterError

    try:
        return bin_dir(request.param)
    except ClusterError as exc:
        if request.param == "crio":
            pytest.skip(f"the CRI-O set (Kubernetes 1.34) is not built: make cluster-build RUNTIME=crio ({exc})")
        missing("the real-cluster lane's kube-apiserver and etcd", f"make cluster-build ({exc})")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def api(bins: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoneApiServer]:
    server = start_apiserver(tmp_path_factory.mktemp("lone-apiserver"), bins)
    try:
        yield server
    finally:
        server.stop()


def run(argv: list[str], api: LoneApiServer, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    home = api.layout.root
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env |= {"KUBECONFIG": str(api.kubeconfig), "HELM_CACHE_HOME": str(home / "helm-cache"),
            "HELM_CONFIG_HOME": str(home / "helm-config"), "HELM_DATA_HOME": str(home / "helm-data")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env, input=stdin)


def kubectl(bins: Path, api: LoneApiServer, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run([str(bins / "kubectl"), *args], api, stdin)


@pytest.fixture(scope="module")
def installed(api: LoneApiServer, bins: Path, helm: str) -> dict[str, Any]:
    done = kubectl(bins, api, "apply", "--server-side", "-f", str(CRD))
    assert done.returncode == 0, done.stderr
    done = kubectl(bins, api, "wait", "--for=condition=Established", "--timeout=60s",
                   "crd/securitycontextconstraints.security.openshift.io")
    assert done.returncode == 0, done.stderr
    done = run([helm, "install", RELEASE, str(CHART), "-n", NS, "--create-namespace", "-o", "json"], api)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def manifest_scc(release: dict[str, Any]) -> Doc:
    (scc,) = [d for d in yaml.safe_load_all(release["manifest"]) if d and d["kind"] == "SecurityContextConstraints"]
    return dict(scc)


def served_scc(bins: Path, api: LoneApiServer) -> Doc:
    done = kubectl(bins, api, "get", "securitycontextconstraints.security.openshift.io", NAME, "-o", "json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_helm_install_finds_openshift_and_the_api_server_keeps_every_field(
        installed: dict[str, Any], bins: Path, api: LoneApiServer) -> None:
    rendered, served = manifest_scc(installed), served_scc(bins, api)
    # Every field the chart wrote came back as written: none was pruned as unknown or changed by the schema.
    assert {k: v for k, v in served.items() if k not in ("metadata", "status")} == \
        {k: v for k, v in rendered.items() if k != "metadata"}
    assert served["seLinuxContext"]["seLinuxOptions"]["type"] == "spc_t"  # the default cpusetEnforcement: auto
    for kind, name in (("daemonset", NAME), ("role", f"{NAME}-scc"), ("rolebinding", f"{NAME}-scc")):
        done = kubectl(bins, api, "-n", NS, "get", kind, name, "-o", "name")
        assert done.returncode == 0, done.stderr


def test_only_the_agents_service_account_may_use_the_scc(installed: dict[str, Any], bins: Path,
                                                         api: LoneApiServer) -> None:
    def can_use(account: str, scc: str = NAME) -> str:
        done = kubectl(bins, api, "auth", "can-i", "use", f"securitycontextconstraints.security.openshift.io/{scc}",
                       "-n", NS, f"--as=system:serviceaccount:{NS}:{account}")
        return done.stdout.strip()

    assert can_use(NAME) == "yes"
    assert can_use("default") == "no"
    assert can_use(NAME, scc="privileged") == "no"


def test_an_upgrade_narrows_the_selinux_type(installed: dict[str, Any], bins: Path, api: LoneApiServer,
                                             helm: str) -> None:
    done = run([helm, "upgrade", RELEASE, str(CHART), "-n", NS, "--set", "cpusetEnforcement=none"], api)
    assert done.returncode == 0, done.stderr
    assert served_scc(bins, api)["seLinuxContext"]["seLinuxOptions"]["type"] == "container_device_plugin_t"


def test_the_crd_schema_refuses_what_openshift_refuses(installed: dict[str, Any], bins: Path,
                                                       api: LoneApiServer) -> None:
    """The schema does work: a misspelt field and a missing required one are refused, so the chart's SCC passing
    means something."""
    scc = {k: v for k, v in manifest_scc(installed).items() if k != "metadata"} | {"metadata": {"name": "probe"}}
    misspelt = {k: v for k, v in scc.items() if k != "allowHostPID"} | {"allowHostPid": False}
    done = kubectl(bins, api, "create", "--validate=strict", "-f", "-", stdin=json.dumps(misspelt))
    assert done.returncode != 0 and "allowHostPid" in done.stderr, done.stdout + done.stderr
    assert 'unknown field "allowHostPid"' in done.stderr or "allowHostPID: Required value" in done.stderr
    wrong = scc | {"runAsUser": {"type": "MustRunAsRoot"}}
    done = kubectl(bins, api, "create", "-f", "-", stdin=json.dumps(wrong))
    assert done.returncode != 0 and "MustRunAsRoot" in done.stderr, done.stdout + done.stderr
