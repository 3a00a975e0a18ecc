"""Which store implementation serves a configuration (SQLite, the embedded default)."""

from __future__ import annotations

from bot.store import Store
from bot.store.sqlite import SQLiteStore


def open_store(path: str) -> Store:
    """The store at `path` (SQLite), not yet opened: call `open()` before use."""
    return SQLiteStore(path)
