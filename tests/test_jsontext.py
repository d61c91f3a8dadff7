"""agent/observe/jsontext.py writes what ``json.dumps(value, indent=N)`` writes, character for character, and
leaves every value it does not write itself to json."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from agent.observe.jsontext import json_text
from agent.observe.report import grouping_dict
from agent.policy.dra import SliceSettings, build_pool, pool_dict
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.embedded import embedded_snapshot_names, load_embedded

ODD: list[Any] = [
    {}, [], (), "", 0, -1, 10**30, True, False, None, [[]], [{}], {"a": []}, {"a": {}}, [[], [[]], {}],
    "plain text: with 'quotes', spaces and :colons", 'a "quote"', "back\\slash", "tab\there", "line\nbreak",
    "\x00\x1f\x7f", "é", "日本", "\U0001f600", "\ud800", 1.5, float("nan"), float("inf"), -0.0, 1e100,
    {1: "int key"}, {None: 1, True: 2, 2.5: 3}, {"b": 1, "a": 2}, (1, (2, (3,))), [True, 1, 1.0],
    {"nested": {"deeper": [1, {"deepest": [None, "x"]}]}},
]


class Num(int):
    pass


@pytest.mark.parametrize("indent", [2, 1, 4])
@pytest.mark.parametrize("value", ODD, ids=repr)
def test_odd_values_are_written_as_json_writes_them(value: Any, indent: int) -> None:
    assert json_text(value, indent) == json.dumps(value, indent=indent)


def test_subclasses_and_other_types_are_json_s() -> None:
    assert json_text({"n": Num(3)}) == json.dumps({"n": Num(3)}, indent=2)
    with pytest.raises(TypeError):
        json_text({"set": {1, 2}})  # json's error, as before
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        json_text(deep)


def test_every_report_of_every_bundled_shape() -> None:
    for name in embedded_snapshot_names():
        topology = load_embedded(name)
        for settings in (GroupingSettings(), GroupingSettings(levels=("drawer", "book", "socket"), min_group_cores=0),
                         GroupingSettings(uniform_groups=True, reserved_cpus=frozenset({0, 5}))):
            grouping = group_topology(topology, settings)
            report = {**grouping_dict(topology, grouping), "cpuset_enforcement": {"mode": "none"}}
            if grouping.groups:
                report["dra"] = pool_dict(build_pool(grouping, topology, SliceSettings("node-1")))
            assert json_text(report) == json.dumps(report, indent=2), name


def test_random_plain_values() -> None:
    rng = random.Random(23)
    words = ["", "a", "topology/book", "x y", "é", '"', "\\", "\n", "0-3,8"]

    def value(depth: int) -> Any:
        kind = rng.randrange(8 if depth < 4 else 5)
        if kind == 0:
            return rng.choice(words)
        if kind == 1:
            return rng.randrange(-1000, 1000)
        if kind == 2:
            return rng.choice([True, False, None])
        if kind == 3:
            return rng.random() if rng.random() < 0.1 else rng.randrange(5)
        if kind == 4:
            return rng.choice(words[:5])
        if kind in (5, 6):
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {rng.choice(words): value(depth + 1) for _ in range(rng.randrange(4))}

    for _ in range(3000):
        v = value(0)
        assert json_text(v) == json.dumps(v, indent=2)
