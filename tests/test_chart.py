"""The Helm chart, rendered with the real helm binary and checked object by object.

helm comes from $HELM, else .tools/bin/helm (tools/get-helm.sh), else PATH. Without it the tests skip
locally and fail under CI=true (CI installs it). The admission policies' CEL is evaluated with cel-python
(module ``celpy``) when installed, with the Kubernetes quantity and ``join`` functions it uses supplied here.
What needs a cluster (``lookup`` in NOTES.txt, the live discovery Helm sees) runs ``helm install --dry-run=server``
against a minimal fake API server in this file: discovery, /version and the namespaces, nothing else.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, missing

CHART = REPO / "deploy" / "helm" / "s390x-topology-agent"
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
FLOOR, VAP_MIN, NEWEST = "1.26.0", "1.30.0", "1.34.0"
Doc = dict[str, Any]


def find_helm() -> str | None:
    if os.environ.get("HELM"):
        return shutil.which(os.environ["HELM"])  # None when $HELM is not an executable
    local = REPO / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("helm")


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        missing("helm", "run tools/get-helm.sh, or set HELM=/path/to/helm")
    assert path is not None
    return path


@functools.cache
def _helm_template(helm: str, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    cmd = [helm, "template", "t", str(CHART), "-n", "kube-system", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


Render = Callable[..., list[Doc]]


@pytest.fixture(scope="session")
def render(helm: str) -> Render:
    """render("--set", "a=b", kube_version=..., vap=True) -> the rendered objects; RuntimeError on failure."""

    def _render(*args: str, kube_version: str = VAP_MIN, vap: bool = True, hooks: bool = False) -> list[Doc]:
        extra = ("--kube-version", kube_version, *(("--api-versions", VAP_API) if vap else ()))
        result = _helm_template(helm, (*extra, *args))
        if result.returncode:
            raise RuntimeError(result.stderr)
        # The uninstall hook's objects (helm.sh/hook: pre-delete) only with hooks=True (tests/test_chart_uninstall.py).
        return [d for d in yaml.safe_load_all(result.stdout)
                if d and (hooks or "helm.sh/hook" not in ((d.get("metadata") or {}).get("annotations") or {}))]

    return _render


@pytest.fixture(scope="session")
def template_error(helm: str) -> Callable[..., str]:
    """template_error(args...) -> helm's stderr; fails the test when helm renders fine."""

    def _error(*args: str) -> str:
        result = _helm_template(helm, ("--kube-version", VAP_MIN, *args))
        assert result.returncode != 0, f"helm template {' '.join(args)} should have failed"
        return result.stderr

    return _error


