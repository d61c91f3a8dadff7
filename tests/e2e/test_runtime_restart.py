"""The node's container runtime restarted under the agent, on the real cluster: whichever runtime the lane runs
(containerd, or CRI-O with ``make e2e RUNTIME=crio``), stopped with SIGTERM and started again, then killed with
SIGKILL and started again (a crash: containerd's shims and CRI-O's conmons keep the containers running).

With ``cpusetEnforcement: nri`` and ``sharedPool: true`` (the release is upgraded, and put back afterwards): each time
the runtime closes the agent's NRI connection, the agent dials again, registers and gets a Synchronize of every
container; a book pod created before keeps running on its book, untouched, and the next plain pod is created on the
shared pool, never on the held book, and a new book pod on the other book from its first instruction.

Local lane only (it restarts the node's runtime).
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.topology.cpulist import parse_cpulist
from tests.e2e.snapshots import Expected
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import delete_pods, wait_for
from tests.support.e2e.node import agent_pod, proc_status
from tests.support.e2e.nri import first_cpus_line

pytestmark = pytest.mark.e2e

SYNCHRONIZED = "NRI: synchronized "  # the agent's log line at each Synchronize (agent/nri/stub.py)


def synchronizations(env: E2EEnv, core: Any, node: str) -> int:
    agent = agent_pod(core, env, node)
    logs = env.kubectl("-n", env.namespace, "logs", agent.metadata.name).stdout
    return logs.count(SYNCHRONIZED)


def test_the_runtime_restarted_and_crashed_keeps_a_holder_on_its_book_and_nri_synchronizes_again(
        core: Any, pod_namespace: str, nri: E2EEnv, node: str, exp: Expected, made: list[str]) -> None:
    book = f"{nri.prefix}/book"
    held, held_cpus = first_cpus_line(core, pod_namespace, nri, node, {book: 1})
    made.append(held)
    assert held_cpus in exp.cpulists(book), f"the holder's first instruction ran on {held_cpus}, not on one book"
    for crash in (False, True):
        how = "crashed (SIGKILL)" if crash else "restarted (SIGTERM)"
        before = synchronizations(nri, core, node)
        nri.restart_runtime(crash=crash)

        def synchronized_again(before: int = before) -> bool:
            return synchronizations(nri, core, node) > before

        wait_for(f"the agent to synchronize with {nri.runtime} again after it {how}", synchronized_again,
                 timeout=60, interval=0.5)
        pod = core.read_namespaced_pod(held, pod_namespace)
        assert pod.status.phase == "Running" and pod.status.container_statuses[0].restart_count == 0, pod.status
        seen = wait_for(f"{held}'s cpuset to read after {nri.runtime} {how}",
                        lambda: proc_status(nri, pod_namespace, held, "Cpus_allowed_list"), timeout=60, interval=0.5)
        assert seen == held_cpus, f"after {nri.runtime} {how} the holder runs on {seen}, not its book {held_cpus}"
        plain, plain_cpus = first_cpus_line(core, pod_namespace, nri, node, {})
        made.append(plain)
        overlap = set(parse_cpulist(plain_cpus)) & set(parse_cpulist(held_cpus))
        assert not overlap, (f"after {nri.runtime} {how} a plain pod's first line ran on {plain_cpus}, which "
                             f"includes the held book {held_cpus}")
        delete_pods(core, pod_namespace, [plain])  # its CPU request would leave no room for a second book pod
    second, second_cpus = first_cpus_line(core, pod_namespace, nri, node, {book: 1})
    made.append(second)
    assert second_cpus in exp.cpulists(book) and second_cpus != held_cpus, (second_cpus, held_cpus)
