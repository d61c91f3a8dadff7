"""Faults, measured: the agent with production defaults (``bench/lib/production.py``) on the 400-CPU
``z16-400`` tree, against the kubelet emulator, under five loads a node can put on it.

* **A stderr nobody reads**: ``serve --log-level debug`` (a log line per Allocate) with its stderr a
  pipe the bench never drains, four clients calling Allocate for 60 s (``--quick``: 8 s). The pipe
  fills after a few hundred lines; from then on every record waits in the agent's bounded queue or is
  dropped. Reported: RSS growth from the full pipe to the end (target <= 16 MiB: the queue holds 4096
  records) and the Allocate p50 against the same load on an agent whose stderr goes to a file, run
  just before (target: ratio <= 1.3, and no call near its 5 s deadline).
* **100 ListAndWatch streams**: Allocate round trips (one client) in ABBA blocks with and without
  100 more streams opened on the resource (the agent keeps 4 and ends the oldest that is not
  kubelet's). Target: p50 ratio <= 1.3.
* **60 bursts of kubelet restarts**: three restarts within milliseconds, 60 times; each time from
  the last ``kubelet.sock`` reappearing to the agent registered again with its devices. Target: every
  one < 1 s.
* **100 mixed pods back to back**: ``--levels book,socket``, rounds of 20 pods (6 one-book,
  14 one-socket, in a seeded order that fits the node's 16 books) admitted through the emulated
  kubelet one right after the other, then all deleted and the node waited free. Kubelet's view of
  the blocked devices lags behind each admission; the agent's preference must not offer what its
  Allocate refuses. Target: 0 admission failures.
* **2,000 idle HTTP connections**: ``/healthz`` latency with 2,000 connections opened and left idle
  (the agent keeps at most 512, closing the longest-idle) against the same with none, before and
  after. Target: every ``/healthz`` within kubelet's default probe timeout, 1 s.

Reports only; exits 1 when the agent is broken (never registers, a wrong or failed Allocate).

    .venv/bin/python bench/node/faults.py [--quick]
"""

from __future__ import annotations

import contextlib
import http.client
import resource
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from agent.plugin.server import socket_name
from agent.topology.embedded import load_embedded
from bench.lib.common import (
    INFO,
    MISSED,
    BenchError,
    Row,
    at_most,
    bench_main,
    fmt_time,
    median,
    percentile,
    skipped,
    spread,
)
from bench.lib.production import Production
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import AdmissionError, Container, KubeletEmulator
from topology_devkit.sysfs_writer import write_sysfs_tree
from topology_devkit.testing.wait import wait_until

BENCH = "faults"
SHAPE = "z16-400"
BOOK = "topology/book"
DEADLINE = 5.0  # seconds, each Allocate
CLIENTS = 4
TARGET_GROWTH_MIB = 16.0
TARGET_RATIO = 1.3
TARGET_REREGISTER_S = 1.0
TARGET_HEALTHZ_S = 1.0  # kubelet's default probe timeoutSeconds
IDLE_CONNECTIONS = 2000
STREAMS = 100
SOCKET = "topology/socket"
ROUND_BOOKS, ROUND_SOCKETS = 6, 14  # one round's pods: 6 + 14 / 2 = 13 of the 16 books at most


def allocate_request(ids: list[str]) -> bytes:
    return api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=ids)]).SerializeToString()


def requests_for(books: list[str]) -> list[bytes]:
    """1- and 2-book requests over every book: the device sets kubelet would send."""
    ones = [[b] for b in books]
    twos = [[books[i], books[i + 1]] for i in range(0, len(books) - 1, 2)]
    return [allocate_request(ids) for ids in ones + twos]


@contextmanager
def raw_allocate(kubelet: KubeletEmulator) -> Iterator[Callable[[bytes], float]]:
    """A client that sends ready request bytes and returns each call's seconds (BenchError on failure)."""
    path = kubelet.device_plugin_dir / socket_name(BOOK)
    with grpc.insecure_channel(f"unix://{path}") as channel:
        call = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")

        def timed(request: bytes) -> float:
            started = time.perf_counter()
            try:
                answer = call(request, timeout=DEADLINE)
            except grpc.RpcError as exc:
                raise BenchError(f"Allocate failed: {exc.code()} {exc.details()}") from None
            took = time.perf_counter() - started
            if b"TOPOLOGY_CPUS" not in answer:
                raise BenchError("an Allocate answer without TOPOLOGY_CPUS")
            return took

        yield timed


