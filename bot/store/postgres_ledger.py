"""The PostgreSQL store's ledgers: the audit log (append-only) and the spending of each day."""

from __future__ import annotations

from collections.abc import Sequence

from bot.store import AuditRow, Spent
from bot.store.postgres_base import PostgresBase


class PostgresLedger(PostgresBase):
    async def append_audit(self, rows: Sequence[AuditRow]) -> None:
        async with self._connection() as conn, conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO audit (at, kind, conv, actor, tool, detail)"
                " VALUES (%s,%s,%s,%s,%s,%s)",
                [(r.at, r.kind, r.conv, r.actor, r.tool, r.detail) for r in rows])

    async def audit(self, *, since: float | None = None, conv: str | None = None,
                    limit: int = 1000) -> list[AuditRow]:
        rows = await self._rows(
            "SELECT at, kind, conv, actor, tool, detail, id FROM audit"
            " WHERE (%s::float8 IS NULL OR at >= %s) AND (%s::text IS NULL OR conv = %s)"
            " ORDER BY id DESC LIMIT %s", (since, since, conv, conv, limit))
        return [AuditRow(*r) for r in reversed(rows)]

    async def prune_audit(self, before: float) -> int:
        return await self._count("DELETE FROM audit WHERE at < %s", (before,))

    async def add_spend(self, day: str, scopes: Sequence[str], tokens: int,
                        cost: float) -> None:
        async with self._connection() as conn, conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO spend (day, scope, tokens, cost) VALUES (%s,%s,%s,%s)"
                " ON CONFLICT (day, scope) DO UPDATE SET tokens = spend.tokens + excluded.tokens,"
                " cost = spend.cost + excluded.cost", [(day, s, tokens, cost) for s in scopes])

    async def spent(self, day: str, scopes: Sequence[str]) -> dict[str, Spent]:
        rows = await self._rows("SELECT scope, tokens, cost, lifted FROM spend"
                                " WHERE day = %s AND scope = ANY(%s)", (day, list(scopes)))
        return {r[0]: Spent(int(r[1]), float(r[2]), bool(r[3])) for r in rows}

    async def lift_budget(self, day: str, scope: str) -> None:
        await self._count("INSERT INTO spend (day, scope, lifted) VALUES (%s,%s,TRUE)"
                          " ON CONFLICT (day, scope) DO UPDATE SET lifted = TRUE", (day, scope))
