"""Which store implementation serves a configuration: SQLite (the embedded default) or
PostgreSQL (several processes on one database).

psycopg is imported only when a PostgreSQL URL is given, so SQLite users never load it.
"""

from __future__ import annotations

from bot.store import Store
from bot.store.sqlite import SQLiteStore

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SQLITE_SCHEME = "sqlite://"


def open_store(target: str, *, pool_size: int = 10) -> Store:
    """The store at `target`, not yet opened: call `open()` before use.

    `postgresql://...` or `postgres://...` is a PostgreSQL server (with up to `pool_size`
    connections); `sqlite:///abs/path` or `sqlite://rel/path` a SQLite file, as is
    anything else (a plain path, `:memory:`).
    """
    lowered = target.lower()
    if lowered.startswith(POSTGRES_SCHEMES):
        from bot.store.postgres import PostgresStore

        return PostgresStore(target, max_size=pool_size)
    if lowered.startswith(SQLITE_SCHEME):
        return SQLiteStore(target[len(SQLITE_SCHEME):])
    return SQLiteStore(target)
