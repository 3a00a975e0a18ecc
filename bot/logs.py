"""Logging with secrets redacted from every record."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable

_TOKEN_PATTERNS = re.compile(
    r"(xox[abprs]-[A-Za-z0-9-]{8,}|xapp-[A-Za-z0-9-]{8,}|sk-[A-Za-z0-9_-]{12,}"
    r"|\b\d{6,12}:[A-Za-z0-9_-]{30,}\b)")


class Redactor(logging.Filter):
    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "[secret]")
        return _TOKEN_PATTERNS.sub("[secret]", text)

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


def setup(level: int, secrets: Iterable[str]) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(Redactor(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "LiteLLM", "litellm", "aiosqlite", "apscheduler", "telegram.ext",
                  "slack_bolt", "slack_sdk"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
