"""Allocate under concurrency, and re-registration: the agent with production defaults, as kubelet sees it.

The agent runs as the chart runs it (``bench/lib/production.py``: the image-like install, node labels over
TLS, metrics and probes, kubelet's files, JSON logs at info, default intervals) on the ``z16-400``
host-root tree (16 books), next to the kubelet emulator in this process.

* **Allocate p50 against a bare echo.** The echo (``bench/lib/grpc_load.py echo``) is a sync ``grpc.server``
  of the agent's type (a 16-thread pool, a Unix socket), run by the same interpreter as the agent, in its
  own process; its generic handler answers with the bytes the agent answers (the product's
  ``plan_allocation`` and ``render`` in this process; every answer of both sides is compared with them).
  A load client in a third process (``bench/lib/grpc_load.py drive``) keeps 1, 4 or 16 calls in flight
  on one channel per side, in blocks that alternate A B B A. Two kinds of device sets: **repeated** (24
  sets sent again and again: the agent's cached answers) and **first-time** (every request a device set
  the agent has not seen before, in no order seen before). A first-time Allocate comes as kubelet sends
  it: after a GetPreferredAllocation for the same set (untimed, to both sides; kubelet asks whenever it has
  a choice, and the agent plans the set it prefers while answering); the same sets with no preference
  asked first (kubelet's ``devicesToAllocate`` skips it when it has no choice: bench/HISTORY.md, off the happy
  path) are a target row at 1 client (kubelet admits pods one at a time) and info rows at 4 and 16. The sets are
  the books of one size (13 or 12 cores: balanced, as
  GetPreferredAllocation picks them on this node), 1 to 4 of them: about 300 sets besides the repeated
  ones, so each first-time row gets fresh agent and echo processes of its own in every round (a new
  agent has seen nothing), and blocks of 70 calls (40 with ``--quick``). Three rounds, the rows' order
  reversed every other round.
  Target: p50 agent/echo <= 1.3 in every target row; the p99 ratio and each block pair's p50 ratio
  (min/median/max: the noise) are shown. ``--only KIND`` (repeated, first-time, first-time-alone; again
  for more), ``--clients N`` (again for more) and ``--rounds N`` measure some rows only (no
  re-registration then).
* **The Allocate handler in-process.** ``DevicePluginServicer.Allocate`` called directly (the request parsed
  from its bytes, a context that only aborts) on a device table made as ``serve`` makes it (the ``z16-400``
  tree, default settings, the metrics observer), for every first-time set once (each planned and rendered in
  the call) and then for the repeated sets again and again (answered from the table's cache); each call
  timed with ``perf_counter``. Target: p99 <= 1 ms for both kinds (kubelet has no timeout on Allocate; the
  gRPC rows above add the transport).
* **Re-registration.** From the emulator's ``kubelet.sock`` coming back after ``restart(down_for=0.5)``
  to the agent's Register being counted, median of 12 restarts. Target <= 0.3 s.

``--pin`` (not used by ``make bench``) runs the load client on CPU 0 and the agent and the echo on CPU 1
(``taskset``): on two shared cores the rounds' ratios at 4 and 16 clients then vary by a few percent
instead of tens of percent, but the servers' threads share one core, which is not how a node runs them.

    .venv/bin/python bench/node/allocate.py [--quick] [--pin] [--only KIND]... [--clients N]... [--rounds N]
"""

from __future__ import annotations

import argparse
import itertools
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc

from agent._proto.deviceplugin.v1beta1 import api_pb2
from agent.devices.table import NodeDevices
from agent.observe.metrics import AgentMetrics
from agent.plugin.server import WORKERS, socket_name
from agent.plugin.servicer import DevicePluginServicer, render
from agent.policy.allocation import AllocationSettings, plan_allocation
from agent.policy.grouping import Group, GroupingSettings, group_topology
from agent.topology.embedded import load_embedded
from agent.topology.sysfs import read_sysfs
from bench.lib.common import (
    INFO,
    BenchError,
    Row,
    at_most,
    bench_main,
    fmt_time,
    median,
    percentile,
    spread,
    stop_process,
)
from bench.lib.production import ImageInstall, Production
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.sysfs_writer import write_sysfs_tree

