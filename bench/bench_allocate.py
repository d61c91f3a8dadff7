"""Allocate latency, start-up and re-registration benchmark: the agent as kubelet sees it.

The agent runs as its own process (``python -m agent serve --topology-file embedded:z16-lpar``)
against the kubelet emulator, which runs in this process. Three measurements:

* ``allocate``: Allocate round trips over the agent's Unix socket with a real grpcio client (one
  long-lived channel, as kubelet keeps one), a rotating mix of one-, two- and four-book requests,
  versus the same calls to a bare echo server in the same run: a sync ``grpc.server`` with a
  ``ThreadPoolExecutor`` of the same size on a Unix socket, in its own process too, serving the same
  method path with a generic handler that returns the agent's own response bytes for each request
  (captured during warm-up), so both sides move the same bytes and do the same client-side
  (de)serialisation. Blocks of calls alternate ABBA. Reports p50 and p99 of each and the ratios
  agent/echo (target: p50 ratio <= 1.3). The agent's answers are checked against
  ``plan_allocation``: a wrong answer exits 1.
* ``startup``: from spawning ``python -m agent serve ...`` to the emulator counting the Register
  call (target <= 0.6 s), median of a few runs, interleaved with a floor measured the same way:
  spawning ``python -c "import grpc; <the generated DevicePlugin stubs>"`` until it exits.
* ``reregister``: emulator restarts (``restart(down_for, block=False)``); from the moment
  ``is_running`` becomes true again (kubelet.sock is back) to the agent's Register being counted
  (target <= 0.3 s), median of >= 10 restarts.

Reports only; exits 0 unless the agent answers wrongly or never registers.

    .venv/bin/python bench/bench_allocate.py [--quick] [--calls 4000] [--block 250]
        [--startups 5] [--restarts 12] [--down-for 0.5]

(``--serve-echo SOCKET RESPONSES`` is the echo server's own entry point; the benchmark spawns it.)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent._proto.deviceplugin.v1beta1 import api_pb2
from agent.plugin.server import WORKERS, socket_name
from agent.policy.allocation import plan_allocation
from agent.policy.grouping import Group, group_topology
from agent.topology.embedded import load_embedded
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.kubelet_emulator.constants import LOGGER_NAME

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = "z16-lpar"
RESOURCE = "topology/book"
ALLOCATE = "/v1beta1.DevicePlugin/Allocate"
TARGET_P50_RATIO = 1.3
TARGET_STARTUP_S = 0.6
TARGET_REREGISTER_S = 0.3
FLOOR_CODE = "import grpc; from agent._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc"

RawCall = Callable[[bytes], bytes]


class BenchError(Exception):
    """The thing under test is broken (wrong answer, never registers): exit 1."""


# --------------------------------------------------------------------------- echo server (child)

def serve_echo(path: Path, responses: Path) -> int:
    """A bare sync gRPC server: Allocate answers with canned bytes (or the request itself)."""
    table = {bytes.fromhex(k): bytes.fromhex(v) for k, v in json.loads(responses.read_text()).items()}

    def allocate(request: bytes, context: grpc.ServicerContext) -> bytes:
        return table.get(request, request)

    handler = grpc.method_handlers_generic_handler(
        "v1beta1.DevicePlugin", {"Allocate": grpc.unary_unary_rpc_method_handler(allocate)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="echo"),
                         options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{path}")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    print("ready", flush=True)
    stop.wait()
    server.stop(None).wait(2)
    return 0


# --------------------------------------------------------------------------- helpers

def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def quiet_emulator() -> None:
    emulator_log = logging.getLogger(LOGGER_NAME)
    emulator_log.addHandler(logging.NullHandler())
    emulator_log.propagate = False


def agent_command(kubelet: KubeletEmulator) -> list[str]:
    return [sys.executable, "-m", "agent", "serve", "--topology-file", f"embedded:{TOPOLOGY}",
            "--kubelet-dir", str(kubelet.device_plugin_dir),
            "--pod-resources-socket", str(kubelet.pod_resources_socket),
            "--metrics-port", "0", "--no-node-labels"]


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def running_agent(kubelet: KubeletEmulator, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    before = kubelet.registrations(RESOURCE)
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(agent_command(kubelet), cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=log_file, stderr=log_file)
    try:
        try:
            kubelet.wait_for(lambda: kubelet.registrations(RESOURCE) > before, 30.0)
            kubelet.wait_registered(RESOURCE, 10.0)
        except TimeoutError:
            raise BenchError(f"the agent never registered {RESOURCE} (log: {log_path})") from None
        yield proc
    finally:
        stop_process(proc)


def raw_callable(channel: grpc.Channel) -> RawCall:
    call = channel.unary_unary(ALLOCATE)  # bytes in, bytes out

    def invoke(request: bytes) -> bytes:
        return call(request, timeout=10)

    return invoke


def typed_callable(channel: grpc.Channel) -> Callable[[api_pb2.AllocateRequest], api_pb2.AllocateResponse]:
    """What kubelet's client does: serialise the request, deserialise the response."""
    call = channel.unary_unary(ALLOCATE, request_serializer=api_pb2.AllocateRequest.SerializeToString,
                               response_deserializer=api_pb2.AllocateResponse.FromString)

    def invoke(request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        return call(request, timeout=10)

    return invoke


def request_mix(groups: Sequence[Group]) -> list[list[str]]:
    """Every single book, the book pairs of each drawer, and each drawer's first four books."""
    ids = [g.id for g in groups]
    by_drawer: dict[object, list[str]] = {}
    for g in groups:
        by_drawer.setdefault(g.key[0], []).append(g.id)
    mix: list[list[str]] = [[i] for i in ids]
    for members in by_drawer.values():
        mix += [members[i:i + 2] for i in range(0, len(members) - 1, 2)]
        if len(members) >= 4:
            mix.append(members[:4])
    return mix


def check_answers(requests: Sequence[list[str]], call: RawCall, groups: dict[str, Group]) -> None:
    for ids in requests:
        request = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])
        response = api_pb2.AllocateResponse.FromString(call(request.SerializeToString()))
        want = plan_allocation([groups[i] for i in ids]).envs
        got = dict(response.container_responses[0].envs) if response.container_responses else {}
        if got != dict(want):
            raise BenchError(f"Allocate {ids}: the agent answered {got}, plan_allocation says {dict(want)}")


