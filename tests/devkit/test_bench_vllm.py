"""bench/cluster/vllm_beside_hog.py's pure parts (the bench itself runs on the real-cluster lane): the hog's CPU
request, the interleaved rounds and their statistics (vllm_figure.py), where a request's time went (vllm_where.py),
the reserved CPUs it confines the lane's host processes to, and its command line's refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.cluster import vllm_beside_hog, vllm_figure, vllm_where
from bench.cluster.vllm_beside_hog import check_reserved, hog_millicores, reserved_values
from bench.cluster.vllm_figure import Run, Spread, figures, ratios, schedule, table, verdicts
from topology_devkit.realcluster import confine


def test_the_hog_requests_what_the_node_has_left_beside_the_server() -> None:
    assert hog_millicores("2", ["100m", "250m"]) == 2000 - 350 - 1000 - 50
    assert hog_millicores("1950m", ["0"], server="500m") == 1400


def test_the_hog_requests_at_least_100m_on_a_full_node() -> None:
    assert hog_millicores("2", ["1", "900m"]) == 100


def test_the_runs_interleave_every_mode_once_per_round_and_back_in_the_next() -> None:
    assert schedule(3) == [(0, "alone"), (0, "enforcing"), (0, "none"), (1, "none"), (1, "enforcing"), (1, "alone"),
                           (2, "alone"), (2, "enforcing"), (2, "none")]
    with pytest.raises(ValueError):
        schedule(0)


def rounds(*p99s: tuple[float, float, float]) -> list[Run]:
    """One round per (alone, enforcing, none) p99 in ms; p50 half of it, tokens/s 1000 / p99."""
    return [Run(mode, r, p / 2e3, p / 1e3, 1000 / p) for r, trio in enumerate(p99s)
            for mode, p in zip(vllm_figure.MODES, trio, strict=True)]


def test_a_mode_is_judged_against_its_own_rounds_alone_run() -> None:
    runs = rounds((100, 110, 150), (200, 220, 300))  # the machine twice as slow in round 1: the ratios do not move
    assert ratios(runs, "enforcing", "p99") == pytest.approx([1.1, 1.1])
    assert ratios(runs, "none", "tok_s") == pytest.approx([100 / 150, 200 / 300])


def test_a_round_without_its_alone_run_is_left_out() -> None:
    runs = [r for r in rounds((100, 110, 150), (100, 300, 150)) if not (r.round == 1 and r.mode == "alone")]
    assert ratios(runs, "enforcing", "p99") == pytest.approx([1.1])


def test_the_verdict_is_on_the_median_ratio_and_the_spread_is_beside_it() -> None:
    runs = rounds((100, 105, 150), (100, 110, 160), (100, 300, 140), (100, 100, 150), (100, 112, 170))
    found = figures(runs)
    p99 = found["enforcing"].ratio["p99"]
    assert (p99.median, p99.low, p99.high, p99.count) == pytest.approx((1.10, 1.00, 3.00, 5))
    assert verdicts(found) == {"goal": "met", "below none": "met"}  # one 3x round does not decide it
    row = next(line for line in table(found) if line.startswith("| enforcing"))
    assert "1.10x (1.00-3.00)" in row and "p99 <= 1.15x: met; below none: met" in row
    assert found["alone"].absolute["p99"] == Spread(0.1, 0.1, 0.1, 5)


def test_a_median_past_the_goal_is_missed_even_with_a_good_round() -> None:
    found = figures(rounds((100, 90, 150), (100, 160, 150), (100, 170, 150)))
    assert verdicts(found) == {"goal": "MISSED", "below none": "MISSED"}
    assert "p99 <= 1.15x: MISSED" in table(found)[3]


def test_no_verdict_without_an_enforcing_run_paired_with_alone() -> None:
    found = figures([Run("alone", 0, 0.05, 0.1, 300.0)])
    assert verdicts(found) == {} and list(found) == ["alone"]
    assert [r.verdict for r in vllm_beside_hog.rows(found, 60, [])] == ["MISSED"]


METRICS_PAGE = """# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 4.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny"} %s
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny"} %s
vllm:request_queue_time_seconds_sum{engine="0",model_name="tiny"} %s
vllm:request_queue_time_seconds_count{engine="0",model_name="tiny"} %s
vllm:request_inference_time_seconds_sum{engine="0",model_name="tiny"} %s
vllm:request_inference_time_seconds_count{engine="0",model_name="tiny"} %s
vllm:request_decode_time_seconds_sum{engine="0",model_name="tiny"} garbage
"""


def test_vllm_timings_are_the_mean_over_the_requests_between_two_pages() -> None:
    before = vllm_where.histogram_totals(METRICS_PAGE % (0.2, 5, 0.01, 5, 0.15, 5))
    after = vllm_where.histogram_totals(METRICS_PAGE % (2.2, 25, 0.03, 25, 1.75, 25))
    assert before["e2e_request_latency_count"] == 5 and "request_decode_time_sum" not in before
    means = vllm_where.phase_means(before, after)
    assert means == pytest.approx({"e2e_request_latency": 0.1, "request_queue_time": 0.001,
                                   "request_inference_time": 0.08})
    figures_ = vllm_where.per_request(means, 0.12, [], 20)
    assert figures_ == pytest.approx({"client": 120.0, "vLLM e2e": 100.0, "outside vLLM": 20.0,
                                      "API server's part": 19.0, "queued": 1.0})


THREADS_BEFORE = """T 1 1 1000000 500000 vllm
T 1 7 0 0 vllm
T 40 40 5000000 0 VLLM::EngineCor
T 90 90 10 10 sh
"""
THREADS_AFTER = """T 1 1 3000000 1500000 vllm
T 1 7 1000000 4000000 vllm
T 40 40 25000000 2000000 VLLM::EngineCor
T 40 41 1000000 1000000 VLLM::EngineCor
T 95 95 10 5000000 sh
not a thread line
"""


def test_each_process_s_cpu_and_run_queue_time_over_the_stream() -> None:
    found = vllm_where.process_times(vllm_where.parse_threads(THREADS_BEFORE), vllm_where.parse_threads(THREADS_AFTER))
    assert [(p.name, p.pid) for p in found] == [("vllm", 1), ("VLLM::EngineCor", 40)]  # longest wait first, no sh
    api, engine = found
    assert (api.run_s, api.wait_s, api.top_thread, api.top_wait_s) == pytest.approx((0.003, 0.005, "vllm", 0.004))
    assert (engine.run_s, engine.wait_s) == pytest.approx((0.021, 0.003))  # thread 41 is new: counted whole
    figures_ = vllm_where.per_request({}, 0.05, found, 10)
    assert figures_["vllm wait"] == pytest.approx(0.5) and figures_["VLLM::EngineCor run"] == pytest.approx(2.1)
    assert vllm_where.line({"client": 50.0}) == "ms/request: client 50.0"


def test_the_reserved_cpus_must_leave_a_book() -> None:
    assert check_reserved("0", 2) == "0"
    assert check_reserved("2,0-1", 4) == "0-2"
    for bad in ("0-1", "3", "x"):
        with pytest.raises(ValueError):
            check_reserved(bad, 2)
    assert reserved_values("0,2") == ("--set-string", "agent.reservedCpus=0\\,2", "--set", "agent.levels=book")
    assert reserved_values("") == ()


@pytest.mark.parametrize("argv", [["--runs", "0"], ["--requests", "0"], ["--reserved-cpus", "0-255"]])
def test_the_command_line_refuses_with_one_line(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["vllm_beside_hog.py", *argv])
    assert vllm_beside_hog.main() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vllm_beside_hog: ")


def test_the_cpuset_cgroup_of_a_process_is_read_from_its_cgroup_file() -> None:
    assert confine.cpuset_path("4:memory:/x\n3:cpuset:/topology-lane-host\n0::/\n") == "/topology-lane-host"
    assert confine.cpuset_path("3:cpu,cpuset:/\n") == "/"
    assert confine.cpuset_path("0::/\n") is None


def test_confine_makes_the_group_with_the_roots_memory_nodes_and_the_cpus(tmp_path: Path) -> None:
    (tmp_path / "cpuset.mems").write_text("0\n")
    assert confine.confine("0", [], root=tmp_path) == []
    group = tmp_path / confine.GROUP
    assert (group / "cpuset.mems").read_text() == "0\n" and (group / "cpuset.cpus").read_text() == "0\n"
    assert confine.release(root=tmp_path / "nowhere") == 0


def test_the_agent_switches_once_per_round_and_keeps_the_reserved_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    upgrades: list[tuple[str, ...]] = []
    monkeypatch.setattr(vllm_beside_hog, "helm_upgrade", lambda *values: upgrades.append(values))
    agent = vllm_beside_hog.Agent(reserved_values("0"))
    for _, mode in schedule(3):
        agent.ensure(vllm_beside_hog.MODES[mode][0])
    assert len(upgrades) == 4  # the first run's values, then one switch per round
    assert all(values[:2] == ("--set-string", "agent.reservedCpus=0") for values in upgrades)


def test_a_whole_bench_run_confines_saves_each_run_and_restores_the_lane(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    calls: list[str] = []
    p99 = {"alone": 0.1, "enforcing": 0.11, "none": 0.16}
    monkeypatch.setattr(vllm_beside_hog, "_why_not", lambda image: None)
    monkeypatch.setattr(vllm_beside_hog, "kubectl", lambda *args, **kw: type("Done", (), {
        "stdout": '{"items": [{"metadata": {"name": "node"}}]}' if args[:2] == ("get", "nodes") else ""})())

    def confined(reserved: str, whole_host: bool) -> str:
        calls.append(f"confine {reserved}{' whole host' if whole_host else ''}")
        return "confined"

    monkeypatch.setattr(vllm_beside_hog, "_confine", confined)
    monkeypatch.setattr(vllm_beside_hog, "_release", lambda: calls.append("release"))
    monkeypatch.setattr(vllm_beside_hog, "helm_upgrade", lambda *values: calls.append(f"helm {' '.join(values)}"))
    monkeypatch.setattr(vllm_beside_hog, "measure", lambda mode, rnd, node, requests, agent: Run(
        mode, rnd, p99[mode] / 2, p99[mode], 300.0, extra={"book": "1", "hog_cpu": "", "ready_s": 50.0,
                                                           "where": {"client": 50.0}, "top_waiter": "",
                                                           "book_line": ""}))
    raw = tmp_path / "runs.json"
    rows_ = vllm_beside_hog.run(False, 10, 2, "0", None, raw)
    assert calls == ["confine 0 whole host", "helm ", "release"]  # the lane's own values again, then every CPU back
    assert [r.verdict for r in rows_[:2]] == ["met", "met"] and rows_[0].measured == "1.10x (1.10-1.10)"
    saved = json.loads(raw.read_text())
    assert [(r["round"], r["mode"]) for r in saved["runs"]] == schedule(2)
    assert saved["settings"]["host"] == "whole host confined" and "load_after" in saved["settings"]


def test_a_cpus_busy_and_steal_ticks_are_read_from_proc_stat() -> None:
    text = ("cpu  9 9 9 9 9 9 9 9 0 0\n"
            "cpu0 10 1 5 100 3 1 1 2 0 0\n"
            "cpu1 20 0 10 50 0 0 2 7 0 0\nintr 5\n")
    assert vllm_where.parse_proc_stat(text) == {0: vllm_where.CpuTicks(18, 2), 1: vllm_where.CpuTicks(32, 7)}


def host_thread(pid: int, tid: int, run_ns: int, allowed: set[int], cgroup: str = "/",
                comm: str = "t") -> vllm_where.HostThread:
    return vllm_where.HostThread(pid, tid, comm, run_ns, frozenset(allowed), cgroup)


def test_the_book_cpus_time_splits_into_the_servers_and_anything_elses() -> None:
    before = {(1, 1): host_thread(1, 1, 0, {1}, "/kubepods/podabc-1/x"),
              (7, 7): host_thread(7, 7, 1_000_000, {0, 1}, "/", "etcd"),
              (7, 8): host_thread(7, 8, 0, {0, 1}, "/"),
              (9, 9): host_thread(9, 9, 0, {0}, "/topology-lane-host", "kubelet")}
    after = {(1, 1): host_thread(1, 1, 600_000_000, {1}, "/kubepods/podabc-1/x"),
             (7, 7): host_thread(7, 7, 101_000_000, {0, 1}, "/", "etcd"),
             (7, 8): host_thread(7, 8, 50_000_000, {0, 1}, "/"),
             (9, 9): host_thread(9, 9, 900_000_000, {0}, "/topology-lane-host", "kubelet"),  # never on the book
             (3, 3): host_thread(3, 3, 20_000_000, {1}, "/", "new")}  # started during the stream: counts whole
    stat_before = {0: vllm_where.CpuTicks(0, 0), 1: vllm_where.CpuTicks(100, 0)}
    stat_after = {0: vllm_where.CpuTicks(500, 0), 1: vllm_where.CpuTicks(180, 3)}
    found = vllm_where.book_cpus(stat_before, stat_after, 100, frozenset({1}), before, after, ("abc-1",))
    assert (found.busy_s, found.server_s, found.steal_s) == pytest.approx((0.8, 0.6, 0.03))
    assert [(name, pid, cgroup) for name, pid, _, cgroup in found.others] == [("etcd", 7, "/"), ("new", 3, "/")]
    assert [seconds for _, _, seconds, _ in found.others] == pytest.approx([0.15, 0.02])
    line = vllm_where.book_line(found, 10)
    assert "busy 80.0, server 60.0, anything else 20.0, steal 3.0" in line and "etcd(7) 15.0 [/]" in line


def test_the_whole_host_is_every_process_with_a_command_line(tmp_path: Path) -> None:
    for pid, cmdline in (("1", b"init\0"), ("2", b""), ("40", b"etcd\0--x\0")):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cmdline").write_bytes(cmdline)
    (tmp_path / "self").mkdir()
    assert confine.host_pids(tmp_path) == [1, 40]  # pid 2, a kernel thread, stays where the kernel put it
