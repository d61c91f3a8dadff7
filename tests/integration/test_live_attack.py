"""Bad input at every door at once, against the running ``serve`` process: a runtime on the NRI socket that sends
garbage, then valid frames; a flood of Allocate calls with ids never offered; the holds file truncated again and
again while the agent writes it. Afterwards the agent still serves (Allocate, NRI creations), no held book is lost
(across a restart with pod-resources away, from the saved holds alone), and the metrics count what happened."""

from __future__ import annotations

import json
import random
import struct
import threading
import traceback
from pathlib import Path

import grpc

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.nri import wire
from agent.nri.wire import mux_frames, ttrpc_message
from tests.support.env import BOOK
from tests.support.harness import short_tmpdir
from tests.support.nri_runtime import FakeRuntime
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import Container, KubeletEmulator
from topology_devkit.testing.wait import wait_until

DOMAIN = "topology.s390x.ibm.com"
FLOOD = 400


def serve(k: KubeletEmulator, root: Path, runtime: FakeRuntime, **kw: object) -> AgentProcess:
    return AgentProcess(k, root, "--levels", "book", "--cpuset-enforcement", "nri", "--nri-socket",
                        str(runtime.path), "--cri-socket", str(root / "no-cri.sock"), **kw)  # type: ignore[arg-type]


def nri_attack(runtime: FakeRuntime) -> None:
    """Garbage the trunk can refuse on its stream, then garbage that breaks the framing, then a valid runtime."""
    runtime.accept(timeout=20)
    runtime.serve_register()
    assert runtime.conn is not None
    runtime.conn.sendall(mux_frames(wire.PLUGIN_CONN, ttrpc_message(1, wire.REQUEST, b"\x0a\xff\xff")))
    answer = runtime._next(wire.PLUGIN_CONN)  # an envelope that is no Request: refused on its stream, trunk kept
    assert answer.stream == 1 and wire.Response.decode(answer.data).code == wire.INVALID_ARGUMENT
    runtime.stream = 3
    assert runtime.call("NoSuchMethod", b"\x01\x02").code == wire.UNIMPLEMENTED
    assert runtime.call("CreateContainer", b"\xff" * 40).code == wire.INVALID_ARGUMENT
    assert runtime.call("Configure", nri.ConfigureRequest(runtime_name="hostile").SerializeToString()).code == wire.OK
    runtime.conn.sendall(random.Random(7).randbytes(3000) + struct.pack(">II", wire.PLUGIN_CONN, 1 << 30))
    runtime.drop()  # the plugin closed the trunk on the broken framing, or is about to: it dials again
    runtime.handshake()  # a valid runtime: register, configure, synchronize


def test_the_agent_survives_a_live_attack_and_counts_it() -> None:
    root = short_tmpdir()
    runtime = FakeRuntime(root / "nri.sock")
    try:
        with KubeletEmulator(root) as k:
            def holds() -> Path:
                return k.device_plugin_dir / "s390x-topology-agent" / "topology" / "holds.json"

            agent = serve(k, root, runtime)
            try:
                k.wait_registered(BOOK, timeout=30)
                pod = k.admit_pod("ns", "llm", [Container("main", {BOOK: 1})])
                book = pod.devices("main", BOOK)[0]
                wait_until("the hold saved", lambda: holds().exists() and book in holds().read_text(), 10)

                failures: list[BaseException] = []

                def attack() -> None:
                    try:
                        nri_attack(runtime)
                    except BaseException as exc:  # the test thread says it
                        failures.append(exc)

                attacker = threading.Thread(target=attack)
                attacker.start()
                refused = []

                def flood(n: int) -> None:
                    for i in range(n):
                        try:
                            agent.allocate(BOOK, [f"never-offered-{i}", book, book])
                        except grpc.RpcError as exc:
                            refused.append(exc.code())

                floods = [threading.Thread(target=flood, args=(FLOOD // 4,)) for _ in range(4)]
                for t in floods:
                    t.start()
                stop = threading.Event()

                def truncate() -> None:  # the holds file cut short, over and over, while the agent rewrites it
                    rng = random.Random(3)
                    while not stop.is_set():
                        path = holds()
                        try:
                            with open(path, "r+b") as f:
                                f.truncate(rng.randrange(0, 40))
                        except OSError:
                            pass
                        stop.wait(0.005)

                cutter = threading.Thread(target=truncate)
                cutter.start()
                for n in range(6):  # holds change hands meanwhile: each change is a write
                    other = k.admit_pod("ns", f"churn-{n}", [Container("main", {BOOK: 1})])
                    assert other.devices("main", BOOK)[0] != book
                    k.delete_pod("ns", other.name)
                for t in floods:
                    t.join(60)
                attacker.join(60)
                stop.set()
                cutter.join(10)

                assert failures == [], "".join(traceback.format_exception(failures[0])[-2:]) + "\n".join(
                    line for line in agent.log_path.read_text().splitlines() if "NRI" in line)
                assert refused == [grpc.StatusCode.INVALID_ARGUMENT] * FLOOD
                assert agent.metric("topology_agent_rpc_calls_total", method="Allocate", resource=BOOK,
                                    code="INVALID_ARGUMENT") == FLOOD
                assert runtime.registered and len(runtime.registered) >= 2  # dialed again after the broken framing
                wait_until("NRI registered again", lambda: "registered with fake" in agent.get("/readyz")[1], 10)
                with open(holds(), "r+b") as f:  # cut short once more, after the agent's last write
                    f.truncate(5)
                wait_until("the holds file put back whole, with the held book", lambda: book in _holds(holds()), 15)
                created = runtime.call("CreateContainer", nri.CreateContainerRequest(
                    pod=nri.PodSandbox(id="p1", name="llm", namespace="ns", uid="u1"),
                    container=nri.Container(id="c1", pod_sandbox_id="p1", name="main",
                                            annotations={f"{DOMAIN}/groups": book, f"{DOMAIN}/resource": BOOK}),
                ).SerializeToString())
                assert created.code == wire.OK  # the NRI hooks still answer
                assert agent.allocate(BOOK, [book]).container_responses  # and Allocate still serves
                assert agent.stop() == 0
            finally:
                agent.stop()
            # No held book lost: a new agent with pod-resources away has the saved holds alone.
            again = serve(k, root, runtime, pod_resources=root / "no-pod-resources.sock")
            try:
                k.wait_registered(BOOK, timeout=30)
                k.wait_for(lambda: book not in k.healthy_devices(BOOK) or book in _blocked(again),
                           timeout=15, what="the held book kept")
                other = k.admit_pod("ns", "after", [Container("main", {BOOK: 1})])
                assert other.devices("main", BOOK)[0] != book
            finally:
                again.stop()
    finally:
        runtime.close()


def _holds(path: Path) -> str:
    """The saved holds as text ("" while the file is not whole JSON)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    return json.dumps(doc["holds"]) if isinstance(doc, dict) and "holds" in doc else ""


def _blocked(agent: AgentProcess) -> str:
    status, text = agent.get("/allocations")
    return text if status == 200 else ""
