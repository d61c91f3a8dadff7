"""GetPreferredAllocation benchmark: the agent's answer over gRPC, against a bare echo of the same size.

kubelet calls GetPreferredAllocation during pod admission and waits for it. For each device table
(16 books: ``z16-400``; 80 and 160 books: synthetic z16-like drawers of 4 books of 12 or 13 cores;
160 books with vertical polarization, where some books have vertical:low CPUs and the search must
weigh them) and each request size (1, N/4, N/2, 3N/4 and N-1 of N books, all N available in a
shuffled order, nothing must be included), the script times round trips with a grpcio client on a Unix socket to:

* ``agent``: a process of its own serving the product's ``PluginServer`` (``DevicePluginServicer``
  over a ``DeviceTable`` of ``agent.devices.table.NodeDevices``, rendered with
  ``agent.plugin.servicer.render``);
* ``echo``: a process of its own serving a bare sync ``grpc.server`` of the same type (the same
  thread-pool size, a Unix socket) whose generic handler returns the agent's own response bytes for
  each request (captured first), so both sides move the same bytes.

Each row alternates blocks of calls to the two sides (ABBA) after a warm-up, in a few rounds of
fresh processes (where the scheduler places them moves either side by 10-25 % on two shared
cores), and reports the median and minimum of each, the ratio of the medians over all rounds
(target: agent/echo <= 2) and the range of the rounds' ratios. The ``before``,
``cold`` and ``after`` columns time the preference function alone, in this process, interleaved:
``before`` is the code this replaced (copied below from git history: every combination scored up
to 20,000, a greedy fill above); ``after`` is ``agent.policy.preference.preferred_allocation`` on
the table with its :class:`PreferenceIndex` kept, as the agent's device table keeps it; ``cold`` the
same with the index made in the call (what the agent pays once per table).

Reports only; exits 1 if the agent's answer over the wire differs from ``preferred_allocation`` in
this process, or from the old exhaustive search wherever that searched exhaustively.

    .venv/bin/python bench/node/preference.py [--quick] [--rounds 3] [--calls 400] [--block 50] [--reps 5]
        [--tables NAME ...]

(``--serve-agent DIR TABLE`` and ``--serve-echo SOCKET RESPONSES`` are the servers' own entry points;
the benchmark spawns them.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from functools import partial
from itertools import combinations
from math import comb
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent._proto.deviceplugin.v1beta1 import api_pb2
from agent.devices.table import NodeDevices
from agent.plugin.server import WORKERS, PluginServer, socket_name
from agent.plugin.servicer import render
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import Group, Grouping, GroupingSettings, group_topology
from agent.policy.preference import PreferenceIndex, preferred_allocation
from bench.lib.common import ROOT, BenchError, at_most, bench_main, fmt_time, stop_process
from bench.lib.common import Row as CommonRow
from topology_devkit.synthetic import SHAPES, LparShape, build_topology

BENCH = "preference"
RESOURCE = "topology/book"
METHOD = "/v1beta1.DevicePlugin/GetPreferredAllocation"
TARGET_RATIO = 2.0
SETTINGS = GroupingSettings(levels=("book",))


# --------------------------------------------------------------------------- device tables

def _drawers(count: int, dispatching: str = "horizontal") -> LparShape:
    """``count`` drawers of 4 books (z16 DCMs) of two chips: 7+6 or 6+6 cores, as in z16-400."""
    layout = tuple(tuple((7, 6) if b in (d % 4, (d + 2) % 4) else (6, 6) for b in range(4)) for d in range(count))
    return LparShape(name=f"{count}x4-books", machine_type="3931", drawers=layout, cores_per_chip=8,
                     dispatching=dispatching)


TABLES: dict[str, Callable[[], LparShape]] = {
    "z16-400": lambda: SHAPES["z16-400"],
    "80 books": lambda: _drawers(20),
    "160 books": lambda: _drawers(40),
    "160 vertical": lambda: _drawers(40, "vertical"),
}


def grouping_of(name: str) -> Grouping:
    return group_topology(build_topology(TABLES[name]()), SETTINGS)


# --------------------------------------------------------------------------- before: the replaced code
# agent/policy/preference.py before this change (git 3cd3a58), unchanged but for the names.

BEFORE_EXHAUSTIVE_LIMIT = 20_000


def _before_parent(g: Group) -> tuple[int | None, ...]:
    return g.key[:-1]


def _before_has_low(g: Group) -> bool:
    return any(p == "vertical:low" for p, _ in g.polarization)


def _before_score(chosen: Sequence[Group]) -> tuple[int, int, int, tuple[tuple[int, ...], ...]]:
    sizes = [len(g.cores) for g in chosen]
    return (
        len({_before_parent(g) for g in chosen}),
        max(sizes) - min(sizes),
        sum(_before_has_low(g) for g in chosen),
        tuple(sorted(g.order for g in chosen)),
    )


def before_preferred_allocation(table: Mapping[str, Group], available: Sequence[str], must_include: Sequence[str],
                                size: int) -> list[str]:
    must = list(dict.fromkeys(must_include))
    free = [table[i] for i in dict.fromkeys(available) if i in table and i not in must]
    need = size - len(must)
    fixed = [table[i] for i in must]
    if need == 0:
        return must
    free.sort(key=lambda g: (g.order, g.id))
    if comb(len(free), need) <= BEFORE_EXHAUSTIVE_LIMIT:
        best = min(combinations(free, need), key=lambda extra: _before_score([*fixed, *extra]))
        return must + [g.id for g in sorted(best, key=lambda g: (g.order, g.id))]
    return must + [g.id for g in _before_greedy(fixed, free, need)]


def _before_greedy(fixed: list[Group], free: list[Group], need: int) -> list[Group]:
    by_parent: dict[tuple[int | None, ...], list[Group]] = {}
    for g in free:
        by_parent.setdefault(_before_parent(g), []).append(g)
    fixed_parents = {_before_parent(g) for g in fixed}
    target = len(fixed[0].cores) if fixed else None

    def parent_rank(item: tuple[tuple[int | None, ...], list[Group]]) -> tuple[int, int, tuple[int, ...]]:
        parent, groups = item
        return (0 if parent in fixed_parents else 1, -min(len(groups), need), tuple(-1 if k is None else k
                                                                                  for k in parent))

    chosen: list[Group] = []
    for _, groups in sorted(by_parent.items(), key=parent_rank):
        size_target = target if target is not None else max(len(g.cores) for g in groups)
        groups = sorted(groups, key=lambda g: (abs(len(g.cores) - size_target), _before_has_low(g), g.order))
        for g in groups:
            if len(chosen) == need:
                break
            chosen.append(g)
            target = target if target is not None else len(g.cores)
        if len(chosen) == need:
            break
    return sorted(chosen, key=lambda g: (g.order, g.id))


# --------------------------------------------------------------------------- servers (children)

def _serve_until_sigterm(stop_server: Callable[[], None]) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    print("ready", flush=True)
    stop.wait()
    stop_server()
    return 0


def serve_agent(directory: Path, table: str) -> int:
    """The product's plugin server for ``table``'s books, on ``directory``/topology-book.sock."""
    grouping = grouping_of(table)
    devices = NodeDevices(grouping, SETTINGS, AllocationSettings(), render)
    server = PluginServer(devices.table(RESOURCE), directory)
    server.start()
    return _serve_until_sigterm(server.stop)


def serve_echo(path: Path, responses: Path) -> int:
    """A bare sync gRPC server: GetPreferredAllocation answers with canned bytes."""
    canned = {bytes.fromhex(k): bytes.fromhex(v) for k, v in json.loads(responses.read_text()).items()}

    def preferred(request: bytes, context: grpc.ServicerContext) -> bytes:
        return canned[request]

    handler = grpc.method_handlers_generic_handler(
        "v1beta1.DevicePlugin", {"GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(preferred)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="echo"),
                         options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return _serve_until_sigterm(lambda: server.stop(None).wait(2))


def spawn(*args: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        stop_process(proc)
        raise BenchError(f"server {' '.join(args)} did not start")
    return proc


# --------------------------------------------------------------------------- measuring

@dataclass
class SizeRow:
    table: str
    groups: int
    size: int
    before: list[float]  # seconds, in-process
    cold: list[float]  # the new function, its index made in the call
    after: list[float]
    agent: list[float]  # seconds, round trips
    echo: list[float]
    round_ratios: list[float]  # agent/echo medians of each round


Call = Callable[[api_pb2.PreferredAllocationRequest], api_pb2.PreferredAllocationResponse]


def typed_call(channel: grpc.Channel) -> Call:
    """What kubelet's client does: serialise the request, deserialise the response."""
    call = channel.unary_unary(METHOD, request_serializer=api_pb2.PreferredAllocationRequest.SerializeToString,
                               response_deserializer=api_pb2.PreferredAllocationResponse.FromString)

    def invoke(request: api_pb2.PreferredAllocationRequest) -> api_pb2.PreferredAllocationResponse:
        return call(request, timeout=30)

    return invoke


