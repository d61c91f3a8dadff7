"""Logging for the agent: one line per event, text or JSON, with stable keys."""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import time

# Keys callers pass with ``extra=`` that belong in every rendering of the line.
EVENT_KEYS: tuple[str, ...] = ("resource", "device", "cpus", "reason", "before", "after", "holder")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in EVENT_KEYS:
            if hasattr(record, key):
                line[key] = getattr(record, key)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = [f"{k}={getattr(record, k)}" for k in EVENT_KEYS if hasattr(record, k)]
        return f"{text} [{' '.join(fields)}]" if fields else text


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time of the record (it may be replaced)."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


_listener: logging.handlers.QueueListener | None = None


class _InProcessQueueHandler(logging.handlers.QueueHandler):
    """Hands the record over as it is: formatting happens in the listener's thread."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """Log lines are formatted and written by a thread of their own: a slow or blocked stderr
    never stalls Allocate."""
    global _listener
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    if _listener is not None:
        _listener.stop()
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    _listener = logging.handlers.QueueListener(records, handler, respect_handler_level=False)
    _listener.start()
    atexit.register(_listener.stop)
    root = logging.getLogger()
    root.handlers[:] = [_InProcessQueueHandler(records)]
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} (debug, info, warning, error)")
    root.setLevel(numeric)
