"""Who else owns CPUs on this node: kubelet's CPU manager and ``reservedSystemCPUs``.

kubelet's CPU manager keeps a checkpoint at ``/var/lib/kubelet/cpu_manager_state``
(``{"policyName":"static","defaultCpuSet":"0-1,6-7","entries":{"<pod-uid>":{"<container>":"2-5"}},"checksum":1}``;
``none`` has an empty ``defaultCpuSet`` and no entries). With the static policy kubelet pins the cgroups of Guaranteed
pods with integer CPU requests to CPUs of its own choosing and re-applies them every reconcile period, which defeats
the CPU binding the agent hands out: that is a finding.

Parsing and the findings are pure; the two ``read_*`` functions do the file I/O."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from agent.errors import CpuListError, CpuManagerStateError, KubeletConfigError
from agent.policy.grouping import Grouping
from agent.topology.cpulist import format_cpulist, parse_cpulist

# libyaml's safe loader when PyYAML was built with it (many times faster on kubelet's config), else Python's.
_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

CPU_MANAGER_STATE_PATH = "/var/lib/kubelet/cpu_manager_state"
KUBELET_CONFIG_PATH = "/var/lib/kubelet/config.yaml"


MAX_FILE_BYTES = 4 * 2**20  # either file is a few KiB; more is not kubelet's, and is not read into memory


def _read_bounded(path: str | os.PathLike[str]) -> str:
    """A kubelet file's text; OSError (FileNotFoundError too) or UnicodeDecodeError as open and read raise them,
    and OSError(EFBIG) for a file larger than MAX_FILE_BYTES."""
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_FILE_BYTES // 2**20} MiB")
    return data.decode("utf-8")


@dataclass(frozen=True, slots=True)
class CpuManagerState:
    """kubelet's CPU manager checkpoint."""

    policy: str  # "none", "static", ...
    default_cpus: tuple[int, ...] = ()  # the shared pool (static); empty with policy none
    exclusive: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)  # pod uid -> container -> CPUs

    @property
    def exclusive_cpus(self) -> tuple[int, ...]:
        """Every CPU some container holds exclusively, sorted."""
        return tuple(sorted({cpu for containers in self.exclusive.values() for cpus in containers.values()
                             for cpu in cpus}))


def _cpus(text: Any, what: str) -> tuple[int, ...]:
    if not isinstance(text, str):
        raise CpuManagerStateError(f"{what} must be a CPU list string, not {type(text).__name__}")
    try:
        return tuple(parse_cpulist(text))
    except CpuListError as exc:
        raise CpuManagerStateError(f"{what}: {exc}") from None


