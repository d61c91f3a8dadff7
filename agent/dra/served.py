"""Whether the API server serves what DRA mode writes: read once at start, before anything is published.

Must hold: the agent writes ``resource.k8s.io/v1`` only, with shared counters in slices of their own (the layout of
partitionable devices from Kubernetes 1.35 on); so it refuses ``--mode dra`` with one line naming the minor it needs
on an API server that serves no v1 or is older than 1.35, and on 1.35 warns that the ``DRAPartitionableDevices``
gate must be on (a client cannot see it). A server that answers neither discovery nor ``/version`` is let through
with a warning: the first publication then fails with the API server's own message. Why, with the KEP:
docs/contributing/design/dra-slices.md ("Which API servers take the slices")."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agent.errors import KubeApiError, StartupError

log = logging.getLogger("topology-agent.dra")

GROUP = "resource.k8s.io"
WRITTEN = ("v1",)  # the versions of the group the agent writes and reads, newest first
MINIMUM = (1, 36)  # partitionable devices beta and on by default (KEP-4815)
WITH_GATE = (1, 35)  # the counter layout the agent publishes, behind the DRAPartitionableDevices gate
NEEDS = "Kubernetes 1.36 or newer (1.35 with the DRAPartitionableDevices feature gate on)"


@runtime_checkable
class ServedApi(Protocol):
    def served_versions(self, group: str) -> list[str] | None:
        """The versions of ``group`` the API server serves, preferred first; None when it serves no such group."""

    def server_version(self) -> dict[str, Any]:
        """The API server's ``/version`` document (``gitVersion``, ``major``, ``minor``)."""


@dataclass(frozen=True)
class Served:
    """What the API server said: the group's versions (None: the group is not served) and its version document."""

    versions: tuple[str, ...] | None
    git_version: str = ""
    major: int | None = None
    minor: int | None = None

    @classmethod
    def of(cls, versions: Sequence[str] | None, version: dict[str, Any]) -> Served:
        major, minor = _number(version.get("major")), _number(version.get("minor"))
        git = str(version.get("gitVersion") or "")
        if (major is None or minor is None) and (found := re.match(r"v?(\d+)\.(\d+)", git)):
            major, minor = int(found.group(1)), int(found.group(2))
        return cls(tuple(versions) if versions is not None else None, git, major, minor)

    @property
    def name(self) -> str:
        return self.git_version or (f"v{self.major}.{self.minor}" if self.minor is not None else "of unknown version")


def choose_version(served: Served) -> str:
    """The ``resource.k8s.io`` version DRA mode uses on this API server, or StartupError (one line) naming the
    Kubernetes minor it needs and why this server is not it."""
    if served.versions is not None and not served.versions:
        served = Served(None, served.git_version, served.major, served.minor)
    if served.versions is None:
        raise StartupError(f"--mode dra needs {NEEDS}: the API server ({served.name}) serves no {GROUP} API "
                           "(Dynamic Resource Allocation is off); use mode deviceplugin on this cluster")
    usable = [v for v in WRITTEN if v in served.versions]
    if not usable:
        raise StartupError(f"--mode dra needs {NEEDS}: the API server ({served.name}) serves {GROUP} "
                           f"{', '.join(served.versions)}, not {' or '.join(WRITTEN)}; use mode deviceplugin on this "
                           "cluster")
    if served.major is not None and served.minor is not None and (served.major, served.minor) < WITH_GATE:
        raise StartupError(f"--mode dra needs {NEEDS}: the API server is {served.name}, whose ResourceSlices keep "
                           "shared counters beside the devices that consume them, not in slices of their own as the "
                           "agent publishes them; use mode deviceplugin on this cluster")
    if served.major is not None and served.minor is not None and (served.major, served.minor) < MINIMUM:
        log.warning("the API server is %s: the ResourceSlices' shared counters need the DRAPartitionableDevices "
                    "feature gate on in the API server and the scheduler (beta and on by default from 1.36); "
                    "without it a book and its sockets could be allocated at once", served.name)
    return usable[0]


def check_served(api: ServedApi) -> str:
    """Read what the API server serves and choose (:func:`choose_version`); a server that does not say is let
    through with a warning (the version the agent writes; a wrong guess fails at the first publication, loudly)."""
    try:
        served = Served.of(api.served_versions(GROUP), api.server_version())
    except (KubeApiError, OSError) as exc:
        log.warning("could not read which %s versions the API server serves (%s): assuming %s", GROUP, exc,
                    WRITTEN[0])
        return WRITTEN[0]
    version = choose_version(served)
    log.info("the API server (%s) serves %s %s: DRA mode writes %s/%s", served.name, GROUP,
             ", ".join(served.versions or ()), GROUP, version)
    return version


def _number(value: Any) -> int | None:
    """``"34"`` or ``"34+"`` (managed distributions add a plus) as 34; None for anything else."""
    found = re.match(r"(\d+)", str(value or ""))
    return int(found.group(1)) if found else None
