"""Read the topology from ``lscpu -J -e=...`` output: a second source and a cross-check of sysfs, and what vLLM sees
(it runs ``lscpu -J -e=CPU,CORE,NODE,SOCKET,BOOK`` on s390x).

``parse_lscpu_json`` is pure; ``read_lscpu`` runs the command and parses its output. Every util-linux dialect is
read (strings, numbers, a bare ``-`` for a missing number, repaired by :func:`repair_lscpu_json` only where a JSON
value stands alone); anything else is a :class:`TopologyReadError` naming the source, the cpu entry and the value.
lscpu's CORE/SOCKET/BOOK/DRAWER are logical indexes in order of first appearance, kept as the model's ids.

Must hold: machine facts are only what the per-CPU table tells (s390x from BOOK/DRAWER/ADDRESS/polarization, no
machine type). The dialects and the facts, one by one: docs/contributing/design/lscpu.md."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping
from typing import Any

from agent.errors import TopologyReadError
from agent.topology.model import Cpu, Machine, Topology, normalize_polarization

# The columns the agent asks for. Output with fewer columns, or in another order, parses too.
LSCPU_COLUMNS: tuple[str, ...] = (
    "CPU",
    "CORE",
    "SOCKET",
    "BOOK",
    "DRAWER",
    "NODE",
    "POLARIZATION",
    "ADDRESS",
    "CONFIGURED",
    "ONLINE",
)
DEFAULT_TIMEOUT = 10.0

_MISSING_STRINGS = frozenset({"-", ""})
_DIGITS = re.compile(r"[0-9]+")
_TRUE = frozenset({"yes", "y", "true", "1"})
_FALSE = frozenset({"no", "n", "false", "0"})
# lscpu's parsable (-p) short forms, on top of what normalize_polarization knows.
_POLARIZATION_SHORT = {"h": "horizontal", "vh": "vertical:high", "vm": "vertical:medium", "vl": "vertical:low"}
_POLARIZATION_UNKNOWN = frozenset({"-", "", "u", "unknown"})
_WHITESPACE = " \t\r\n"


def repair_lscpu_json(text: str) -> str:
    """Replace each bare ``-`` that stands for a value with ``null`` (util-linux 2.38-2.40).

    Only a ``-`` in value position (after ``:`` inside an object, after ``[`` or ``,`` inside
    an array) whose next non-blank character is ``,``, ``}``, ``]`` or the end of the text is
    replaced. Strings (escapes included) are copied unchanged, so are negative numbers and a
    ``-`` anywhere else, which leaves invalid input invalid. Valid JSON is returned unchanged.
    """
    if "-" not in text:
        return text
    out: list[str] = []
    stack: list[str] = []  # open containers, "{" or "["
    last = ""  # last significant character outside strings
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
            last = '"'
            continue
        if ch == "-" and stack:
            value_position = last == ":" or (stack[-1] == "[" and last in ("[", ","))
            if value_position:
                k = i + 1
                while k < n and text[k] in _WHITESPACE:
                    k += 1
                if k == n or text[k] in ",}]":
                    out.append("null")
                    last = "l"
                    i += 1
                    continue
        if ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
        if ch not in _WHITESPACE:
            last = ch
        out.append(ch)
        i += 1
    return "".join(out)


def _decode(text: str, source: str) -> Any:
    if not text.strip():
        raise TopologyReadError(f"{source}: empty lscpu output")
    repaired = repair_lscpu_json(text.lstrip("\ufeff"))
    try:
        return json.loads(repaired)
    except json.JSONDecodeError as exc:
        near = repaired[max(exc.pos - 15, 0) : exc.pos + 15]
        raise TopologyReadError(
            f"{source}: not valid lscpu JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (near {near!r})"
        ) from None


class _Cell:
    """Reads one cpu entry's cells, raising errors that name the source and the entry."""

    def __init__(self, source: str, index: int, entry: Mapping[str, Any]) -> None:
        self.source = source
        self.index = index
        self.entry = entry
        self.where = f"cpus[{index}]"

    def fail(self, key: str, value: Any, expected: str) -> TopologyReadError:
        return TopologyReadError(f"{self.source}: {self.where}: bad {key!r} value {value!r} (expected {expected})")

    def integer(self, key: str) -> int | None:
        value = self.entry.get(key)
        if value is None:
            return None
        if isinstance(value, bool):
            raise self.fail(key, value, "a non-negative integer or '-'")
        if isinstance(value, int):
            if value < 0:
                raise self.fail(key, value, "a non-negative integer or '-'")
            return value
        if isinstance(value, str):
            stripped = value.strip()
            if stripped in _MISSING_STRINGS:
                return None
            if _DIGITS.fullmatch(stripped):
                return int(stripped, 10)
        raise self.fail(key, value, "a non-negative integer or '-'")

    def flag(self, key: str) -> bool:
        """A yes/no cell; missing or unknown (``-``) counts as True, the model's default."""
        value = self.entry.get(key)
        if value is None:
            return True
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            word = value.strip().lower()
            if word in _MISSING_STRINGS:
                return True
            if word in _TRUE:
                return True
            if word in _FALSE:
                return False
        raise self.fail(key, value, "true/false, yes/no or '-'")

    def polarization(self, key: str) -> str:
        value = self.entry.get(key)
        if value is None:
            return "unknown"
        if isinstance(value, str):
            word = value.strip().lower()
            if word in _POLARIZATION_UNKNOWN:
                return "unknown"
            if word in _POLARIZATION_SHORT:
                return _POLARIZATION_SHORT[word]
            normalized = normalize_polarization(word)
            if normalized != "unknown":
                return normalized
        raise self.fail(key, value, "horizontal, vert-high, vert-medium, vert-low or '-'")


