"""The PostgreSQL store's plumbing: the pool, transactions, errors, migrations.

A store holds one `psycopg_pool.AsyncConnectionPool`; its connections are in autocommit
at READ COMMITTED. A method that writes more than one statement runs them in one
transaction (`_tx`), a lone statement is its own (`_rows`, `_row`, `_count`).

The writes that must happen once (a redelivered inbound, a second press on a button, two
schedulers on one slot) are conditional statements: `INSERT ... ON CONFLICT DO NOTHING`,
`UPDATE ... WHERE status = 'pending'`. At READ COMMITTED a second writer waits for the
first one's row lock, then re-checks its condition against the committed row and finds
nothing to do, so they hold across processes as well as within one.

`open()` migrates over a connection of its own (one transaction holding an advisory
lock, so workers starting together migrate once), then opens the pool. Every psycopg
error becomes `StoreError` (`StoreConflict` when another process wrote first: a unique
key, a serialization failure, a deadlock); its message never holds the password of the
URL.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn
from urllib.parse import unquote

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from bot.core.errors import StoreConflict, StoreError
from bot.core.events import ConvKey
from bot.store.postgres_schema import LOCK_KEY, MIGRATIONS, TABLES, VERSION_TABLE

Conn = AsyncConnection[TupleRow]
Row = tuple[Any, ...]

CONFLICTS = (psycopg.errors.UniqueViolation, psycopg.errors.SerializationFailure,
             psycopg.errors.DeadlockDetected)
"""Errors of a write that lost to another process's: `StoreConflict`, not "unavailable"."""

OPEN_TIMEOUT_S = 10.0
"""How long `open()` waits for the pool's first connection."""

_URL_PASSWORD = re.compile(r"(://[^/?#@\s:]*:)([^/?#\s]*)@")
_PARAM_PASSWORD = re.compile(r"(password\s*=\s*)('[^']*'|[^&\s]*)", re.IGNORECASE)


def redact(url: str) -> str:
    """`url` fit for a message: its password (`user:password@`, `password=`) is ***."""
    return _PARAM_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", url))


def _passwords(url: str) -> set[str]:
    found = {m.group(2) for m in _URL_PASSWORD.finditer(url)}
    found |= {m.group(2).strip("'") for m in _PARAM_PASSWORD.finditer(url)}
    try:
        found.add(str(conninfo_to_dict(url).get("password") or ""))
    except psycopg.Error:
        pass
    return {p for p in found | {unquote(p) for p in found} if p}


def fail(context: str, exc: BaseException, url: str) -> NoReturn:
    """Raise StoreError for `exc` (StoreConflict for a write another process won), with no
    password of `url` in its message (and without `exc` as its cause, should the driver's
    own text have held one)."""
    text = str(exc)
    for password in sorted(_passwords(url), key=len, reverse=True):
        text = text.replace(password, "***")
    if isinstance(exc, CONFLICTS):
        raise StoreConflict(f"write conflict: {text}") from (exc if text == str(exc) else None)
    raise StoreError(f"{context}: {text}") from (exc if text == str(exc) else None)


def conv_key(row: Row, offset: int = 0) -> ConvKey:
    return ConvKey.stored(row[offset], row[offset + 1], row[offset + 2])


async def fetchone(conn: Conn, sql: str, args: Sequence[Any] = ()) -> Row | None:
    return await (await conn.execute(sql, args)).fetchone()


async def schema_version(conn: Conn) -> int:
    row = await fetchone(conn, "SELECT COALESCE(MAX(version), 0) FROM schema_version")
    return int(row[0]) if row else 0


async def read_committed(conn: Conn) -> None:
    """Every transaction of `conn` at READ COMMITTED, whatever the server's default: the
    conditional writes rely on it (a stricter level fails the second writer instead),
    and so do migrations (which must read the version after taking the lock)."""
    await conn.execute("SET default_transaction_isolation TO 'read committed'")


async def _apply_migrations(conn: Conn) -> int:
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        await conn.execute(VERSION_TABLE)
        version = await schema_version(conn)
        if version > len(MIGRATIONS):
            raise StoreError(f"database schema v{version} is newer than this Tandem"
                             f" (v{len(MIGRATIONS)})")
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            await conn.execute(script)
            await conn.execute("INSERT INTO schema_version (version, applied_at)"
                               " VALUES (%s, %s)", (number, time.time()))
        return len(MIGRATIONS) - version


async def migrate(url: str) -> int:
    """Bring the schema at `url` up to date; returns how many migrations it applied
    (0 when it was current). Raises StoreError, also for a schema newer than this code."""
    try:
        async with await AsyncConnection.connect(url, autocommit=True) as conn:
            await read_committed(conn)
            return await _apply_migrations(conn)
    except (psycopg.Error, StoreError) as exc:
        fail(f"cannot open the database {redact(url)}", exc, url)


class PostgresBase:
    def __init__(self, url: str, *, max_size: int = 10) -> None:
        self.url = url
        self.max_size = max_size
        self._pool: AsyncConnectionPool[Conn] | None = None

    # -- plumbing ---------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        await migrate(self.url)
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self.url, min_size=1, max_size=self.max_size, open=False,
            kwargs={"autocommit": True}, configure=read_committed, name="tandem-store")
        try:
            await pool.open(wait=True, timeout=OPEN_TIMEOUT_S)
        except psycopg.Error as exc:
            await pool.close()
            fail(f"cannot open the database {redact(self.url)}", exc, self.url)
        self._pool = pool

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def __aenter__(self) -> PostgresBase:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """A pooled connection (autocommit: each statement is its own transaction)."""
        if self._pool is None:
            raise StoreError("the store is closed")
        try:
            async with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            fail("database error", exc, self.url)

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[Conn]:
        """A pooled connection inside one transaction (committed on leaving)."""
        async with self._connection() as conn, conn.transaction():
            yield conn

    async def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        async with self._connection() as conn:
            return await (await conn.execute(sql, args)).fetchall()

    async def _row(self, sql: str, args: Sequence[Any] = ()) -> Row | None:
        async with self._connection() as conn:
            return await fetchone(conn, sql, args)

    async def _count(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run one statement; how many rows it changed."""
        async with self._connection() as conn:
            return (await conn.execute(sql, args)).rowcount

    async def integrity_check(self) -> str:
        """'ok' when every table is there and the schema is this code's version."""
        async with self._connection() as conn:
            cur = await conn.execute("SELECT t FROM unnest(%s::text[]) AS t"
                                     " WHERE to_regclass(t) IS NULL", (list(TABLES),))
            missing = [str(r[0]) for r in await cur.fetchall()]
            version = None if "schema_version" in missing else await schema_version(conn)
        problems = [f"missing tables: {', '.join(missing)}"] if missing else []
        if version is not None and version != len(MIGRATIONS):
            problems.append(f"schema v{version}, this Tandem expects v{len(MIGRATIONS)}")
        return "; ".join(problems) or "ok"