def start(prod: Production, kubelet: KubeletEmulator, tree: Path, workdir: Path, *extra: str,
          stderr_pipe: bool = False) -> AgentProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    agent = AgentProcess(kubelet, workdir, *prod.args(tree), *extra, topology=None, entry=prod.entry(),
                         env=prod.env(), cwd=workdir, rescan_interval=None, metrics_address=None,
                         stderr_pipe=stderr_pipe)
    try:
        kubelet.wait_registered(BOOK, 30)
    except TimeoutError:
        agent.kill()
        raise BenchError(f"the agent never registered {BOOK}") from None
    return agent


def metric(port: int, name: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def load(call: Callable[[bytes], float], requests: list[bytes], seconds: float,
         on_tick: Callable[[], None] | None = None) -> list[float]:
    """CLIENTS threads calling Allocate for ``seconds``; ``on_tick`` runs about every 0.5 s meanwhile."""
    times: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    until = time.monotonic() + seconds

    def client(offset: int) -> None:
        mine, i = [], offset
        try:
            while time.monotonic() < until:
                mine.append(call(requests[i % len(requests)]))
                i += 1
        except BaseException as exc:  # carried to the bench thread
            errors.append(exc)
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=client, args=(c * 7,), daemon=True) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if on_tick is not None:
            on_tick()
        for t in threads:
            t.join(0.5 / CLIENTS)
    if errors:
        raise errors[0] if isinstance(errors[0], BenchError) else BenchError(f"a client failed: {errors[0]!r}")
    return times


# --------------------------------------------------------------------------- the four faults