def kinds(docs: list[Doc]) -> dict[str, list[Doc]]:
    out: dict[str, list[Doc]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def one(docs: list[Doc], kind: str) -> Doc:
    found = kinds(docs).get(kind, [])
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def agent_container(docs: list[Doc]) -> Doc:
    containers = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent"]
    return containers[0]


def env_of(container: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def mounts_of(docs: list[Doc]) -> dict[str, tuple[Doc, Doc]]:
    """volume name -> (volumeMount, volume)."""
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["name"]: (m, volumes[m["name"]]) for m in agent_container(docs)["volumeMounts"]}


FAKE_ARGS = (
    "--set", "fakeTopology.enabled=true",
    "--set-file", f"fakeTopology.snapshots.default\\.json={REPO / 'agent/data/z16-lpar.json'}",
    "--set-file", f"fakeTopology.snapshots.worker2\\.json={REPO / 'agent/data/z14-lpar.json'}",
)


# ------------------------------------------------------------------------------------------- lint / validate


@pytest.mark.parametrize("args", [(), FAKE_ARGS], ids=["default", "fake-topology"])
def test_helm_lint_strict(helm: str, args: tuple[str, ...]) -> None:
    result = subprocess.run([helm, "lint", "--strict", str(CHART), *args], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


SCRAPER_NS = '{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}'  # kube-prometheus-stack's Prometheus
SCRAPER_POD = '{"matchLabels":{"app.kubernetes.io/name":"prometheus"}}'
# Every option on at once (what tools/check-chart.sh and the checkov run in deploy/helm/README.md render too).
ALL_OPTIONS = (
    *FAKE_ARGS,
    "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "metrics.allocationsPodNames=true",
    "--set", "seccompProfile.install=true",
    "--set", "kubelet.readState=true",
    "--set", "networkPolicy.enabled=true",
    "--set-json", f"networkPolicy.scraper.namespaceSelector={SCRAPER_NS}",
    "--set-json", f"networkPolicy.scraper.podSelector={SCRAPER_POD}",
)


@pytest.mark.parametrize("kube_version", [FLOOR, VAP_MIN, NEWEST])
@pytest.mark.parametrize("args", [(), FAKE_ARGS, ("--set", "metrics.serviceMonitor.enabled=true"), ALL_OPTIONS],
                         ids=["default", "fake-topology", "service-monitor", "all-options"])
def test_rendered_objects_pass_strict_schema_validation(render: Render, kube_version: str,
                                                        args: tuple[str, ...]) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        missing("kubernetes-validate", "pip install kubernetes-validate")
    vap = kube_version != FLOOR  # only clusters >= 1.30 serve the v1 policy
    docs = render(*args, kube_version=kube_version, vap=vap)
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no schema bundled (tools/check-chart.sh lets kubernetes-validate warn about it)
        kubernetes_validate.validate(doc, kube_version, strict=True)


def test_chart_refuses_kubernetes_below_its_floor(helm: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={FLOOR}-0"
    result = _helm_template(helm, ("--kube-version", "1.25.0"))
    assert result.returncode != 0 and "kubeVersion" in result.stderr


def test_default_objects_and_namespaces(render: Render) -> None:
    docs = render()
    assert sorted(kinds(docs)) == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "Role", "RoleBinding",
                                   "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    for doc in docs:
        if doc["kind"] in ("DaemonSet", "ServiceAccount", "ConfigMap", "Service"):
            assert doc["metadata"]["namespace"] == "kube-system"


# ------------------------------------------------------------------------------------------------- DaemonSet


def test_kubelet_directories_are_mounted_as_directories(render: Render) -> None:
    mounts = mounts_of(render())
    dp_mount, dp_volume = mounts["device-plugins"]
    assert dp_mount["mountPath"] == "/var/lib/kubelet/device-plugins"
    assert dp_volume["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    assert not dp_mount.get("readOnly")  # the agent creates its sockets there
    pr_mount, pr_volume = mounts["pod-resources"]
    assert pr_mount["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert pr_volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    for _, volume in mounts.values():
        host = volume.get("hostPath")
        if host:
            assert not host["path"].endswith(".sock") and host.get("type") != "Socket"


def test_sys_is_mounted_read_only_and_proc_is_the_containers_own(render: Render) -> None:
    docs = render()
    mount, volume = mounts_of(docs)["host-sys"]
    assert mount == {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True}
    assert volume["hostPath"]["path"] == "/sys"
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_HOST_ROOT"] == "/host"
    assert env["TOPOLOGY_AGENT_PROC_ROOT"] == "/proc"  # /proc/sysinfo and /proc/cpuinfo are not namespaced
    assert "TOPOLOGY_AGENT_TOPOLOGY_FILE" not in env


def test_kubelet_root_is_a_value(render: Render) -> None:
    docs = render("--set", "kubelet.root=/var/lib/rancher/k3s/agent/kubelet/")
    mounts = mounts_of(docs)
    assert mounts["device-plugins"][1]["hostPath"]["path"] == "/var/lib/rancher/k3s/agent/kubelet/device-plugins"
    assert mounts["pod-resources"][1]["hostPath"]["path"] == "/var/lib/rancher/k3s/agent/kubelet/pod-resources"
    # The container paths do not move, and the agent is told where they are.
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_KUBELET_DIR"] == mounts["device-plugins"][0]["mountPath"]
    assert env["TOPOLOGY_AGENT_POD_RESOURCES_SOCKET"] == mounts["pod-resources"][0]["mountPath"] + "/kubelet.sock"


def test_kubelet_state_mount_is_opt_in_and_read_only(render: Render) -> None:
    docs = render("--set", "cpusetEnforcement=none")  # enforcement (the default auto) reads the state too
    assert "kubelet-root" not in mounts_of(docs)
    env = env_of(agent_container(docs))
    assert "TOPOLOGY_AGENT_CPU_MANAGER_STATE" not in env and "TOPOLOGY_AGENT_KUBELET_CONFIG" not in env
    docs = render("--set", "kubelet.readState=true")
    mount, volume = mounts_of(docs)["kubelet-root"]
    assert mount["readOnly"] is True and volume["hostPath"] == {"path": "/var/lib/kubelet", "type": "Directory"}
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_CPU_MANAGER_STATE"] == mount["mountPath"] + "/cpu_manager_state"
    assert env["TOPOLOGY_AGENT_KUBELET_CONFIG"] == mount["mountPath"] + "/config.yaml"


def test_security_context_uid0_without_privileges(render: Render) -> None:
    docs = render()
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    sc = agent_container(docs)["securityContext"]
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key)
    # A read-only root filesystem still needs a writable /tmp.
    assert mounts_of(docs)["tmp"][1]["emptyDir"]["medium"] == "Memory"


def test_security_context_says_why_uid0(helm: str) -> None:
    text = (CHART / "templates" / "daemonset.yaml").read_text()
    comment = " ".join(line.strip().lstrip("#").strip() for line in text.splitlines() if line.strip().startswith("#"))
    for words in ("uid 0", "0750", "CAP_DAC_OVERRIDE", "capability is dropped", "65532"):
        assert words in comment, f"the security-context comment should mention {words!r}"


def test_probes_on_healthz_and_readyz(render: Render) -> None:
    container = agent_container(render("--set", "metrics.port=9555"))
    assert container["ports"] == [{"name": "metrics", "containerPort": 9555, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert env_of(container)["TOPOLOGY_AGENT_METRICS_PORT"] == "9555"


def test_scrape_annotations(render: Render) -> None:
    annotations = one(render(), "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9400",
                           "prometheus.io/path": "/metrics"}
    docs = render("--set", "metrics.podAnnotations=false")
    assert not one(docs, "DaemonSet")["spec"]["template"]["metadata"].get("annotations")


def test_priority_tolerations_and_arch_selector(render: Render) -> None:
    pod = one(render("--set-json", 'extraTolerations=[{"key":"ibm.com/z","operator":"Exists"}]'),
              "DaemonSet")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "s390x"}
    tolerations = pod["tolerations"]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in tolerations
    assert {"operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert {"operator": "Exists", "effect": "NoExecute"} in tolerations
    assert tolerations[-1] == {"key": "ibm.com/z", "operator": "Exists"}


def test_node_selector_is_overridable(render: Render) -> None:
    # Helm merges maps: a default key goes away by setting it to null.
    pod = one(render("--set-json", 'nodeSelector={"kubernetes.io/arch":null,"example.com/pool":"inference"}'),
              "DaemonSet")
    assert pod["spec"]["template"]["spec"]["nodeSelector"] == {"example.com/pool": "inference"}
    pod = one(render("--set", "nodeSelector=null"), "DaemonSet")
    assert "nodeSelector" not in pod["spec"]["template"]["spec"]


def test_rolling_update_never_surges(render: Render) -> None:
    strategy = one(render(), "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_agent_settings_reach_the_environment(render: Render) -> None:
    env = env_of(agent_container(render(
        "--set", "agent.levels=book\\,socket",
        "--set", "agent.resourcePrefix=z.example.com",
        "--set", "agent.reservedCpus=0-1\\,8",
        "--set-json", 'agent.excludePolarization=["vertical:low","unknown"]',
        "--set", "agent.ompThreadsPerCore=2",
        "--set", "agent.reserveCoresPerGroup=0",
        "--set", "agent.minGroupCores=3",
        "--set", "agent.openmpEnv=true",
        "--set", "agent.logLevel=debug",
        "--set", "agent.logFormat=text",
        "--set", "agent.nodeLabels=false",
        "--set-json", "agent.rescanInterval=2.5",
        "--set", "agent.podResourcesInterval=0",
    )))
    assert env["TOPOLOGY_AGENT_LEVELS"] == "book,socket"
    assert env["TOPOLOGY_AGENT_RESOURCE_PREFIX"] == "z.example.com"
    assert env["TOPOLOGY_AGENT_RESERVED_CPUS"] == "0-1,8"
    assert env["TOPOLOGY_AGENT_EXCLUDE_POLARIZATION"] == "vertical:low,unknown"
    assert env["TOPOLOGY_AGENT_OMP_THREADS_PER_CORE"] == "2"
    assert env["TOPOLOGY_AGENT_RESERVE_CORES_PER_GROUP"] == "0"
    assert env["TOPOLOGY_AGENT_MIN_GROUP_CORES"] == "3"
    assert env["TOPOLOGY_AGENT_OPENMP_ENV"] == "true"
    assert env["TOPOLOGY_AGENT_LOG_LEVEL"] == "debug"
    assert env["TOPOLOGY_AGENT_LOG_FORMAT"] == "text"
    assert env["TOPOLOGY_AGENT_NODE_LABELS"] == "false"
    assert env["TOPOLOGY_AGENT_RESCAN_INTERVAL"] == "2.5"
    assert env["TOPOLOGY_AGENT_POD_RESOURCES_INTERVAL"] == "0"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_container_level_openmp_env_is_off_and_one_core_is_reserved_by_default(render: Render) -> None:
    env = env_of(agent_container(render()))
    assert env["TOPOLOGY_AGENT_OPENMP_ENV"] == "false"
    assert env["TOPOLOGY_AGENT_RESERVE_CORES_PER_GROUP"] == "1"
    assert env["TOPOLOGY_AGENT_MIN_GROUP_CORES"] == "auto"


def test_the_runtime_socket_is_mounted_only_with_cpuset_enforcement(render: Render) -> None:
    plain = mounts_of(render("--set", "cpusetEnforcement=none"))
    assert "cri-socket" not in plain and "nri-socket" not in plain and "kubelet-root" not in plain
    default = render()  # auto: NRI where the runtime offers it, else CRI; both sockets' folders and the state
    assert env_of(agent_container(default))["TOPOLOGY_AGENT_CPUSET_ENFORCEMENT"] == "auto"
    assert {"cri-socket", "nri-socket", "kubelet-root"} <= set(mounts_of(default))
    docs = render("--set", "cpusetEnforcement=cri", "--set", "sharedPool=true",
                  "--set", "criSocket=/run/crio/crio.sock")
    mounts = mounts_of(docs)
    mount, volume = mounts["cri-socket"]
    assert volume["hostPath"] == {"path": "/run/crio", "type": "Directory"}
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_CRI_SOCKET"] == f"{mount['mountPath']}/crio.sock"
    assert env["TOPOLOGY_AGENT_CPUSET_ENFORCEMENT"] == "cri" and env["TOPOLOGY_AGENT_SHARED_POOL"] == "true"
    # kubelet's state is read, to refuse enforcement under the static CPU manager policy
    assert mounts["kubelet-root"][0]["readOnly"] is True and "TOPOLOGY_AGENT_CPU_MANAGER_STATE" in env


def test_seccomp_profile_install_is_an_init_container_writing_under_kubelets_seccomp_dir(render: Render) -> None:
    plain = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    assert "initContainers" not in plain
    assert "seccomp-profiles" not in {v["name"] for v in plain["volumes"]}
    spec = one(render("--set", "seccompProfile.install=true", "--set", "kubelet.root=/var/lib/k0s/kubelet"),
               "DaemonSet")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["args"] == ["seccomp-profile", "--install", "/host-seccomp/profiles"]
    assert init["image"] == agent_container(render())["image"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert init["resources"]["limits"] == {"cpu": "100m", "memory": "64Mi"}  # bounded, unlike the agent's CPU
    (mount,) = init["volumeMounts"]
    volume = {v["name"]: v for v in spec["volumes"]}[mount["name"]]
    assert volume["hostPath"] == {"path": "/var/lib/k0s/kubelet/seccomp/profiles", "type": "DirectoryOrCreate"}
    # The agent mounts it only to remove the profile when the release is uninstalled (uninstall.cleanup).
    assert mount["name"] in {m["name"] for m in spec["containers"][0]["volumeMounts"]}
    spec = one(render("--set", "seccompProfile.install=true", "--set", "uninstall.cleanup=false"),
               "DaemonSet")["spec"]["template"]["spec"]
    assert mount["name"] not in {m["name"] for m in spec["containers"][0]["volumeMounts"]}


def test_every_agent_variable_is_a_serve_flag(render: Render, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's TOPOLOGY_AGENT_* variables name real flags of `topology-agent serve`, with values it accepts."""
    from agent import cli
    from agent.cli.flags import ENV_PREFIX
    from agent.cli.settings import allocation_settings, grouping_settings

    container = agent_container(render("--set", "kubelet.readState=true", "--set-json",
                                       'agent.excludePolarization=["vertical:low"]', "--set", "agent.levels=book",
                                       "--set", "metrics.allocationsPodNames=true"))
    assert container["args"] == ["serve"]
    env = {k: v for k, v in env_of(container).items() if k.startswith(ENV_PREFIX)}
    serve = next(a for a in cli.build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    flags = {opt for action in serve._actions for opt in action.option_strings}
    to_flag = {k: "--" + k[len(ENV_PREFIX):].lower().replace("_", "-") for k in env}
    unknown = sorted(k for k, flag in to_flag.items() if flag not in flags)
    assert not unknown, f"variables without a serve flag: {unknown}"
    # The same values given as flags: argparse checks choices, the settings builders check the rest.
    argv = ["serve"]
    for key, value in env.items():
        if to_flag[key] in ("--node-labels", "--openmp-env", "--allocations-pod-names", "--shared-pool",
                            "--uniform-groups"):  # booleans
            argv.append(to_flag[key] if value == "true" else "--no-" + to_flag[key][2:])
        else:
            argv += [to_flag[key], value]
    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the env twins must parse too (booleans are read at parser build time)
    args = cli.build_parser().parse_args(argv)
    assert args.kubelet_dir == "/var/lib/kubelet/device-plugins"
    assert args.allocations_pod_names is True
    assert grouping_settings(args).exclude_polarization == frozenset({"vertical:low"})
    allocation_settings(args)


def test_image_tag_defaults_to_app_version_and_digest_wins(render: Render) -> None:
    assert agent_container(render())["image"] == "s390x-topology-agent:0.1.0"
    digest = "sha256:" + "a" * 64
    container = agent_container(render("--set", "image.repository=quay.io/x/agent", "--set", f"image.digest={digest}"))
    assert container["image"] == f"quay.io/x/agent@{digest}"


# ------------------------------------------------------------------------------------------------------ RBAC


EVICTION_RULE = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}


def test_rbac_is_get_and_patch_on_nodes_create_on_events_and_on_evictions_only(render: Render) -> None:
    docs = render()
    role = one(docs, "ClusterRole")
    # nodes/status: patch only, and only beside the node-restriction policy that holds it to lowering the agent's
    # own extended resources to zero (a hand-over to the other mode; test_node_policy_admits_only_our_...)
    # pods/eviction: create only, for a stranded holder's pod (strandedPolicy evict, the default; below)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
                             {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                             {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}, EVICTION_RULE]
    binding = one(docs, "ClusterRoleBinding")
    account = one(docs, "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "kube-system"}]
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    # The one Role: get on its own DaemonSet, to tell an uninstall from a rolling update (test_chart_uninstall.py).
    assert one(docs, "Role")["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets"],
                                           "resourceNames": [one(docs, "DaemonSet")["metadata"]["name"]],
                                           "verbs": ["get"]}]
    assert not {"Role", "RoleBinding"} & set(kinds(render("--set", "uninstall.cleanup=false")))


def test_no_rbac_without_node_labels(render: Render) -> None:
    assert not {"ClusterRole", "ClusterRoleBinding"} & set(kinds(render("--set", "agent.nodeLabels=false")))


@pytest.mark.parametrize(("args", "policy"), [
    ((), "evict"),
    (("--set", "strandedPolicy=keep"), "keep"),
    (("--set", "cpusetEnforcement=cri"), "evict"),
    (("--set", "cpusetEnforcement=nri"), "evict"),
    (("--set", "cpusetEnforcement=none"), None),
    (("--set", "agent.nodeLabels=false"), "keep"),  # no API access at all: it cannot evict, so it keeps
], ids=["default", "keep", "cri", "nri", "no-enforcement", "no-api-access"])
def test_stranded_policy_evict_grants_create_on_pods_eviction_only_where_the_agent_evicts(
        render: Render, args: tuple[str, ...], policy: str | None) -> None:
    """Issue 34: the agent evicts a stranded holder's pod (strandedPolicy evict) only with cpuset enforcement and
    API access; the ClusterRole grants pods/eviction exactly then, and the agent is told keep otherwise."""
    docs = render(*args)
    env = env_of(agent_container(docs))
    assert env.get("TOPOLOGY_AGENT_STRANDED_POLICY") == policy
    roles = kinds(docs).get("ClusterRole", [])
    rules = [r for role in roles for r in role["rules"] if "pods/eviction" in r["resources"]]
    assert rules == ([EVICTION_RULE] if policy == "evict" else [])
    assert not [r for role in roles for r in role["rules"] if set(r["resources"]) & {"pods", "pods/status"}]


def test_service_account_token_only_for_node_labels(render: Render) -> None:
    docs = render()
    assert one(docs, "ServiceAccount")["automountServiceAccountToken"] is True
    assert one(docs, "DaemonSet")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    docs = render("--set", "agent.nodeLabels=false")
    assert one(docs, "ServiceAccount")["automountServiceAccountToken"] is False
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    # No projected token volume sneaks in some other way either.
    assert not [v for v in pod["volumes"] if "projected" in v or "secret" in v]
    # Someone else's account (serviceAccount.create=false): the pod itself still refuses the token.
    docs = render("--set", "agent.nodeLabels=false", "--set", "serviceAccount.create=false",
                  "--set", "serviceAccount.name=shared")
    assert "ServiceAccount" not in kinds(docs)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "shared" and pod["automountServiceAccountToken"] is False


# ---------------------------------------------------------------------------------------------------- metrics


def test_service_monitor_off_by_default(render: Render) -> None:
    assert not {"ServiceMonitor", "Service"} & set(kinds(render()))


def test_service_monitor_when_enabled(render: Render) -> None:
    docs = render("--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.interval=15s",
                  "--set-json", 'metrics.serviceMonitor.labels={"release":"prometheus"}')
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kube-system"]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_allocations_name_no_pod_unless_asked(render: Render) -> None:
    assert env_of(agent_container(render()))["TOPOLOGY_AGENT_ALLOCATIONS_POD_NAMES"] == "false"
    env = env_of(agent_container(render("--set", "metrics.allocationsPodNames=true")))
    assert env["TOPOLOGY_AGENT_ALLOCATIONS_POD_NAMES"] == "true"


NETPOL_ARGS = ("--set", "networkPolicy.enabled=true",
               "--set-json", f"networkPolicy.scraper.namespaceSelector={SCRAPER_NS}",
               "--set-json", f"networkPolicy.scraper.podSelector={SCRAPER_POD}")


def agent_policy(docs: list[Doc]) -> Doc:
    """The agent's NetworkPolicy (the uninstall hook's pod has one of its own, tests/test_chart_uninstall.py)."""
    (policy,) = [d for d in kinds(docs).get("NetworkPolicy", []) if d["metadata"]["name"] == "t-s390x-topology-agent"]
    return policy


def test_network_policy_off_by_default(render: Render) -> None:
    assert "NetworkPolicy" not in kinds(render())


def test_network_policy_admits_only_the_scraper_to_the_metrics_port(render: Render) -> None:
    docs = render(*NETPOL_ARGS, "--set", "metrics.port=9555")
    policy = agent_policy(docs)
    assert policy["metadata"]["namespace"] == "kube-system"
    spec = policy["spec"]
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]  # egress stays open: the agent calls the API server
    (rule,) = spec["ingress"]
    # One peer with both selectors (AND), not two peers (OR: any pod of monitoring, or any prometheus anywhere).
    assert rule["from"] == [{"namespaceSelector": json.loads(SCRAPER_NS), "podSelector": json.loads(SCRAPER_POD)}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9555}]
    # That is the port the probes and the scraper use; the probes come from the pod's own node, which
    # NetworkPolicy always admits, so no rule names the kubelet.
    container = agent_container(docs)
    assert container["ports"][0]["containerPort"] == 9555
    assert container["readinessProbe"]["httpGet"]["port"] == container["ports"][0]["name"]


def test_network_policy_with_one_selector(render: Render) -> None:
    (rule,) = agent_policy(render("--set", "networkPolicy.enabled=true", "--set-json",
                         f"networkPolicy.scraper.podSelector={SCRAPER_POD}"))["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": json.loads(SCRAPER_POD)}]  # the release namespace only
    (rule,) = agent_policy(render("--set", "networkPolicy.enabled=true", "--set-json",
                         f"networkPolicy.scraper.namespaceSelector={SCRAPER_NS}"))["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": json.loads(SCRAPER_NS)}]


def test_network_policy_needs_a_scraper(template_error: Callable[..., str]) -> None:
    stderr = template_error("--set", "networkPolicy.enabled=true")
    assert "networkPolicy.scraper.namespaceSelector" in stderr and "to name the metrics scraper" in stderr


# ------------------------------------------------------------------------------------------ admission policy


REQUESTS, NODES = "topology-requests", "node-restriction"  # the two policies, by the suffix of their names


def policy_of(docs: list[Doc], which: str = REQUESTS) -> tuple[Doc, Doc]:
    """(ValidatingAdmissionPolicy, its binding) named <fullname>-<which>."""
    found = kinds(docs)
    (policy,) = [p for p in found.get("ValidatingAdmissionPolicy", []) if p["metadata"]["name"].endswith(which)]
    (binding,) = [b for b in found.get("ValidatingAdmissionPolicyBinding", [])
                  if b["spec"]["policyName"] == policy["metadata"]["name"]]
    return policy, binding


def policies(docs: list[Doc]) -> set[str]:
    """Which policies were rendered, each with its binding: {"topology-requests", "node-restriction"}."""
    found = kinds(docs)
    names = {p["metadata"]["name"] for p in found.get("ValidatingAdmissionPolicy", [])}
    bound = {b["spec"]["policyName"] for b in found.get("ValidatingAdmissionPolicyBinding", [])}
    assert names == bound, f"policies {names} and bindings {bound} differ"
    return {which for which in (REQUESTS, NODES) for name in names if name.endswith(which)}


BOTH = {REQUESTS, NODES}
LIVE = ("--api-versions", "apps/v1/DaemonSet")  # what `helm install` sees: discovery lists kinds, not only groups


def test_admission_policies_offline_follow_the_kubernetes_version(render: Render) -> None:
    """`helm template` knows no kinds: Kubernetes >= 1.30 (GA of admissionregistration.k8s.io/v1) decides."""
    assert policies(render(kube_version=NEWEST, vap=False)) == BOTH
    assert policies(render(kube_version=VAP_MIN, vap=False)) == BOTH
    assert policies(render(kube_version="1.29.15", vap=False)) == set()
    assert policies(render(kube_version=FLOOR, vap=False)) == set()


def test_admission_policies_trust_a_live_discovery(render: Render) -> None:
    """With kinds in the API list (a live cluster, or a GitOps tool passing them), the list alone decides."""
    assert policies(render(*LIVE, kube_version=NEWEST, vap=False)) == set()  # e.g. the API switched off
    assert policies(render(*LIVE, kube_version=NEWEST, vap=True)) == BOTH
    assert policies(render(kube_version="1.29.15", vap=True)) == BOTH  # told it is served: believed


def test_admission_policies_force_and_enabled(render: Render) -> None:
    assert policies(render("--set", "admissionPolicy.force=true", kube_version=FLOOR, vap=False)) == BOTH
    assert policies(render("--set", "admissionPolicy.force=true", *LIVE, kube_version=NEWEST, vap=False)) == BOTH
    assert policies(render("--set", "admissionPolicy.enabled=false")) == {NODES}
    assert policies(render("--set", "admissionPolicy.enabled=false", "--set", "admissionPolicy.force=true")) == {NODES}
    assert policies(render("--set", "nodeRestrictionPolicy.enabled=false")) == {REQUESTS}
    # No node labels: no RBAC and no token, so nothing to restrict.
    assert policies(render("--set", "agent.nodeLabels=false")) == {REQUESTS}


def test_admission_policy_shape(render: Render) -> None:
    policy, binding = policy_of(render())
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["prefix"] == "'topology/'"
    assert "initContainers" in variables["containers"]
    assert "startsWith(variables.prefix)).size() > 1" in variables["multipleResources"]
    assert "quantity(string(c.resources.requests['cpu'])).isInteger()" in variables["nonIntegerCpu"]
    assert "r.startsWith('topology/')" in spec["matchConditions"][0]["expression"]
    multiple, cpu = spec["validations"]
    assert multiple["expression"] == "variables.multipleResources.size() == 0"
    assert cpu["expression"] == "variables.nonIntegerCpu.size() == 0"
    for validation in (multiple, cpu):
        assert validation["reason"] == "Invalid"
        assert "\n" not in validation["message"]  # the API rejects line breaks in messages
    assert "only one topology/ resource" in multiple["message"]
    assert "split the work into one container per group" in multiple["message"]
    assert "whole number of CPUs" in cpu["message"] and 'such as "24"' in cpu["message"]


def test_admission_policy_follows_the_resource_prefix(render: Render) -> None:
    policy, _ = policy_of(render("--set", "agent.resourcePrefix=ibm.example.com"))
    text = json.dumps(policy)
    assert "'ibm.example.com/'" in text and "topology/" not in text


def test_admission_policy_actions_and_namespaces(render: Render) -> None:
    _, binding = policy_of(render("--set-json", 'admissionPolicy.validationActions=["Warn","Audit"]',
                                  "--set-json", 'admissionPolicy.namespaceSelector={"matchLabels":{"ai":"yes"}}'))
    assert binding["spec"]["validationActions"] == ["Warn", "Audit"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": {"ai": "yes"}}


# --- evaluating the CEL with cel-python

_SUFFIX = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
           "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
           "P": Decimal("1e15"), "E": Decimal("1e18"), "Ki": Decimal(2**10), "Mi": Decimal(2**20),
           "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60)}
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


def parse_quantity(text: str) -> Decimal | None:
    """Kubernetes resource.Quantity syntax (enough of it for the policy): None when not a quantity."""
    m = _QUANTITY.match(text)
    if not m:
        return None
    try:
        number = Decimal(m.group(1))
        return number * Decimal("1" + m.group(2)) if m.group(2) else number * _SUFFIX[m.group(3) or ""]
    except InvalidOperation:
        return None


@pytest.fixture(scope="session")
def cel() -> Callable[[str, dict[str, Any]], Any]:
    """cel(expression, activation) with the Kubernetes functions the policy uses (quantity, join)."""
    try:
        import celpy
        from celpy import celtypes
    except ImportError:
        missing("cel-python", "pip install cel-python; it evaluates the admission policy's CEL")

    def is_quantity(s: Any) -> Any:
        return celtypes.BoolType(parse_quantity(str(s)) is not None)

    def quantity(s: Any) -> Any:
        if parse_quantity(str(s)) is None:
            raise ValueError(f"quantity: {s!r} is not a quantity")
        return celtypes.StringType(str(s))

    def is_integer(q: Any) -> Any:
        value = parse_quantity(str(q))
        return celtypes.BoolType(value is not None and value == value.to_integral_value() and abs(value) < 2**63)

    def as_integer(q: Any) -> Any:
        value = parse_quantity(str(q))
        if value is None or value != value.to_integral_value():
            raise ValueError(f"asInteger: {q!r} is not an integer")
        return celtypes.IntType(int(value))

    def join(items: Any, sep: Any = "") -> Any:
        return celtypes.StringType(str(sep).join(str(i) for i in items))

    functions = {"isQuantity": is_quantity, "quantity": quantity, "isInteger": is_integer,
                 "asInteger": as_integer, "join": join}
    env = celpy.Environment()

    def evaluate(expression: str, activation: dict[str, Any]) -> Any:
        program = env.program(env.compile(expression), functions=functions)
        result = program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})  # type: ignore[attr-defined]
        if isinstance(result, Exception):
            raise result
        return result

    return evaluate


@pytest.fixture(scope="session")
def admit(render: Render, cel: Callable[[str, dict[str, Any]], Any]) -> Callable[..., list[str]]:
    """admit(pod, prefix=None) -> the messages of the failed validations ([] = admitted), as the API server would."""

    @functools.cache
    def policy_spec(prefix: str | None) -> Doc:
        args = ("--set", f"agent.resourcePrefix={prefix}") if prefix else ()
        return policy_of(render(*args))[0]["spec"]

    def _admit(pod: Doc, prefix: str | None = None) -> list[str]:
        spec = policy_spec(prefix)
        activation: dict[str, Any] = {"object": pod}
        if not all(bool(cel(c["expression"], activation)) for c in spec["matchConditions"]):
            return []
        variables: dict[str, Any] = {}
        for var in spec["variables"]:  # in order: later ones use earlier ones
            value = cel(var["expression"], {"object": pod, "variables": variables})
            variables[var["name"]] = json.loads(json.dumps(value, default=_cel_to_json))
        failures = []
        for validation in spec["validations"]:
            act = {"object": pod, "variables": variables}
            if not bool(cel(validation["expression"], act)):
                failures.append(str(cel(validation["messageExpression"], act)))
        return failures

    return _admit


def _cel_to_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    if isinstance(value, list | tuple):
        return list(value)
    return str(value)


def _cel_plain(value: Any) -> Any:
    """A CEL value as plain JSON data, booleans kept (celpy's BoolType is an int: JSON would make it 1)."""
    from celpy import celtypes

    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, dict):
        return {str(k): _cel_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cel_plain(v) for v in value]
    return json.loads(json.dumps(value, default=_cel_to_json))


def pod(*containers: Doc, init: list[Doc] | None = None) -> Doc:
    spec: Doc = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def container(name: str, **requests: str) -> Doc:
    """A container as admission sees it: the API server has already copied limits into missing requests."""
    c: Doc = {"name": name, "image": "vllm-cpu"}
    if requests:
        reqs = {k.replace("__", "/").replace("_", "."): v for k, v in requests.items()}
        c["resources"] = {"requests": reqs, "limits": dict(reqs)}
    return c


def test_cel_admits_one_resource_with_integer_cpu(admit: Callable[..., list[str]]) -> None:
    assert admit(pod(container("llm", cpu="8", memory="16Gi", topology__book="1"))) == []
    assert admit(pod(container("llm", cpu="16", topology__socket="2"))) == []
    assert admit(pod(container("llm", cpu="2k", topology__book="1"))) == []  # canonical form of 2000


def test_cel_ignores_pods_without_topology_resources(admit: Callable[..., list[str]]) -> None:
    assert admit(pod(container("web", cpu="250m", memory="64Mi"))) == []
    assert admit(pod(container("bare"))) == []
    assert admit(pod(container("other", cpu="500m", example_com__gpu="2"))) == []


def test_cel_rejects_two_topology_resources(admit: Callable[..., list[str]]) -> None:
    failures = admit(pod(container("sidecar", cpu="1"), container("llm", cpu="8", topology__book="1",
                                                                   topology__socket="1")))
    assert len(failures) == 1
    assert failures[0].startswith("container(s) llm request more than one topology/ resource")
    assert "split the work into one container per group" in failures[0]


def test_cel_rejects_topology_resource_without_integer_cpu(admit: Callable[..., list[str]]) -> None:
    for cpu in (None, "1500m", "0.5", "0"):
        requests = {"topology__book": "1", **({"cpu": cpu} if cpu else {})}
        failures = admit(pod(container("llm", memory="1Gi", **requests)))
        assert len(failures) == 1, (cpu, failures)
        assert failures[0].startswith("container(s) llm request a topology/ resource without an integer cpu")
        assert 'such as "24"' in failures[0] and "and no cpu limit" in failures[0]
        assert "limits.cpu" not in failures[0]  # a cpu limit equal to the request would make the pod Guaranteed


def test_cel_checks_init_containers_and_names_every_offender(admit: Callable[..., list[str]]) -> None:
    failures = admit(pod(container("a", topology__book="1", topology__socket="1"),
                         init=[container("warmup", cpu="1", topology__book="1", topology__drawer="1")]))
    assert failures[0].startswith("container(s) a, warmup request more than one topology/ resource")
    assert failures[1].startswith("container(s) a request a topology/ resource without an integer cpu")


def test_cel_uses_the_configured_prefix(admit: Callable[..., list[str]]) -> None:
    two = pod(container("llm", cpu="500m", topology__book="1", topology__socket="1"))
    assert admit(two, prefix="ibm.example.com") == []  # topology/ is someone else's resource now
    mine = pod(container("llm", cpu="8", ibm_example_com__book="1", ibm_example_com__socket="1"))
    assert admit(mine, prefix="ibm.example.com")[0].startswith(
        "container(s) llm request more than one ibm.example.com/ resource")


# --- the node-restriction policy: its shape, then its CEL evaluated as the API server would

AGENT_USER = "system:serviceaccount:kube-system:t-s390x-topology-agent"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
OURS = "topology.s390x.ibm.com/"


def test_node_restriction_policy_shape(render: Render) -> None:
    from agent.node.labels import KEY_PREFIX

    docs = render()
    policy, binding = policy_of(docs, NODES)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"  # RBAC alone grants patch on every Node: fail closed
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes", "nodes/status"]}]
    account = one(docs, "ServiceAccount")["metadata"]
    assert spec["matchConditions"] == [{"name": "is-the-agent", "expression":
                                        f"request.userInfo.username == 'system:serviceaccount:{account['namespace']}"
                                        f":{account['name']}'"}]
    assert {v["name"]: v["expression"] for v in spec["variables"]}["prefix"] == f"'{KEY_PREFIX}'"
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # Nodes are cluster-scoped: no namespace to select
    for validation in spec["validations"]:
        assert validation["reason"] == "Forbidden"
        assert "\n" not in validation["message"]
    # The user it matches follows the release namespace and the account name.
    policy, _ = policy_of(render("-n", "z-system", "--set", "serviceAccount.name=topo"), NODES)
    assert "'system:serviceaccount:z-system:topo'" in policy["spec"]["matchConditions"][0]["expression"]


def test_node_restriction_policy_sits_beside_a_patch_only_nodes_role(render: Render) -> None:
    """The policy covers what the role grants on nodes and their status: UPDATE (PATCH); events can only be
    created. Without the policy there is no patch on the status at all (it would be every Node's, unbounded)."""
    rule, status, events = one(render("--set", "strandedPolicy=keep"), "ClusterRole")["rules"]
    assert rule["resources"] == ["nodes"] and set(rule["verbs"]) <= {"get", "patch"}
    assert status["resources"] == ["nodes/status"] and status["verbs"] == ["patch"]
    assert events["resources"] == ["events"] and events["verbs"] == ["create"]
    unguarded = one(render("--set", "nodeRestrictionPolicy.enabled=false"), "ClusterRole")["rules"]
    assert not [r for r in unguarded if "nodes/status" in r["resources"]]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the agent sends: application/merge-patch+json)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


NODE: Doc = {
    "apiVersion": "v1", "kind": "Node",
    "metadata": {
        "name": "z1", "uid": "0f8a", "resourceVersion": "4711",
        "labels": {"kubernetes.io/hostname": "z1", "kubernetes.io/arch": "s390x", "pool": "inference",
                   f"{OURS}books": "4", f"{OURS}drawers": "2"},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0", f"{OURS}topology": '{"books":4}'},
        "managedFields": [{"manager": "kubelet", "operation": "Update"}],
    },
    "spec": {"podCIDR": "10.244.1.0/24", "taints": [{"key": "ibm.com/z", "effect": "NoSchedule"}]},
    "status": {"allocatable": {"cpu": "32", "topology/book": "4"},
               "conditions": [{"type": "Ready", "status": "True"}]},
}


def changed(patch: Doc, base: Doc = NODE) -> Doc:
    return merge_patch(json.loads(json.dumps(base)), patch)


def agent(node: str | None = "z1", *, extra: dict[str, list[str]] | None = None,
          user: str = AGENT_USER) -> Doc:
    """request.userInfo of a pod-bound token (node-name extra) or of a token without it (node=None)."""
    info: Doc = {"username": user, "uid": "6a1c",
                 "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}
    info_extra = dict(extra or {})
    if node is not None:
        info_extra |= {NODE_NAME_KEY: [node], "authentication.kubernetes.io/pod-name": ["t-agent-x2k"]}
    if info_extra:
        info["extra"] = info_extra  # the API server omits an empty extra (omitempty)
    return info


@pytest.fixture(scope="session")
def node_update(render: Render, cel: Callable[[str, dict[str, Any]], Any]) -> Callable[..., list[str]]:
    """node_update(new, old=NODE, user=agent()) -> the failed validations' messages ([] = admitted)."""
    spec = policy_of(render(), NODES)[0]["spec"]

    def _update(new: Doc, old: Doc = NODE, user: Doc | None = None, subresource: str = "") -> list[str]:
        request = {"operation": "UPDATE", "kind": {"group": "", "version": "v1", "kind": "Node"},
                   "name": new["metadata"]["name"], "userInfo": user if user is not None else agent()}
        if subresource:  # the API server leaves an empty subResource out of the request (omitempty)
            request["subResource"] = subresource
        base = {"object": new, "oldObject": old, "request": request}
        if not all(bool(cel(c["expression"], base)) for c in spec["matchConditions"]):
            return []
        variables: dict[str, Any] = {}
        for var in spec["variables"]:
            value = cel(var["expression"], {**base, "variables": variables})
            variables[var["name"]] = _cel_plain(value)
        failures = []
        for validation in spec["validations"]:
            act = {**base, "variables": variables}
            if not bool(cel(validation["expression"], act)):
                expression = validation.get("messageExpression")
                failures.append(str(cel(expression, act)) if expression else validation["message"])
        return failures

    return _update


def test_node_policy_admits_our_keys_on_our_node(node_update: Callable[..., list[str]]) -> None:
    assert node_update(changed({"metadata": {"labels": {f"{OURS}books": "3"}}})) == []
    assert node_update(changed({"metadata": {"labels": {f"{OURS}smt": "2"},
                                             "annotations": {f"{OURS}topology": '{"books":3}'}}})) == []
    # Removing our own keys is allowed too (the agent drops a level that disappeared).
    assert node_update(changed({"metadata": {"labels": {f"{OURS}drawers": None}}})) == []
    assert node_update(changed({"metadata": {"annotations": {f"{OURS}topology": None}}})) == []
    # A node without any label or annotation yet.
    bare = changed({"metadata": {"labels": None, "annotations": None}})
    assert node_update(changed({"metadata": {"labels": {f"{OURS}books": "4"}}}, bare), old=bare) == []
    # Fields the API server maintains itself on every write are not the agent's doing.
    assert node_update(changed({"metadata": {"resourceVersion": "4712", "labels": {f"{OURS}books": "3"},
                                             "managedFields": [{"manager": "topology-agent"}]}})) == []


def test_node_policy_admits_the_agents_own_patch(node_update: Callable[..., list[str]]) -> None:
    """The body NodeLabeler really sends, applied as a merge patch, passes: the policy fits the agent."""
    from types import SimpleNamespace

    from agent.node.labeler import NodeLabeler
    from agent.node.labels import node_annotations, node_labels
    from agent.policy.grouping import group_topology
    from agent.topology.embedded import load_embedded

    bodies: list[Doc] = []
    meta = NODE["metadata"]
    api = SimpleNamespace(
        node_metadata=lambda name, timeout: (dict(meta["labels"]), dict(meta["annotations"])),
        patch_node=lambda name, body, timeout: bodies.append(body))
    topology = load_embedded("z16-lpar")
    grouping = group_topology(topology)
    labeler = NodeLabeler("z1", api)  # a stand-in for the API server
    assert labeler.sync(node_labels(topology, grouping, "none"), node_annotations(topology, grouping))
    (body,) = bodies
    assert f"{OURS}drawers" in body["metadata"]["labels"]  # stale: the patch removes it (null)
    assert node_update(changed(body)) == []


def test_node_policy_denies_another_node(node_update: Callable[..., list[str]]) -> None:
    other = changed({"metadata": {"name": "z2", "labels": {f"{OURS}books": "3"}}})
    assert node_update(other, old=changed({"metadata": {"name": "z2"}})) == [
        "the topology agent running on node z1 may not update Node z2: only its own"]


def test_node_policy_denies_foreign_labels_and_annotations(node_update: Callable[..., list[str]]) -> None:
    for patch, key in [({"labels": {"pool": "batch"}}, "pool"),  # changed
                       ({"labels": {"pool": None}}, "pool"),  # removed
                       ({"labels": {"node-role.kubernetes.io/gpu": ""}}, "node-role.kubernetes.io/gpu"),  # added
                       ({"labels": {"topology.s390x.ibm.com": "x"}}, "topology.s390x.ibm.com"),  # no slash: not ours
                       ({"labels": {"topology.s390x.ibm.com.evil/books": "1"}}, "topology.s390x.ibm.com.evil/books")]:
        failures = node_update(changed({"metadata": patch}))
        assert failures == [f"the topology agent may only change {OURS} labels, not {key}"], patch
    for patch, key in [({"annotations": {"node.alpha.kubernetes.io/ttl": "30"}}, "node.alpha.kubernetes.io/ttl"),
                       ({"annotations": {"node.alpha.kubernetes.io/ttl": None}}, "node.alpha.kubernetes.io/ttl"),
                       ({"annotations": {"example.com/owner": "me"}}, "example.com/owner")]:
        failures = node_update(changed({"metadata": patch}))
        assert failures == [f"the topology agent may only change {OURS} annotations, not {key}"], patch
    # Ours and a foreign key in one patch: the whole request is denied, naming only the foreign key.
    both = changed({"metadata": {"labels": {f"{OURS}books": "3", "pool": None, "zone": "a"}}})
    assert node_update(both) == [f"the topology agent may only change {OURS} labels, not zone, pool"]


def test_node_policy_denies_spec_status_finalizers_and_owners(node_update: Callable[..., list[str]]) -> None:
    prefix = f"the topology agent may only change {OURS} labels and annotations of its Node, not "
    cases: list[tuple[Doc, str]] = [
        ({"spec": {"taints": [{"key": "ibm.com/z", "effect": "NoSchedule"},
                              {"key": "evil", "effect": "NoExecute"}]}}, "spec"),
        ({"spec": {"taints": None}}, "spec"),
        ({"spec": {"unschedulable": True}}, "spec"),
        ({"spec": {"podCIDR": "10.244.9.0/24"}}, "spec"),
        ({"status": {"allocatable": {"cpu": "32", "topology/book": "40"}}}, "status"),
        ({"metadata": {"finalizers": ["example.com/hold"]}}, "metadata.finalizers"),
        ({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "1"}]}},
         "metadata.ownerReferences"),
    ]
    for patch, what in cases:
        assert node_update(changed(patch)) == [prefix + what], patch
    # Riding along with a legitimate label change does not help.
    sneaky = changed({"metadata": {"labels": {f"{OURS}books": "3"}}, "spec": {"unschedulable": True}})
    assert node_update(sneaky) == [prefix + "spec"]
    everything = changed({"metadata": {"finalizers": ["f"]}, "spec": {"unschedulable": True}, "status": {"x": "y"}})
    assert node_update(everything) == [prefix + "spec, status, metadata.finalizers"]


