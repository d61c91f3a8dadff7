"""Read a node's CPU topology from sysfs and procfs under a host root (default ``/``).

The only module that opens files under ``sys/`` and ``proc/``. It reads just what the model
needs, and a sibling mask once per container rather than once per CPU (the kernel keeps masks
symmetric), so a periodic rescan of a 400-CPU node stays cheap. Interpretation is left to
:mod:`agent.topology.derive`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agent.errors import CpuListError, TopologyReadError
from agent.topology.cpulist import parse_cpulist, parse_cpumask
from agent.topology.derive import RawCpu, build_topology, environment_from_sysinfo, parse_sysinfo
from agent.topology.model import Machine, Topology, normalize_polarization

_CPU_DIR = re.compile(r"cpu(\d+)")
_NODE_DIR = re.compile(r"node(\d+)")
_MACHINE_RE = re.compile(r"machine\s*=\s*([0-9A-Fa-f]{4})")

# level -> (id file, list file, hex mask file)
_LEVEL_FILES: dict[str, tuple[str, str, str]] = {
    "core": ("core_id", "thread_siblings_list", "thread_siblings"),
    "socket": ("physical_package_id", "core_siblings_list", "core_siblings"),
    "book": ("book_id", "book_siblings_list", "book_siblings"),
    "drawer": ("drawer_id", "drawer_siblings_list", "drawer_siblings"),
}


def _read(path: str) -> str | None:
    """A small file's text, None when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise TopologyReadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = os.read(fd, 65536)
    except OSError as exc:
        raise TopologyReadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TopologyReadError(f"{path}: not text") from None


def _int(path: str) -> int | None:
    text = _read(path)
    if text is None or text == "":
        return None
    try:
        return int(text, 10)
    except ValueError:
        raise TopologyReadError(f"{path}: expected a number, found {text[:40]!r}") from None


def _flag(path: str) -> bool | None:
    value = _int(path)
    if value is None:
        return None
    if value not in (0, 1):
        raise TopologyReadError(f"{path}: expected 0 or 1, found {value}")
    return value == 1


def _cpus(list_path: str, mask_path: str | None = None) -> list[int] | None:
    """A cpulist file, else the matching hex mask file, else None."""
    text = _read(list_path)
    try:
        if text is not None:
            return parse_cpulist(text)
        if mask_path is not None:
            mask = _read(mask_path)
            if mask is not None:
                return parse_cpumask(mask)
    except CpuListError as exc:
        raise TopologyReadError(f"{list_path if text is not None else mask_path}: {exc}") from None
    return None


def _numbered_dirs(path: str, pattern: re.Pattern[str]) -> list[int]:
    """N of every entry the pattern matches whole (its group is N), ascending."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise TopologyReadError(f"{path}: cannot list: {exc.strerror or exc}") from None
    return sorted(int(m.group(1)) for n in names if (m := pattern.fullmatch(n)))


class _Containers:
    """Sibling masks and container ids seen so far, so each container is read once."""

    def __init__(self) -> None:
        self.mask_of: dict[str, dict[int, frozenset[int]]] = {level: {} for level in _LEVEL_FILES}
        self.id_of: dict[str, dict[frozenset[int], int | None]] = {level: {} for level in _LEVEL_FILES}
        # Per level: (level, its masks by member CPU, ids by mask, id file, list file, mask file).
        self.levels = [(level, self.mask_of[level], self.id_of[level], *files) for level, files in _LEVEL_FILES.items()]


def _container(topo: str, cpu: int, mask_of: dict[int, frozenset[int]], id_of: dict[frozenset[int], int | None],
               id_file: str, list_file: str, mask_file: str) -> tuple[frozenset[int] | None, int | None]:
    """(sibling mask, kernel id) of ``cpu``'s container at one level, read when no CPU of it was read before."""
    cpus = _cpus(f"{topo}/{list_file}", f"{topo}/{mask_file}")
    kernel_id = _kernel_id(f"{topo}/{id_file}")
    if cpus is None:
        return None, kernel_id
    mask = frozenset(cpus)
    if cpu not in mask:
        mask = mask | {cpu}
    for member in mask:
        mask_of.setdefault(member, mask)
    id_of.setdefault(mask, kernel_id)
    return mask, kernel_id


def _kernel_id(path: str) -> int | None:
    value = _int(path)
    return None if value is None or value < 0 else value


def _read_cpu(cpu_dir: str, cpu: int, online_set: set[int] | None, containers: _Containers,
              details: bool = True) -> RawCpu:
    """One CPU's files, as few as the model needs: the global online list stands for each CPU's
    ``online``, ``configure`` only matters for an offline CPU (standby CPUs are offline), and an online
    CPU's topology directory is known to exist by what reading it finds."""
    base = f"{cpu_dir}/cpu{cpu}"
    if online_set is not None:
        online = cpu in online_set
    else:
        flag = _flag(f"{base}/online")
        online = True if flag is None else flag  # cpu0 on x86 has no online file: it cannot go offline
    configured = None if online else _flag(f"{base}/configure")
    polarization = _read(f"{base}/polarization")
    topo = f"{base}/topology"
    ids: dict[str, int | None] = {}
    masks: dict[str, frozenset[int] | None] = {}
    has_topology = False
    # An online CPU has its topology directory; an offline one (standby CPUs, many on some LPARs)
    # usually has none: one stat then saves a dozen failed opens.
    if online or os.path.isdir(topo):
        for level, mask_of, id_of, id_file, list_file, mask_file in containers.levels:
            mask = mask_of.get(cpu)
            if mask is not None:
                kernel_id = id_of[mask]
            else:
                mask, kernel_id = _container(topo, cpu, mask_of, id_of, id_file, list_file, mask_file)
            masks[level] = mask
            ids[level] = kernel_id
            if mask is not None or kernel_id is not None:
                has_topology = True
    if not has_topology:
        ids, masks = {}, {}
    return RawCpu(cpu, online, True if configured is None else configured, normalize_polarization(polarization),
                  _flag(f"{base}/dedicated") if details else None, _int(f"{base}/address") if details else None,
                  has_topology, ids, masks)