def blocked_stderr(prod: Production, tree: Path, tmp: Path, seconds: float) -> list[Row]:
    """Two agents side by side, one logging to a drained file, one to a pipe nobody reads; the drained
    one is measured before and after the blocked one (A B A), half the blocked window each side."""
    baseline_s = min(seconds, 20.0) / 2
    with KubeletEmulator(tmp / "k1") as k1, KubeletEmulator(tmp / "k2") as k2:
        drained_agent = start(prod, k1, tree, tmp / "a1", "--log-level", "debug")
        agent = start(prod, k2, tree, tmp / "a2", "--log-level", "debug", stderr_pipe=True)
        peak = [0]

        def sample() -> None:
            peak[0] = max(peak[0], agent.rss_kib())

        try:
            with raw_allocate(k1) as drained_call, raw_allocate(k2) as call:
                drained_requests = requests_for(sorted(k1.devices(BOOK)))
                requests = requests_for(sorted(k2.devices(BOOK)))
                load(drained_call, drained_requests, 2.0)  # warm: every answer cached
                load(call, requests, 2.0)  # fills the 64 KiB pipe many times over
                drained = load(drained_call, drained_requests, baseline_s)
                before = agent.rss_kib()
                blocked = load(call, requests, seconds, on_tick=sample)
                after = agent.rss_kib()
                drained += load(drained_call, drained_requests, baseline_s)
            dropped = metric(agent.metrics_port, "topology_agent_log_records_dropped_total")
            alive = agent.proc.poll() is None
        finally:
            agent.kill()
            drained_agent.stop()
    if not alive:
        raise BenchError("the agent died with its stderr blocked")
    growth = (max(after, peak[0]) - before) / 1024
    ratio = median(blocked) / median(drained)
    worst = max(blocked)
    return [
        Row(BENCH, f"RSS growth, stderr blocked, {seconds:.0f} s of Allocates at debug",
            f"{growth:.1f} MiB ({before / 1024:.1f} -> peak {max(after, peak[0]) / 1024:.1f} MiB); "
            f"{len(blocked)} calls, {dropped:.0f} log records dropped", growth,
            f"<= {TARGET_GROWTH_MIB:.0f} MiB", at_most(growth, TARGET_GROWTH_MIB),
            raw={"before_kib": before, "after_kib": after, "peak_kib": peak[0], "calls": len(blocked),
                 "dropped": dropped}),
        Row(BENCH, f"Allocate p50, stderr blocked vs drained ({CLIENTS} clients)",
            f"{fmt_time(median(blocked))} vs {fmt_time(median(drained))}: ratio {ratio:.2f}; p99 "
            f"{fmt_time(percentile(blocked, 99))} vs {fmt_time(percentile(drained, 99))}; slowest "
            f"{fmt_time(worst)} (deadline {DEADLINE:.0f} s)",
            ratio, f"p50 ratio <= {TARGET_RATIO}", at_most(ratio, TARGET_RATIO) if worst < DEADLINE / 2 else MISSED,
            raw={"blocked_s": sorted(blocked)[:: max(1, len(blocked) // 200)], "drained_p50": median(drained)}),
    ]


def open_streams(kubelet: KubeletEmulator, n: int) -> tuple[grpc.Channel, list[object]]:
    path = kubelet.device_plugin_dir / socket_name(BOOK)
    channel = grpc.insecure_channel(f"unix://{path}")
    stub = api_pb2_grpc.DevicePluginStub(channel)
    streams = [stub.ListAndWatch(api_pb2.Empty()) for _ in range(n)]
    for stream in streams:  # each one was served: its first list came, or the agent ended it
        with contextlib.suppress(grpc.RpcError):
            next(stream)
    return channel, streams


def many_streams(prod: Production, tree: Path, tmp: Path, quick: bool) -> list[Row]:
    blocks, per_block = (4, 150) if quick else (8, 400)
    sides: dict[bool, list[float]] = {False: [], True: []}
    ratios: list[float] = []
    with KubeletEmulator(tmp / "k3") as kubelet:
        agent = start(prod, kubelet, tree, tmp)
        try:
            requests = requests_for(sorted(kubelet.devices(BOOK)))
            with raw_allocate(kubelet) as call:
                for r in requests * 20:
                    call(r)
                for b in range(blocks):
                    block: dict[bool, list[float]] = {}
                    for with_streams in ((False, True) if b % 2 == 0 else (True, False)):
                        opened = open_streams(kubelet, STREAMS) if with_streams else None
                        try:
                            block[with_streams] = [call(requests[i % len(requests)]) for i in range(per_block)]
                        finally:
                            if opened is not None:
                                for stream in opened[1]:
                                    stream.cancel()  # type: ignore[attr-defined]
                                opened[0].close()
                        sides[with_streams] += block[with_streams]
                    ratios.append(median(block[True]) / median(block[False]))
            if kubelet.registrations(BOOK) != 1:
                raise BenchError("the agent registered again: kubelet's stream was ended")
            kept = metric(agent.metrics_port, "topology_agent_list_and_watch_streams")
        finally:
            agent.stop()
    ratio = median(sides[True]) / median(sides[False])
    return [Row(BENCH, f"Allocate p50 with {STREAMS} ListAndWatch streams opened vs none",
                f"{fmt_time(median(sides[True]))} vs {fmt_time(median(sides[False]))}: ratio {ratio:.2f} "
                f"(blocks min/median/max {spread(ratios)}); p99 {fmt_time(percentile(sides[True], 99))} vs "
                f"{fmt_time(percentile(sides[False], 99))}; streams open afterwards {kept:.0f}",
                ratio, f"p50 ratio <= {TARGET_RATIO}", at_most(ratio, TARGET_RATIO),
                raw={"block_ratios": ratios})]


def restart_bursts(prod: Production, tree: Path, tmp: Path, bursts: int) -> list[Row]:
    took: list[float] = []
    with KubeletEmulator(tmp / "k4") as kubelet:
        agent = start(prod, kubelet, tree, tmp)
        try:
            for _ in range(bursts):
                before = kubelet.registrations(BOOK)
                for _ in range(3):
                    kubelet.restart()
                back = time.monotonic()
                try:
                    wait_until("re-registration",
                               lambda b=before: kubelet.registrations(BOOK) > b  # type: ignore[misc]
                               and kubelet.allocatable(BOOK) > 0, 15, every=0.001)
                except (AssertionError, TimeoutError) as exc:
                    raise BenchError(f"no re-registration within 15 s of a burst: {exc}") from None
                took.append(time.monotonic() - back)
            alive = agent.proc.poll() is None
        finally:
            agent.stop()
    if not alive:
        raise BenchError("the agent died during the restart bursts")
    worst = max(took)
    return [Row(BENCH, f"re-registration after each of {bursts} bursts of 3 kubelet restarts",
                f"slowest {fmt_time(worst)}, median {fmt_time(median(took))}, p90 {fmt_time(percentile(took, 90))}",
                worst, f"every one < {TARGET_REREGISTER_S:.0f} s", at_most(worst, TARGET_REREGISTER_S),
                raw={"seconds": took})]


def healthz(port: int, n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            body = response.read()
        except OSError as exc:
            raise BenchError(f"/healthz failed: {exc}") from None
        finally:
            conn.close()
        if response.status != 200 or body != b"ok\n":
            raise BenchError(f"/healthz answered {response.status} {body!r}")
        times.append(time.perf_counter() - started)
    return times


def idle_connections(prod: Production, tree: Path, tmp: Path, quick: bool) -> list[Row]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IDLE_CONNECTIONS + 512
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < wanted:
        return [skipped(BENCH, f"/healthz during {IDLE_CONNECTIONS} idle connections",
                        f"every one <= {TARGET_HEALTHZ_S:.0f} s", f"descriptor limit {hard} < {wanted}")]
    probes = 20 if quick else 50
    with KubeletEmulator(tmp / "k5") as kubelet:
        agent = start(prod, kubelet, tree, tmp)
        port = agent.metrics_port
        try:
            quiet = healthz(port, probes)
            idle: list[socket.socket] = []
            try:
                opened = time.monotonic()
                for _ in range(IDLE_CONNECTIONS):
                    idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                opening = time.monotonic() - opened
                crowded = healthz(port, probes)
                threads = agent.threads()
            finally:
                for s in idle:
                    s.close()
            quiet += healthz(port, probes)
            if kubelet.registrations(BOOK) != 1 or agent.proc.poll() is not None:
                raise BenchError("the agent restarted or re-registered under idle connections")
        finally:
            agent.stop()
    worst = max(crowded)
    ratio = median(crowded) / median(quiet)
    return [Row(BENCH, f"/healthz during {IDLE_CONNECTIONS} idle connections",
                f"slowest {fmt_time(worst)}, p50 {fmt_time(median(crowded))} vs {fmt_time(median(quiet))} with none "
                f"(ratio {ratio:.2f}); {IDLE_CONNECTIONS} opened in {opening:.1f} s; agent threads {threads}",
                worst, f"every one <= {TARGET_HEALTHZ_S:.0f} s", at_most(worst, TARGET_HEALTHZ_S),
                raw={"crowded": crowded, "quiet": quiet})]


def mixed_admissions(prod: Production, tree: Path, tmp: Path, rounds: int) -> list[Row]:
    """Book and socket pods admitted back to back; every admission failure counted with its reason."""
    import random

    failures: list[str] = []
    admitted = 0
    with KubeletEmulator(tmp / "k5") as kubelet:
        agent = start(prod, kubelet, tree, tmp / "a5", "--levels", "book,socket")
        try:
            kubelet.wait_registered(SOCKET, 30)
            order = random.Random(20)
            for r in range(rounds):
                kinds = [BOOK] * ROUND_BOOKS + [SOCKET] * ROUND_SOCKETS
                order.shuffle(kinds)
                for n, resource in enumerate(kinds):
                    try:
                        kubelet.admit_pod("bench", f"r{r}-p{n}", [Container("c", {resource: 1})])
                        admitted += 1
                    except AdmissionError as exc:
                        failures.append(f"{resource}: {exc}")
                for pod in kubelet.pods():
                    kubelet.delete_pod(pod.namespace, pod.name)
                kubelet.wait_for(lambda: not kubelet.unhealthy_devices(BOOK) and not kubelet.unhealthy_devices(SOCKET),
                                 timeout=60, what="the node free again")
        except TimeoutError as exc:
            raise BenchError(f"mixed admissions: {exc}") from None
        finally:
            agent.stop()
    total = rounds * (ROUND_BOOKS + ROUND_SOCKETS)
    return [Row(BENCH, f"admission failures, {total} mixed book/socket pods back to back",
                f"{len(failures)} of {total} failed ({admitted} admitted; {rounds} rounds of {ROUND_BOOKS} book and "
                f"{ROUND_SOCKETS} socket pods){': ' + failures[0][:120] if failures else ''}",
                len(failures), "0", at_most(len(failures), 0), raw={"failures": failures, "admitted": admitted})]


def run(quick: bool) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="bfa-", dir="/tmp"))  # short: Unix socket paths < 108 bytes
    rows: list[Row] = []
    try:
        tree = tmp / "root"
        write_sysfs_tree(load_embedded(SHAPE), tree)
        with Production(tmp) as prod:
            rows += blocked_stderr(prod, tree, tmp, 8.0 if quick else 60.0)
            rows += many_streams(prod, tree, tmp, quick)
            rows += restart_bursts(prod, tree, tmp, 10 if quick else 60)
            rows += idle_connections(prod, tree, tmp, quick)
            rows += mixed_admissions(prod, tree, tmp, 1 if quick else 5)
            rows.append(Row(BENCH, "set-up", f"{SHAPE}, {prod.install.how}", None, "", INFO, prod.labels_note))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    return bench_main(BENCH, run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