def _cpus_of(data: Any, source: str) -> list[Any]:
    if not isinstance(data, dict):
        raise TopologyReadError(f'{source}: lscpu JSON must be an object with a "cpus" list, got {type(data).__name__}')
    if "cpus" not in data:
        hint = " (this is `lscpu -J` summary output; run `lscpu -J -e=...`)" if "lscpu" in data else ""
        raise TopologyReadError(f'{source}: no "cpus" list in lscpu JSON{hint}')
    cpus = data["cpus"]
    if not isinstance(cpus, list):
        raise TopologyReadError(f'{source}: "cpus" must be a list, got {type(cpus).__name__}')
    if not cpus:
        raise TopologyReadError(f'{source}: "cpus" is empty: lscpu listed no CPUs')
    return cpus


def _cpu_from_entry(source: str, index: int, entry: Any) -> Cpu:
    if not isinstance(entry, dict):
        raise TopologyReadError(f"{source}: cpus[{index}] must be an object, got {type(entry).__name__}")
    if "cpu" not in entry:
        raise TopologyReadError(f'{source}: cpus[{index}] has no "cpu" number')
    cells = _Cell(source, index, entry)
    number = cells.integer("cpu")
    if number is None:
        raise cells.fail("cpu", entry["cpu"], "a CPU number")
    cells.where = f"cpus[{index}] (cpu {number})"
    return Cpu(
        cpu=number,
        core=cells.integer("core"),
        socket=cells.integer("socket"),
        book=cells.integer("book"),
        drawer=cells.integer("drawer"),
        node=cells.integer("node"),
        online=cells.flag("online"),
        configured=cells.flag("configured"),
        polarization=cells.polarization("polarization"),
        dedicated=None,
        address=cells.integer("address"),
    )


def _core_key(cpu: Cpu) -> tuple[int | None, int | None, int | None, int] | None:
    return None if cpu.core is None else (cpu.drawer, cpu.book, cpu.socket, cpu.core)


