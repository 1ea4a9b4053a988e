"""Structured logging: every record as one JSON line on stderr.

Extra fields travel in `extra={"fields": {...}}` and are merged into the line, so a decision reads
`{"time": ..., "level": "INFO", "logger": "gpupack.decisions", "msg": "decision", "pod": ..., ...}`.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as JSON: time, level, logger, msg, its `fields`, and the traceback if any."""
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class StderrHandler(logging.StreamHandler):
    """A stream handler on whatever `sys.stderr` is when a record is written, not when it was made: code that
    swaps stderr (a test runner, an embedding process) and closes the old one keeps getting the logs."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass  # StreamHandler.__init__ and setStream assign it; the current sys.stderr always wins


def configure(level: int = logging.INFO) -> None:
    """Send every log record to stderr as JSON (replaces the root logger's handlers)."""
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
