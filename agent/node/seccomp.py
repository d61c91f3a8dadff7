"""The seccomp profile vLLM pods need, shipped with the agent and installed on each node.

``vllm-numa.json`` is containerd 1.6.20's RuntimeDefault profile (``contrib/seccomp/seccomp_default.go``,
``DefaultProfile``, for a pod with the default CRI capabilities and without CAP_SYS_ADMIN) plus the
NUMA calls vLLM's memory binding makes: ``get_mempolicy``, ``set_mempolicy``, ``mbind``,
``migrate_pages``, ``move_pages`` (RuntimeDefault allows the first three only with CAP_SYS_NICE and
the last two never). It is in the OCI runtime-spec format, the one containerd reads a Localhost
profile as (``specs.LinuxSeccomp``) and CRI-O also accepts. One file per node architecture:
libseccomp refuses to mix big-endian (s390x) and little-endian architectures in one filter, and
``clone``'s flags are argument 1 on s390x but 0 elsewhere. Pods name it the same on every node:
``seccompProfile: {type: Localhost, localhostProfile: profiles/vllm-numa.json}``.
"""

from __future__ import annotations

import platform
from importlib.resources import files
from pathlib import Path

from agent.atomic import write_atomically
from agent.errors import UsageError

PROFILE_NAME = "vllm-numa.json"
# platform.machine() -> the architecture name of the shipped file (Go's GOARCH, as containerd uses).
ARCHITECTURES: dict[str, str] = {"s390x": "s390x", "x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64",
                                 "arm64": "arm64"}


def node_arch() -> str:
    return platform.machine()


def profile(arch: str) -> bytes:
    """The profile for ``arch`` (``s390x``, ``amd64``/``x86_64``, ``arm64``/``aarch64``)."""
    goarch = ARCHITECTURES.get(arch)
    if goarch is None:
        raise UsageError(f"no seccomp profile for architecture {arch!r} (have: s390x, amd64, arm64)")
    return files("agent").joinpath("data", "seccomp", f"vllm-numa-{goarch}.json").read_bytes()


def install(directory: Path, arch: str) -> bool:
    """Write ``directory/vllm-numa.json`` for ``arch`` atomically; False when it was already there."""
    content = profile(arch)
    target = Path(directory) / PROFILE_NAME
    try:
        if target.read_bytes() == content:
            return False
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise UsageError(f"cannot read {target}: {exc.strerror or exc}") from None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, content)
    except OSError as exc:
        raise UsageError(f"cannot install the seccomp profile in {directory}: {exc.strerror or exc}") from None
    return True