# --------------------------------------------------------------------------- (a) Allocate latency

@dataclass
class LatencyResult:
    agent: list[float]
    echo: list[float]


def run_block(call: Callable[[api_pb2.AllocateRequest], api_pb2.AllocateResponse],
              requests: Sequence[api_pb2.AllocateRequest], n: int, offset: int, out: list[float]) -> None:
    clock = time.perf_counter
    for i in range(n):
        request = requests[(offset + i) % len(requests)]
        started = clock()
        call(request)
        out.append(clock() - started)


def measure_allocate(kubelet: KubeletEmulator, tmp: Path, calls: int, block: int, warmup: int) -> LatencyResult:
    topology = load_embedded(TOPOLOGY)
    groups = {g.id: g for g in group_topology(topology).by_resource(RESOURCE)}
    id_sets = request_mix(list(groups.values()))
    requests = [api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])
                for ids in id_sets]
    agent_socket = kubelet.device_plugin_dir / socket_name(RESOURCE)
    echo_socket = tmp / "echo.sock"
    responses_file = tmp / "responses.json"
    echo: subprocess.Popen[bytes] | None = None
    with running_agent(kubelet, tmp / "agent-allocate.log"):
        agent_channel = grpc.insecure_channel(f"unix://{agent_socket}")
        try:
            raw_agent = raw_callable(agent_channel)
            check_answers(id_sets, raw_agent, groups)
            canned = {r.SerializeToString().hex(): raw_agent(r.SerializeToString()).hex() for r in requests}
            responses_file.write_text(json.dumps(canned))
            echo = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve-echo",
                                     str(echo_socket), str(responses_file)],
                                    cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
            assert echo.stdout is not None
            if echo.stdout.readline().strip() != b"ready":
                raise RuntimeError("the echo server did not start")
            echo_channel = grpc.insecure_channel(f"unix://{echo_socket}")
            try:
                agent_call = typed_callable(agent_channel)
                echo_call = typed_callable(echo_channel)
                scratch: list[float] = []
                run_block(agent_call, requests, warmup, 0, scratch)
                run_block(echo_call, requests, warmup, 0, scratch)
                result = LatencyResult([], [])
                blocks = max(1, math.ceil(calls / block))
                for b in range(blocks):
                    order = [(agent_call, result.agent), (echo_call, result.echo)]
                    if b % 2:
                        order.reverse()  # ABBA: neither side always runs first
                    for call, out in order:
                        run_block(call, requests, block, b * block, out)
            finally:
                echo_channel.close()
        finally:
            agent_channel.close()
            if echo is not None:
                stop_process(echo)
    return result


# --------------------------------------------------------------------------- (b) start-up

