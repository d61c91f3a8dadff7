"""A pod that carries the agent's own annotations is not pinned to a book by them, on the real runtime with
``cpusetEnforcement: nri`` and ``sharedPool: true``.

CRI-O copies every pod annotation into each of its containers' OCI spec annotations, which is what it hands an NRI
plugin as the container's annotations (``internal/factory/container/container.go`` ``SpecAddAnnotations`` at v1.34.0,
https://github.com/cri-o/cri-o/blob/v1.34.0/internal/factory/container/container.go; ``server/nri-api.go``
``criContainer.GetAnnotations``); containerd does that only for the annotations its ``pod_annotations`` setting lists.
So a pod that writes ``topology.s390x.ibm.com/groups`` itself looks, to NRI on CRI-O, like a container whose
Allocate named that book: the agent believes those annotations only when they differ from the pod's own (kubelet's
container annotations, written after the pod's, win on CRI-O as on containerd). The pod asks no book and names the
book a real holder has: its first line is the shared pool, never that book.

Local lane only (it changes the release); the release is put back afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.topology.cpulist import parse_cpulist
from tests.e2e.snapshots import Expected
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.nri import first_cpus_line

pytestmark = pytest.mark.e2e

DOMAIN = "topology.s390x.ibm.com"


def test_a_pods_own_groups_annotation_does_not_put_it_on_a_held_book(
        core: Any, pod_namespace: str, nri: E2EEnv, node: str, exp: Expected, made: list[str]) -> None:
    book = f"{nri.prefix}/book"
    held, held_cpus = first_cpus_line(core, pod_namespace, nri, node, {book: 1})
    made.append(held)
    group = next(g.id for g in exp.grouping.groups if g.resource == book and g.cpulist == held_cpus)
    forged, first = first_cpus_line(core, pod_namespace, nri, node, {},
                                annotations={f"{DOMAIN}/groups": group, f"{DOMAIN}/resource": book})
    made.append(forged)
    cpus = set(parse_cpulist(first))
    assert not cpus & set(parse_cpulist(held_cpus)), (
        f"a pod annotated {DOMAIN}/groups={group} by itself ran on {sorted(cpus)}, in the book {held}'s holds "
        f"({held_cpus}) on {nri.runtime}")