def test_node_policy_admits_only_our_allocatable_lowered_to_zero_in_the_status(
        node_update: Callable[..., list[str]]) -> None:
    """A hand-over to the other mode (agent/node/handover.py): the agent's own merge patch of its Node's status, and
    nothing else there."""
    from agent.policy.allocatable import zero_patch

    assert node_update(changed(zero_patch(["topology/book"])), subresource="status") == []
    assert node_update(changed(zero_patch(["topology/book", "topology/socket"])), subresource="status") == []
    prefix = "in its Node's status the topology agent may only lower the allocatable of topology/ resources to 0, not "
    cases: list[tuple[Doc, str]] = [
        ({"status": {"allocatable": {"topology/book": "40"}}}, "status.allocatable[topology/book]"),  # raised
        ({"status": {"allocatable": {"topology/book": None}}}, "status.allocatable[topology/book]"),  # removed
        ({"status": {"allocatable": {"cpu": "0"}}}, "status.allocatable[cpu]"),  # not ours
        ({"status": {"allocatable": {"example.com/gpu": "0"}}}, "status.allocatable[example.com/gpu]"),
        ({"status": {"capacity": {"topology/book": "0"}}}, "status.capacity"),
        ({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, "status.conditions"),
        ({"status": {"declaredFeatures": ["x"]}}, "status.declaredFeatures"),  # a field newer than the chart too
        ({"status": {"conditions": None}}, "status.conditions"),
    ]
    for patch, what in cases:
        assert node_update(changed(patch), subresource="status") == [prefix + what], patch
    sneaky = changed({"status": {"allocatable": {"topology/book": "0"}, "conditions": []}})
    assert node_update(sneaky, subresource="status") == [prefix + "status.conditions"]
    other = changed({"metadata": {"name": "z2"}, **zero_patch(["topology/book"])})
    assert node_update(other, old=changed({"metadata": {"name": "z2"}}), subresource="status") == [
        "the topology agent running on node z1 may not update Node z2: only its own"]
    # The main resource still refuses any status change, the zero included.
    assert node_update(changed(zero_patch(["topology/book"]))) == [
        f"the topology agent may only change {OURS} labels and annotations of its Node, not status"]


def test_node_policy_denies_a_token_without_the_node_name(node_update: Callable[..., list[str]]) -> None:
    ours = changed({"metadata": {"labels": {f"{OURS}books": "3"}}})
    no_node = ("no node association found for the topology agent's ServiceAccount: its token must be bound to a pod"
               " on a node")
    for user in (agent(None),  # no extra at all (a TokenRequest without a bound pod, or the gate off)
                 agent(None, extra={"authentication.kubernetes.io/pod-name": ["t-agent-x2k"]}),
                 agent(None, extra={NODE_NAME_KEY: []})):
        failures = node_update(ours, user=user)
        assert len(failures) == 1 and failures[0].startswith(no_node), (user, failures)


def test_node_policy_leaves_other_users_alone(node_update: Callable[..., list[str]]) -> None:
    """Only the agent's account is evaluated: kubelets, controllers and admins are not this policy's business."""
    taint_everything = changed({"metadata": {"name": "z2", "labels": {"pool": None}}, "spec": {"unschedulable": True}})
    for user in ("system:node:z1", "system:serviceaccount:kube-system:node-controller", "kubernetes-admin",
                 "system:serviceaccount:other-ns:t-s390x-topology-agent"):
        assert node_update(taint_everything, user=agent(None, user=user)) == []


# ---------------------------------------------------------------------------- helm install against a fake API

# The kinds the chart renders, as a 1.30+ API server lists them in discovery: (group/version, resource, kind,
# namespaced). A cluster below 1.30 serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy.
_API = [
    ("v1", "namespaces", "Namespace", False), ("v1", "nodes", "Node", False), ("v1", "secrets", "Secret", True),
    ("v1", "serviceaccounts", "ServiceAccount", True), ("v1", "configmaps", "ConfigMap", True),
    ("v1", "services", "Service", True), ("apps/v1", "daemonsets", "DaemonSet", True),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ("rbac.authorization.k8s.io/v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True),
    ("batch/v1", "jobs", "Job", True),
    ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True),
    ("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", False),
    ("admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
     False),
]


@dataclass
class FakeCluster:
    """What the fake API server answers: a Kubernetes version and namespaces (name -> labels)."""

    minor: int = 34
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)

    def resources(self) -> list[tuple[str, str, str, bool]]:
        return [r for r in _API if self.minor >= 30 or not r[2].startswith("ValidatingAdmissionPolicy")]

    def answer(self, path: str) -> tuple[int, Doc]:
        if path == "/version":
            return 200, {"major": "1", "minor": str(self.minor), "gitVersion": f"v1.{self.minor}.0",
                         "platform": "linux/s390x"}
        groups: dict[str, list[tuple[str, str, str, bool]]] = {}
        for r in self.resources():
            groups.setdefault(r[0], []).append(r)
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                 "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}}
                for gv in groups if "/" in gv]}
        for gv, resources in groups.items():
            if path == ("/api/v1" if gv == "v1" else f"/apis/{gv}"):
                return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": [
                    {"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
                     "verbs": ["get", "list", "create", "update", "patch", "delete"]}
                    for _, name, kind, namespaced in resources]}
        match = re.fullmatch(r"/api/v1/namespaces/([^/]+)", path)
        if match and match.group(1) in self.namespaces:
            return 200, {"kind": "Namespace", "apiVersion": "v1",
                         "metadata": {"name": match.group(1), "labels": self.namespaces[match.group(1)]}}
        if path.endswith("/secrets"):  # Helm's release storage: no releases yet
            return 200, {"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": []}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                     "message": f"{path} not found"}