def request_for(ids: Sequence[str], size: int) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=list(ids), allocation_size=size)])


def timed(call: Callable[[], object], out: list[float], n: int) -> None:
    clock = time.perf_counter
    for _ in range(n):
        started = clock()
        call()
        out.append(clock() - started)


def in_process(table: dict[str, Group], ids: list[str], size: int, reps: int
               ) -> tuple[list[float], list[float], list[float]]:
    """The old function, the new one with the table's index kept (as the device table keeps it) and
    without (the index made in the call), rotating which goes first, ``reps`` times each."""
    before: list[float] = []
    cold: list[float] = []
    warm: list[float] = []
    index = PreferenceIndex(table)
    for i in range(reps):
        sides = [(partial(before_preferred_allocation, table), before), (partial(preferred_allocation, table), cold),
                 (partial(preferred_allocation, table, index=index), warm)]
        for fn, out in sides[i % 3:] + sides[:i % 3]:
            timed(partial(fn, ids, [], size), out, 1)
    return before, cold, warm


def sizes_for(n: int) -> list[int]:
    return sorted({1, n // 4, n // 2, 3 * n // 4, n - 1})


def measure_round(name: str, directory: Path, groups: dict[str, Group], ids: list[str],
                  requests: dict[int, api_pb2.PreferredAllocationRequest], rows: dict[int, SizeRow],
                  calls: int, block: int, warmup: int) -> None:
    """One round: fresh agent and echo processes, every request size timed on both, ABBA."""
    directory.mkdir(parents=True, exist_ok=True)
    agent = spawn("--serve-agent", str(directory), name)
    echo: subprocess.Popen[bytes] | None = None
    try:
        agent_channel = grpc.insecure_channel(f"unix://{directory / socket_name(RESOURCE)}")
        agent_call = typed_call(agent_channel)
        canned = {}
        for size, request in requests.items():
            answer = list(agent_call(request).container_responses[0].deviceIDs)
            want = preferred_allocation(groups, ids, [], size)
            if answer != want:
                raise BenchError(f"{name}, {size} of {len(ids)}: the agent answered {answer}, "
                                 f"preferred_allocation says {want}")
            if comb(len(ids), size) <= BEFORE_EXHAUSTIVE_LIMIT:
                old = before_preferred_allocation(groups, ids, [], size)
                if old != want:
                    raise BenchError(f"{name}, {size} of {len(ids)}: the exhaustive search answered {old}, "
                                     f"the new search {want}")
            response = api_pb2.PreferredAllocationResponse(
                container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=answer)])
            canned[request.SerializeToString().hex()] = response.SerializeToString().hex()
        responses = directory / "responses.json"
        responses.write_text(json.dumps(canned))
        echo_socket = directory / "echo.sock"
        echo = spawn("--serve-echo", str(echo_socket), str(responses))
        echo_channel = grpc.insecure_channel(f"unix://{echo_socket}")
        echo_call = typed_call(echo_channel)
        try:
            for size, request in requests.items():
                scratch: list[float] = []
                for call in (agent_call, echo_call):
                    timed(partial(call, request), scratch, warmup)
                row = rows[size]
                agent_times: list[float] = []
                echo_times: list[float] = []
                for b in range(max(1, calls // block)):
                    sides = [(agent_call, agent_times), (echo_call, echo_times)]
                    for call, out in (sides if b % 2 == 0 else sides[::-1]):  # ABBA
                        timed(partial(call, request), out, block)
                row.agent += agent_times
                row.echo += echo_times
                row.round_ratios.append(statistics.median(agent_times) / statistics.median(echo_times))
        finally:
            echo_channel.close()
            agent_channel.close()
    finally:
        stop_process(agent)
        if echo is not None:
            stop_process(echo)


def measure_table(name: str, tmp: Path, rounds: int, calls: int, block: int, warmup: int, reps: int) -> list[SizeRow]:
    groups = grouping_of(name).by_id(RESOURCE)
    ids = list(groups)
    random.Random(len(ids)).shuffle(ids)  # kubelet lists the available ids in no particular order
    requests = {size: request_for(ids, size) for size in sizes_for(len(ids))}
    rows = {size: SizeRow(name, len(ids), size, [], [], [], [], [], []) for size in requests}
    for r in range(rounds):  # fresh processes each round: where the scheduler puts them varies
        measure_round(name, tmp / f"{name.replace(' ', '-')}-{r}", groups, ids, requests, rows, calls, block, warmup)
    for size, row in rows.items():
        row.before, row.cold, row.after = in_process(groups, ids, size, reps)
    return list(rows.values())


# --------------------------------------------------------------------------- report

def report(rows: Sequence[SizeRow], rounds: int, calls: int, block: int, reps: int) -> None:
    print(f"GetPreferredAllocation benchmark: agent (PluginServer/DevicePluginServicer over a DeviceTable) and a "
          f"bare echo, each its own process on a Unix socket; {rounds} rounds of fresh processes, {calls} calls "
          f"per side per row and round in ABBA blocks of {block} (ratio: of all calls' medians; rounds: each "
          f"round's); before/cold/after: the function alone in this process (cold: its index made in the call), "
          f"median of {reps}; {os.cpu_count()} CPUs")
    header = (f"{'table':<13} {'N':>4} {'size':>4}  {'before':>9} {'cold':>8} {'after':>8}  {'agent p50':>9} "
              f"{'echo p50':>9} {'agent min':>9} {'echo min':>9}  {'ratio':>5} {'rounds':>9}  {'target':>6}  verdict")
    print(header)
    print("-" * len(header))
    for r in rows:
        a50, e50 = statistics.median(r.agent), statistics.median(r.echo)
        ratio = a50 / e50
        spread = f"{min(r.round_ratios):.2f}-{max(r.round_ratios):.2f}"
        print(f"{r.table:<13} {r.groups:>4} {r.size:>4}  {fmt_time(statistics.median(r.before)):>9} "
              f"{fmt_time(statistics.median(r.cold)):>8} {fmt_time(statistics.median(r.after)):>8}  {fmt_time(a50):>9} "
              f"{fmt_time(e50):>9} {fmt_time(min(r.agent)):>9} {fmt_time(min(r.echo)):>9}  {ratio:>5.2f} {spread:>9}  "
              f"{'<= ' + str(TARGET_RATIO):>6}  {'met' if ratio <= TARGET_RATIO else 'NOT met'}")


def rows_for(rows: Sequence[SizeRow]) -> list[CommonRow]:
    """One row of the one table per device table: its worst request size."""
    out: list[CommonRow] = []
    for name in dict.fromkeys(r.table for r in rows):
        mine = [r for r in rows if r.table == name]
        ratios = {r.size: statistics.median(r.agent) / statistics.median(r.echo) for r in mine}
        worst = max(ratios.values())
        rounds = [x for r in mine for x in r.round_ratios]
        text = ", ".join(f"{size}: {ratio:.2f}" for size, ratio in ratios.items())
        out.append(CommonRow(BENCH, f"GetPreferredAllocation p50 vs echo, {name} ({mine[0].groups} groups)",
                             f"ratio by request size {text}; rounds {min(rounds):.2f}-{max(rounds):.2f}", worst,
                             f"every size <= {TARGET_RATIO}", at_most(worst, TARGET_RATIO),
                             raw={str(r.size): {"agent_p50_s": statistics.median(r.agent),
                                                "echo_p50_s": statistics.median(r.echo), "rounds": r.round_ratios,
                                                "before_s": statistics.median(r.before),
                                                "after_s": statistics.median(r.after),
                                                "cold_s": statistics.median(r.cold)} for r in mine}))
    return out


def run(quick: bool, rounds: int = 3, calls: int = 400, block: int = 50, warmup: int = 50, reps: int = 5,
        tables: Sequence[str] = tuple(TABLES)) -> list[CommonRow]:
    if quick:
        rounds, calls, block, warmup, reps = 1, 60, 15, 10, 1
    tmp = Path(tempfile.mkdtemp(prefix="bpa-", dir="/tmp"))  # short: Unix socket paths < 108 bytes
    rows: list[SizeRow] = []
    try:
        for name in tables:
            rows += measure_table(name, tmp, rounds, calls, block, warmup, reps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(rows, rounds, calls, block, reps)
    return rows_for(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--rounds", type=int, default=3, help="fresh agent and echo processes per table (default 3)")
    parser.add_argument("--calls", type=int, default=400, help="timed calls per side per row and round (default 400)")
    parser.add_argument("--block", type=int, default=50, help="calls per interleaved block (default 50)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed calls per side per row first (default 50)")
    parser.add_argument("--reps", type=int, default=5, help="in-process runs of before and after per row (default 5)")
    parser.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES), help="device tables")
    parser.add_argument("--serve-agent", nargs=2, metavar=("DIR", "TABLE"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-echo", nargs=2, metavar=("SOCKET", "RESPONSES"), help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.serve_agent:
        return serve_agent(Path(args.serve_agent[0]), args.serve_agent[1])
    if args.serve_echo:
        return serve_echo(Path(args.serve_echo[0]), Path(args.serve_echo[1]))
    return bench_main(BENCH, lambda quick: run(quick, args.rounds, args.calls, args.block, args.warmup, args.reps,
                                               args.tables), __doc__, rest)


if __name__ == "__main__":
    raise SystemExit(main())
