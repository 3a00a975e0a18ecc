"""The SQLite store's plumbing: the connection, one-hop calls, transactions, migrations.

Each public method is one round trip to aiosqlite's worker thread: a multi-statement
change runs there as one function inside `BEGIN IMMEDIATE ... COMMIT`, so it is atomic
and costs one thread hop. The connection is always closed (`close()`), since
aiosqlite's worker thread would otherwise keep the interpreter alive.

The database holds every conversation, so a new one is created private before SQLite
opens it: its folder 0700, the file 0600 (SQLite gives -wal and -shm the file's mode).
An existing database keeps its mode; `tandem doctor` warns when it is readable by others.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from bot.core.errors import StoreError, StoreUnusable
from bot.core.events import ConvKey
from bot.core.file_modes import private_dir, private_file
from bot.store.sqlite_schema import MIGRATIONS

T = TypeVar("T")


def conv_key(row: sqlite3.Row | tuple[Any, ...], offset: int = 0) -> ConvKey:
    return ConvKey.stored(row[offset], row[offset + 1], row[offset + 2])


SQLITE_HEADER = b"SQLite format 3\x00"


def unusable(path: Path) -> str | None:
    """Why `path` cannot hold Tandem's database, or None (what SQLite would only say as
    "unable to open database file", or not at all until the first query)."""
    if path.is_dir():
        return "is a directory, not a database file"
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                return f"is under {parent}, which is a file, not a folder"
            break
    if path.is_file() and path.stat().st_size:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
            if head != SQLITE_HEADER and head.strip(b"\x00"):  # zeros: SQLite decides
                return "exists and is not a SQLite database (pick another store.path)"
    return None


class SQLiteBase:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db: aiosqlite.Connection | None = None

    # -- plumbing ---------------------------------------------------------------------

    async def open(self) -> None:
        if str(self.path) != ":memory:" and (problem := unusable(self.path)):
            raise StoreUnusable(f"{self.path} {problem}")
        try:
            if str(self.path) != ":memory:":
                private_dir(self.path.parent)
                private_file(self.path)
            self._db = await aiosqlite.connect(self.path, isolation_level=None)
            await self._run(self._setup)
        except (sqlite3.Error, OSError, StoreError) as exc:
            await self.close()  # else aiosqlite's thread keeps the process alive
            raise StoreError(f"cannot open the database {self.path}: {exc}") from exc

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

    async def __aenter__(self) -> SQLiteBase:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` on the connection in aiosqlite's worker thread (one hop)."""
        if self._db is None:
            raise StoreError("the store is closed")
        conn = self._db

        def call() -> T:
            result = fn(conn._conn)
            if isinstance(result, sqlite3.Cursor):
                # finished in the connection's thread: a cursor freed in another thread
                # resets its statement while this thread runs the next one ("misuse")
                result.close()
                return None  # type: ignore[return-value]
            return result

        try:
            done: T = await conn._execute(call)  # type: ignore[no-untyped-call]
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc
        return done

    async def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def wrapped(db: sqlite3.Connection) -> T:
            db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return result

        return await self._run(wrapped)

    @staticmethod
    def _setup(db: sqlite3.Connection) -> None:
        db.execute("PRAGMA busy_timeout=5000")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise sqlite3.DatabaseError(
                f"database schema v{version} is newer than this Tandem (v{len(MIGRATIONS)})")
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _statements(script):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version={number}")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    async def integrity_check(self) -> str:
        return await self._run(lambda db: str(db.execute("PRAGMA integrity_check").fetchone()[0]))


def _statements(script: str) -> list[str]:
    """A script's statements: split on ";" where a statement is complete (a trigger's
    body holds semicolons of its own)."""
    out, buf = [], ""
    for piece in script.split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \n;"):
                out.append(buf)
            buf = ""
    if buf.strip(" \n;"):
        out.append(buf)
    return out
