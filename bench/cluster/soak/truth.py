"""Reads the truth on the real-cluster lane's node into :class:`bench.cluster.soak.invariants.Snapshot`: not the
agent's view.

* every running container (containerd's CRI): its host PID, then each thread's ``Cpus_allowed_list`` from
  ``/proc/<pid>/task/*/status``;
* the groups held, by kubelet: its device-manager checkpoint (``kubelet_internal_checkpoint``: init containers too),
  pod-resources' List (devices and DRA claims per container), and the API's ResourceClaims (allocated devices of this
  driver, reserved for a pod);
* the agent's own hold file and DRA checkpoint, the CDI spec files, the driver's ResourceSlices;
* the pods and claims that exist, the pods that failed admission (phase Failed with a reason), the pods being deleted
  (their deletionTimestamp and grace);
* the Node's allocatable of each topology resource (what the scheduler sees offered);
* the agent's process: RSS (``VmRSS``) and open files.

Each read that fails (a component down during a fault) leaves that part empty for this second and is counted.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent._proto.podresources.v1 import api_pb2 as pr
from agent._proto.podresources.v1 import api_pb2_grpc as pr_grpc
from agent.cri.client import CriClient
from agent.errors import CriError
from agent.topology.cpulist import parse_cpulist
from bench.cluster.soak.invariants import AgentProc, Container, Failure, Hold, Snapshot, Terminating

DRIVER = "topology.s390x.ibm.com"
PREFIX = "topology/"
KUBELET = Path("/var/lib/kubelet")
CHECKPOINT = KUBELET / "device-plugins" / "kubelet_internal_checkpoint"
AGENT_STATE = KUBELET / "device-plugins" / "s390x-topology-agent"
POD_RESOURCES = KUBELET / "pod-resources" / "kubelet.sock"
CONTAINERD = Path("/run/containerd/containerd.sock")
CDI_DIR = Path("/var/run/cdi")
FAILED_REASONS = ("UnexpectedAdmissionError", "OutOf", "Unexpected", "NodeAffinity", "Evicted")


@dataclass
class Config:
    """What the soak set (the runner changes it with each upgrade and CPU fault)."""

    groups: dict[str, frozenset[int]]
    online: frozenset[int]
    mode: str = "deviceplugin"
    enforcement: str = "cri"
    shared_pool: bool = False


@dataclass
class ReadErrors:
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


def allowed_per_thread(pid: int, proc: Path = Path("/proc")) -> tuple[frozenset[int], ...]:
    """Each thread's ``Cpus_allowed_list`` (a thread that ended meanwhile is skipped)."""
    out = []
    try:
        tasks = sorted((proc / str(pid) / "task").iterdir())
    except OSError:
        return ()
    for task in tasks:
        try:
            text = (task / "status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out.append(frozenset(parse_cpulist(line.split(":", 1)[1].strip())))
    return tuple(out)


def checkpoint_holds(text: str, uids: dict[str, str]) -> list[Hold]:
    """kubelet's device-manager checkpoint -> holds of our resources (DeviceIDs is a NUMA node -> ids map in
    current kubelets, a list in old ones)."""
    data = json.loads(text).get("Data", {})
    holds = []
    for entry in data.get("PodDeviceEntries") or []:
        if not str(entry.get("ResourceName", "")).startswith(PREFIX):
            continue
        ids = entry.get("DeviceIDs") or {}
        flat = [i for v in ids.values() for i in v] if isinstance(ids, dict) else list(ids)
        holds += [Hold(str(i), str(entry["PodUID"]), str(entry.get("ContainerName", "")), "checkpoint") for i in flat]
    return holds


def claim_containers(pod: Any, claim_name: str) -> tuple[str, ...]:
    """The containers (init containers too) of ``pod`` that use the ResourceClaim named ``claim_name``: kubelet hands
    a claim's devices only to those (their CDI devices, their pod-resources rows), not to the pod's other containers.
    They are the containers naming the pod's entry for it in ``resources.claims``, and, for the claim the scheduler
    made for extended resources (a DeviceClass's ``extendedResourceName``), the containers its request mappings name
    (``status.extendedResourceClaimStatus``). Pure (a V1Pod in)."""
    spec, status = pod.spec, pod.status
    entries = {rc.name for rc in spec.resource_claims or [] if rc.resource_claim_name == claim_name}
    entries |= {st.name for st in (status.resource_claim_statuses if status else None) or []
                if st.resource_claim_name == claim_name}
    users = [c.name for c in [*(spec.init_containers or []), *(spec.containers or [])]
             if any(ref.name in entries for ref in ((c.resources.claims if c.resources else None) or []))]
    extended = status.extended_resource_claim_status if status else None
    if extended is not None and extended.resource_claim_name == claim_name:
        users += [m.container_name for m in extended.request_mappings or []]
    return tuple(dict.fromkeys(users))


def cdi_files(folder: Path = CDI_DIR) -> dict[str, str]:
    """The driver's CDI spec files -> the claim uid in their name (``<driver>-<level>_<uid>.json``)."""
    if not folder.is_dir():
        return {}
    return {p.name: p.stem.rsplit("_", 1)[-1] for p in folder.glob(f"{DRIVER}-*.json")}


def agent_hold_groups(state: Path = AGENT_STATE) -> tuple[frozenset[str], frozenset[str]]:
    """The groups in the agent's hold file (``topology/holds.json``) and the claim uids in its DRA checkpoint."""
    groups: set[str] = set()
    try:
        doc = json.loads((state / "topology" / "holds.json").read_text())
        groups |= {str(pair[1]) for pair in doc.get("holds", [])}
        groups |= {str(row[1]) for row in doc.get("pods", [])}
    except (OSError, ValueError, IndexError, TypeError, AttributeError):
        pass
    claims: set[str] = set()
    try:
        doc = json.loads((state / "dra" / "claims.json").read_text())
        claims |= {str(c["uid"]) for c in doc.get("claims", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return frozenset(groups), frozenset(claims)


def terminating(pod: Any) -> Terminating | None:
    """A V1Pod being deleted: its deletionTimestamp (the deletion plus its grace) and the grace it was given; None
    for a pod not being deleted. Pure."""
    meta = pod.metadata
    if meta.deletion_timestamp is None:
        return None
    grace = meta.deletion_grace_period_seconds
    if grace is None:
        grace = pod.spec.termination_grace_period_seconds if pod.spec.termination_grace_period_seconds is not None \
            else 30
    return Terminating(meta.uid, f"{meta.namespace}/{meta.name}", meta.deletion_timestamp.timestamp(), float(grace))


def advertised(allocatable: dict[str, str] | None) -> dict[str, int]:
    """The Node's allocatable -> each topology resource's count (a resource it does not list offers 0). Pure."""
    out = {}
    for name, value in (allocatable or {}).items():
        if name.startswith(PREFIX):
            try:
                out[name] = int(value)
            except ValueError:
                out[name] = 0
    return out


def process_usage(pid: int) -> AgentProc | None:
    try:
        rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return None
    return AgentProc(pid, rss, fds)


class Truth:
    """One reader for the whole soak (its CRI and pod-resources channels are reused)."""

    def __init__(self, api: Any, node: str, namespaces: tuple[str, ...], agent_namespace: str) -> None:
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.node = node
        self.namespaces = namespaces
        self.agent_namespace = agent_namespace
        self.cri = CriClient(CONTAINERD, timeout=3.0)
        self.errors = ReadErrors()
        self.failures_seen: dict[str, Failure] = {}

    def close(self) -> None:
        self.cri.close()

    # --- API ---------------------------------------------------------------------------------------------------
    def _pods(self) -> list[Any]:
        return [p for ns in self.namespaces for p in self.core.list_namespaced_pod(ns, _request_timeout=10).items]

    def _claims(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ns in self.namespaces:
            out += self.custom.list_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims",
                                                             _request_timeout=10)["items"]
        return out

    def _advertised(self) -> dict[str, int]:
        return advertised(self.core.read_node(self.node, _request_timeout=10).status.allocatable)

    def _slices(self) -> int:
        items = self.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                       field_selector=f"spec.driver={DRIVER}",
                                                       _request_timeout=10)["items"]
        return sum(1 for s in items if s["spec"].get("nodeName") == self.node)

    # --- node --------------------------------------------------------------------------------------------------
    def _pod_resources(self, uids: dict[str, str]) -> list[Hold]:
        with grpc.insecure_channel(f"unix://{POD_RESOURCES}") as channel:
            answer = pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(), timeout=3)
        holds = []
        for pod in answer.pod_resources:
            uid = uids.get(f"{pod.namespace}/{pod.name}", f"{pod.namespace}/{pod.name}")
            for c in pod.containers:
                holds += [Hold(d, uid, c.name, "pod-resources") for devices in c.devices
                          if devices.resource_name.startswith(PREFIX) for d in devices.device_ids]
                holds += [Hold(r.device_name, uid, c.name, "pod-resources") for claim in c.dynamic_resources
                          for r in claim.claim_resources if r.driver_name == DRIVER]
        return holds

    def _containers(self) -> tuple[list[Container], AgentProc | None]:
        out = []
        agent = None
        for info in self.cri.list_containers():
            try:
                status = self.cri.container_status(info.id)
            except CriError:
                continue
            if status.pid is None:
                continue
            allowed = allowed_per_thread(status.pid)
            if not allowed:
                continue
            out.append(Container(info.pod_uid, f"{info.pod_namespace}/{info.pod_name}", info.container_name,
                                 status.started_at / 1e9, allowed))
            if info.pod_namespace == self.agent_namespace and info.container_name == "agent":
                agent = process_usage(status.pid)
        return out, agent

    def read(self, config: Config) -> Snapshot:
        t = time.time()
        pods: list[Any] = []
        try:
            pods = self._pods()
        except Exception:
            self.errors.add("pods")
        uids = {f"{p.metadata.namespace}/{p.metadata.name}": p.metadata.uid for p in pods}
        pod_uids = frozenset(uids.values())
        failures = []
        for p in pods:
            reason = p.status.reason or ""
            if p.status.phase == "Failed" and reason and p.metadata.uid not in self.failures_seen:
                f = Failure(f"{p.metadata.namespace}/{p.metadata.name}", p.metadata.uid, reason,
                            (p.status.message or "")[:300], requested(p))
                self.failures_seen[p.metadata.uid] = f
                failures.append(f)
        holds: list[Hold] = []
        try:  # kubelet frees a gone pod's entries at its next Allocate: only existing pods' entries are holds
            holds += [h for h in checkpoint_holds(CHECKPOINT.read_text(), uids) if h.pod_uid in pod_uids]
        except (OSError, ValueError, KeyError):
            self.errors.add("kubelet checkpoint")
        try:
            holds += self._pod_resources(uids)
        except grpc.RpcError:
            self.errors.add("pod-resources")
        claims: list[dict[str, Any]] = []
        try:
            claims = self._claims()
        except Exception:
            self.errors.add("claims")
        listed = {(h.group, h.pod_uid) for h in holds}
        by_uid = {p.metadata.uid: p for p in pods}
        for c in claims:
            results = (c.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", [])
            for ref in c.get("status", {}).get("reservedFor") or []:
                uid = ref.get("uid", "")
                pod = by_uid.get(uid)
                # the containers using it (an init container that ended among them); the pod as a whole ("") when
                # the pod is not known or names none of its containers
                users = (claim_containers(pod, c["metadata"]["name"]) if pod is not None else ()) or ("",)
                for r in results:
                    if r.get("driver") == DRIVER and not r.get("adminAccess") and (r["device"], uid) not in listed:
                        holds += [Hold(r["device"], uid, user, "claim") for user in users]
        slices = 0
        try:
            slices = self._slices()
        except Exception:
            self.errors.add("slices")
        containers: list[Container] = []
        agent = None
        try:
            containers, agent = self._containers()
        except CriError:
            self.errors.add("cri")
        offered: dict[str, int] | None = None
        try:
            offered = self._advertised()
        except Exception:
            self.errors.add("node")
        agent_groups, agent_claims = agent_hold_groups()
        # Pods that are gone but still have a running container (being torn down) are no holders' concern here.
        return Snapshot(
            t=t, groups=config.groups, online=config.online, enforcement=config.enforcement,
            shared_pool=config.shared_pool, mode=config.mode, containers=tuple(containers), holds=tuple(holds),
            pods=pod_uids | {c.pod_uid for c in containers}, claims=frozenset(c["metadata"]["uid"] for c in claims),
            agent_holds=agent_groups, agent_claims=agent_claims, cdi_files=cdi_files(), slices=slices,
            failures=tuple(failures), agent=agent,
            terminating=tuple(t for t in map(terminating, pods) if t is not None), advertised=offered)


def requested(pod: Any) -> str:
    """The topology resource a pod asked for (a claim: its pod-level claim)."""
    for c in [*(pod.spec.init_containers or []), *pod.spec.containers]:
        for name in (c.resources.requests or {}) if c.resources else {}:
            if name.startswith(PREFIX):
                return str(name)
    return "claim" if pod.spec.resource_claims else ""
