"""Topology snapshots shipped inside the package (``agent/data/*.json``, read through importlib.resources).

They are the synthetic z14-z17 shapes of :mod:`topology_devkit.synthetic`, written by
``python -m topology_devkit.synthetic --write-data``, so demos and tests can run on a
realistic IBM Z node from any machine.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable

from agent.errors import TopologyReadError
from agent.topology import snapshot_format as snapshot
from agent.topology.model import Topology

_SUFFIX = ".json"


def _data_dir() -> Traversable:
    return files("agent").joinpath("data")


def embedded_snapshot_names() -> list[str]:
    """Names of the shipped snapshots (file names without ``.json``), sorted."""
    try:
        entries = list(_data_dir().iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(e.name[: -len(_SUFFIX)] for e in entries if e.name.endswith(_SUFFIX) and e.is_file())


def load_embedded(name: str) -> Topology:
    """The shipped snapshot ``name`` (e.g. ``z16-lpar``); TopologyReadError names the valid ones."""
    names = embedded_snapshot_names()
    if name not in names:
        raise TopologyReadError(
            f"no embedded topology snapshot named {name!r}; valid names: {', '.join(names) or '(none shipped)'}"
        )
    resource = _data_dir().joinpath(name + _SUFFIX)
    try:
        text = resource.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyReadError(f"embedded snapshot {name!r}: cannot read: {exc}") from None
    return snapshot.loads(text, f"embedded snapshot {name!r}")
