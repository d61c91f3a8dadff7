"""CRI-O as the lane's node runtime (``make cluster-up RUNTIME=crio``): its configuration, its images, and what
``cluster-down`` removes after it.

CRI-O 1.34.0 (built by ``devkit/cluster/build.sh crio`` with Kubernetes 1.34) runs the pods through Debian's conmon
and the lane's runc, with the cgroupfs manager (kubelet's ``cgroupDriver: cgroupfs``: these machines have cgroup v1
and no systemd), and NRI on (its default in 1.34: ``internal/config/nri/nri.go`` ``New``). Its paths are the ones a
CRI-O node has (the chart's ``criSocket: /run/crio/crio.sock``; containers/storage under ``/var/lib/containers`` and
``/run/containers``; pinned namespaces under ``/var/run/{net,uts,ipc,user}ns``), except for what would reach into
the host's own configuration: no drop-in folder (``--config-dir`` is the lane's, empty), the signature policy, the
NRI plugin folders and irqbalance's files are the lane's (CRI-O otherwise writes a restore file of irqbalance's
banned CPUs at ``/etc/sysconfig/orig_irq_banned_cpus``: ``server/server.go``, ``RestoreIrqBalanceConfig``).

Images go into containers/storage with CRI-O's own copier (``test/copyimg`` of the same module and build tags), from
the OCI archives the containerd lane imports: no registry, no second tool.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .layout import CDI_DIR, NRI_SOCKET, PAUSE_IMAGE, Layout
from .mounts import mounts_under, remove_tree, unmount
from .procs import ClusterError, alive, kill_and_wait, pids_of, run

CRIO_SOCKET = Path("/run/crio/crio.sock")
CRIO_STATE = Path("/run/crio")  # the socket's folder, mounted into the agent's pod (the chart's criSocket folder)
STORAGE_ROOT = Path("/var/lib/containers/storage")
STORAGE_RUNROOT = Path("/run/containers/storage")
CRIO_LIB = Path("/var/lib/crio")  # the clean-shutdown file
CRIO_LOGS = Path("/var/log/crio")
RUNC_ROOT = Path("/run/runc")  # CRI-O's runc handler state (its documented default root for runc)
NAMESPACES_DIR = Path("/var/run")  # pinns pins each pod's namespaces in <dir>/<kind>ns/<uuid> (CRI-O's default)
PINNED_KINDS = ("netns", "utsns", "ipcns", "userns", "pidns")
CONMON = Path("/usr/bin/conmon")  # Debian's conmon (versions.env CONMON_DEBIAN_VERSION)
# CRI-O names a pod's pinned namespaces by a UUID (internal/config/nsmgr: uuid.New()); CNI's netns of the containerd
# lane are cni-<uuid>.
_PINNED_NAME = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def config_dir(layout: Layout) -> Path:
    """The drop-in folder CRI-O reads after its config file (the lane's own, empty: none of the host's apply)."""
    return layout.etc / "crio.conf.d"


def crio_root(layout: Layout) -> Path:
    return layout.root / "crio"


def crio_config(layout: Layout, bin_dir: Path) -> str:
    """crio.conf for the lane (TOML; every key as CRI-O v1.34.0's ``crio config`` names it)."""
    root = crio_root(layout)
    return f"""# The real-cluster lane's CRI-O (devkit/topology_devkit/realcluster/crio.py).
[crio]
root = "{STORAGE_ROOT}"
runroot = "{STORAGE_RUNROOT}"
storage_driver = "overlay"
log_dir = "{CRIO_LOGS / 'pods'}"
version_file = "{CRIO_STATE / 'version'}"
clean_shutdown_file = "{CRIO_LIB / 'clean.shutdown'}"

[crio.api]
listen = "{CRIO_SOCKET}"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
# cgroup v1 and no systemd here: kubelet's cgroupDriver is cgroupfs, and CRI-O's manager must match it.
cgroup_manager = "cgroupfs"
pinns_path = "{bin_dir / 'pinns'}"
namespaces_dir = "{NAMESPACES_DIR}"
container_exits_dir = "{CRIO_STATE / 'exits'}"
container_attach_socket_dir = "{CRIO_STATE}"
cdi_spec_dirs = ["/etc/cdi", "{CDI_DIR}"]
irqbalance_config_file = "{root / 'irqbalance'}"
irqbalance_config_restore_file = "disable"
log_level = "info"

[crio.runtime.runtimes.runc]
# The lane's runc, through restrict_oom.py on these machines (no CAP_SYS_RESOURCE): see runc_wrapper.
runtime_path = "{runc_wrapper(layout)}"
runtime_type = "oci"
runtime_root = "{RUNC_ROOT}"
monitor_path = "{CONMON}"
# With cgroupfs, conmon goes into the pod's cgroup (CRI-O refuses any other value for cgroupfs).
monitor_cgroup = "pod"

[crio.image]
pause_image = "{PAUSE_IMAGE}"
pause_command = "/pause"
pinned_images = ["{PAUSE_IMAGE}"]
signature_policy = "{layout.etc / 'policy.json'}"

[crio.network]
network_dir = "{layout.cni_conf}"
plugin_dirs = ["{bin_dir / 'cni'}"]

[crio.nri]
enable_nri = true
nri_listen = "{NRI_SOCKET}"
nri_plugin_dir = "{root / 'nri' / 'plugins'}"
nri_plugin_config_dir = "{root / 'nri' / 'conf.d'}"
"""


RESTRICT_OOM = Path(__file__).with_name("restrict_oom.py")


def runc_wrapper(layout: Layout) -> Path:
    return crio_root(layout) / "runc"


def runc_wrapper_script(bin_dir: Path) -> str:
    """What CRI-O runs as runc: the lane's runc, with a create's or run's OCI spec first held to this VM's limit on
    ``oom_score_adj`` by :mod:`.restrict_oom` (containerd's ``restrict_oom_score_adj``, which CRI-O lacks); every other
    call goes straight to runc."""
    runc = bin_dir / "runc"
    return f"""#!/bin/sh
# The real-cluster lane's runc for CRI-O (devkit/topology_devkit/realcluster/restrict_oom.py says why).
case " $* " in
  *" create "*|*" run "*) exec /usr/bin/python3 {RESTRICT_OOM} {runc} "$@" ;;
esac
exec {runc} "$@"
"""


def signature_policy() -> str:
    """containers/image's policy for the lane's local images (no registry, nothing signed)."""
    return json.dumps({"default": [{"type": "insecureAcceptAnything"}]}, indent=1) + "\n"


def write_config(layout: Layout, bin_dir: Path) -> Path:
    path = layout.etc / "crio.conf"
    path.write_text(crio_config(layout, bin_dir))
    (layout.etc / "policy.json").write_text(signature_policy())
    config_dir(layout).mkdir(parents=True, exist_ok=True)
    for folder in ("nri/plugins", "nri/conf.d"):
        (crio_root(layout) / folder).mkdir(parents=True, exist_ok=True)
    runc_wrapper(layout).write_text(runc_wrapper_script(bin_dir))
    runc_wrapper(layout).chmod(0o755)
    return path


def argv(layout: Layout, bin_dir: Path) -> list[str]:
    return [str(bin_dir / "crio"), "--config", str(layout.etc / "crio.conf"), "--config-dir", str(config_dir(layout))]


def probe_host() -> None:
    if not CONMON.is_file():
        raise ClusterError(f"CRI-O needs conmon at {CONMON}: apt-get install conmon (Debian's, as .ci/run does)")


HUGETLB = Path("/sys/fs/cgroup/hugetlb")


def _hugetlb_marker(layout: Layout) -> Path:
    return crio_root(layout) / "hugetlb-mounted"


def _kernel_has_hugetlb() -> bool:
    for line in Path("/proc/cgroups").read_text().splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == "hugetlb" and fields[-1] == "1":
            return True
    return False


def mount_hugetlb(layout: Layout) -> str | None:
    """Mount cgroup v1's hugetlb controller where a node has it, when the kernel has it and nothing mounted it; a note
    when the lane did (``cluster-down`` unmounts it again).

    CRI-O takes the controllers the kernel lists in /proc/cgroups for the ones it can use
    (``internal/config/node/cgroups_linux.go``, ``checkRelevantControllers``: opencontainers/cgroups'
    ``GetAllSubsystems``), so it passes kubelet's hugepage limits into every container's spec
    (``internal/factory/container/container.go``, "If the kernel has no support for hugetlb, silently ignore the
    limits"), and runc then fails every container here ("cannot set hugetlb limit: container could not join or create
    cgroup"): these machines enable hugetlb in the kernel but mount it nowhere. A real node's init mounts every
    controller; containerd has ``disable_hugetlb_controller``, CRI-O has no such setting.
    """
    if not _kernel_has_hugetlb() or mounts_under([HUGETLB]):
        return None
    HUGETLB.mkdir(exist_ok=True)
    run(["mount", "-t", "cgroup", "-o", "hugetlb", "hugetlb", str(HUGETLB)], timeout=30)
    _hugetlb_marker(layout).parent.mkdir(parents=True, exist_ok=True)
    _hugetlb_marker(layout).write_text(f"{HUGETLB}\n")
    return f"mounted cgroup v1's hugetlb controller at {HUGETLB} (the kernel has it, nothing had mounted it)"


def unmount_hugetlb(layout: Layout) -> list[str]:
    """Unmount the hugetlb controller when the lane mounted it (after the pods' cgroups are gone); what stayed."""
    if not _hugetlb_marker(layout).exists():
        return []
    unmount([HUGETLB])
    if mounts_under([HUGETLB]):
        return [str(HUGETLB)]
    try:
        HUGETLB.rmdir()
    except OSError:
        return [str(HUGETLB)]
    _hugetlb_marker(layout).unlink(missing_ok=True)
    return []


def answers(timeout: float = 3.0) -> bool:
    """CRI-O answers a CRI Version call on its socket."""
    from agent.cri.client import CriClient
    from agent.errors import CriError

    client = CriClient(CRIO_SOCKET, timeout=timeout)
    try:
        return client.version().startswith("cri-o ")
    except CriError:
        return False
    finally:
        client.close()


def import_archives(bin_dir: Path, layout: Layout, archives: list[tuple[str, Path]]) -> list[str]:
    """Each (name, OCI archive) into CRI-O's containers/storage under that name, with CRI-O's own copier (the store
    is shared with a running CRI-O through containers/storage's locks, as ``podman load`` shares it); the names."""
    names = []
    for name, archive in archives:
        run([str(bin_dir / "copyimg"), "--root", str(STORAGE_ROOT), "--runroot", str(STORAGE_RUNROOT),
             "--storage-driver", "overlay", "--signature-policy", str(layout.etc / "policy.json"),
             "--image-name", name, "--import-from", f"oci-archive:{archive}"], timeout=1800)
        names.append(name)
    return names


def listed_images(timeout: float = 10.0) -> set[str]:
    """The image names CRI-O lists (CRI ListImages), for an import that is done already."""
    import grpc

    from agent._proto.runtime.v1 import api_pb2 as cri
    from agent._proto.runtime.v1 import api_pb2_grpc as cri_grpc

    channel = grpc.insecure_channel(f"unix://{CRIO_SOCKET}")
    try:
        answer = cri_grpc.ImageServiceStub(channel).ListImages(cri.ListImagesRequest(), timeout=timeout)
        return {tag for image in answer.images for tag in image.repo_tags}
    except grpc.RpcError as err:
        raise ClusterError(f"CRI-O did not list its images: {err.code().name}") from None
    finally:
        channel.close()


def own_monitors() -> list[int]:
    """The lane's conmon processes (by their exit folder: CRI-O passes ``--exit-dir <container_exits_dir>``)."""
    return pids_of("conmon", str(CRIO_STATE / "exits"))


def stop_monitors() -> None:
    for pid in own_monitors():
        if alive(pid):
            kill_and_wait(pid, 2.0)


def pinned_namespaces() -> list[Path]:
    """The namespace files CRI-O's pinns left in the namespaces folders (bind mounts, named by UUID)."""
    found = []
    for kind in PINNED_KINDS:
        folder = NAMESPACES_DIR / kind
        for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
            if _PINNED_NAME.match(entry.name):
                found.append(entry)
    return found


def state_paths() -> list[Path]:
    """Where CRI-O keeps state that mounts may sit below (storage layers, shm, pinned namespaces)."""
    return [STORAGE_ROOT, STORAGE_RUNROOT, CRIO_STATE, RUNC_ROOT, *pinned_namespaces()]


def clean_host(layout: Layout) -> list[str]:
    """Unmount and remove what CRI-O left on the host (after it and its pods stopped, and their cgroups are gone);
    what stayed mounted."""
    for entry in pinned_namespaces():
        unmount([entry])
        if not mounts_under([entry]):
            entry.unlink(missing_ok=True)
    for kind in PINNED_KINDS:
        folder = NAMESPACES_DIR / kind
        if kind != "netns" and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # pinns made it (uts, ipc, user, pid: nothing else uses these folders)
    left: list[str] = []
    for path in (STORAGE_ROOT, STORAGE_RUNROOT, CRIO_STATE, CRIO_LIB, CRIO_LOGS, RUNC_ROOT):
        left += remove_tree(path)
    for parent in (STORAGE_ROOT.parent, STORAGE_RUNROOT.parent):  # /var/lib/containers keeps other tools' files
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
    left += unmount_hugetlb(layout)
    left += remove_tree(crio_root(layout))
    return left


def state_mode_note() -> str | None:
    """CRI-O makes its socket's folder itself; what mode it has is said by status (the agent needs its x bit)."""
    try:
        mode = CRIO_STATE.stat().st_mode & 0o7777
    except OSError:
        return None
    return None if mode & 0o111 else f"{CRIO_STATE} is {mode:04o}: the agent (uid 0, no capabilities) cannot reach it"


def environment(bin_dir: Path) -> dict[str, str]:
    """CRI-O's environment: the lane's binaries first on PATH (CNI plugins are found by plugin_dirs)."""
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