def measure_startup(kubelet: KubeletEmulator, tmp: Path, runs: int) -> tuple[list[float], list[float]]:
    agent_s: list[float] = []
    floor_s: list[float] = []
    log_path = tmp / "agent-startup.log"
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", FLOOR_CODE], cwd=ROOT, check=True, stdin=subprocess.DEVNULL)
        floor_s.append(time.perf_counter() - started)

        before = kubelet.registrations(RESOURCE)
        seen: list[float] = []

        def registered(before: int = before, seen: list[float] = seen) -> bool:
            if kubelet.registrations(RESOURCE) > before:
                seen.append(time.perf_counter())
                return True
            return False

        with log_path.open("ab") as log_file:
            started = time.perf_counter()
            proc = subprocess.Popen(agent_command(kubelet), cwd=ROOT, stdin=subprocess.DEVNULL,
                                    stdout=log_file, stderr=log_file)
        try:
            kubelet.wait_for(registered, 30.0)
        except TimeoutError:
            raise BenchError(f"the agent never registered {RESOURCE} (log: {log_path})") from None
        finally:
            stop_process(proc)
        agent_s.append(seen[0] - started)
    return agent_s, floor_s


# --------------------------------------------------------------------------- (c) re-registration

def measure_reregister(kubelet: KubeletEmulator, tmp: Path, restarts: int, down_for: float) -> list[float]:
    out: list[float] = []
    with running_agent(kubelet, tmp / "agent-restart.log"):
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
    return out


# --------------------------------------------------------------------------- report

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--calls", type=int, default=4000, help="timed Allocate calls per side (default 4000)")
    parser.add_argument("--block", type=int, default=250, help="calls per interleaved block (default 250)")
    parser.add_argument("--warmup", type=int, default=300, help="untimed calls per side first (default 300)")
    parser.add_argument("--startups", type=int, default=5, help="agent start-ups timed (default 5)")
    parser.add_argument("--restarts", type=int, default=12, help="kubelet restarts timed (default 12)")
    parser.add_argument("--down-for", type=float, default=0.5, help="seconds kubelet stays down (default 0.5)")
    parser.add_argument("--serve-echo", nargs=2, metavar=("SOCKET", "RESPONSES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_echo:
        return serve_echo(Path(args.serve_echo[0]), Path(args.serve_echo[1]))
    if args.quick:
        args.calls, args.block, args.warmup, args.startups, args.restarts = 400, 100, 50, 1, 2

    quiet_emulator()
    tmp = Path(tempfile.mkdtemp(prefix="bal-", dir="/tmp"))  # short: Unix socket paths < 108 bytes
    kubelet = KubeletEmulator(tmp / "k")
    try:
        kubelet.start()
        latency = measure_allocate(kubelet, tmp, args.calls, args.block, args.warmup)
        rereg = measure_reregister(kubelet, tmp, args.restarts, args.down_for)
        startup, floor = measure_startup(kubelet, tmp, args.startups)
    except BenchError as exc:
        print(f"bench_allocate: BROKEN: {exc}")
        return 1
    finally:
        kubelet.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"Allocate / start-up / re-registration benchmark: agent as a subprocess "
          f"(--topology-file embedded:{TOPOLOGY}, resource {RESOURCE}) against the in-process kubelet "
          f"emulator; {os.cpu_count()} CPUs")
    a50, a99 = percentile(latency.agent, 50), percentile(latency.agent, 99)
    e50, e99 = percentile(latency.echo, 50), percentile(latency.echo, 99)
    print(f"  (a) Allocate round trip, {len(latency.agent)} calls per side in ABBA blocks of {args.block} "
          f"after {args.warmup} warm-up calls; answers checked against plan_allocation: ok")
    for name, p50, p99, values in (("agent", a50, a99, latency.agent), ("bare echo", e50, e99, latency.echo)):
        print(f"      {name:<10}  p50 {p50 * 1e6:7.0f} us   p99 {p99 * 1e6:7.0f} us   max {max(values) * 1e6:7.0f} us")
    ratio50 = a50 / e50
    print(f"      ratio agent/echo: p50 {ratio50:.2f} (target <= {TARGET_P50_RATIO}: "
          f"{'met' if ratio50 <= TARGET_P50_RATIO else 'NOT met'})   p99 {a99 / e99:.2f}")
    s_med, f_med = statistics.median(startup), statistics.median(floor)
    print(f"  (b) spawn to registered, median of {len(startup)}: {s_med:.3f} s (min {min(startup):.3f}, "
          f"max {max(startup):.3f}) (target <= {TARGET_STARTUP_S} s: "
          f"{'met' if s_med <= TARGET_STARTUP_S else 'NOT met'})")
    print(f"      floor (spawn python, import grpc + stubs, exit), median: {f_med:.3f} s; "
          f"agent - floor: {s_med - f_med:.3f} s; ratio {s_med / f_med:.2f}")
    r_med = statistics.median(rereg)
    print(f"  (c) kubelet.sock back -> re-registered, median of {len(rereg)} restarts (down {args.down_for} s): "
          f"{r_med * 1000:.0f} ms (min {min(rereg) * 1000:.0f}, max {max(rereg) * 1000:.0f}) "
          f"(target <= {TARGET_REREGISTER_S * 1000:.0f} ms: {'met' if r_med <= TARGET_REREGISTER_S else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
