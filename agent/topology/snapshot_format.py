"""The topology snapshot format: one versioned JSON document holding the model.

``topology-agent snapshot`` writes it; every command that reads topology accepts it
instead of a host root. ``to_dict``/``from_dict`` are pure; ``load``/``dump`` do the file I/O.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.errors import TopologyReadError
from agent.topology.model import DISPATCHING_MODES, ENVIRONMENTS, POLARIZATIONS, Cpu, Machine, Topology

SNAPSHOT_VERSION = 1

_CPU_INT_FIELDS = ("core", "socket", "book", "drawer", "node", "address")


def to_dict(topology: Topology) -> dict[str, Any]:
    m = topology.machine
    return {
        "version": SNAPSHOT_VERSION,
        "machine": {
            "arch": m.arch,
            "machine_type": m.machine_type,
            "generation": m.generation,
            "environment": m.environment,
            "topology_facility": m.topology_facility,
            "dispatching": m.dispatching,
            "smt_threads": m.smt_threads,
            "memory_nodes": list(m.memory_nodes),
            "has_node_dirs": m.has_node_dirs,
        },
        "cpus": [
            {
                "cpu": c.cpu,
                "core": c.core,
                "socket": c.socket,
                "book": c.book,
                "drawer": c.drawer,
                "siblings": list(c.siblings),
                "node": c.node,
                "online": c.online,
                "configured": c.configured,
                "polarization": c.polarization,
                "dedicated": c.dedicated,
                "address": c.address,
            }
            for c in topology.cpus
        ],
    }


def _want(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


def _opt_int(value: Any, what: str) -> int | None:
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
    _want(ok, f"{what} must be an integer or null")
    checked: int | None = value
    return checked


def _bool(value: Any, what: str) -> bool:
    _want(isinstance(value, bool), f"{what} must be true or false")
    return bool(value)


def from_dict(data: Any) -> Topology:
    """Build a Topology from a decoded snapshot; ValueError names the first bad field."""
    _want(isinstance(data, dict), "a snapshot is a JSON object")
    _want(data.get("version") == SNAPSHOT_VERSION,
          f"unsupported snapshot version {data.get('version')!r} (this agent reads version {SNAPSHOT_VERSION})")
    m = data.get("machine")
    _want(isinstance(m, dict), "'machine' must be an object")
    nodes = m.get("memory_nodes", [0])
    _want(isinstance(nodes, list) and bool(nodes) and all(isinstance(n, int) and n >= 0 for n in nodes),
          "machine.memory_nodes must be a non-empty list of node numbers")
    environment = m.get("environment", "unknown")
    _want(environment in ENVIRONMENTS, f"machine.environment must be one of {', '.join(ENVIRONMENTS)}")
    dispatching = m.get("dispatching", "unknown")
    _want(dispatching in DISPATCHING_MODES, f"machine.dispatching must be one of {', '.join(DISPATCHING_MODES)}")
    facility = m.get("topology_facility")
    _want(facility is None or isinstance(facility, bool), "machine.topology_facility must be true, false or null")
    smt = m.get("smt_threads", 1)
    _want(isinstance(smt, int) and smt >= 1, "machine.smt_threads must be a positive integer")
    machine_type = m.get("machine_type")
    _want(machine_type is None or isinstance(machine_type, str), "machine.machine_type must be a string or null")
    arch = m.get("arch", "unknown")
    _want(isinstance(arch, str), "machine.arch must be a string")
    machine = Machine(
        arch=arch,
        machine_type=machine_type,
        environment=environment,
        topology_facility=facility,
        dispatching=dispatching,
        smt_threads=smt,
        memory_nodes=tuple(sorted(set(nodes))),
        has_node_dirs=_bool(m.get("has_node_dirs", False), "machine.has_node_dirs"),
    )
    raw_cpus = data.get("cpus")
    _want(isinstance(raw_cpus, list), "'cpus' must be a list")
    cpus: list[Cpu] = []
    seen: set[int] = set()
    for i, raw in enumerate(raw_cpus):
        where = f"cpus[{i}]"
        _want(isinstance(raw, dict), f"{where} must be an object")
        number = raw.get("cpu")
        _want(isinstance(number, int) and not isinstance(number, bool) and number >= 0,
              f"{where}.cpu must be a CPU number")
        _want(number not in seen, f"{where}: CPU {number} appears twice")
        seen.add(number)
        ints = {name: _opt_int(raw.get(name), f"{where}.{name}") for name in _CPU_INT_FIELDS}
        siblings = raw.get("siblings", [])
        _want(isinstance(siblings, list)
              and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in siblings),
              f"{where}.siblings must be a list of CPU numbers")
        _want(not siblings or number in siblings, f"{where}.siblings must include CPU {number} itself")
        polarization = raw.get("polarization", "unknown")
        _want(polarization in POLARIZATIONS, f"{where}.polarization must be one of {', '.join(POLARIZATIONS)}")
        dedicated = raw.get("dedicated")
        _want(dedicated is None or isinstance(dedicated, bool), f"{where}.dedicated must be true, false or null")
        cpus.append(
            Cpu(
                cpu=number,
                siblings=tuple(sorted(set(siblings))),
                online=_bool(raw.get("online", True), f"{where}.online"),
                configured=_bool(raw.get("configured", True), f"{where}.configured"),
                polarization=polarization,
                dedicated=dedicated,
                **ints,
            )
        )
    _check_cores(cpus)
    return Topology(machine=machine, cpus=tuple(cpus))


def _check_cores(cpus: list[Cpu]) -> None:
    """SMT siblings must describe whole cores: present CPUs that agree on their core and sit in
    the same drawer, book and socket (else groups would split cores or share threads)."""
    by_number = {c.cpu: c for c in cpus}
    for c in cpus:
        for sibling in c.siblings:
            other = by_number.get(sibling)
            _want(other is not None, f"CPU {c.cpu}: sibling CPU {sibling} is not in the snapshot")
            assert other is not None
            _want(other.siblings == c.siblings,
                  f"CPU {c.cpu} and its sibling CPU {sibling} disagree on their core's threads")
            _want(other.socket_key == c.socket_key,
                  f"CPU {c.cpu} and its sibling CPU {sibling} are in different drawers, books or sockets")


def dumps(topology: Topology) -> str:
    return json.dumps(to_dict(topology), indent=1, sort_keys=False) + "\n"


MAX_SNAPSHOT_BYTES = 16 * 2**20


def loads(text: str, source: str = "<snapshot>") -> Topology:
    if not text.strip():
        raise TopologyReadError(f"{source}: empty file, not a topology snapshot (make one with "
                                "`topology-agent snapshot -o FILE`)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TopologyReadError(f"{source}: not valid JSON: {exc}") from None
    except RecursionError:  # arrays or objects nested a thousand deep: no snapshot looks like that
        raise TopologyReadError(f"{source}: not a topology snapshot: JSON nested too deeply") from None
    try:
        return from_dict(data)
    except ValueError as exc:
        raise TopologyReadError(f"{source}: not a topology snapshot: {exc}") from None


def load(path: str | Path) -> Topology:
    p = Path(path)
    try:
        with p.open("rb") as f:  # bounded: /dev/zero or a huge file is refused, not read into memory
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
        if len(data) > MAX_SNAPSHOT_BYTES:
            raise TopologyReadError(f"{p}: not a topology snapshot: larger than {MAX_SNAPSHOT_BYTES // 2**20} MiB "
                                    "(a 400-CPU machine's is well under 1 MiB)")
        text = data.decode("utf-8")
    except OSError as exc:
        raise TopologyReadError(f"{p}: cannot read topology file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TopologyReadError(f"{p}: not a topology snapshot: not UTF-8 text") from None
    return loads(text, str(p))


def dump(topology: Topology, path: str | Path) -> None:
    Path(path).write_text(dumps(topology), encoding="utf-8")
