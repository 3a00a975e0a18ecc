"""Logging with secrets redacted from every record; expected failures on one line; as
text, or as JSON lines (`logging.format: json`) for a log collector."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

from bot.core import redact
from bot.core.errors import ModelError, StoreConflict


class Redactor(logging.Filter):
    """Every record's message and traceback through Tandem's one redaction pass."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.redact = redact.Redactor(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = self.redact(message)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if clean != message:
            record.msg, record.args = clean, None
        return True


class OneLine(logging.Filter):
    """A record about an expected failure (the model unreachable, cut off, rate limited:
    `ModelError`; a write another process won: `StoreConflict`) keeps one line: the
    exception's type and first line replace its traceback, which `-v` (DEBUG) shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, ModelError | StoreConflict):
            return True
        message = record.getMessage()
        lines = str(exc).strip().splitlines()
        summary = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        if (lines[0] if lines else type(exc).__name__) not in message:
            message = f"{message} ({summary})"
        record.msg, record.args = message, None
        record.exc_info, record.exc_text = None, None
        return True


class JsonLines(logging.Formatter):
    """One JSON object per record, on one line: `time` (ISO 8601, UTC), `level`, `logger`,
    `message`, and `exception` (the traceback, redacted like the message) when there is
    one. ASCII only, so no character in a message can break the line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, UTC)
                 .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                 "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry)


def setup(level: int, secrets: Iterable[str], *, tracebacks: bool | None = None,
          format: Literal["text", "json"] = "text") -> None:
    """Log to stderr at `level`, as text or JSON lines (`format`, the config's
    `logging.format`). Tracebacks of expected failures only when `tracebacks` (default:
    at DEBUG, i.e. `tandem -v`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if format == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if not (level <= logging.DEBUG if tracebacks is None else tracebacks):
        handler.addFilter(OneLine())
    handler.addFilter(Redactor(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "LiteLLM", "litellm", "aiosqlite", "apscheduler", "telegram.ext",
                  "slack_bolt", "slack_sdk"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