def _read_nodes(node_dir: str) -> tuple[dict[int, int], list[int], bool]:
    """(cpu -> node, real memory nodes, whether node dirs exist)."""
    nodes = _numbered_dirs(node_dir, _NODE_DIR)
    cpu_nodes: dict[int, int] = {}
    for node in nodes:
        cpus = _cpus(f"{node_dir}/node{node}/cpulist", f"{node_dir}/node{node}/cpumap") or []
        for cpu in cpus:
            cpu_nodes.setdefault(cpu, node)
    if not nodes:
        return cpu_nodes, [0], False
    with_memory = _cpus(f"{node_dir}/has_memory")
    memory = sorted(set(with_memory) & set(nodes)) if with_memory else []
    return cpu_nodes, memory or nodes, True


def _arch(root: str, cpuinfo: str | None, sysinfo: str | None) -> str:
    if sysinfo is not None or (cpuinfo is not None and "IBM/S390" in cpuinfo):
        return "s390x"
    if os.path.realpath(root) == "/":
        return os.uname().machine or "unknown"
    return "unknown"


def read_sysfs(root: str | Path = "/", proc_root: str | Path | None = None, details: bool = True) -> Topology:
    """The topology of the machine whose ``sys/`` and ``proc/`` trees live under ``root``.

    Without ``details`` each CPU's address and dedication are not read (grouping needs neither; a
    snapshot keeps them): two files fewer per CPU for every rescan.

    ``proc_root`` overrides where ``sysinfo`` and ``cpuinfo`` are read (a container that mounts
    the host's /sys elsewhere can read its own /proc: those files are not namespaced).
    """
    root_path = os.path.normpath(os.fspath(root))  # plain strings: a read joins a dozen paths per CPU
    proc = os.path.normpath(os.fspath(proc_root)) if proc_root is not None else f"{root_path}/proc"
    if not os.path.isdir(root_path):
        raise TopologyReadError(f"{root_path}: host root does not exist or is not a directory")
    cpu_dir = f"{root_path}/sys/devices/system/cpu"
    if not os.path.isdir(cpu_dir):
        raise TopologyReadError(f"{cpu_dir}: no such directory: {root_path} does not hold a sysfs tree")
    numbers = _numbered_dirs(cpu_dir, _CPU_DIR)
    present = _cpus(f"{cpu_dir}/present")
    if present is not None:
        present_set = set(present)
        numbers = [n for n in numbers if n in present_set]
    if not numbers:
        raise TopologyReadError(f"{cpu_dir}: no present CPU directories (cpuN)")
    online_list = _cpus(f"{cpu_dir}/online")
    online_set = set(online_list) if online_list is not None else None
    containers = _Containers()
    raws = [_read_cpu(cpu_dir, n, online_set, containers, details) for n in numbers]

    sysinfo_text = _read(f"{proc}/sysinfo")
    cpuinfo_text = _read(f"{proc}/cpuinfo") if sysinfo_text is None else None
    arch = _arch(root_path, cpuinfo_text, sysinfo_text)
    info = parse_sysinfo(sysinfo_text) if sysinfo_text is not None else {}
    dispatching = {"0": "horizontal", "1": "vertical"}.get(_read(f"{cpu_dir}/dispatching") or "", "unknown")
    cpu_nodes, memory_nodes, has_node_dirs = _read_nodes(f"{root_path}/sys/devices/system/node")
    if arch == "s390x":
        environment = environment_from_sysinfo(info) if sysinfo_text is not None else "unknown"
        facility: bool | None = ("CPU Topology HW" in info) if sysinfo_text is not None else None
        machine_type = info.get("Type") or _machine_from_cpuinfo(cpuinfo_text)
    else:
        environment, facility, machine_type = "none", None, None
    machine = Machine(
        arch=arch,
        machine_type=machine_type,
        environment=environment,
        topology_facility=facility,
        dispatching=dispatching,
        memory_nodes=tuple(memory_nodes),
        has_node_dirs=has_node_dirs,
    )
    return build_topology(raws, machine, cpu_nodes)


def _machine_from_cpuinfo(cpuinfo: str | None) -> str | None:
    if cpuinfo is None:
        return None
    match = _MACHINE_RE.search(cpuinfo)
    return match.group(1) if match else None


def sysfs_fingerprint(root: str | Path = "/") -> tuple[str | None, ...]:
    """A cheap summary that changes when CPUs go online or offline, come or go, or the
    dispatching mode changes: three small files instead of a full read of every CPU."""
    cpu_dir = f"{os.path.normpath(os.fspath(root))}/sys/devices/system/cpu"
    return tuple(_read(f"{cpu_dir}/{name}") for name in ("online", "present", "dispatching"))
