"""The chart's uninstall (docs/admin/upgrade-uninstall.md): a pre-delete hook Job that deletes the DaemonSet in
the foreground, the agent told its DaemonSet's name (and given get on it alone) so it cleans its node up only while
that DaemonSet is being deleted, and nothing of it when uninstall.cleanup is off or the agent has no API token."""

from __future__ import annotations

from typing import Any

from tests.support.chart import FAKE_ARGS, Render, agent_container, env_of, mounts_of, one

HOOK = "pre-delete"
DS_NAME = "t-s390x-topology-agent"
HOOK_NAME = f"{DS_NAME}-uninstall"


def full(render: Render, *args: str) -> list[dict[str, Any]]:
    """Everything helm template renders, the hook's objects too."""
    return render(*args, hooks=True)


def hook_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == HOOK]


def hook_job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = [d for d in hook_docs(docs) if d["kind"] == "Job"]
    return job


def args_of(job: dict[str, Any]) -> dict[str, str]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "uninstall"
    return dict(a.removeprefix("--").split("=", 1) for a in container["args"][1:])


def test_the_hook_deletes_the_agents_daemonset_on_the_agents_nodes(render: Render) -> None:
    docs = full(render)
    job = hook_job(docs)
    ds = one(docs, "DaemonSet")
    assert args_of(job) == {"daemonset": ds["metadata"]["name"], "namespace": "kube-system",
                            "node-selector": "kubernetes.io/arch=s390x", "timeout": "120"}
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == ds["spec"]["template"]["spec"]["nodeSelector"]
    assert pod["tolerations"] == ds["spec"]["template"]["spec"]["tolerations"]
    assert pod["containers"][0]["image"] == agent_container(docs)["image"]
    assert pod["serviceAccountName"] == HOOK_NAME and pod["automountServiceAccountToken"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert job["spec"]["activeDeadlineSeconds"] > 120  # the command gives up first and exits 0


def test_the_hook_rbac_exists_before_the_job_and_goes_with_it(render: Render) -> None:
    docs = hook_docs(full(render))
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
                                         "Job"}
    weights = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in docs}
    assert all(w < weights["Job"] for kind, w in weights.items() if kind != "Job")
    for d in docs:
        assert d["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    role = next(d for d in docs if d["kind"] == "Role")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [DS_NAME],
                              "verbs": ["get", "delete"]}]
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]}]


def test_the_agent_may_read_its_own_daemonset_only(render: Render) -> None:
    docs = [d for d in full(render) if d not in hook_docs(full(render))]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [DS_NAME],
                              "verbs": ["get"]}]
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    sa = one(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"][0]["name"] == sa and binding["roleRef"]["name"] == role["metadata"]["name"]
    assert env_of(agent_container(docs))["TOPOLOGY_AGENT_RELEASE_DAEMONSET"] == DS_NAME


def test_fake_topology_drops_the_arch_from_the_hooks_selector(render: Render) -> None:
    job = hook_job(full(render, *FAKE_ARGS, "--set-json",
                        'nodeSelector={"kubernetes.io/arch":"s390x","pool":"z"}'))
    assert args_of(job)["node-selector"] == "pool=z"
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "z"}


def test_extra_env_reaches_the_hook(render: Render) -> None:
    job = hook_job(full(render, "--set-json",
                        'agent.extraEnv=[{"name":"KUBERNETES_SERVICE_HOST","value":"10.88.0.1"}]'))
    assert job["spec"]["template"]["spec"]["containers"][0]["env"] == [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "10.88.0.1"}]


def test_the_seccomp_profile_is_removable_by_the_agent(render: Render) -> None:
    docs = full(render, "--set", "seccompProfile.install=true")
    mount, volume = mounts_of(docs)["seccomp-profiles"]
    assert mount["mountPath"] == "/host-seccomp/profiles" and not mount.get("readOnly")
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/seccomp/profiles"
    assert env_of(agent_container(docs))["TOPOLOGY_AGENT_SECCOMP_PROFILE_DIR"] == "/host-seccomp/profiles"
    assert "seccomp-profiles" not in mounts_of(full(render))  # without the profile the agent does not mount it


def test_cleanup_off_or_no_token_renders_none_of_it(render: Render) -> None:
    for args in (("--set", "uninstall.cleanup=false"), ("--set", "agent.nodeLabels=false"),
                 ("--set", "rbac.create=false")):
        docs = full(render, *args, "--set", "seccompProfile.install=true")
        assert hook_docs(docs) == [], args
        assert not [d for d in docs if d["kind"] == "Role"], args
        env = env_of(agent_container(docs))
        assert "TOPOLOGY_AGENT_RELEASE_DAEMONSET" not in env and "TOPOLOGY_AGENT_SECCOMP_PROFILE_DIR" not in env


def test_the_timeout_is_a_value(render: Render, template_error: Any) -> None:
    assert args_of(hook_job(full(render, "--set", "uninstall.timeoutSeconds=300")))["timeout"] == "300"
    assert "timeoutSeconds" in template_error("--set", "uninstall.timeoutSeconds=0")


NETPOL = ("--set", "networkPolicy.enabled=true",
          "--set-json", 'networkPolicy.scraper.namespaceSelector={"matchLabels":{"kubernetes.io/metadata.name":"m"}}')


def test_with_network_policies_the_hook_pod_admits_no_ingress(render: Render) -> None:
    docs = full(render, *NETPOL)
    pod_labels = hook_job(docs)["spec"]["template"]["metadata"]["labels"]
    selecting = [d for d in docs if d["kind"] == "NetworkPolicy"
                 and d["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()]
    assert [d["metadata"]["name"] for d in selecting] == [HOOK_NAME]
    (policy,) = selecting
    assert policy["spec"]["policyTypes"] == ["Ingress"] and not policy["spec"].get("ingress")  # egress stays open
    assert "helm.sh/hook" not in (policy["metadata"].get("annotations") or {})  # there while the hook runs
    # No hook, no policy of its own.
    off = full(render, *NETPOL, "--set", "uninstall.cleanup=false")
    assert [d["metadata"]["name"] for d in off if d["kind"] == "NetworkPolicy"] == [DS_NAME]
