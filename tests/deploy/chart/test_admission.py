"""The chart's two ValidatingAdmissionPolicies (topology requests of pods, the agent's writes to Nodes): when they
render, their shape, and their CEL evaluated with cel-python (module ``celpy``, with the Kubernetes quantity and
``join`` functions supplied here) as the API server would."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

import pytest

from tests.support.chart import (
    BOTH,
    FLOOR,
    NEWEST,
    NODES,
    REQUESTS,
    Doc,
    Render,
    one,
    policies,
    policy_of,
)
from tests.support.env import missing

# ------------------------------------------------------------------------------------------ admission policy


LIVE = ("--api-versions", "apps/v1/DaemonSet")  # what `helm install` sees: discovery lists kinds, not only groups


def test_admission_policies_offline_are_rendered(render: Render) -> None:
    """`helm template` knows no kinds: every minor of the chart's window serves admissionregistration.k8s.io/v1."""
    assert policies(render(kube_version=FLOOR, vap=False)) == BOTH
    assert policies(render(kube_version=NEWEST, vap=False)) == BOTH


def test_admission_policies_trust_a_live_discovery(render: Render) -> None:
    """With kinds in the API list (a live cluster, or a GitOps tool passing them), the list alone decides."""
    assert policies(render(*LIVE, kube_version=NEWEST, vap=False)) == set()  # e.g. the API switched off
    assert policies(render(*LIVE, kube_version=NEWEST, vap=True)) == BOTH
    assert policies(render(*LIVE, kube_version=FLOOR, vap=True)) == BOTH


def test_admission_policies_force_and_enabled(render: Render) -> None:
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
    rule, status, events, slices = one(render("--set", "strandedPolicy=keep"), "ClusterRole")["rules"]
    assert rule["resources"] == ["nodes"] and set(rule["verbs"]) <= {"get", "patch"}
    assert status["resources"] == ["nodes/status"] and status["verbs"] == ["patch"]
    assert events["resources"] == ["events"] and events["verbs"] == ["create"]
    assert slices["resources"] == ["resourceslices"] and set(slices["verbs"]) == {"list", "delete"}
    unguarded = one(render("--set", "nodeRestrictionPolicy.enabled=false"), "ClusterRole")["rules"]
    assert not [r for r in unguarded if {"nodes/status", "resourceslices"} & set(r["resources"])]


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
    """A hand-over to the other mode (agent/node/resource_withdrawal.py): the agent's own merge patch of its Node's
    status, and nothing else there."""
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
