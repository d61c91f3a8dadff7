"""The topology model: what one node's CPUs look like. Pure data, no I/O.

Container ids on IBM Z are hierarchical, not globally unique (the z13 dump has sockets 2
and 3 inside book 1 inside drawer 4), so a socket is keyed by (drawer, book, socket) and a
book by (drawer, book). ``None`` stands for "this level does not exist or is unknown".
"""

from __future__ import annotations

from dataclasses import dataclass

POLARIZATIONS: tuple[str, ...] = (
    "horizontal",
    "vertical:high",
    "vertical:medium",
    "vertical:low",
    "unknown",
)

# /proc/sysinfo "Type:" -> generation name.
MACHINE_GENERATIONS: dict[str, str] = {
    "2817": "z196",
    "2818": "z114",
    "2827": "zEC12",
    "2828": "zBC12",
    "2964": "z13",
    "2965": "z13s",
    "3906": "z14",
    "3907": "z14",
    "8561": "z15",
    "8562": "z15",
    "3931": "z16",
    "3932": "z16",
    "9175": "z17",
    "9176": "z17",
}

ENVIRONMENTS: tuple[str, ...] = ("lpar", "zvm", "kvm", "unknown", "none")
DISPATCHING_MODES: tuple[str, ...] = ("horizontal", "vertical", "unknown")

SocketKey = tuple[int | None, int | None, int | None]
BookKey = tuple[int | None, int | None]


# sysfs's and lscpu's spellings of each polarization.
_POLARIZATION_ALIASES: dict[str, str] = {
    "horizontal": "horizontal",
    "horiz": "horizontal",
    "vertical:high": "vertical:high",
    "vert-high": "vertical:high",
    "vertical:medium": "vertical:medium",
    "vert-medium": "vertical:medium",
    "vertical:low": "vertical:low",
    "vert-low": "vertical:low",
}


def normalize_polarization(text: str | None) -> str:
    """Map sysfs (``vertical:low``) and lscpu (``vert-low``) spellings to the model's."""
    if text is None:
        return "unknown"
    return _POLARIZATION_ALIASES.get(text.strip().lower(), "unknown")


def generation_of(machine_type: str | None) -> str | None:
    """The IBM Z generation for a machine type number, or None when unknown."""
    if machine_type is None:
        return None
    return MACHINE_GENERATIONS.get(machine_type.strip())


@dataclass(frozen=True, slots=True)
class Cpu:
    """One logical CPU (an SMT thread on SMT machines)."""

    cpu: int
    core: int | None = None
    socket: int | None = None
    book: int | None = None
    drawer: int | None = None
    siblings: tuple[int, ...] = ()  # SMT threads of this CPU's core, itself included, sorted
    node: int | None = None  # NUMA node listing this CPU, None when the machine has no node dirs
    online: bool = True
    configured: bool = True  # False: standby (deconfigured) on an LPAR
    polarization: str = "unknown"
    dedicated: bool | None = None
    address: int | None = None

    @property
    def socket_key(self) -> SocketKey:
        return (self.drawer, self.book, self.socket)

    @property
    def book_key(self) -> BookKey:
        return (self.drawer, self.book)

    @property
    def threads(self) -> tuple[int, ...]:
        """The CPUs of this CPU's core (itself alone when siblings are unknown)."""
        return self.siblings or (self.cpu,)


@dataclass(frozen=True, slots=True)
class Machine:
    """Facts about the machine as a whole."""

    arch: str = "unknown"  # "s390x", "x86_64", "aarch64", ... or "unknown"
    machine_type: str | None = None  # /proc/sysinfo Type, e.g. "3931"
    environment: str = "unknown"  # lpar | zvm | kvm | unknown | none (not s390)
    topology_facility: bool | None = None  # "CPU Topology HW:" present; None when not s390
    dispatching: str = "unknown"  # horizontal | vertical | unknown
    smt_threads: int = 1  # SMT threads per core
    memory_nodes: tuple[int, ...] = (0,)  # real memory nodes; (0,) when there is no node dir
    has_node_dirs: bool = False

    @property
    def generation(self) -> str | None:
        return generation_of(self.machine_type)

    @property
    def is_s390(self) -> bool:
        return self.arch == "s390x"


@dataclass(frozen=True, slots=True)
class Topology:
    """Every CPU the node has (present CPUs) and the machine facts."""

    machine: Machine
    cpus: tuple[Cpu, ...] = ()  # ascending CPU numbers, each once (the last of a repeated number kept)

    def __post_init__(self) -> None:
        numbers = [c.cpu for c in self.cpus]
        if numbers != sorted(set(numbers)):
            cpus = tuple(sorted({c.cpu: c for c in self.cpus}.values(), key=lambda c: c.cpu))
            object.__setattr__(self, "cpus", cpus)  # frozen: normalized once, here

    def by_number(self) -> dict[int, Cpu]:
        return {c.cpu: c for c in self.cpus}

    @property
    def online_cpus(self) -> list[int]:
        return [c.cpu for c in self.cpus if c.online]
