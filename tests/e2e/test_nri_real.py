"""Pinning at creation through NRI on the real cluster: the release upgraded to
``cpusetEnforcement: nri`` with ``sharedPool: true``, the lane's containerd 2.4.2 (NRI on by default) creates each
container with its cpuset already set, so the very first line a container prints is its final cpuset.

Local lane only (it changes the release); the release is put back afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.topology.cpulist import parse_cpulist
from tests.e2e.snapshots import Expected
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.node import agent_pod
from tests.support.e2e.nri import first_cpus_line

pytestmark = pytest.mark.e2e
def test_a_book_pods_first_line_shows_its_book(core: Any, pod_namespace: str, nri: E2EEnv, node: str,
                                               exp: Expected, made: list[str]) -> None:
    book = f"{nri.prefix}/book"
    name, cpus = first_cpus_line(core, pod_namespace, nri, node, {book: 1})
    made.append(name)
    assert cpus in exp.cpulists(book), f"the first instruction ran on {cpus}, not on one book"


def test_a_plain_pod_never_runs_on_a_held_book(core: Any, pod_namespace: str, nri: E2EEnv, node: str,
                                               exp: Expected, made: list[str]) -> None:
    book = f"{nri.prefix}/book"
    held, held_cpus = first_cpus_line(core, pod_namespace, nri, node, {book: 1})
    made.append(held)
    plain, plain_cpus = first_cpus_line(core, pod_namespace, nri, node, {})
    made.append(plain)
    overlap = set(parse_cpulist(plain_cpus)) & set(parse_cpulist(held_cpus))
    assert not overlap, f"a plain pod's first line ran on {plain_cpus}, which includes the held book {held_cpus}"
    assert agent_pod(core, nri, node)
