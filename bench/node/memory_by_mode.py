"""Memory by mode: the running agent's RSS in device-plugin mode and in DRA mode, side by side.

DRA mode used to reach the API server through the ``kubernetes`` package (its API models, urllib3, pydantic and
the rest: about 45 MiB more than device-plugin mode); it now speaks through the agent's own client
(``agent/node/kubeapi.py``), as the node labels always did. The goal is device-plugin mode's figure.

Two agents start side by side as the chart runs them (``bench/lib/production.py``: the image-like install, node labels
over TLS to a fake API server in a private mount namespace, metrics on with kubelet's probes) on the ``z16-400``
host-root tree, each with its own kubelet emulator and API server: one in device-plugin mode (waited for until
registered), one with ``--mode dra`` (waited for until its ResourceSlices are published to its API server; its
kubelet plugin serves, no kubelet takes the registration). After ``SETTLE`` seconds, ``VmRSS`` of each.
Target: DRA mode at most 5 MiB above device-plugin mode. ``--quick`` settles 10 s instead of 60 s.

    .venv/bin/python bench/node/memory_by_mode.py [--quick]
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.topology.embedded import load_embedded
from bench.lib.common import INFO, BenchError, Row, at_most, bench_main
from bench.lib.production import SLICES, NodeApiServer, Prober, Production
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.sysfs_writer import write_sysfs_tree
from topology_devkit.testing.wait import wait_until

BENCH = "memory_by_mode"
SHAPE = "z16-400"
RESOURCE = "topology/book"
SETTLE = 60.0  # seconds after the agent is up (registered, or its slices published) before RSS is read
QUICK_SETTLE = 10.0
TARGET_EXTRA_MIB = 5.0  # DRA mode over device-plugin mode


def published(api: NodeApiServer | None) -> bool:
    return api is not None and len(api.slices) > 0


def run(quick: bool) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="bmo-", dir="/tmp"))  # short: Unix socket paths < 108 bytes
    try:
        tree = tmp / "root"
        write_sysfs_tree(load_embedded(SHAPE), tree)
        with contextlib.ExitStack() as stack:
            agents = {}
            for mode in ("deviceplugin", "dra"):
                work = tmp / mode
                work.mkdir()
                prod = stack.enter_context(Production(work))
                if prod.api is None:
                    raise BenchError(f"no API server for the agents: {prod.labels_note}")
                kubelet = stack.enter_context(KubeletEmulator(work / "k"))
                extra = [] if mode == "deviceplugin" else [
                    "--mode", "dra", "--dra-registry-dir", str(work / "registry"), "--cdi-dir", str(work / "cdi"),
                    "--dra-plugin-dir", str(work / "plugins" / "topology.s390x.ibm.com")]
                agent = prod.agent(kubelet, tree, *extra)
                stack.callback(agent.stop)
                agents[mode] = (prod, kubelet, agent)
            spawned = time.monotonic()
            up: dict[str, float] = {}
            for mode, (prod, kubelet, agent) in agents.items():
                try:
                    if mode == "deviceplugin":
                        kubelet.wait_registered(RESOURCE, 60)
                    else:
                        wait_until("the DRA agent's ResourceSlices", functools.partial(published, prod.api), 60)
                except TimeoutError:
                    said = [str(e.get("msg", "")) for e in agent.log() if e.get("level") in ("warning", "error")]
                    raise BenchError(f"the {mode} agent did not come up: {' | '.join(said[-2:])[-600:]}") from None
                up[mode] = time.monotonic() - spawned
                stack.callback(Prober(agent.metrics_port).stop)
            time.sleep(QUICK_SETTLE if quick else SETTLE)
            rss = {mode: agent.rss_kib() / 1024 for mode, (_, _, agent) in agents.items()}
            hwm = {mode: agent.status_kib("VmHWM") / 1024 for mode, (_, _, agent) in agents.items()}
            dra_api = agents["dra"][0].api
            assert dra_api is not None
            slices = len(dra_api.slices)
            lists = sum(1 for r in dra_api.requests if r.method == "GET" and r.path.startswith(SLICES))
            install = agents["dra"][0].install.how
            for mode, (_, _, agent) in agents.items():
                if agent.proc.poll() is not None:
                    raise BenchError(f"the {mode} agent exited (log: {agent.log_path})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    settle = QUICK_SETTLE if quick else SETTLE
    limit = rss["deviceplugin"] + TARGET_EXTRA_MIB
    return [
        Row(BENCH, "RSS, device-plugin mode", f"{rss['deviceplugin']:.1f} MiB (VmHWM {hwm['deviceplugin']:.1f} MiB)",
            rss["deviceplugin"], "", INFO),
        Row(BENCH, "RSS, DRA mode, vs device-plugin mode",
            f"{rss['dra']:.1f} MiB (VmHWM {hwm['dra']:.1f} MiB): {rss['dra'] - rss['deviceplugin']:+.1f} MiB; "
            f"{slices} ResourceSlices published, {lists} Lists", rss["dra"],
            f"<= device-plugin + {TARGET_EXTRA_MIB:.0f} MiB", at_most(rss["dra"], limit)),
        Row(BENCH, "set-up", f"{SHAPE}, RSS {settle:.0f} s after each was up (device plugin registered "
            f"{up['deviceplugin']:.1f} s, DRA slices published {up['dra']:.1f} s after the spawn)", None, "", INFO,
            install),
    ]


def main(argv: list[str] | None = None) -> int:
    return bench_main(BENCH, run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