BENCH = "allocate"
SHAPE = "z16-400"
RESOURCE = "topology/book"
CONCURRENCY = (1, 4, 16)
REPEATED_SETS = 24
TARGET_P50_RATIO = 1.3
TARGET_REREGISTER_S = 0.3
TARGET_HANDLER_P99_S = 0.001
LOAD = Path(__file__).resolve().parents[1] / "lib" / "grpc_load.py"


# --------------------------------------------------------------------------- device sets and answers

def device_sets(groups: Sequence[Group], seed: int = 15) -> list[tuple[str, ...]]:
    """Every ordered id list of 1 to 4 books of the same size, shuffled."""
    by_size: dict[int, list[str]] = {}
    for g in groups:
        by_size.setdefault(len(g.cores), []).append(g.id)
    sets = [p for ids in by_size.values() for k in range(1, 5) for p in itertools.permutations(ids, k)]
    random.Random(seed).shuffle(sets)
    return sets


def first_time_sets(sets: Sequence[tuple[str, ...]], repeated: int) -> list[tuple[str, ...]]:
    """One order of each set not among the first ``repeated`` lists: the agent answers a set, in any
    order, from its cache once it has seen it."""
    seen = {frozenset(ids) for ids in sets[:repeated]}
    fresh = []
    for ids in sets[repeated:]:
        if frozenset(ids) not in seen:
            seen.add(frozenset(ids))
            fresh.append(ids)
    return fresh


def preference_request(available: Sequence[str], ids: Sequence[str]) -> bytes:
    """The GetPreferredAllocation kubelet sends before allocating ``ids``: every device available, the
    set as must-include (so the preference is the set the bench allocates next)."""
    return api_pb2.PreferredAllocationRequest(container_requests=[api_pb2.ContainerPreferredAllocationRequest(
        available_deviceIDs=list(available), must_include_deviceIDs=list(ids), allocation_size=len(ids))]
    ).SerializeToString()


def request_bytes(ids: Sequence[str]) -> bytes:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]).SerializeToString()


def answer_bytes(groups: dict[str, Group], ids: Sequence[str]) -> bytes:
    """What the agent must answer: the product's plan, rendered as the agent renders it."""
    return render(plan_allocation([groups[i] for i in ids], AllocationSettings()))  # one container's answer


def check_agent(socket: Path, table: dict[bytes, bytes], requests: Sequence[bytes]) -> None:
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        call = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")
        for request in requests:
            got = call(request, timeout=10)
            parse = api_pb2.AllocateResponse.FromString
            if parse(got) != parse(table[request]):  # map fields serialize in no fixed order
                raise BenchError(f"Allocate {api_pb2.AllocateRequest.FromString(request)}: the agent answered "
                                 f"{api_pb2.AllocateResponse.FromString(got)}, the product's plan is "
                                 f"{api_pb2.AllocateResponse.FromString(table[request])}")


# --------------------------------------------------------------------------- one round

