"""OpenShift: the chart's SecurityContextConstraints, rendered where the cluster serves security.openshift.io/v1 (or
when asked), admits the agent's pods in every mode and nothing wider than they ask for; only the agent's
ServiceAccount may use it; the uninstall hook's pod is admitted by OpenShift's own restricted-v2. What the SCC admits
is checked by tests/support/scc.py (OpenShift's SCC rules); that the API server accepts the objects, in
test_openshift_apiserver.py."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from tests.support.chart import FAKE_ARGS, Doc, Installed, Render, chart_install, kinds, one
from tests.support.scc import RESTRICTED_V2, refusals

OPENSHIFT_API = ("--api-versions", "security.openshift.io/v1")
ON = ("--set", "openshift.scc.create=true")
NAME = "t-s390x-topology-agent"


def scc_of(docs: list[Doc]) -> Doc:
    return one(docs, "SecurityContextConstraints")


def pod_of(docs: list[Doc]) -> Doc:
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]


def test_rendered_where_openshift_serves_it_or_when_asked(render: Render) -> None:
    assert "SecurityContextConstraints" not in kinds(render())
    assert "SecurityContextConstraints" not in kinds(render("--set", "openshift.scc.create=false", *OPENSHIFT_API))
    for args in (OPENSHIFT_API, ON):
        docs = render(*args)
        assert scc_of(docs)["metadata"]["name"] == NAME
        annotations = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
        assert annotations["openshift.io/required-scc"] == NAME


MODES = {
    "default": (),
    "none": ("--set", "cpusetEnforcement=none"),
    "cri": ("--set", "cpusetEnforcement=cri", "--set", "sharedPool=true"),
    "nri": ("--set", "cpusetEnforcement=nri"),
    "dra": ("--set", "mode=dra"),
    "every-option": (*FAKE_ARGS, "--set", "seccompProfile.install=true", "--set", "kubelet.readState=true",
                     "--set", "metrics.allocationsPodNames=true"),
    "no-token": ("--set", "agent.nodeLabels=false", "--set", "cpusetEnforcement=none"),
}


@pytest.mark.parametrize("args", MODES.values(), ids=MODES.keys())
def test_the_scc_admits_the_agents_pods_and_nothing_wider(render: Render, args: tuple[str, ...]) -> None:
    docs = render(*ON, *args)
    scc, pod = scc_of(docs), pod_of(docs)
    assert refusals(scc, pod) == []
    # Nothing the pods do not ask for: no privileged container, host namespace or port, added capability, escalation.
    assert [scc[k] for k in ("allowPrivilegedContainer", "allowHostIPC", "allowHostNetwork", "allowHostPID",
                             "allowHostPorts", "allowPrivilegeEscalation")] == [False] * 6
    assert scc["allowedCapabilities"] == [] and scc["requiredDropCapabilities"] == ["ALL"]
    assert scc["runAsUser"] == {"type": "MustRunAs", "uid": 0} and scc["readOnlyRootFilesystem"] is True
    assert scc["seccompProfiles"] == ["runtime/default"]
    # Exactly the volume types the pods use (the token, when mounted, is a projected volume kubelet adds).
    used = {next(iter(set(v) - {"name"})) for v in pod["volumes"]}
    token = {"projected"} if pod["automountServiceAccountToken"] else set()
    assert set(scc["volumes"]) == used | token
    assert pod["securityContext"]["seLinuxOptions"]["type"] == scc["seLinuxContext"]["seLinuxOptions"]["type"]


def test_the_refusal_check_can_fail(render: Render) -> None:
    docs = render(*ON)
    scc, pod = scc_of(docs), copy.deepcopy(pod_of(docs))
    agent = pod["containers"][0]["securityContext"]
    agent.update(privileged=True, allowPrivilegeEscalation=True, capabilities={"add": ["SYS_ADMIN"]})
    pod["hostPID"] = True
    pod["volumes"].append({"name": "data", "persistentVolumeClaim": {"claimName": "x"}})
    assert len(refusals(scc, pod)) == 6  # the five above, and ALL no longer dropped
    assert refusals(RESTRICTED_V2, pod_of(docs))  # restricted-v2 refuses host paths and uid 0


def test_selinux_type_is_the_narrowest_that_does_the_job(render: Render) -> None:
    def selinux(*args: str) -> str:
        return str(scc_of(render(*ON, *args))["seLinuxContext"]["seLinuxOptions"]["type"])

    # Only kubelet's sockets and /sys: container-selinux's device-plugin type.
    assert selinux("--set", "cpusetEnforcement=none") == "container_device_plugin_t"
    # The runtime's sockets, kubelet's root or DRA's directories: out of a confined type's reach.
    assert selinux() == "spc_t"
    assert selinux("--set", "cpusetEnforcement=none", "--set", "kubelet.readState=true") == "spc_t"
    assert selinux("--set", "cpusetEnforcement=none", "--set", "seccompProfile.install=true") == "spc_t"
    assert selinux("--set", "cpusetEnforcement=none", "--set", "mode=dra") == "spc_t"
    assert selinux("--set", "openshift.scc.seLinuxType=container_t") == "container_t"


def test_only_the_agents_service_account_may_use_it(render: Render) -> None:
    docs = render(*ON)
    (role,) = [r for r in kinds(docs)["Role"] if r["metadata"]["name"] == f"{NAME}-scc"]
    assert role["rules"] == [{"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
                              "resourceNames": [NAME], "verbs": ["use"]}]
    (binding,) = [b for b in kinds(docs)["RoleBinding"] if b["metadata"]["name"] == f"{NAME}-scc"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{NAME}-scc"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod_of(docs)["serviceAccountName"],
                                    "namespace": "kube-system"}]
    no_rbac = render(*ON, "--set", "rbac.create=false")
    assert "SecurityContextConstraints" in kinds(no_rbac)
    assert f"{NAME}-scc" not in {r["metadata"]["name"] for r in kinds(no_rbac).get("Role", [])}


def test_the_uninstall_hook_is_admitted_by_restricted_v2(render: Render) -> None:
    hook = one([d for d in render(*ON, hooks=True) if d["kind"] == "Job"], "Job")["spec"]["template"]["spec"]
    assert refusals(RESTRICTED_V2, hook) == []
    plain = one([d for d in render(hooks=True) if d["kind"] == "Job"], "Job")["spec"]["template"]["spec"]
    assert refusals(RESTRICTED_V2, plain) == ["uninstall: runAsUser 65532 is outside the namespace's range "
                                              "1000680000-1000689999"]


def test_a_live_openshift_gets_the_scc_and_notes_ask_for_no_pod_security_label(
        install: Callable[..., Installed]) -> None:
    """helm install reads discovery: security.openshift.io/v1 served is OpenShift (openshift.scc.create=auto)."""
    installed = install(*chart_install("-n", "topo"), openshift=True, namespaces={"topo": {}})
    assert scc_of(installed.manifest)["metadata"]["name"] == NAME
    assert f"admitted by the SecurityContextConstraints {NAME}" in installed.notes and "spc_t" in installed.notes
    assert "POD SECURITY" not in installed.notes
    plain = install(*chart_install("-n", "topo"), namespaces={"topo": {}})
    assert "SecurityContextConstraints" not in kinds(plain.manifest) and "POD SECURITY" in plain.notes


def test_schema_refuses_other_values(template_error: Callable[..., str]) -> None:
    assert "create" in template_error("--set", "openshift.scc.create=yes")
    assert "seLinuxType" in template_error("--set", "openshift.scc.seLinuxType=spc")
