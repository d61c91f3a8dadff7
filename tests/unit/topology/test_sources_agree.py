"""The same machine read through sysfs, through lscpu JSON and through a snapshot round-trip
gives the same model (ids aside: lscpu numbers containers by first appearance)."""

from __future__ import annotations

import pytest

from agent.topology import snapshot_format as snapshot
from agent.topology.lscpu import parse_lscpu_json
from agent.topology.sysfs import read_sysfs
from tests.support.env import REAL_DUMPS, real_dump
from topology_devkit.shape import canonical_shape

# sysfs puts both CPUs of this 2009 dump in one socket (core_siblings); lscpu prints no socket
# because there is no thread_siblings file. The grouping advertises nothing there either way.
SOCKET_DIFFERS = {"hwloc-2s390-2c"}


@pytest.mark.parametrize("name", sorted(REAL_DUMPS))
def test_sysfs_and_lscpu_give_the_same_shape(name: str) -> None:
    dump_dir, root = real_dump(name)
    from_sysfs = canonical_shape(read_sysfs(root))
    from_lscpu = canonical_shape(parse_lscpu_json((dump_dir / "lscpu-e.json").read_text(), "lscpu-e.json"))
    if name in SOCKET_DIFFERS:
        assert from_sysfs["sockets"] == [[0, 1]] and from_lscpu["sockets"] == []
        from_sysfs["sockets"] = from_lscpu["sockets"] = []
    assert from_sysfs == from_lscpu


@pytest.mark.parametrize("name", sorted(REAL_DUMPS))
def test_snapshot_round_trip_is_exact(name: str) -> None:
    _, root = real_dump(name)
    topology = read_sysfs(root)
    assert snapshot.loads(snapshot.dumps(topology)) == topology
