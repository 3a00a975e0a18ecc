"""The SQLite store's ledgers: the audit log (append-only) and the spending of each day."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from bot.store import AuditRow, Spent
from bot.store.sqlite_base import SQLiteBase


class SQLiteLedger(SQLiteBase):
    async def append_audit(self, rows: Sequence[AuditRow]) -> None:
        values = [(r.at, r.kind, r.conv, r.actor, r.tool, r.detail) for r in rows]
        await self._tx(lambda db: db.executemany(
            "INSERT INTO audit (at, kind, conv, actor, tool, detail) VALUES (?,?,?,?,?,?)",
            values))

    async def audit(self, *, since: float | None = None, conv: str | None = None,
                    limit: int = 1000) -> list[AuditRow]:
        def fn(db: sqlite3.Connection) -> list[AuditRow]:
            rows = db.execute(
                "SELECT at, kind, conv, actor, tool, detail, id FROM audit"
                " WHERE (? IS NULL OR at >= ?) AND (? IS NULL OR conv = ?)"
                " ORDER BY id DESC LIMIT ?", (since, since, conv, conv, limit)).fetchall()
            return [AuditRow(*r) for r in reversed(rows)]

        return await self._run(fn)

    async def prune_audit(self, before: float) -> int:
        return await self._tx(lambda db: db.execute(
            "DELETE FROM audit WHERE at < ?", (before,)).rowcount)

    async def add_spend(self, day: str, scopes: Sequence[str], tokens: int,
                        cost: float) -> None:
        await self._tx(lambda db: db.executemany(
            "INSERT INTO spend (day, scope, tokens, cost) VALUES (?,?,?,?)"
            " ON CONFLICT (day, scope) DO UPDATE SET tokens = tokens + excluded.tokens,"
            " cost = cost + excluded.cost", [(day, s, tokens, cost) for s in scopes]))

    async def spent(self, day: str, scopes: Sequence[str]) -> dict[str, Spent]:
        marks = ",".join("?" * len(scopes))
        sql = f"SELECT scope, tokens, cost, lifted FROM spend WHERE day=? AND scope IN ({marks})"
        return await self._run(lambda db: {
            r[0]: Spent(r[1], r[2], bool(r[3])) for r in db.execute(sql, (day, *scopes))})

    async def lift_budget(self, day: str, scope: str) -> None:
        await self._tx(lambda db: db.execute(
            "INSERT INTO spend (day, scope, lifted) VALUES (?,?,1)"
            " ON CONFLICT (day, scope) DO UPDATE SET lifted = 1", (day, scope)))
