"""Placement quality benchmark: where tensor-parallel ranks land, with the agent and without it.

Pure: no gRPC, no timing. On the ``z16-lpar`` snapshot (8 books in 2 drawers, SMT-2) and the
``pr40714`` machine (3 books of 12, 12 and 1 cores, SMT-2, from vLLM PR #40714's log), the node is
filled with pods of one book (TP=1) and two books (TP=2): every mix (n1, n2) with n1 + 2*n2 <= books,
pods admitted one-book pods first (the order that fragments the free books most). Two placements:

* ``agent``: groups from ``agent.policy.grouping`` at level book; each pod's books are chosen
  by ``agent.policy.preference.preferred_allocation`` from the books still free (what kubelet asks
  the plugin), and its ranks are the ``VLLM_CPU_OMP_THREADS_BIND`` lists of ``plan_allocation``
  (one rank per group).
* ``vLLM alone``: no agent, every pod sees the whole node and applies PR #40714's rule by itself
  (../shared/docs/s390x-topology.md C.3): book-aware binding over the books of the online CPUs with a known
  core, in lscpu's logical book order; rank i takes book i (round-robin when ranks outnumber books);
  per core, the highest SMT thread. (vLLM's one reserved CPU is not modelled.) ``--vllm-domain
  drawer`` models the alternative version of the PR that prefers drawers (when there are several)
  over books.

For each mix it prints (a) the share of ranks whose pinned CPUs lie inside one book and (b) the share
of pinned CPUs (pod, CPU pairs) that another pod also pins, plus, for information, the agent's worst
TP balance (smallest/largest rank of a two-book pod, in cores) and vLLM alone's most pods pinned to one CPU.
Target for the agent: 100% and 0% at every mix, one row per machine. A miss (or two pods handed
overlapping cpusets) would be a bug: the row is BROKEN and the exit status 1.

    .venv/bin/python bench/node/placement.py [--quick] [--vllm-domain book|drawer]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.policy.allocation import ENV_CPUS, ENV_VLLM_BIND, plan_allocation
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.preference import preferred_allocation
from agent.topology.cpulist import parse_cpulist
from agent.topology.embedded import load_embedded
from agent.topology.model import Cpu, Topology
from bench.lib.common import BROKEN, MET, Row, bench_main

BENCH = "placement"
MACHINES: tuple[str, ...] = ("z16-lpar", "pr40714")


@dataclass(frozen=True, slots=True)
class PodPlacement:
    books: int  # tensor-parallel size: one rank per book
    ranks: tuple[tuple[int, ...], ...]  # the CPUs each rank's OpenMP threads are pinned to
    cpuset: tuple[int, ...]  # what the container may run on (the whole node without the agent)


@dataclass(frozen=True, slots=True)
class Quality:
    ranks_in_one_book: float  # share of ranks whose CPUs lie inside one book
    shared_pins: float  # share of (pod, pinned CPU) pairs whose CPU another pod also pins
    max_pods_per_cpu: int
    cpusets_disjoint: bool
    balance: float | None  # worst min/max rank size over the pods with several ranks (None: no such pod)


def mixes(books: int) -> list[tuple[int, int]]:
    """Every (one-book pods, two-book pods) that fits, the empty mix left out."""
    return [(n1, n2) for n2 in range(books // 2 + 1) for n1 in range(books - 2 * n2 + 1) if n1 + n2 > 0]


def pod_sizes(n1: int, n2: int) -> list[int]:
    return [1] * n1 + [2] * n2


# --------------------------------------------------------------------------- with the agent

def place_with_agent(topology: Topology, sizes: Sequence[int]) -> list[PodPlacement]:
    grouping = group_topology(topology, GroupingSettings(levels=("book",)))
    table = grouping.by_id("topology/book")
    free = [g.id for g in grouping.groups]
    placed: list[PodPlacement] = []
    for size in sizes:
        ids = preferred_allocation(table, free, [], size)
        free = [i for i in free if i not in ids]
        plan = plan_allocation([table[i] for i in ids])
        ranks = tuple(tuple(parse_cpulist(r)) for r in plan.envs[ENV_VLLM_BIND].split("|"))
        placed.append(PodPlacement(size, ranks, tuple(parse_cpulist(plan.envs[ENV_CPUS]))))
    return placed


# --------------------------------------------------------------------------- vLLM alone

def _domain_key(level: str) -> Callable[[Cpu], Hashable]:
    if level == "drawer":
        return lambda c: c.drawer if c.drawer is not None else 0
    return lambda c: c.book_key if c.book is not None else (None, 0)  # lscpu "-" -> 0 (PR's fix-up)


def vllm_level(topology: Topology, level: str) -> str:
    """The drawer-preferring version binds by drawer only when there is more than one."""
    drawers = {c.drawer for c in topology.cpus if c.online and c.configured}
    return "drawer" if level == "drawer" and len(drawers) > 1 else "book"


def vllm_domains(topology: Topology, level: str) -> list[list[int]]:
    """Per domain in lscpu's logical order (first appearance by CPU number): the highest SMT
    thread of each core, sorted. Offline CPUs are dropped: lscpu prints their CORE as ``-``."""
    key = _domain_key(vllm_level(topology, level))
    cores: dict[Hashable, dict[tuple[int, ...], int]] = {}
    for cpu in topology.cpus:  # ascending CPU numbers
        if not (cpu.online and cpu.configured):
            continue
        per_core = cores.setdefault(key(cpu), {})
        core = cpu.threads
        per_core[core] = max(per_core.get(core, cpu.cpu), cpu.cpu)
    return [sorted(per_core.values()) for per_core in cores.values()]


def place_vllm_alone(topology: Topology, sizes: Sequence[int], level: str) -> list[PodPlacement]:
    domains = vllm_domains(topology, level)
    node = tuple(c.cpu for c in topology.cpus if c.online and c.configured)
    return [PodPlacement(size, tuple(tuple(domains[i % len(domains)]) for i in range(size)), node)
            for size in sizes]


# --------------------------------------------------------------------------- scoring

def quality(topology: Topology, pods: Sequence[PodPlacement]) -> Quality:
    book_of = {c.cpu: c.book_key for c in topology.cpus}
    ranks = [rank for pod in pods for rank in pod.ranks]
    in_one_book = sum(1 for rank in ranks if len({book_of[c] for c in rank}) == 1)
    pins = [set(c for rank in pod.ranks for c in rank) for pod in pods]
    load = Counter(c for pinned in pins for c in pinned)
    pairs = sum(len(p) for p in pins)
    shared = sum(1 for pinned in pins for c in pinned if load[c] > 1)
    cpu_owners = Counter(c for pod in pods for c in pod.cpuset)
    balances = [min(map(len, pod.ranks)) / max(map(len, pod.ranks)) for pod in pods if len(pod.ranks) > 1]
    return Quality(
        ranks_in_one_book=in_one_book / len(ranks) if ranks else 1.0,
        shared_pins=shared / pairs if pairs else 0.0,
        max_pods_per_cpu=max(load.values(), default=0),
        cpusets_disjoint=all(n == 1 for n in cpu_owners.values()),
        balance=min(balances) if balances else None,
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:5.1f}%"


def report_machine(name: str, level: str, quick: bool) -> Row:
    """Print the table for one machine; its row: met when the agent has 100% / 0% at every mix."""
    topology = load_embedded(name)
    books = len(group_topology(topology, GroupingSettings(levels=("book",))).groups)
    cores = {c.threads for c in topology.cpus if c.online and c.configured}
    all_mixes = mixes(books)
    if quick:  # the mixes that fill the node
        all_mixes = [(n1, n2) for n1, n2 in all_mixes if n1 + 2 * n2 == books]
    print(f"\n{name}: {len(topology.cpus)} CPUs, {len(cores)} cores, SMT-{topology.machine.smt_threads}, "
          f"{books} books; vLLM alone binds by {vllm_level(topology, level)}")
    header = (f"  {'1-book':>6} {'2-book':>6} {'ranks':>5} | {'agent: rank in 1 book':>21} {'shared pins':>11} "
              f"{'TP balance':>10} | {'vLLM alone: rank in 1 book':>26} {'shared pins':>11} {'max pods/CPU':>12}")
    print(header)
    print("  " + "-" * (len(header) - 2))
    missed: list[tuple[int, int]] = []
    alone_shared: list[float] = []
    alone_max = 0
    worst_balance: float | None = None
    for n1, n2 in all_mixes:
        sizes = pod_sizes(n1, n2)
        ours = quality(topology, place_with_agent(topology, sizes))
        alone = quality(topology, place_vllm_alone(topology, sizes, level))
        good = ours.ranks_in_one_book == 1.0 and ours.shared_pins == 0.0 and ours.cpusets_disjoint
        if not good:
            missed.append((n1, n2))
        alone_shared.append(alone.shared_pins)
        alone_max = max(alone_max, alone.max_pods_per_cpu)
        if ours.balance is not None:
            worst_balance = ours.balance if worst_balance is None else min(worst_balance, ours.balance)
        flag = "" if good else "   <-- AGENT MISSED THE TARGET"
        print(f"  {n1:>6} {n2:>6} {n1 + 2 * n2:>5} | {_pct(ours.ranks_in_one_book):>21} {_pct(ours.shared_pins):>11} "
              f"{_pct(ours.balance):>10} | {_pct(alone.ranks_in_one_book):>26} {_pct(alone.shared_pins):>11} "
              f"{alone.max_pods_per_cpu:>12}{flag}")
    measured = (f"agent: {len(all_mixes) - len(missed)} of {len(all_mixes)} mixes at 100 % / 0 % (worst TP balance "
                f"{_pct(worst_balance).strip()}); vLLM alone: up to {100 * max(alone_shared):.0f} % shared pins, "
                f"{alone_max} pods on one CPU")
    return Row(BENCH, f"placement on {name}: ranks in one book / shared pins", measured,
               float(len(missed)), "100 % / 0 % at every mix",
               MET if not missed else BROKEN, "" if not missed else f"the agent missed at mixes {missed}: a bug",
               raw={"mixes": len(all_mixes), "missed": missed})


def run(quick: bool, vllm_domain: str = "book") -> list[Row]:
    print("Placement benchmark: the node filled with 1-book (TP=1) and 2-book (TP=2) pods; the agent "
          "(grouping + preferred_allocation + plan_allocation) versus vLLM PR #40714's rule in every pod alone")
    return [report_machine(name, vllm_domain, quick) for name in MACHINES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--vllm-domain", choices=("book", "drawer"), default="book",
                        help="what vLLM alone binds ranks to (default book, as PR #40714's log shows)")
    known, rest = parser.parse_known_args(argv)
    return bench_main(BENCH, lambda quick: run(quick, known.vllm_domain), __doc__, rest)


if __name__ == "__main__":
    raise SystemExit(main())
