"""Logging for the agent: one line per event, text or JSON, with stable keys."""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import threading
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


MAX_QUEUED = 4096  # records waiting for the writer; beyond this they are dropped and counted


class _Dropped:
    """Records dropped because the queue was full (stderr not drained fast enough, or not at all)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.unreported = 0

    def add(self) -> None:
        with self._lock:
            self.total += 1
            self.unreported += 1

    def take_unreported(self) -> int:
        with self._lock:
            n, self.unreported = self.unreported, 0
            return n


DROPPED = _Dropped()


def dropped_records() -> int:
    """Log records dropped so far because the writer could not keep up."""
    return DROPPED.total


class _InProcessQueueHandler(logging.handlers.QueueHandler):
    """Hands the record over as it is (formatting happens in the writer's thread); never blocks:
    when the queue is full the record is dropped and counted."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            DROPPED.add()


class _BatchWriter:
    """Formats and writes queued records from a thread of its own, a batch per wake-up: a burst
    of Allocates costs the callers one queue put each, and stderr one write per batch."""

    BATCH_DELAY = 0.02  # seconds to gather a burst before writing

    def __init__(self, records: queue.Queue[logging.LogRecord | None], handler: logging.Handler) -> None:
        self.records = records
        self.handler = handler
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            first = self.records.get()
            batch = [first]
            if first is not None:
                time.sleep(self.BATCH_DELAY)
            while True:
                try:
                    batch.append(self.records.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            lines = [self._format(r) for r in batch if r is not None]
            dropped = DROPPED.take_unreported()
            if dropped:
                lines.append(self.handler.format(logging.LogRecord(
                    "topology-agent.logs", logging.WARNING, __file__, 0,
                    "%d log records were dropped: stderr was not drained fast enough", (dropped,), None)))
            if lines:
                try:
                    stream = sys.stderr
                    stream.write("\n".join(lines) + "\n")
                    stream.flush()
                except (OSError, ValueError):
                    pass  # stderr gone: nothing sensible to do with a log line
            if stop:
                return

    def _format(self, record: logging.LogRecord) -> str:
        """A record as one line; one whose message does not fit its arguments becomes a line saying
        so (as logging's own handleError would), never the end of this thread and of every later line."""
        try:
            return self.handler.format(record)
        except Exception as exc:  # a bad record must not silence the log
            return self.handler.format(logging.LogRecord(
                record.name, record.levelno, record.pathname, record.lineno,
                "unformattable log message %r with arguments %r (%s)", (record.msg, record.args, exc), None))

    def stop(self) -> None:
        if self._thread.is_alive():
            try:
                self.records.put(None, timeout=2)  # a writer stuck on stderr must not hold the exit
            except queue.Full:
                return
            self._thread.join(timeout=5)


_writer: _BatchWriter | None = None


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """Log lines are formatted and written by a thread of their own: a slow or blocked stderr
    never stalls Allocate."""
    global _writer
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} (debug, info, warning, error)")
    handler = logging.Handler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    if _writer is not None:
        _writer.stop()
    records: queue.Queue[logging.LogRecord | None] = queue.Queue(MAX_QUEUED)
    _writer = _BatchWriter(records, handler)
    _writer.start()
    atexit.register(shutdown_logging)
    root = logging.getLogger()
    root.handlers[:] = [_InProcessQueueHandler(records)]
    root.setLevel(numeric)


def shutdown_logging() -> None:
    """Write what is queued and stop the writer thread (also runs at exit)."""
    global _writer
    if _writer is not None:
        _writer.stop()
        _writer = None
        logging.getLogger().handlers[:] = []
