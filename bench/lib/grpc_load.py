"""Two small processes for the gRPC benches. The echo imports nothing but grpc (so any interpreter with grpcio
runs it, the image-like install's included):

* ``echo SOCKET TABLE WORKERS``: a bare sync ``grpc.server`` (a ``ThreadPoolExecutor`` of WORKERS threads, a
  Unix socket, ``grpc.so_reuseport`` 0, as the agent's plugin server) whose generic handler answers
  ``/v1beta1.DevicePlugin/Allocate`` with the bytes TABLE (a pickled dict: request bytes -> response bytes)
  holds for the request. It prints ``ready`` and serves until SIGTERM.
* ``drive SPEC OUT``: the load client. SPEC (a pickled dict of :class:`DriveSpec`'s fields) names two
  targets (A, B), or one (A alone), and the calls; blocks of calls alternate A B B A A B ...; within a
  block, ``concurrency`` asyncio tasks share one ``grpc.aio`` channel per target (kubelet keeps one
  connection per plugin) and take the block's requests in turn, each task timing its own calls. (The
  asyncio client costs the 2-core machine 80-200 us of CPU per call, a thread per client 190-350 us: the
  cheaper the client, the less it dilutes the servers' difference.) After each block (not timed) every
  answer is
  compared with the expected one: as messages (``AllocateResponse``, from the generated stubs: map fields
  serialize in no fixed order), or as bytes. OUT gets a pickled dict of :class:`DriveResult`'s fields.

A closed loop: each task sends its next call when the previous one returned, so with C tasks there are C
calls in flight.
"""

from __future__ import annotations

import asyncio
import pickle
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent import futures
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ALLOCATE = "/v1beta1.DevicePlugin/Allocate"
PREFERRED = "/v1beta1.DevicePlugin/GetPreferredAllocation"


@dataclass
class DriveSpec:
    targets: tuple[str, ...]  # grpc targets of side A and side B, e.g. unix:///path (side A alone: one target)
    warmup: list[bytes]  # requests sent to each side first, untimed (the same list to both)
    blocks: list[list[bytes]]  # per block the requests, sent to both sides in that block
    expected: dict[bytes, bytes]  # request -> the answer both sides must give
    concurrency: int
    method: str = ALLOCATE
    timeout: float = 30.0
    compare: str = "allocate"  # "allocate": parse both as AllocateResponse; "bytes": the bytes; "none": no check
    # request -> a GetPreferredAllocation request the same task sends first, untimed (kubelet asks for a
    # preference before it allocates; the echo answers it with an empty response)
    before: dict[bytes, bytes] = field(default_factory=dict)


@dataclass
class DriveResult:
    latencies: tuple[list[list[float]], list[list[float]]]  # per side, per block, seconds
    wrong: tuple[int, int] = (0, 0)  # answers that differed from the expected bytes, per side
    example: tuple[bytes, bytes, bytes] | None = None  # (request, got, expected) of a wrong answer, side A


def serve_echo(socket: str, table_file: str, workers: int) -> int:
    import grpc

    with open(table_file, "rb") as f:
        table: dict[bytes, bytes] = pickle.load(f)

    def allocate(request: bytes, context: object) -> bytes:
        return table[request]

    def preferred(request: bytes, context: object) -> bytes:
        return b""  # an empty PreferredAllocationResponse

    handler = grpc.method_handlers_generic_handler(
        "v1beta1.DevicePlugin", {"Allocate": grpc.unary_unary_rpc_method_handler(allocate),
                                 "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(preferred)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="echo"),
                         options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    print("ready", flush=True)
    stop.wait()
    server.stop(None).wait(2)
    return 0


Same = Callable[[bytes, bytes], bool]


def _same(compare: str) -> Same:
    if compare == "none":
        return lambda a, b: True
    if compare == "bytes":
        return lambda a, b: a == b
    from agent._proto.deviceplugin.v1beta1 import api_pb2

    parse = api_pb2.AllocateResponse.FromString
    return lambda a, b: a == b or parse(a) == parse(b)


async def _run_block(call: Callable[[bytes], Awaitable[bytes]], requests: Sequence[bytes], concurrency: int,
                     before: Callable[[bytes], Awaitable[bytes]] | None = None,
                     before_requests: dict[bytes, bytes] | None = None
                     ) -> tuple[list[float], list[tuple[bytes, bytes]]]:
    """Every request once, ``concurrency`` in flight; (latencies, (request, answer) pairs). A request
    with a ``before_requests`` entry is preceded by that call to ``before`` (untimed)."""
    work = iter(requests)
    latencies: list[float] = []
    answers: list[tuple[bytes, bytes]] = []
    clock = time.perf_counter

    async def worker() -> None:
        for request in work:  # the workers share the iterator: each call takes the next request
            if before is not None and before_requests and request in before_requests:
                await before(before_requests[request])
            started = clock()
            answer = await call(request)
            latencies.append(clock() - started)
            answers.append((request, answer))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, answers


async def _drive(spec: DriveSpec) -> DriveResult:
    import grpc

    channels = [grpc.aio.insecure_channel(t) for t in spec.targets]
    try:
        calls: list[Callable[[bytes], Awaitable[bytes]]] = []
        befores: list[Callable[[bytes], Awaitable[bytes]]] = []
        for channel in channels:
            for method, out in ((spec.method, calls), (PREFERRED, befores)):
                stub = channel.unary_unary(method)

                async def call(request: bytes, stub: Any = stub) -> bytes:
                    answer: bytes = await stub(request, timeout=spec.timeout)
                    return answer

                out.append(call)
        result = DriveResult(([], []))
        wrong = [0, 0]
        same = _same(spec.compare)

        def check(side: int, answers: list[tuple[bytes, bytes]]) -> None:
            bad = [(r, a) for r, a in answers if not same(a, spec.expected.get(r, b""))]
            wrong[side] += len(bad)
            if bad and side == 0 and result.example is None:
                result.example = (bad[0][0], bad[0][1], spec.expected.get(bad[0][0], b""))

        sides = range(len(calls))
        for side in sides:
            check(side, (await _run_block(calls[side], spec.warmup, spec.concurrency, befores[side], spec.before))[1])
        for b, requests in enumerate(spec.blocks):
            for side in [s for s in ((0, 1) if b % 2 == 0 else (1, 0)) if s in sides]:  # A B, B A, A B, ...
                latencies, answers = await _run_block(calls[side], requests, spec.concurrency, befores[side],
                                                      spec.before)
                result.latencies[side].append(latencies)
                check(side, answers)  # after the block: not timed
        result.wrong = (wrong[0], wrong[1])
        return result
    finally:
        for channel in channels:
            await channel.close()


def drive(spec: DriveSpec) -> DriveResult:
    return asyncio.run(_drive(spec))


def main(argv: Sequence[str]) -> int:
    if len(argv) == 4 and argv[0] == "echo":
        return serve_echo(argv[1], argv[2], int(argv[3]))
    if len(argv) == 3 and argv[0] == "drive":
        spec = DriveSpec(**pickle.loads(Path(argv[1]).read_bytes()))  # plain dicts on the wire
        Path(argv[2]).write_bytes(pickle.dumps(asdict(drive(spec))))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
