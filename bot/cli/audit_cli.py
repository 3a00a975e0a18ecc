"""`tandem audit`: print the audit log (all of it, or since a time, or one conversation)."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from datetime import UTC, datetime

from bot.core.config import Config
from bot.core.errors import ConfigError, StoreError, StoreUnusable

_AGO = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
LIMIT = 100_000


def since(text: str, now: float | None = None) -> float:
    """`--since`: an age (`30m`, `12h`, `7d`, `2w`) or a date or time (`2026-12-01`,
    `2026-12-01T09:30`, UTC unless it names its offset)."""
    now = time.time() if now is None else now
    if m := _AGO.match(text.strip()):
        return now - int(m.group(1)) * _UNITS[m.group(2)]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError("--since", f"{text!r} is neither an age (30m, 12h, 7d) nor a date "
                          "(2026-12-01, 2026-12-01T09:30)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def run(config: Config, since_text: str | None, conversation: str | None,
        as_json: bool) -> int:
    start = since(since_text) if since_text else None
    from bot.store.backends import open_store

    async def read() -> list[str]:
        store = open_store(config.store.target)
        await store.open()
        try:
            rows = await store.audit(since=start, conv=conversation, limit=LIMIT)
        finally:
            await store.close()
        return [r.as_json() if as_json else r.line() for r in rows]

    try:
        lines = asyncio.run(read())
    except StoreUnusable as exc:
        raise ConfigError("store.path", str(exc)) from None
    except StoreError as exc:
        sys.stderr.write(f"tandem: {exc}\n")
        return 1
    for text in lines:
        sys.stdout.write(text + "\n")
    if not lines and not as_json:
        sys.stderr.write("tandem: the audit log has no entries"
                         + (" that match" if start or conversation else "") + "\n")
    return 0