@dataclass
class Installed:
    manifest: list[Doc]
    notes: str


@pytest.fixture(scope="session")
def fake_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeCluster, Path]]:
    """A fake API server on 127.0.0.1 and a kubeconfig for it; tests set the cluster's state before use."""
    cluster = FakeCluster()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            code, body = cluster.answer(self.path.split("?", 1)[0])
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    home = tmp_path_factory.mktemp("fake-api")
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "admin", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "admin"}}],
    }))
    yield cluster, kubeconfig
    server.shutdown()
    server.server_close()


@pytest.fixture
def install(helm: str, fake_api: tuple[FakeCluster, Path]) -> Callable[..., Installed]:
    """install(*helm_args, minor=34, namespaces={...}) -> what `helm install --dry-run=server` would create."""
    cluster, kubeconfig = fake_api

    def _install(*args: str, minor: int = 34, namespaces: dict[str, dict[str, str]] | None = None) -> Installed:
        cluster.minor = minor
        cluster.namespaces = dict(namespaces or {})
        home = kubeconfig.parent
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env |= {"KUBECONFIG": str(kubeconfig), "HELM_CACHE_HOME": str(home / "cache"),
                "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
        # --disable-openapi-validation: the fake server has no OpenAPI documents (kubernetes-validate checks schemas).
        cmd = [helm, *args, "--dry-run=server", "--disable-openapi-validation", "-o", "json"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)
        assert result.returncode == 0, result.stderr
        release = json.loads(result.stdout)
        return Installed([d for d in yaml.safe_load_all(release["manifest"]) if d], release["info"]["notes"])

    return _install


def chart_install(*args: str) -> tuple[str, ...]:
    return ("install", "t", str(CHART), *args)


PRIVILEGED = {"pod-security.kubernetes.io/enforce": "privileged"}


def test_notes_say_nothing_about_pod_security_where_the_namespace_is_privileged(
        install: Callable[..., Installed]) -> None:
    notes = install(*chart_install("-n", "topo"), namespaces={"topo": PRIVILEGED}).notes
    assert "POD SECURITY" not in notes and "privileged" not in notes


def test_notes_warn_when_the_namespace_enforces_a_lower_level(install: Callable[..., Installed]) -> None:
    for level in ("baseline", "restricted"):
        notes = install(*chart_install("-n", "topo"), namespaces={
            "topo": {"pod-security.kubernetes.io/enforce": level, "kubernetes.io/metadata.name": "topo"}}).notes
        assert f'The namespace topo enforces "{level}": the API server will refuse every agent pod' in notes
        assert "kubectl label namespace topo pod-security.kubernetes.io/enforce=privileged --overwrite" in notes


def test_notes_explain_an_unlabelled_namespace(install: Callable[..., Installed]) -> None:
    notes = install(*chart_install("-n", "kube-system"), namespaces={"kube-system": {}}).notes
    assert "The namespace kube-system has no pod-security.kubernetes.io/enforce label" in notes
    assert "kubectl label namespace kube-system pod-security.kubernetes.io/enforce=privileged" in notes


def test_notes_ask_for_privileged_when_the_namespace_cannot_be_read(install: Callable[..., Installed]) -> None:
    notes = install(*chart_install("-n", "new-ns", "--create-namespace"), namespaces={}).notes
    assert 'the agent needs the "privileged" Pod Security level' in notes
    assert "Helm could not read the namespace new-ns" in notes
    assert "kubectl label namespace new-ns pod-security.kubernetes.io/enforce=privileged --overwrite" in notes


def test_a_live_cluster_below_1_30_gets_no_policies_and_a_warning(install: Callable[..., Installed]) -> None:
    old = install(*chart_install("-n", "topo"), minor=29, namespaces={"topo": PRIVILEGED})
    assert policies(old.manifest) == set()
    assert "WARNING: no node-restriction policy was rendered" in old.notes
    assert "may patch every Node of the cluster" in old.notes
    new = install(*chart_install("-n", "topo"), minor=30, namespaces={"topo": PRIVILEGED})
    assert policies(new.manifest) == BOTH
    assert "lets each agent update only its own Node" in new.notes and "WARNING" not in new.notes


def test_notes_list_what_to_check(install: Callable[..., Installed]) -> None:
    notes = install(*chart_install("-n", "topo", "--set", "metrics.port=9555"), namespaces={"topo": PRIVILEGED}).notes
    assert "kubectl -n topo rollout status daemonset/t-s390x-topology-agent" in notes
    assert "get pods -l app.kubernetes.io/name=s390x-topology-agent,app.kubernetes.io/instance=t -o wide" in notes
    assert "kubectl get nodes -l kubernetes.io/arch=s390x" in notes
    assert "{.status.allocatable}" in notes and "topology/book" in notes
    assert "curl localhost:9555/readyz" in notes
    assert "kubectl get nodes -L topology.s390x.ibm.com/machine" in notes
    assert "seccomp-profile" not in notes and "NetworkPolicy" not in notes
    notes = install(*chart_install("-n", "topo", *NETPOL_ARGS, "--set", "seccompProfile.install=true",
                                   "--set", "agent.nodeLabels=false"), namespaces={"topo": PRIVILEGED}).notes
    assert "kubectl -n topo logs <agent pod> -c seccomp-profile" in notes
    assert "/var/lib/kubelet/seccomp/profiles/vllm-numa.json" in notes
    assert "localhostProfile: profiles/vllm-numa.json" in notes
    assert "The NetworkPolicy t-s390x-topology-agent admits only the scraper to port 9400" in notes
    assert "topology.s390x.ibm.com/machine" not in notes and "node-restriction" not in notes


# --- the install path (docs/admin/install.md, and the README's five-minute copy), without a registry and a cluster

README_DIGEST = "sha256:" + "0123456789abcdef" * 4  # what `docker buildx imagetools inspect` would print
INSTALL_DOC = REPO / "docs" / "admin" / "install.md"
README = REPO / "README.md"


def install_block(text: str, heading: str) -> str:
    """The first ```sh block after ``heading``."""
    section = text[text.index(heading):]
    start = section.index("```sh\n") + 6
    return section[start:section.index("\n```", start)]


def readme_install_commands() -> tuple[dict[str, str], list[list[str]]]:
    """The shell block of docs/admin/install.md "## Installing": its variables and its commands, expanded as sh
    would. The README's five-minute install is the same block, word for word.

    $(...) substitutions are the registry's answer, which no test has: DIGEST gets README_DIGEST.
    """
    block = install_block(INSTALL_DOC.read_text(encoding="utf-8"), "## Installing\n")
    assert install_block(README.read_text(encoding="utf-8"), "## Five-minute install\n") == block
    variables: dict[str, str] = {}

    def expand(word: str) -> str:
        return re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: variables[m.group(1)], word)

    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        assignment = re.fullmatch(r"([A-Z_]+)=(.*)", line.strip())
        if assignment:
            name, value = assignment.group(1), assignment.group(2)
            variables[name] = (README_DIGEST if value.startswith("$(")
                               else expand(shlex.split(value, comments=True)[0]))
            continue
        commands.append([expand(word) for word in shlex.split(line, comments=True)])
    return variables, commands


