"""bench/cluster/simulated_nodes.py's pure parts (the bench itself runs KWOK on the real-cluster lane's control
plane): the layouts it publishes through the agent's builder, the phases' sizes, the scheduler's metrics and the
latency figures, the pods it creates, the table, the shared control plane's flags and KWOK's pin."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from bench.cluster import control_plane, simulated_nodes
from bench.cluster.simulated_nodes import (
    flat_plan,
    latency_figures,
    node_plan,
    parse_metrics,
    phase_sizes,
    pod_doc,
    scheduler_figures,
    table,
)

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "devkit" / "cluster"


def test_the_counters_layout_is_the_agents_pool_books_and_sockets_sharing_counters() -> None:
    plan = node_plan("sim-00001", "counters")
    levels = sorted(d["attributes"]["level"]["string"] for d in plan.devices)
    assert levels.count("book") == 8 and levels.count("socket") == 16
    assert all(d["consumesCounters"] for d in plan.devices)
    assert any("sharedCounters" in s.spec for s in plan.slices)
    assert {s.spec["nodeName"] for s in plan.slices} == {"sim-00001"}


def test_the_flat_layout_has_the_same_devices_and_no_counter_anywhere() -> None:
    counters, flat = node_plan("n1", "counters"), node_plan("n1", "flat")
    assert [d["name"] for d in flat.devices] == [d["name"] for d in counters.devices]
    assert all("consumesCounters" not in d for d in flat.devices)
    assert all("sharedCounters" not in s.spec for s in flat.slices)
    assert {s.spec["pool"]["resourceSliceCount"] for s in flat.slices} == {len(flat.slices)}
    assert flat.counters == {}
    assert all(d["consumesCounters"] for d in counters.devices)  # the agent's plan is left as it was


def test_flat_plan_keeps_the_slice_names_the_publisher_replaces_by() -> None:
    plan = node_plan("n2", "counters")
    assert {s.name for s in flat_plan(plan).slices} < {s.name for s in plan.slices}


def test_the_books_layouts_are_eight_books_with_their_sockets_counters_or_none() -> None:
    plan, flat = node_plan("n3", "books"), node_plan("n3", "books-flat")
    assert [d["attributes"]["level"]["string"] for d in plan.devices] == ["book"] * 8
    assert all(len(d["consumesCounters"][0]["counters"]) == 2 for d in plan.devices)
    assert [d["name"] for d in flat.devices] == [d["name"] for d in plan.devices]
    assert all("consumesCounters" not in d for d in flat.devices)


def test_the_device_plugin_variant_runs_last_the_others_as_asked() -> None:
    assert simulated_nodes.run_order(["deviceplugin", "extended", "flat"]) == ["extended", "flat", "deviceplugin"]
    assert simulated_nodes.run_order(["flat", "counters"]) == ["flat", "counters"]


def test_the_phases_take_the_books_to_half_then_to_ninety_percent() -> None:
    assert phase_sizes(1000) == (4000, 3200)
    assert phase_sizes(100) == (400, 320)
    assert phase_sizes(3, books_per_node=2) == (3, 2)


def _metrics(pre: float, filt: float, sampled: int, fit: float, scheduled: int, unschedulable: int,
             prebind: float) -> str:
    plugin = "scheduler_plugin_execution_duration_seconds"
    dra = 'plugin="DynamicResources",status="Success"'
    profile = 'profile="default-scheduler"'
    return "\n".join([
        "# HELP scheduler_plugin_execution_duration_seconds ...",
        f'{plugin}_sum{{extension_point="PreFilter",{dra}}} {pre}',
        f'{plugin}_sum{{extension_point="Filter",{dra}}} {filt}',
        f'{plugin}_count{{extension_point="PreFilter",{dra}}} {sampled}',
        f'{plugin}_sum{{extension_point="Filter",plugin="NodeResourcesFit",status="Success"}} {fit}',
        f'scheduler_schedule_attempts_total{{{profile},result="scheduled"}} {scheduled}',
        f'scheduler_schedule_attempts_total{{{profile},result="unschedulable"}} {unschedulable}',
        f'{plugin}_sum{{extension_point="PreBind",{dra}}} {prebind}',
        f'scheduler_framework_extension_point_duration_seconds_sum{{extension_point="Filter",{profile}}} {filt * 2}',
        f'scheduler_framework_extension_point_duration_seconds_count{{extension_point="Filter",{profile}}} {scheduled}',
    ])


METRICS_BEFORE = _metrics(1, 2, 10, 5, 100, 3, 4)
METRICS_AFTER = _metrics(1.5, 3.5, 110, 9, 1100, 53, 14)


def test_the_dra_plugins_computing_time_is_per_sampled_attempt_and_its_prebind_apart() -> None:
    got = scheduler_figures(parse_metrics(METRICS_BEFORE), parse_metrics(METRICS_AFTER))
    assert got["dra_ms_per_attempt"] == pytest.approx(1000 * (0.5 + 1.5) / 100)  # PreBind apart
    assert got["dra_filter_ms_per_attempt"] == pytest.approx(15.0)
    assert got["dra_prebind_ms_per_attempt"] == pytest.approx(100.0)
    assert got["attempts"] == 1050 and got["scheduled"] == 1000
    assert got["filter_ms"] == pytest.approx(1000 * 3 / 1000)  # every attempt: (7 - 4) s over 1000
    assert math.isnan(got["algorithm_ms"])  # not scraped: no figure


def test_no_sampled_attempt_gives_no_figure_rather_than_a_division_by_zero() -> None:
    same = parse_metrics(METRICS_BEFORE)
    assert math.isnan(scheduler_figures(same, same)["dra_ms_per_attempt"])


def test_pods_per_second_run_from_the_first_create_to_the_last_bind() -> None:
    created = {"a": 0.0, "b": 1.0, "c": 2.0, "d": 3.0}
    bound = {"a": 1.0, "b": 1.5, "c": 4.0, "other": 0.5}
    got = latency_figures(created, bound)
    assert got["placed"] == 3 and got["span_s"] == 4.0
    assert got["pods_per_s"] == pytest.approx(0.75)
    assert got["p50_s"] == 1.0 and got["p99_s"] == 2.0
    assert latency_figures({"x": 0.0}, {})["placed"] == 0


def test_the_pods_ask_one_book_by_claim_template_or_extended_resource() -> None:
    claim = pod_doc("p", "claim")["spec"]
    assert claim["resourceClaims"] == [{"name": "book", "resourceClaimTemplateName": simulated_nodes.TEMPLATE}]
    assert claim["nodeSelector"] == {simulated_nodes.SIM_LABEL: "true"}
    for kind in ("extended", "deviceplugin"):
        resources = pod_doc("p", kind)["spec"]["containers"][0]["resources"]
        assert resources["limits"] == {"topology/book": "1"} == resources["requests"]
    with pytest.raises(ValueError):
        pod_doc("p", "gpu")


def test_the_simulated_nodes_are_kwoks_and_the_agents_nodes_take_no_fill_pod() -> None:
    sim = simulated_nodes.node_doc("sim-1", sim=True)["metadata"]
    real = simulated_nodes.node_doc("agent-node-1", sim=False)["metadata"]
    assert sim["annotations"] == {"kwok.x-k8s.io/node": "fake"} == real["annotations"]
    assert sim["labels"][simulated_nodes.SIM_LABEL] == "true" and simulated_nodes.SIM_LABEL not in real["labels"]


def test_the_table_sets_every_layout_beside_counters_in_the_same_phase() -> None:
    rows = [{"variant": "counters", "phase": "0-50%", "placed": 400, "pods_per_s": 20.0, "p99_s": 2.0,
             "filter_ms": 4.0, "sched_cpu_ms_per_pod": 10.0},
            {"variant": "flat", "phase": "0-50%", "placed": 400, "pods_per_s": 30.0, "p99_s": 1.0,
             "filter_ms": 2.0, "sched_cpu_ms_per_pod": 5.0}]
    text = table(rows)
    assert "flat    0-50%: pods/s 1.50x, p99 0.50x, Filter ms 0.50x, scheduler CPU/pod 0.50x" in text
    assert text.splitlines()[0].split()[:2] == ["variant", "phase"]


def test_a_wrong_variant_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulated_nodes.main(["--variants", "counters,gpu"]) == 2
    assert "variants are counters, flat, books, books-flat, extended, deviceplugin" in capsys.readouterr().err


def test_the_scheduler_and_controller_manager_clients_get_the_qps_asked() -> None:
    text = "kind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: /k\n"
    assert "clientConnection:\n  qps: 5000\n  burst: 5000\n  kubeconfig: /k\n" in \
        control_plane.scheduler_config(text, 5000)
    assert control_plane.scheduler_config(text, None) == text
    argv = ["kcm", "--controllers=*", "--v=1"]
    assert control_plane.controller_manager_argv(argv, node_lifecycle=False, qps=None) == [
        "kcm", "--controllers=*,-node-lifecycle-controller", "--v=1"]
    assert control_plane.controller_manager_argv(argv, node_lifecycle=True, qps=70) == [
        "kcm", "--controllers=*", "--v=1", "--kube-api-qps=70", "--kube-api-burst=70"]


def test_kwok_is_pinned_in_versions_env_and_its_module_and_cached_by_those_pins(tmp_path: Path) -> None:
    pins = dict(line.split("=", 1) for line in (CLUSTER / "versions.env").read_text().splitlines()
                if "=" in line and not line.startswith("#"))
    assert f"require sigs.k8s.io/kwok v{pins['KWOK_VERSION']}\n" in (CLUSTER / "go" / "kwok" / "go.mod").read_text()
    assert f"sigs.k8s.io/kwok v{pins['KWOK_VERSION']} h1:" in (CLUSTER / "go" / "kwok" / "go.sum").read_text()
    done = subprocess.run([str(CLUSTER / "build-kwok.sh"), "--print"], capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", "CLUSTER_CACHE": str(tmp_path)})
    folder = Path(done.stdout.strip())
    assert folder.parent == tmp_path and folder.name.startswith("kwok-")
