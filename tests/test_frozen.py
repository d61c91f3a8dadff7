"""The model's and the policy's records (agent/topology/frozen.py) behave as the frozen, slotted dataclasses they
replaced: the same fields in the same order with the same defaults, equality, hashing, repr, frozen-ness,
pickling and copying, pattern matching and :mod:`dataclasses`' functions."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys
from typing import Any

import pytest

from agent.policy.grouping import Group, Grouping, GroupingSettings, Skipped, Uniform
from agent.topology.derive import RawCpu
from agent.topology.embedded import load_embedded
from agent.topology.model import Cpu, Machine, Topology
from tests.conftest import REPO

MISSING = dataclasses.MISSING
# The dataclasses of commit 1159e2e, field by field: (name, default).
BEFORE: dict[Any, list[tuple[str, Any]]] = {
    Cpu: [("cpu", MISSING), ("core", None), ("socket", None), ("book", None), ("drawer", None), ("siblings", ()),
          ("node", None), ("online", True), ("configured", True), ("polarization", "unknown"), ("dedicated", None),
          ("address", None)],
    Machine: [("arch", "unknown"), ("machine_type", None), ("environment", "unknown"), ("topology_facility", None),
              ("dispatching", "unknown"), ("smt_threads", 1), ("memory_nodes", (0,)), ("has_node_dirs", False)],
    Topology: [("machine", MISSING), ("cpus", ())],
    GroupingSettings: [("levels", None), ("resource_prefix", "topology"), ("reserved_cpus", frozenset()),
                       ("exclude_polarization", frozenset()), ("min_group_cores", None), ("uniform_groups", False),
                       ("allow_non_s390x", False)],
    Group: [(n, MISSING) for n in ("level", "resource", "id", "key", "cpus", "cores", "threads_per_core",
                                   "polarization", "memory_nodes", "recorded_nodes")],
    Skipped: [("cpus", MISSING), ("reason", MISSING)],
    Uniform: [("resource", MISSING), ("cpus", MISSING), ("left_out", MISSING)],
    Grouping: [("groups", MISSING), ("skipped", MISSING), ("levels", MISSING), ("level_reason", MISSING),
               ("fidelity", MISSING), ("warnings", ()), ("uniform", ())],
    # RawCpu (sysfs -> derive only) had defaults; every field is given now.
    RawCpu: [(n, MISSING) for n in ("cpu", "online", "configured", "polarization", "dedicated", "address",
                                    "has_topology", "ids", "masks")],
}

Z16 = load_embedded("z16-lpar")


def samples() -> dict[Any, tuple[Any, Any]]:
    """Two different instances of every class."""
    from agent.policy.grouping import group_topology

    grouping = group_topology(Z16, GroupingSettings(levels=("book", "socket"), uniform_groups=True))
    other = group_topology(Z16, GroupingSettings(reserved_cpus=frozenset({0, 1})))
    raw = RawCpu(3, True, True, "horizontal", None, None, True, {"core": 1}, {"core": frozenset({2, 3})})
    return {
        Cpu: (Z16.cpus[0], Z16.cpus[1]), Machine: (Z16.machine, Machine(arch="x86_64")),
        Topology: (Z16, Topology(Z16.machine, Z16.cpus[:4])),
        GroupingSettings: (GroupingSettings(), GroupingSettings(levels=("book",), reserved_cpus=frozenset({1}))),
        Group: (grouping.groups[0], grouping.groups[1]), Skipped: (other.skipped[0], Skipped((9,), "why")),
        Uniform: (grouping.uniform[0], Uniform("topology/book", 8, ("drawer0-book1",))),
        Grouping: (grouping, other), RawCpu: (raw, dataclasses.replace(raw, online=False)),
    }


REFERENCES: dict[str, Any] = {}


def reference(cls: Any) -> Any:
    """The frozen, slotted dataclass of the same fields: what the record must behave like (one per class)."""
    if cls.__name__ not in REFERENCES:
        REFERENCES[cls.__name__] = _reference(cls)
    return REFERENCES[cls.__name__]


def _reference(cls: Any) -> Any:
    return dataclasses.make_dataclass(cls.__name__, [
        (name, object) if default is MISSING else (name, object, dataclasses.field(default=default))
        for name, default in BEFORE[cls]], frozen=True, slots=True)


def as_reference(obj: Any) -> Any:
    return reference(type(obj))(*(getattr(obj, name) for name in obj.__slots__))


@pytest.mark.parametrize("cls", list(BEFORE), ids=lambda c: c.__name__)
def test_the_fields_and_defaults_are_those_of_the_dataclass(cls: Any) -> None:
    assert [(f.name, f.default) for f in dataclasses.fields(cls)] == BEFORE[cls]
    assert cls.__match_args__ == tuple(n for n, _ in BEFORE[cls])
    assert dataclasses.is_dataclass(cls)
    assert not hasattr(samples()[cls][0], "__dict__")  # slotted: no per-instance dict


@pytest.mark.parametrize("cls", list(BEFORE), ids=lambda c: c.__name__)
def test_equality_hash_and_repr_match_the_dataclass(cls: Any) -> None:
    a, b = samples()[cls]
    ref_a, ref_b = as_reference(a), as_reference(b)
    twin = cls(*(getattr(a, n) for n in a.__slots__))
    assert a == twin and a != b and ref_a == as_reference(twin) and ref_a != ref_b
    assert a != ref_a  # another class, as two dataclasses of different classes
    assert a.__eq__(object()) is NotImplemented
    if cls is RawCpu:  # holds dicts: unhashable, as the dataclass was
        with pytest.raises(TypeError):
            hash(a)
        with pytest.raises(TypeError):
            hash(ref_a)
    else:
        assert hash(a) == hash(twin) == hash(ref_a) and hash(a) != hash(b)
    assert repr(a) == repr(ref_a)  # the same class name and field=value list


@pytest.mark.parametrize("cls", list(BEFORE), ids=lambda c: c.__name__)
def test_frozen_copied_pickled_and_replaced(cls: Any) -> None:
    a, b = samples()[cls]
    name = a.__slots__[0]
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to field '{name}'"):
        setattr(a, name, getattr(b, name))
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field"):
        delattr(a, name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.not_a_field = 1
    assert copy.copy(a) == a and copy.deepcopy(a) == a and pickle.loads(pickle.dumps(a)) == a
    changed = dataclasses.replace(a, **{name: getattr(b, name)})
    assert type(changed) is cls and getattr(changed, name) == getattr(b, name)
    assert all(getattr(changed, n) == getattr(a, n) for n in a.__slots__[1:])
    assert dataclasses.asdict(a) == dataclasses.asdict(as_reference(a))


def test_pattern_matching_and_the_model_rules_still_hold() -> None:
    match Z16.cpus[3]:
        case Cpu(cpu, core):
            assert (cpu, core) == (3, Z16.cpus[3].core)
    shuffled = Topology(Z16.machine, (Z16.cpus[5], Z16.cpus[1], dataclasses.replace(Z16.cpus[5], online=False)))
    assert [c.cpu for c in shuffled.cpus] == [1, 5] and not shuffled.cpus[1].online  # sorted; the last one wins
    assert Cpu(7).threads == (7,) and Machine().generation is None


def test_defining_the_records_imports_neither_dataclasses_nor_typing() -> None:
    code = ("import sys; import agent.policy.grouping, agent.topology.derive; "
            "print(sorted(m for m in ('dataclasses', 'typing', 'inspect') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                          timeout=60)
    assert done.stdout.strip() == "[]"


def test_replace_copies_every_field_but_the_changed_ones() -> None:
    from agent.topology.model import Machine

    machine = Machine("s390x", "3931", "LPAR", True, "horizontal", 1, (0,), True)
    changed = machine._replace(smt_threads=2)
    assert changed == dataclasses.replace(machine, smt_threads=2) and machine.smt_threads == 1
    with pytest.raises(TypeError, match="no field"):
        machine._replace(smt=2)
