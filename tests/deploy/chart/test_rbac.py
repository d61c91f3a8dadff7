"""The chart's RBAC: what the agent's account may do (get and patch its Node, create events and evictions, delete
its node's ResourceSlices) and nothing more, only with node labels on, and its token mounted only then."""

from __future__ import annotations

import pytest

from tests.support.chart import (
    Render,
    agent_container,
    env_of,
    kinds,
    one,
)

# ------------------------------------------------------------------------------------------------------ RBAC


EVICTION_RULE = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}


def test_rbac_is_get_patch_on_nodes_create_on_events_and_evictions_delete_on_own_slices_only(render: Render) -> None:
    docs = render()
    role = one(docs, "ClusterRole")
    # nodes/status: patch only, and only beside the node-restriction policy that holds it to lowering the agent's
    # own extended resources to zero (a hand-over to the other mode; test_node_policy_admits_only_our_...)
    # pods/eviction: create only, for a stranded holder's pod (strandedPolicy evict, the default; below)
    # resourceslices: list and delete, beside the policy that holds them to its own node's (the slices a DRA agent
    # left before a switch; test_dra.py)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
                             {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                             {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}, EVICTION_RULE,
                             {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                              "verbs": ["list", "delete"]}]
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
    """The agent evicts a stranded holder's pod (strandedPolicy evict) only with cpuset enforcement and API
    access; the ClusterRole grants pods/eviction exactly then, and the agent is told keep otherwise."""
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