def _machine(cpus: list[Cpu], smt_threads: int) -> Machine:
    polarizations = {c.polarization for c in cpus}
    if any(p.startswith("vertical") for p in polarizations):
        dispatching = "vertical"
    elif "horizontal" in polarizations:
        dispatching = "horizontal"
    else:
        dispatching = "unknown"
    s390 = any(
        c.book is not None or c.drawer is not None or c.address is not None or c.polarization != "unknown" for c in cpus
    )
    nodes = sorted({c.node for c in cpus if c.node is not None})
    return Machine(
        arch="s390x" if s390 else "unknown",
        machine_type=None,
        environment="unknown",
        topology_facility=None,
        dispatching=dispatching,
        smt_threads=max(smt_threads, 1),
        memory_nodes=tuple(nodes) if nodes else (0,),
        has_node_dirs=bool(nodes),
    )


def parse_lscpu_json(text: str, source: str = "<lscpu>") -> Topology:
    """The topology described by ``lscpu -J -e=...`` output, in any util-linux dialect.

    ``source`` names the input in error messages. Raises :class:`TopologyReadError` (one
    line, naming ``source`` and the problem) on anything that is not such output.
    """
    cpus = _cpus_of(_decode(text, source), source)
    parsed: list[Cpu] = []
    seen: dict[int, int] = {}
    for index, entry in enumerate(cpus):
        cpu = _cpu_from_entry(source, index, entry)
        if cpu.cpu in seen:
            raise TopologyReadError(f"{source}: cpus[{index}]: cpu {cpu.cpu} already listed at cpus[{seen[cpu.cpu]}]")
        seen[cpu.cpu] = index
        parsed.append(cpu)

    cores: dict[tuple[int | None, int | None, int | None, int], list[int]] = {}
    for cpu in parsed:
        key = _core_key(cpu)
        if key is not None:
            cores.setdefault(key, []).append(cpu.cpu)
    with_siblings = []
    for cpu in parsed:
        key = _core_key(cpu)
        siblings = tuple(sorted(cores[key])) if key is not None else ()
        with_siblings.append(
            Cpu(
                cpu=cpu.cpu,
                core=cpu.core,
                socket=cpu.socket,
                book=cpu.book,
                drawer=cpu.drawer,
                siblings=siblings,
                node=cpu.node,
                online=cpu.online,
                configured=cpu.configured,
                polarization=cpu.polarization,
                dedicated=None,
                address=cpu.address,
            )
        )
    smt = max((len(members) for members in cores.values()), default=1)
    return Topology(machine=_machine(with_siblings, smt), cpus=tuple(with_siblings))


def lscpu_command(sysroot: str | None = None, lscpu: str = "lscpu") -> list[str]:
    """The argv ``read_lscpu`` runs."""
    argv = [lscpu, "-J", "-e=" + ",".join(LSCPU_COLUMNS)]
    if sysroot is not None:
        argv += ["--sysroot", sysroot]
    return argv


def read_lscpu(sysroot: str | None = None, lscpu: str = "lscpu", *, timeout: float = DEFAULT_TIMEOUT) -> Topology:
    """Run lscpu (on ``sysroot`` when given) and parse its JSON.

    The command runs with ``LC_ALL=C`` (util-linux <= 2.37 translates yes/no). A missing
    binary, a non-zero exit or a timeout raise :class:`TopologyReadError` naming the command.
    """
    argv = lscpu_command(sysroot, lscpu)
    command = shlex.join(argv)
    env = dict(os.environ, LC_ALL="C")
    try:
        result = subprocess.run(
            argv,
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout,
            env=env,
            check=False,
        )
    except FileNotFoundError:
        raise TopologyReadError(f"{command}: lscpu not found ({lscpu!r} is not an executable on PATH)") from None
    except subprocess.TimeoutExpired:
        raise TopologyReadError(f"{command}: timed out after {timeout:g}s") from None
    except OSError as exc:
        raise TopologyReadError(f"{command}: cannot run: {exc.strerror or exc}") from None
    if result.returncode != 0:
        detail = next((line.strip() for line in (result.stderr or "").splitlines() if line.strip()), "")
        reason = f"exit status {result.returncode}" if result.returncode > 0 else f"signal {-result.returncode}"
        raise TopologyReadError(f"{command}: failed with {reason}" + (f": {detail}" if detail else ""))
    return parse_lscpu_json(result.stdout, source=command)