def readme_helm_install() -> list[str]:
    (install,) = [c for c in readme_install_commands()[1] if c[:2] == ["helm", "install"]]
    return install


def test_readme_install_renders_the_pushed_image_by_digest(helm: str) -> None:
    variables, _ = readme_install_commands()
    args = readme_helm_install()
    repository = f"{variables['REGISTRY']}/s390x-topology-agent"
    assert f"image.repository={repository}" in args and f"image.digest={README_DIGEST}" in args
    # The digest is read from the very image the chart is pointed at (the manifest list make image pushed).
    assert 'DIGEST=$(docker buildx imagetools inspect "$REGISTRY/s390x-topology-agent:$TAG"' in INSTALL_DOC.read_text()
    # The documented exact flags, only `install` turned into `template`, run from the repository root as written.
    result = subprocess.run([helm, "template", *args[2:], "--set", "seccompProfile.install=true"], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    expected = f"{repository}@{README_DIGEST}"
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["containers"] + pod["initContainers"]] == [expected, expected]
    assert one(docs, "DaemonSet")["metadata"]["namespace"] == args[args.index("-n") + 1]


def test_readme_install_path_against_a_fake_cluster(install: Callable[..., Installed]) -> None:
    """The documented namespace and label, then its exact `helm install`: no Pod Security warning, the image."""
    variables, commands = readme_install_commands()
    (label,) = [c for c in commands if c[:3] == ["kubectl", "label", "namespace"]]
    namespace = label[3]
    assert ["kubectl", "create", "namespace", namespace] in commands
    labels = dict(pair.split("=", 1) for pair in label[4:])
    args = readme_helm_install()
    released = install(*args[1:], namespaces={namespace: labels})
    expected = f"{variables['REGISTRY']}/s390x-topology-agent@{README_DIGEST}"
    assert agent_container(released.manifest)["image"] == expected
    assert f"(image {expected})" in released.notes
    assert "POD SECURITY" not in released.notes
    assert policies(released.manifest) == BOTH


