"""What an OpenShift SecurityContextConstraints admits, for the chart's tests: the checks of OpenShift's SCC admission
(its API reference, security.openshift.io/v1 SecurityContextConstraints, and "Managing security context
constraints") that the chart's pods meet or miss, applied to a pod spec. ``refusals(scc, pod)`` lists what the SCC
refuses; an empty list admits the pod. A range or level an SCC leaves to the namespace (MustRunAsRange, an SELinux
level) is the namespace's here: ``uid_range`` stands for its openshift.io/sa.scc.uid-range annotation."""

from __future__ import annotations

from typing import Any

Doc = dict[str, Any]

# The volume types of a pod spec's volumes (every key of a volume but its name is its type).
_NOT_A_TYPE = {"name"}
# OpenShift's restricted-v2 (every authenticated account may use it), as its documentation lists its fields.
RESTRICTED_V2: Doc = {
    "allowPrivilegedContainer": False, "allowPrivilegeEscalation": False, "allowHostDirVolumePlugin": False,
    "allowHostIPC": False, "allowHostNetwork": False, "allowHostPID": False, "allowHostPorts": False,
    "allowedCapabilities": ["NET_BIND_SERVICE"], "requiredDropCapabilities": ["ALL"], "readOnlyRootFilesystem": False,
    "runAsUser": {"type": "MustRunAsRange"}, "seLinuxContext": {"type": "MustRunAs"},
    "fsGroup": {"type": "MustRunAs"}, "supplementalGroups": {"type": "RunAsAny"},
    "seccompProfiles": ["runtime/default"],
    "volumes": ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                "secret"],
}


def _containers(pod: Doc) -> list[Doc]:
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def _effective(pod: Doc, container: Doc, key: str) -> Any:
    """A security setting as the container gets it: its own, else the pod's."""
    own = (container.get("securityContext") or {}).get(key)
    return own if own is not None else (pod.get("securityContext") or {}).get(key)


def refusals(scc: Doc, pod: Doc, uid_range: tuple[int, int] = (1000680000, 1000689999)) -> list[str]:
    """What ``scc`` refuses of ``pod`` (a PodSpec), one line each; empty when it admits the pod."""
    out: list[str] = []
    for flag, field in (("hostNetwork", "allowHostNetwork"), ("hostPID", "allowHostPID"), ("hostIPC", "allowHostIPC")):
        if pod.get(flag) and not scc[field]:
            out.append(f"{flag} is not allowed")
    allowed_volumes = set(scc.get("volumes") or [])
    for volume in pod.get("volumes", []):
        (kind,) = set(volume) - _NOT_A_TYPE
        if "*" not in allowed_volumes and kind not in allowed_volumes:
            out.append(f"volume {volume['name']}: {kind} volumes are not allowed")
        if kind == "hostPath" and not scc["allowHostDirVolumePlugin"]:
            out.append(f"volume {volume['name']}: host paths are not allowed")
    pod_seccomp = ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    for c in _containers(pod):
        name, ctx = c["name"], c.get("securityContext") or {}
        if ctx.get("privileged") and not scc["allowPrivilegedContainer"]:
            out.append(f"{name}: privileged containers are not allowed")
        escalation = ctx.get("allowPrivilegeEscalation")
        if scc.get("allowPrivilegeEscalation") is False and escalation is not False:
            out.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = ctx.get("capabilities") or {}
        allowed_caps = set(scc.get("allowedCapabilities") or [])
        for cap in caps.get("add") or []:
            if "*" not in allowed_caps and cap not in allowed_caps:
                out.append(f"{name}: capability {cap} may not be added")
        for cap in scc.get("requiredDropCapabilities") or []:
            if cap not in (caps.get("drop") or []) and "ALL" not in (caps.get("drop") or []):
                out.append(f"{name}: capability {cap} must be dropped")
        for port in c.get("ports") or []:
            if port.get("hostPort") and not scc["allowHostPorts"]:
                out.append(f"{name}: host port {port['hostPort']} is not allowed")
        if scc["readOnlyRootFilesystem"] and not ctx.get("readOnlyRootFilesystem"):
            out.append(f"{name}: the root filesystem must be read-only")
        uid, rule = _effective(pod, c, "runAsUser"), scc["runAsUser"]
        if rule["type"] == "MustRunAs" and uid != rule["uid"]:
            out.append(f"{name}: runAsUser must be {rule['uid']}, not {uid}")
        if rule["type"] == "MustRunAsRange" and uid is not None and not uid_range[0] <= uid <= uid_range[1]:
            out.append(f"{name}: runAsUser {uid} is outside the namespace's range {uid_range[0]}-{uid_range[1]}")
        non_root = uid != 0 and (uid is not None or _effective(pod, c, "runAsNonRoot"))
        if rule["type"] == "MustRunAsNonRoot" and not non_root:
            out.append(f"{name}: must run as non-root")
        selinux, want = _effective(pod, c, "seLinuxOptions") or {}, scc["seLinuxContext"]
        wanted_type = (want.get("seLinuxOptions") or {}).get("type")
        if want["type"] == "MustRunAs" and selinux.get("type") not in (None, wanted_type):
            out.append(f"{name}: SELinux type {selinux.get('type')} is not {wanted_type or 'the default'}")
        seccomp = ((ctx.get("seccompProfile") or {}).get("type")) or pod_seccomp
        profiles = scc.get("seccompProfiles") or []
        named = {"RuntimeDefault": "runtime/default"}.get(seccomp or "")
        if profiles and "*" not in profiles and named not in profiles:
            out.append(f"{name}: seccomp profile {seccomp} is not one of {profiles}")
    return out