def parse_cpu_manager_state(text: str) -> CpuManagerState:
    """Parse kubelet's ``cpu_manager_state`` JSON; CpuManagerStateError (a ValueError) says what is wrong.

    The checksum is not verified (kubelet computes it over its Go structs); it is only ignored.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CpuManagerStateError(f"CPU manager state is not JSON: {exc}") from None
    except RecursionError:  # arrays nested a thousand deep: kubelet writes a flat object
        raise CpuManagerStateError("CPU manager state is not kubelet's checkpoint: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise CpuManagerStateError(f"CPU manager state must be a JSON object, not {type(data).__name__}")
    policy = data.get("policyName")
    if not isinstance(policy, str) or not policy:
        raise CpuManagerStateError("CPU manager state has no policyName (expected e.g. \"none\" or \"static\")")
    default_cpus = _cpus(data.get("defaultCpuSet", ""), "defaultCpuSet")
    entries = data.get("entries")
    if entries is None:  # omitempty in kubelet: absent when nothing is exclusive
        entries = {}
    if not isinstance(entries, dict):
        raise CpuManagerStateError(f"CPU manager state: entries must be an object, not {type(entries).__name__}")
    exclusive: dict[str, dict[str, tuple[int, ...]]] = {}
    for pod, containers in entries.items():
        if not isinstance(containers, dict):
            raise CpuManagerStateError(
                f"CPU manager state: entries[{pod!r}] must map container names to CPU lists "
                f"(a pre-1.18 v1 checkpoint is not supported), not {type(containers).__name__}")
        exclusive[pod] = {name: _cpus(cpus, f"entries[{pod!r}][{name!r}]") for name, cpus in containers.items()}
    return CpuManagerState(policy=policy, default_cpus=default_cpus, exclusive=exclusive)


def read_cpu_manager_state(path: str | os.PathLike[str] = CPU_MANAGER_STATE_PATH) -> CpuManagerState | None:
    """The checkpoint at ``path``; None when there is no such file (no kubelet, or not mounted).

    CpuManagerStateError when the file exists but cannot be read or parsed; the caller logs it.
    """
    try:
        text = _read_bounded(path)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CpuManagerStateError(f"{os.fspath(path)}: cannot read kubelet's CPU manager state: {exc}") from None
    try:
        return parse_cpu_manager_state(text)
    except CpuManagerStateError as exc:
        raise CpuManagerStateError(f"{os.fspath(path)}: {exc}") from None


def read_reserved_system_cpus(kubelet_config_path: str | os.PathLike[str] = KUBELET_CONFIG_PATH) -> tuple[int, ...]:
    """``reservedSystemCPUs`` from a kubelet config file (YAML or JSON); () when file or field is absent.

    KubeletConfigError when the file cannot be read or parsed, or the field is not a CPU list.
    """
    where = os.fspath(kubelet_config_path)
    try:
        text = _read_bounded(kubelet_config_path)
    except FileNotFoundError:
        return ()
    except (OSError, UnicodeDecodeError) as exc:
        raise KubeletConfigError(f"{where}: cannot read the kubelet config: {exc}") from None
    try:
        data = yaml.load(text, Loader=_SAFE_LOADER)
    except (yaml.YAMLError, RecursionError) as exc:
        reason = " ".join(str(exc).split())[:200] if isinstance(exc, yaml.YAMLError) else "nested too deeply"
        raise KubeletConfigError(f"{where}: not YAML/JSON: {reason}") from None
    if data is None:
        return ()
    if not isinstance(data, dict):
        raise KubeletConfigError(f"{where}: a kubelet config must be a mapping, not {type(data).__name__}")
    value = data.get("reservedSystemCPUs")
    if value is None or value == "":
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # `reservedSystemCPUs: 0` parses as an int
    if not isinstance(value, str):
        raise KubeletConfigError(f"{where}: reservedSystemCPUs must be a CPU list such as \"0-1\", not {value!r}")
    try:
        return tuple(parse_cpulist(value))
    except CpuListError as exc:
        raise KubeletConfigError(f"{where}: reservedSystemCPUs: {exc}") from None


def _overlaps(grouping: Grouping, cpus: set[int]) -> list[str]:
    """``topology/book drawer0-book0 (CPUs 0-1)`` for each advertised group sharing CPUs with ``cpus``."""
    found: list[str] = []
    for g in grouping.groups:
        shared = cpus.intersection(g.cpus)
        if shared:
            found.append(f"{g.resource} {g.id} (CPUs {format_cpulist(shared)})")
    return found


def cpu_manager_findings(
    state: CpuManagerState | None,
    grouping: Grouping,
    reserved_system_cpus: tuple[int, ...] = (),
) -> list[str]:
    """Warnings (one line each) when kubelet's CPU manager or reserved CPUs clash with the advertised groups.

    Nothing is said when no group is advertised: then nothing can clash.
    """
    if not grouping.groups:
        return []
    findings: list[str] = []
    if state is not None and state.policy == "static":
        findings.append(
            "kubelet runs the CPU manager with the static policy: it pins the cgroups of Guaranteed pods "
            "with integer CPU requests to CPUs it chooses itself, which need not be the CPUs of the group "
            "the agent allocated, and re-applies them every reconcile period; the OpenMP/CPU binding the "
            "agent hands out then fails or lands on other CPUs. Fix: run kubelet with "
            "cpuManagerPolicy: none on these nodes (drain the node and remove "
            f"{CPU_MANAGER_STATE_PATH} when switching), or keep kubelet from pinning topology pods: keep them "
            "out of the Guaranteed QoS class (no cpu limit, or one above the request)")
    if state is not None and state.exclusive:
        advertised = {c for g in grouping.groups for c in g.cpus}
        holders: list[str] = []
        taken: set[int] = set()
        for pod, containers in sorted(state.exclusive.items()):
            for name, cpus in sorted(containers.items()):
                mine = advertised.intersection(cpus)
                if mine:
                    taken |= mine
                    holders.append(f"pod {pod} container {name}: {format_cpulist(mine)}")
        if taken:
            findings.append(
                f"kubelet's CPU manager gave CPUs {format_cpulist(taken)} exclusively to other containers "
                f"({'; '.join(holders)}); they overlap advertised groups: {', '.join(_overlaps(grouping, taken))}. "
                "Pods bound to these groups will compete with those containers")
    reserved = set(reserved_system_cpus)
    overlapping = _overlaps(grouping, reserved)
    if overlapping:
        shared = reserved.intersection(c for g in grouping.groups for c in g.cpus)
        findings.append(
            f"kubelet's reservedSystemCPUs {format_cpulist(reserved)} overlap advertised groups: "
            f"{', '.join(overlapping)}; system daemons run on CPUs {format_cpulist(shared)}, so pods bound to "
            f"these groups share them. Fix: leave them out of the groups with --reserved-cpus "
            f"{format_cpulist(reserved)}")
    return findings
