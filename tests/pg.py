"""PostgreSQL for tests: throwaway databases on the server named by `TANDEM_TEST_PG`.

The server is required, not optional: when it cannot be reached, every test that needs
it fails, saying which URL it tried and how to point the tests at another one.
`database()` makes a database and drops it after; `SessionDatabase` makes one for the
whole test session the first time a test asks. In it, tests share one migrated schema,
emptied for each test (a few ms with `DELETE`, where `TRUNCATE` or a migrated schema
per test took about 0.1 s each: DDL waits for the disk), or take a schema of their own.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from bot.store.postgres_base import migrate, redact
from bot.store.postgres_schema import TABLES

ADMIN_URL = os.environ.get("TANDEM_TEST_PG", "postgresql://127.0.0.1:5432/test")
"""A database on the test server where this user may CREATE DATABASE."""


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name` instead."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def with_schema(url: str, schema: str, *settings: str) -> str:
    """`url` whose connections see only `schema` (its tables are created there), with
    server `settings` such as "default_transaction_isolation=serializable"."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
    query.append(("options", " ".join(f"-c {s}" for s in (f"search_path={schema}",
                                                          *settings))))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def _admin(url: str) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {redact(url)} ({exc}).\nThe PostgreSQL tests"
            " need a server where this user may create databases: start one, or set"
            " TANDEM_TEST_PG=postgresql://user:password@host:port/dbname", pytrace=False)


@contextmanager
def database(admin_url: str = ADMIN_URL) -> Iterator[str]:
    """A new, empty database `tandem_test_<hex>`; yields its URL, drops it on leaving."""
    name = f"tandem_test_{secrets.token_hex(6)}"
    with _admin(admin_url) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(admin_url, name)
    finally:
        with _admin(admin_url) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


class SessionDatabase:
    """One database for the test session, made when a test first asks for it (so a run
    that never touches PostgreSQL needs no server) and dropped by `drop()`."""

    def __init__(self, admin_url: str = ADMIN_URL) -> None:
        self.admin_url = admin_url
        self._stack = ExitStack()
        self._url: str | None = None
        self._failure: str | None = None
        self._shared: str | None = None
        self._cleaned: set[str] = set()

    def url(self) -> str:
        if self._failure is not None:  # fail every test at once, not after a timeout each
            pytest.fail(self._failure, pytrace=False)
        if self._url is None:
            try:
                self._url = self._stack.enter_context(database(self.admin_url))
            except pytest.fail.Exception as exc:
                self._failure = str(exc.msg)
                raise
        return self._url

    async def schema(self, name: str, *settings: str) -> str:
        """The URL of schema `name` in the session database, made if missing (with server
        `settings`, as `with_schema`)."""
        url = self.url()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(name)))
        return with_schema(url, name, *settings)

    async def shared(self, key: str) -> str:
        """The URL of the shared schema, emptied the first time `key` (a test's own) asks,
        so a test starts from nothing and a store it reopens finds its data."""
        if self._shared is None:
            self._shared = await self.schema("contract")
            await migrate(self._shared)
        if key not in self._cleaned:
            self._cleaned.add(key)
            async with await psycopg.AsyncConnection.connect(self._shared) as conn:
                for table in reversed(TABLES):  # messages before their conversations
                    if table != "schema_version":  # the audit log refuses DELETE
                        verb = "TRUNCATE" if table == "audit" else "DELETE FROM"
                        await conn.execute(sql.SQL(verb + " {}").format(
                            sql.Identifier(table)))
        return self._shared

    def drop(self) -> None:
        self._stack.close()