def spawn_echo(install: ImageInstall, socket: Path, table_file: Path, pin: Sequence[str] = ()
               ) -> subprocess.Popen[bytes]:
    """The echo under the agent's interpreter and environment (the image install's)."""
    proc = subprocess.Popen([*pin, str(install.python), str(LOAD), "echo", str(socket), str(table_file),
                             str(WORKERS)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, cwd=socket.parent,
                            env=install.run_env())
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        stop_process(proc)
        raise BenchError("the echo server did not start")
    return proc


def drive(tmp: Path, spec: dict[str, Any], pin: Sequence[str] = ()) -> dict[str, Any]:
    spec_file, out_file = tmp / "spec.pickle", tmp / "out.pickle"
    spec_file.write_bytes(pickle.dumps(spec))
    done = subprocess.run([*pin, sys.executable, str(LOAD), "drive", str(spec_file), str(out_file)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"the load client failed: {done.stderr[-1500:]}")
    result: dict[str, Any] = pickle.loads(out_file.read_bytes())
    return result


class Series:
    """One row's calls over every round: per side, per block, the latencies."""

    def __init__(self) -> None:
        self.blocks: tuple[list[list[float]], list[list[float]]] = ([], [])
        self.round_ratios: list[float] = []  # each round's p50 ratio (fresh processes each round)

    def add(self, latencies: tuple[list[list[float]], list[list[float]]]) -> None:
        for side in (0, 1):
            self.blocks[side].extend(latencies[side])
        agent, echo = ([x for b in latencies[side] for x in b] for side in (0, 1))
        self.round_ratios.append(median(agent) / median(echo))

    def all(self, side: int) -> list[float]:
        return [x for block in self.blocks[side] for x in block]

    def block_ratios(self) -> list[float]:
        """p50 ratio of each block pair (the agent's block and the echo's block next to it)."""
        return [median(a) / median(e) for a, e in zip(self.blocks[0], self.blocks[1], strict=True)]


def measure_round(prod: Production, tree: Path, tmp: Path, repeated: list[bytes], fresh: list[bytes],
                  table_file: Path, table: dict[bytes, bytes], series: dict[tuple[str, int], Series],
                  order: Sequence[tuple[str, int]], block: int, blocks: int, warmup: int,
                  client_pin: Sequence[str] = (), before: dict[bytes, bytes] | None = None) -> None:
    """Fresh agent and echo processes, every row once. A new agent has seen no request, so every round
    takes its first-time sets from the start of ``fresh`` again (the same sets in every round)."""
    with KubeletEmulator(tmp / "k") as kubelet:
        agent = prod.agent(kubelet, tree)
        echo: subprocess.Popen[bytes] | None = None
        try:
            try:
                kubelet.wait_registered(RESOURCE, 30)
            except TimeoutError:
                raise BenchError(f"the agent never registered {RESOURCE} (log: {agent.log_path})") from None
            agent_socket = kubelet.device_plugin_dir / socket_name(RESOURCE)
            check_agent(agent_socket, table, repeated)
            echo = spawn_echo(prod.install, tmp / "echo.sock", table_file, prod.pin)
            for kind, concurrency in order:
                if kind == "repeated":
                    cycle = itertools.cycle(repeated)
                    warm = [next(cycle) for _ in range(warmup)]
                    planned = [[next(cycle) for _ in range(block)] for _ in range(blocks)]
                else:
                    need = warmup + block * blocks
                    if len(fresh) < need:
                        raise BenchError(f"only {len(fresh)} first-time device sets left, {need} needed")
                    warm, fresh = fresh[:warmup], fresh[warmup:]
                    planned = [fresh[i * block:(i + 1) * block] for i in range(blocks)]
                    fresh = fresh[block * blocks:]
                spec = {"targets": (f"unix://{agent_socket}", f"unix://{tmp / 'echo.sock'}"), "warmup": warm,
                        "blocks": planned, "expected": table, "concurrency": concurrency,
                        "before": before if kind == "first-time" else {}}
                result = drive(tmp, spec, client_pin)
                wrong_agent, wrong_echo = result["wrong"]
                if wrong_agent or wrong_echo:
                    example = result["example"]
                    detail = ""
                    if example is not None:
                        request, got, want = example
                        detail = (f": {api_pb2.AllocateRequest.FromString(request)} answered "
                                  f"{api_pb2.AllocateResponse.FromString(got)}, expected "
                                  f"{api_pb2.AllocateResponse.FromString(want)}")
                    raise BenchError(f"{kind} x{concurrency}: {wrong_agent} wrong agent answers, "
                                     f"{wrong_echo} wrong echo answers{detail}")
                series[(kind, concurrency)].add(result["latencies"])
            if agent.proc.poll() is not None:
                raise BenchError(f"the agent exited during the round (log: {agent.log_path})")
        finally:
            agent.stop()
            if echo is not None:
                stop_process(echo)


# --------------------------------------------------------------------------- the handler in-process

class _Context:
    """What Allocate needs of a gRPC context: a refusal aborts (none is expected here)."""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise BenchError(f"Allocate refused a set in-process: {code}: {details}")


def measure_handler(tree: Path, repeated: Sequence[bytes], fresh: Sequence[bytes], table: dict[bytes, bytes],
                    passes: int) -> dict[str, list[float]]:
    """Seconds per Allocate handler call, in-process: every first-time set once on a new device table, then the
    repeated sets ``passes`` times; every answer checked against the product's plan."""
    grouping = group_topology(read_sysfs(tree, tree / "proc", details=False), GroupingSettings())
    devices = NodeDevices(grouping, GroupingSettings(), AllocationSettings(), render)
    metrics = AgentMetrics()
    metrics.prepare(grouping.resources())
    servicer = DevicePluginServicer(devices.table(RESOURCE), threading.Event(), metrics)
    context = _Context()
    times: dict[str, list[float]] = {"first-time": [], "repeated": []}
    for kind, requests in (("first-time", fresh), ("warm-up", repeated), ("repeated", list(repeated) * passes)):
        for raw in requests:
            started = time.perf_counter()
            answer = servicer.Allocate(api_pb2.AllocateRequest.FromString(raw), context)
            times.setdefault(kind, []).append(time.perf_counter() - started)
            if api_pb2.AllocateResponse.FromString(answer) != api_pb2.AllocateResponse.FromString(table[raw]):
                raise BenchError("the in-process Allocate answered another plan than the product's")
    del times["warm-up"]  # the repeated sets' first calls: planned then, cached since
    return times


# --------------------------------------------------------------------------- re-registration

def measure_reregister(prod: Production, tree: Path, tmp: Path, restarts: int, down_for: float) -> list[float]:
    out: list[float] = []
    with KubeletEmulator(tmp / "kr") as kubelet:
        agent = prod.agent(kubelet, tree)
        try:
            kubelet.wait_registered(RESOURCE, 30)
            for _ in range(restarts):
                before = kubelet.registrations(RESOURCE)
                up: list[float] = []
                reg: list[float] = []

                def running(up: list[float] = up) -> bool:
                    if kubelet.is_running:
                        up.append(time.perf_counter())
                        return True
                    return False

                def registered(before: int = before, reg: list[float] = reg) -> bool:
                    if kubelet.registrations(RESOURCE) > before:
                        reg.append(time.perf_counter())
                        return True
                    return False

                kubelet.restart(down_for, block=False)
                kubelet.wait_for(running, down_for + 10.0)
                try:
                    kubelet.wait_for(registered, 30.0)
                    kubelet.wait_registered(RESOURCE, 10.0)
                except TimeoutError:
                    raise BenchError("the agent did not register again after a kubelet restart") from None
                out.append(reg[0] - up[0])
                time.sleep(0.2)  # let the new ListAndWatch stream settle before the next restart
        finally:
            agent.stop()
    return out


# --------------------------------------------------------------------------- rows

def run(quick: bool, pin: bool = False, only: Sequence[str] = (), clients: Sequence[int] = CONCURRENCY,
        rounds: int | None = None) -> list[Row]:
    """``only``: these kinds of rows (repeated, first-time, first-time-alone), all when empty; ``clients``:
    these concurrencies; ``rounds``: instead of 3 (1 with ``--quick``)."""
    default_rounds, block, blocks, warmup, restarts = (1, 40, 4, 10, 3) if quick else (3, 160, 4, 20, 12)
    rounds = rounds or default_rounds
    tmp = Path(tempfile.mkdtemp(prefix="bal-", dir="/tmp"))  # short: Unix socket paths < 108 bytes
    try:
        tree = tmp / "root"
        write_sysfs_tree(load_embedded(SHAPE), tree)
        grouping = group_topology(read_sysfs(tree, tree / "proc", details=False), GroupingSettings())
        groups = grouping.by_id(RESOURCE)
        sets = device_sets(list(groups.values()))
        requests = {ids: request_bytes(ids) for ids in sets}
        table = {requests[ids]: answer_bytes(groups, ids) for ids in sets}
        repeated = [requests[ids] for ids in sets[:REPEATED_SETS]]
        fresh = [requests[ids] for ids in first_time_sets(sets, REPEATED_SETS)]
        fresh_block = min(block, (len(fresh) - warmup) // blocks)
        all_ids = sorted(groups)
        before = {requests[ids]: preference_request(all_ids, ids) for ids in sets}
        handler = measure_handler(tree, repeated, fresh, table, 10 if quick else 40) if not only else {}
        table_file = tmp / "answers.pickle"
        table_file.write_bytes(pickle.dumps(table))
        rows_order = [(kind, c) for c in clients for kind in ("repeated", "first-time", "first-time-alone")
                      if not only or kind in only]
        series = {key: Series() for key in rows_order}
        with Production(tmp) as prod:
            client_pin: list[str] = []
            if pin:  # the load client on CPU 0, the agent and the echo (one at a time busy) on CPU 1
                client_pin, prod.pin = ["taskset", "-c", "0"], ["taskset", "-c", "1"]
            for r in range(rounds):
                order = rows_order if r % 2 == 0 else rows_order[::-1]
                if any(row[0] == "repeated" for row in order):
                    measure_round(prod, tree, tmp, repeated, fresh, table_file, table, series,
                                  [row for row in order if row[0] == "repeated"], block, blocks, warmup, client_pin)
                for row in (row for row in order if row[0] != "repeated"):  # new processes: every set new
                    measure_round(prod, tree, tmp, repeated, fresh, table_file, table, series, [row],
                                  fresh_block, blocks, warmup, client_pin, before)
            rereg = measure_reregister(prod, tree, tmp, restarts, 0.5) if not only else []
            setup = f"{prod.labels_note}; {prod.install.how}" + ("; pinned: client CPU 0, servers CPU 1" if pin else "")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rows: list[Row] = []
    for kind, concurrency in rows_order:
        s = series[(kind, concurrency)]
        agent, echo = s.all(0), s.all(1)
        a50, e50 = percentile(agent, 50), percentile(echo, 50)
        a99, e99 = percentile(agent, 99), percentile(echo, 99)
        ratio = a50 / e50
        ratios = s.block_ratios()
        alone = kind == "first-time-alone"
        info = alone and concurrency != 1  # without a preference: a target at 1 client (kubelet's pace), else info
        what = {"repeated": "repeated sets", "first-time": "first-time sets after GetPreferredAllocation",
                "first-time-alone": "first-time sets, no GetPreferredAllocation before"}[kind]
        rows.append(Row(
            BENCH, f"Allocate p50, {what}, {concurrency} client{'s' if concurrency > 1 else ''}",
            f"agent {fmt_time(a50)} / echo {fmt_time(e50)} = {ratio:.2f} (p99 {a99 / e99:.2f}; rounds "
            f"{'/'.join(f'{x:.2f}' for x in s.round_ratios)}; blocks {spread(ratios)}; {len(agent)} calls/side)",
            ratio, "" if info else f"p50 ratio <= {TARGET_P50_RATIO}",
            INFO if info else at_most(ratio, TARGET_P50_RATIO),
            reason=("kubelet skips the preference when it has no choice (bench/HISTORY.md: devicesToAllocate); "
                    "the agent then plans the set on the Allocate path" if alone and concurrency == 1 else ""),
            raw={"agent_p50_s": a50, "echo_p50_s": e50, "agent_p99_s": a99, "echo_p99_s": e99,
                 "block_ratios": ratios, "round_ratios": s.round_ratios, "calls_per_side": len(agent),
                 "rounds": rounds}))
    for kind, seconds in handler.items():
        p99 = percentile(seconds, 99)
        rows.append(Row(BENCH, f"Allocate handler p99 in-process, {kind} sets",
                        f"p99 {fmt_time(p99)}, p50 {fmt_time(percentile(seconds, 50))}, max {fmt_time(max(seconds))} "
                        f"({len(seconds)} calls)", p99, f"p99 <= {fmt_time(TARGET_HANDLER_P99_S)}",
                        at_most(p99, TARGET_HANDLER_P99_S), raw={"seconds": seconds}))
    if rereg:
        r50 = median(rereg)
        rows.append(Row(BENCH, "kubelet.sock back -> re-registered",
                        f"{fmt_time(r50)} median of {len(rereg)} (min {fmt_time(min(rereg))}, "
                        f"max {fmt_time(max(rereg))})",
                        r50, f"<= {fmt_time(TARGET_REREGISTER_S)}", at_most(r50, TARGET_REREGISTER_S),
                        raw={"seconds": rereg}))
    rows.append(Row(BENCH, "set-up", f"{rounds} round(s) of fresh agent and echo processes, blocks of {block} calls "
                    f"({fresh_block} for first-time sets, {len(fresh)} of them), "
                    f"{blocks} block pairs per row and round", None, "", INFO, setup))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--only", action="append", default=[], choices=("repeated", "first-time", "first-time-alone"))
    parser.add_argument("--clients", type=int, action="append", default=[])
    parser.add_argument("--rounds", type=int, default=None)
    known, rest = parser.parse_known_args(argv)
    return bench_main(BENCH, lambda quick: run(quick, known.pin, known.only, known.clients or CONCURRENCY,
                                               known.rounds), __doc__, rest)


if __name__ == "__main__":
    raise SystemExit(main())