def test_readme_tag_alternative(render: Render) -> None:
    variables, _ = readme_install_commands()
    assert '`--set image.tag="$TAG"` instead of the digest' in INSTALL_DOC.read_text(encoding="utf-8")
    container = agent_container(render("--set", f"image.repository={variables['REGISTRY']}/s390x-topology-agent",
                                       "--set", f"image.tag={variables['TAG']}"))
    assert container["image"] == f"{variables['REGISTRY']}/s390x-topology-agent:{variables['TAG']}"


# --------------------------------------------------------------------------------------------- fake topology


def test_fake_topology_mode(render: Render) -> None:
    docs = render(*FAKE_ARGS, "--set-json", 'nodeSelector={"kubernetes.io/arch":"s390x","pool":"e2e"}')
    config_map = one(docs, "ConfigMap")
    assert sorted(config_map["data"]) == ["default.json", "worker2.json"]
    from agent.topology import snapshot_format as snapshot

    topology = snapshot.loads(config_map["data"]["default.json"])  # a valid snapshot survives templating
    assert topology == snapshot.load(REPO / "agent/data/z16-lpar.json")
    ds = one(docs, "DaemonSet")
    pod_spec = ds["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"pool": "e2e"}  # only the arch key is dropped
    mounts = mounts_of(docs)
    mount, volume = mounts["fake-topology"]
    assert mount["readOnly"] is True
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert "host-sys" not in mounts
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_TOPOLOGY_FILE"] == mount["mountPath"]
    assert "TOPOLOGY_AGENT_HOST_ROOT" not in env
    assert "checksum/fake-topology" in ds["spec"]["template"]["metadata"]["annotations"]
    assert "device-plugins" in mounts  # the kubelet side stays real


def test_fake_topology_without_arch_selector_default(render: Render) -> None:
    pod_spec = one(render(*FAKE_ARGS), "DaemonSet")["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod_spec


def test_fake_topology_needs_snapshots(template_error: Callable[..., str]) -> None:
    stderr = template_error("--set", "fakeTopology.enabled=true")
    assert "fakeTopology.snapshots" in stderr


# ---------------------------------------------------------------------------------------------- schema


@pytest.mark.parametrize("args, field", [
    (("--set", "metrics.port=0"), "port"),
    (("--set", "metrics.port=65536"), "port"),
    (("--set", "metrics.port=http"), "port"),
    (("--set", "agent.logLevel=verbose"), "logLevel"),
    (("--set", "agent.logFormat=xml"), "logFormat"),
    (("--set", "agent.levels=books"), "levels"),
    (("--set", "agent.levels=book\\,\\,socket"), "levels"),
    (("--set", "agent.levels=auto\\,book"), "levels"),
    (("--set", "agent.reserveCoresPerGroup=-1"), "reserveCoresPerGroup"),
    (("--set", "agent.reserveCoresPerGroup=1.5"), "reserveCoresPerGroup"),
    (("--set", "agent.ompThreadsPerCore=3"), "ompThreadsPerCore"),
    (("--set-string", "agent.ompThreadsPerCore=2"), "ompThreadsPerCore"),
    (("--set", "agent.nodeLabels=yes"), "nodeLabels"),
    (("--set", "agent.reservedCpus=0-a"), "reservedCpus"),
    (("--set", "agent.resourcePrefix=Topology_"), "resourcePrefix"),
    (("--set", "agent.resourcePrefix=kubernetes.io"), "resourcePrefix"),
    (("--set-json", 'agent.excludePolarization=["vertical:sideways"]'), "excludePolarization"),
    (("--set", "agent.excludePolarization=unknown"), "excludePolarization"),
    (("--set", "agent.source=procfs"), "source"),
    (("--set", "agent.rescanInterval=-1"), "rescanInterval"),
    (("--set", "agent.podResourcesInterval=soon"), "podResourcesInterval"),
    (("--set", "kubelet.readState=yes"), "readState"),
    (("--set", "agent.bogus=1"), "bogus"),
    (("--set", "kubelet.root=var/lib/kubelet"), "root"),
    (("--set", "fakeTopology.enabled=1"), "enabled"),
    (("--set", "fakeTopology.snapshots.node1=x"), "snapshots"),
    (("--set-json", 'admissionPolicy.validationActions=["Deny","Warn"]'), "validationActions"),
    (("--set", "admissionPolicy.failurePolicy=Maybe"), "failurePolicy"),
    (("--set", "updateStrategy.maxUnavailable=0"), "maxUnavailable"),
    (("--set", "image.digest=latest"), "digest"),
    (("--set", "metrics.allocationsPodNames=yes"), "allocationsPodNames"),
    (("--set", "nodeRestrictionPolicy.enabled=1"), "enabled"),
    (("--set", "nodeRestrictionPolicy.mode=audit"), "mode"),
    (("--set", "networkPolicy.enabled=on"), "enabled"),
    (("--set-json", 'networkPolicy.scraper.podSelector={"app":"prometheus"}'), "app"),
    (("--set-json", 'networkPolicy.scraper.podSelector={"matchLabels":{"app":1}}'), "app"),
    (("--set-json", 'networkPolicy.scraper.namespaceSelector={"matchExpressions":[{"key":"a","operator":"Is"}]}'),
     "operator"),
    (("--set", "networkPolicy.ingress=all"), "ingress"),
])
def test_schema_rejects(template_error: Callable[..., str], args: tuple[str, ...], field: str) -> None:
    stderr = template_error(*args)
    assert "values don't meet the specifications of the schema" in stderr, stderr
    assert field in stderr, stderr


def iter_values(values: Any, path: str = "") -> Iterator[str]:
    if isinstance(values, dict):
        for key, value in values.items():
            yield from iter_values(value, f"{path}.{key}" if path else key)
    else:
        yield path


def test_every_value_is_in_the_schema() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def known(path: str) -> bool:
        node = schema
        for part in path.split("."):
            props = node.get("properties", {})
            if part in props:
                node = props[part]
                if "$ref" in node:
                    node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
                if "oneOf" in node:  # e.g. a string map or null: free-form below this point
                    return True
                continue
            return node.get("additionalProperties") not in (False, None) or node.get("type") == "object"
        return True

    unknown = [p for p in iter_values(values) if not known(p)]
    assert not unknown, f"values.yaml keys missing from values.schema.json: {unknown}"
