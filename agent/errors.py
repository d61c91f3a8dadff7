"""Every exception the agent raises, in one place. Imports nothing: the core and the shell both use it.

The convention: one class per kind of failure a caller may handle differently, all derived from
:class:`AgentError`. The command line prints a :class:`UserError` as one line and exits 2; anything
else that escapes is a bug. Classes that also derive from ``ValueError`` are bad values.
"""

from __future__ import annotations


def one_line(message: str) -> str:
    """A message as one line whatever it quotes (a value with a newline or another control character): such
    characters shown escaped, as Python writes them, never acted on."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message)


class AgentError(Exception):
    """Base of the agent's own errors."""


class UserError(AgentError):
    """Input or configuration a person must fix: printed as one line, exit status 2."""


# --- input and settings -------------------------------------------------------------------------
class UsageError(UserError):
    """A flag value or argument that cannot be used."""


class TopologyReadError(UserError):
    """Input that cannot be read as topology: the message names the file and the problem."""


class CpuListError(UserError, ValueError):
    """A CPU list or mask that is not in the kernel's format."""


class PolicyError(UserError, ValueError):
    """Grouping settings that cannot be applied (bad level, resource prefix or polarization)."""


# --- start-up ----------------------------------------------------------------------------------
class StartupError(UserError):
    """Something the agent needs is taken or unusable (a socket, a port)."""


class NewerStateError(StartupError):
    """A state file of a format newer than this agent knows (a rollback past a format change): the agent refuses to
    start and never writes over the file."""


class SocketInUseError(StartupError):
    """Another live process serves our socket: at start a reason to exit, later a reason to wait."""


class SocketPathError(AgentError):
    """Our socket cannot be made right now (a directory in its place, a failing bind, no descriptors
    left): retried with backoff, never a reason to exit."""


class EndpointError(StartupError):
    """The metrics port cannot be served (in use, bad address)."""


# --- kubelet and its files ---------------------------------------------------------------------
class RegistrationError(AgentError):
    """kubelet refused the registration or could not be reached."""


class RegistrationAbandoned(RegistrationError):
    """A Register given up because kubelet restarted meanwhile (or the agent stops): register again at once."""


class PodResourcesError(AgentError):
    """The pod-resources socket is missing or kubelet did not answer."""


class CpuManagerStateError(AgentError, ValueError):
    """A CPU manager checkpoint that cannot be read or is not in kubelet's format."""


class KubeletConfigError(AgentError, ValueError):
    """A kubelet config file that cannot be read or has a bad ``reservedSystemCPUs``."""


class SavedStateError(AgentError, ValueError):
    """A saved state file (groups, holds) that cannot be trusted: the message says why."""


class KubeApiError(AgentError):
    """The Kubernetes API server answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404


class NodeLabelerError(AgentError):
    """No Kubernetes API configuration at all (neither in-cluster nor a kubeconfig)."""


# --- the container runtime ------------------------------------------------------------------------
class CriError(AgentError):
    """A CRI call failed: no socket, the runtime did not answer in time, or it refused the call.

    The message is one line naming the socket, the call and the gRPC code; ``code`` is that code's
    name (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``NOT_FOUND``, ...), or ``NO_SOCKET``.
    """

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


# --- requests kubelet sends ----------------------------------------------------------------------
class PreferenceError(AgentError, ValueError):
    """A GetPreferredAllocation request that cannot be answered (unknown must-include ids, bad size)."""


class Refusal(AgentError):
    """An Allocate the agent refuses; ``kind`` says why, so the plugin can map it to a gRPC code.

    ``invalid``: ids that are unknown, duplicated or missing (INVALID_ARGUMENT).
    ``conflict``: a device overlapping a held one (FAILED_PRECONDITION).
    ``unhealthy``: a group that lost CPUs since it was advertised (FAILED_PRECONDITION).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
