"""The docs are the contract users read: their tables must say what the code does
(docs/inference/what-a-container-gets.md, docs/admin/configuration.md)."""

from __future__ import annotations

import argparse
from typing import Any

from agent.cli import build_parser
from agent.dra.prepare import plan_claim
from agent.policy.allocation import ENV_KEYS, OPENMP_ENV_KEYS, AllocationSettings, plan_allocation
from agent.policy.container_claims import ADMIN_ENV, CLAIM_ENV
from agent.policy.grouping import group_topology
from agent.policy.resource_slices import DRIVER
from agent.topology.embedded import load_embedded
from tests.support.docs import CONTAINER, names, table_after
from tests.support.env import REPO

CONFIGURATION = (REPO / "docs" / "admin" / "configuration.md").read_text(encoding="utf-8")


def test_the_environment_table_is_what_allocate_returns() -> None:
    rows = table_after("## The environment", CONTAINER)
    dra = [n for row in rows if row[1].startswith("DRA mode only") for n in names(row[0])]
    rows = [row for row in rows if not row[1].startswith("DRA mode only")]
    always = [n for row in rows if "--openmp-env" not in row[1] for n in names(row[0])]
    opt_in = [n for row in rows if "--openmp-env" in row[1] for n in names(row[0])]
    assert always == list(ENV_KEYS)
    assert opt_in == list(OPENMP_ENV_KEYS)
    assert dra == [CLAIM_ENV, ADMIN_ENV]
    books = group_topology(load_embedded("z16-lpar")).by_resource("topology/book")[:2]
    assert list(plan_allocation(books).envs) == always
    assert set(plan_allocation(books, AllocationSettings(openmp_env=True)).envs) == {*always, *opt_in}
    claim: dict[str, Any] = {"metadata": {"namespace": "ns", "name": "c", "uid": "u"}, "status": {"allocation": {
        "devices": {"results": [{"request": "r", "driver": DRIVER, "pool": "n", "device": b.id} for b in books]}}}}
    _, files = plan_claim(claim, driver=DRIVER, pool="n", groups={b.id: b for b in books},
                          allocation=AllocationSettings())
    (spec,) = files.values()
    assert [e.split("=", 1)[0] for e in spec["devices"][0]["containerEdits"]["env"]] == [*always, CLAIM_ENV]
    for result in books_results(claim):
        result["adminAccess"] = True  # the row's promise: two variables to observe, and the marker
    _, files = plan_claim(claim, driver=DRIVER, pool="n", groups={b.id: b for b in books},
                          allocation=AllocationSettings())
    (spec,) = files.values()
    assert [e.split("=", 1)[0] for e in spec["devices"][0]["containerEdits"]["env"]] == [
        "TOPOLOGY_GROUPS", "TOPOLOGY_CPUS", ADMIN_ENV]


def books_results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return results


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise AssertionError("no subcommands")


def test_the_flag_table_lists_every_serve_flag_with_its_default() -> None:
    rows = table_after("`topology-agent serve` is the DaemonSet's command", CONFIGURATION)
    documented = {n.split(" ")[0] for row in rows for n in names(row[0]) if n.startswith("--")}
    serve = subcommand("serve")
    flags = {opt for action in serve._actions for opt in action.option_strings if opt.startswith("--")} - {"--help"}
    assert flags == documented
    defaults: dict[str, str] = {}
    for row in rows:
        flag_names = [n.split(" ")[0] for n in names(row[0])]
        values = names(row[1])
        defaults.update(zip(flag_names, values, strict=False))
    checked = 0
    for action in serve._actions:
        flag = action.option_strings[0] if action.option_strings else ""
        if flag in defaults and isinstance(action.default, str) and action.default:
            assert defaults[flag] == action.default, flag
            checked += 1
    assert checked >= 15
