"""Log lines: text or JSON, one per event, stable keys, written off the caller's thread."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from agent.observe.logs import setup_logging, shutdown_logging


@pytest.fixture(autouse=True)
def _stop_writer() -> Iterator[None]:
    yield
    shutdown_logging()


def test_json_lines_carry_stable_keys(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info", "json")
    log = logging.getLogger("topology-agent.plugin")
    log.info("Allocate %s -> cpus %s", "drawer0-book0", "0-11",
             extra={"resource": "topology/book", "device": "drawer0-book0", "cpus": "0-11"})
    log.debug("not shown at info")
    shutdown_logging()  # writes what is queued
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line["msg"] == "Allocate drawer0-book0 -> cpus 0-11" and line["level"] == "info"
    assert (line["resource"], line["device"], line["cpus"]) == ("topology/book", "drawer0-book0", "0-11")
    assert "reason" not in line


def test_text_lines_append_the_keys(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("warning", "text")
    logging.getLogger("topology-agent").warning("blocked", extra={"reason": "held by ns/p/c"})
    logging.getLogger("topology-agent").info("hidden")
    shutdown_logging()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("blocked [reason=held by ns/p/c]") and "WARNING" in line


def test_unknown_level_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        setup_logging("loud")


def test_a_record_whose_message_does_not_fit_its_arguments_costs_one_line_not_the_log(
        capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info", "json")
    log = logging.getLogger("topology-agent")
    log.warning("bad %d", "x")  # a bug elsewhere must not end the writer
    log.warning("after")
    shutdown_logging()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["msg"] for line in lines][1] == "after"
    assert "unformattable log message 'bad %d'" in lines[0]["msg"]
