"""The PostgreSQL store's standing records: "always" rules, scheduled jobs, tool processes."""

from __future__ import annotations

import time

from bot.core.events import ConvKey
from bot.store import JobRow, RuleRow, new_id
from bot.store.postgres_base import Row, conv_key
from bot.store.postgres_ledger import PostgresLedger


def _job(r: Row) -> JobRow:
    return JobRow(r[0], r[1], conv_key(r, 2), r[5], r[6], r[7], r[8], r[9], r[10], r[11])


class PostgresStanding(PostgresLedger):
    # -- rules ------------------------------------------------------------------------

    async def add_rule(self, conv_id: int, tool: str, key: str, *, author: str = "",
                       author_name: str = "", session: int | None = None, user: str = "",
                       expires_at: float | None = None) -> None:
        await self._count(
            "WITH gone AS (DELETE FROM rules WHERE conv_id=%s AND tool=%s AND key=%s AND"
            " user_id=%s AND session IS NOT DISTINCT FROM %s::integer)"
            " INSERT INTO rules (id, conv_id, tool, key, created_at, session, user_id, author,"
            " author_name, expires_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
            (conv_id, tool, key, user, session, new_id(), conv_id, tool, key, time.time(),
             session, user, author, author_name, expires_at))

    async def has_rule(self, conv_id: int, tool: str, key: str, *, session: int = 0,
                       user: str = "", now: float | None = None) -> bool:
        return await self._row(
            "SELECT 1 FROM rules WHERE conv_id=%s AND tool=%s AND key=%s AND (session IS NULL"
            " OR session=%s) AND (user_id='' OR user_id=%s) AND (expires_at IS NULL OR"
            " expires_at>%s)",
            (conv_id, tool, key, session, user, time.time() if now is None else now)
        ) is not None

    async def rules(self, conv_id: int, *, session: int | None = None,
                    now: float | None = None) -> list[RuleRow]:
        return [RuleRow(*r) for r in await self._rows(
            "SELECT id, conv_id, tool, key, created_at, session, user_id, author, expires_at,"
            " author_name"
            " FROM rules WHERE conv_id=%s AND (session IS NULL OR session=%s::integer) AND"
            " (expires_at IS NULL OR expires_at>%s) ORDER BY created_at, seq",
            (conv_id, session, time.time() if now is None else now))]

    async def delete_rule(self, conv_id: int, rule_id: str) -> bool:
        return await self._count("DELETE FROM rules WHERE conv_id=%s AND id=%s",
                                 (conv_id, rule_id)) == 1

    # -- jobs -------------------------------------------------------------------------

    _JOB_SQL = ("SELECT j.id, j.conv_id, c.platform, c.chat_id, c.thread_id, j.spec, j.kind,"
                " j.prompt, j.created_by, j.last_slot, j.active, j.anchor FROM jobs j"
                " JOIN conversations c ON c.id = j.conv_id")

    async def add_job(self, row: JobRow) -> None:
        await self._count(
            "INSERT INTO jobs (id, conv_id, spec, kind, anchor, prompt, created_by, last_slot,"
            " active, created_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
            (row.id, row.conv_id, row.spec, row.kind, row.anchor, row.prompt, row.created_by,
             row.last_slot, row.active, time.time()))

    async def jobs(self, conv_id: int | None = None) -> list[JobRow]:
        if conv_id is None:
            rows = await self._rows(self._JOB_SQL + " WHERE j.active"
                                    " ORDER BY j.created_at, j.seq")
        else:
            rows = await self._rows(self._JOB_SQL + " WHERE j.active AND j.conv_id=%s"
                                    " ORDER BY j.created_at, j.seq", (conv_id,))
        return [_job(r) for r in rows]

    async def job(self, job_id: str) -> JobRow | None:
        row = await self._row(self._JOB_SQL + " WHERE j.id=%s", (job_id,))
        return None if row is None else _job(row)

    async def claim_slot(self, job_id: str, slot: float, ref: str, conv: ConvKey,
                         payload: str, *, last: bool = False) -> bool:
        """Claim the run for `slot` and record its inbound, in one commit.

        False if this slot (or a later one) was already claimed, so a slot never runs
        twice, also after a crash mid-run. A second claimer waits for the first one's
        row lock and then sees its `last_slot`. `last` retires a one-shot job.
        """
        async with self._tx() as conn:
            claimed = (await conn.execute(
                "UPDATE jobs SET last_slot=%s, active=%s WHERE id=%s AND active AND"
                " (last_slot IS NULL OR last_slot < %s)",
                (slot, not last, job_id, slot))).rowcount == 1
            if claimed:
                await conn.execute(
                    "INSERT INTO inbound (ref, conv, kind, payload, done, received_at)"
                    " VALUES (%s,%s,'trigger',%s,FALSE,%s) ON CONFLICT DO NOTHING",
                    (ref, str(conv), payload, time.time()))
            return claimed

    async def deactivate_job(self, job_id: str) -> bool:
        return await self._count("UPDATE jobs SET active=FALSE WHERE id=%s AND active",
                                 (job_id,)) == 1

    # -- tool processes ---------------------------------------------------------------

    async def track_process(self, pid: int, owner: str = "") -> None:
        await self._count(
            "INSERT INTO processes (owner, pid, started_at) VALUES (%s,%s,%s)"
            " ON CONFLICT (owner, pid) DO UPDATE SET started_at=excluded.started_at",
            (owner, pid, time.time()))

    async def untrack_process(self, pid: int, owner: str = "") -> None:
        await self._count("DELETE FROM processes WHERE owner=%s AND pid=%s", (owner, pid))

    async def tracked_processes(self, owner: str = "") -> list[int]:
        return [int(r[0]) for r in await self._rows(
            "SELECT pid FROM processes WHERE owner=%s ORDER BY pid", (owner,))]

    async def forget_processes(self, owner: str = "") -> None:
        await self._count("DELETE FROM processes WHERE owner=%s", (owner,))
