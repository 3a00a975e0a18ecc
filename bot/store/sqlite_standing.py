"""The SQLite store's standing records: "always" rules, scheduled jobs, tool processes."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from bot.core.events import ConvKey
from bot.store import JobRow, RuleRow, new_id
from bot.store.sqlite_base import conv_key
from bot.store.sqlite_ledger import SQLiteLedger


class SQLiteStanding(SQLiteLedger):
    # -- rules ------------------------------------------------------------------------

    async def add_rule(self, conv_id: int, tool: str, key: str, *, author: str = "",
                       author_name: str = "", session: int | None = None, user: str = "",
                       expires_at: float | None = None) -> None:
        def add(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM rules WHERE conv_id=? AND tool=? AND key=? AND user_id=?"
                       " AND session IS ?", (conv_id, tool, key, user, session))
            db.execute("INSERT INTO rules (id, conv_id, tool, key, created_at, session, user_id,"
                       " author, author_name, expires_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                       (new_id(), conv_id, tool, key, time.time(), session, user, author,
                        author_name, expires_at))

        await self._run(add)

    async def has_rule(self, conv_id: int, tool: str, key: str, *, session: int = 0,
                       user: str = "", now: float | None = None) -> bool:
        return await self._run(lambda db: db.execute(
            "SELECT 1 FROM rules WHERE conv_id=? AND tool=? AND key=? AND (session IS NULL OR"
            " session=?) AND (user_id='' OR user_id=?) AND (expires_at IS NULL OR expires_at>?)",
            (conv_id, tool, key, session, user, time.time() if now is None else now)
        ).fetchone() is not None)

    async def rules(self, conv_id: int, *, session: int | None = None,
                    now: float | None = None) -> list[RuleRow]:
        return await self._run(lambda db: [RuleRow(*r) for r in db.execute(
            "SELECT id, conv_id, tool, key, created_at, session, user_id, author, expires_at,"
            " author_name"
            " FROM rules WHERE conv_id=? AND (session IS NULL OR session=?) AND"
            " (expires_at IS NULL OR expires_at>?) ORDER BY created_at, rowid",
            (conv_id, session, time.time() if now is None else now))])

    async def delete_rule(self, conv_id: int, rule_id: str) -> bool:
        return await self._run(lambda db: db.execute(
            "DELETE FROM rules WHERE conv_id=? AND id=?", (conv_id, rule_id)).rowcount == 1)

    # -- jobs -------------------------------------------------------------------------

    _JOB_SQL = ("SELECT j.id, j.conv_id, c.platform, c.chat_id, c.thread_id, j.spec, j.kind,"
                " j.prompt, j.created_by, j.last_slot, j.active, j.anchor FROM jobs j"
                " JOIN conversations c ON c.id = j.conv_id")

    @staticmethod
    def _job(r: tuple[Any, ...]) -> JobRow:
        return JobRow(r[0], r[1], conv_key(r, 2), r[5], r[6], r[7], r[8], r[9], bool(r[10]), r[11])

    async def add_job(self, row: JobRow) -> None:
        await self._run(lambda db: db.execute(
            "INSERT INTO jobs (id, conv_id, spec, kind, anchor, prompt, created_by, last_slot,"
            " active, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (row.id, row.conv_id, row.spec, row.kind, row.anchor, row.prompt, row.created_by,
             row.last_slot, int(row.active), time.time())))

    async def jobs(self, conv_id: int | None = None) -> list[JobRow]:
        def fn(db: sqlite3.Connection) -> list[JobRow]:
            if conv_id is None:
                rows = db.execute(self._JOB_SQL + " WHERE j.active=1 ORDER BY j.created_at")
            else:
                rows = db.execute(self._JOB_SQL + " WHERE j.active=1 AND j.conv_id=?"
                                  " ORDER BY j.created_at", (conv_id,))
            return [self._job(r) for r in rows]

        return await self._run(fn)

    async def job(self, job_id: str) -> JobRow | None:
        def fn(db: sqlite3.Connection) -> JobRow | None:
            row = db.execute(self._JOB_SQL + " WHERE j.id=?", (job_id,)).fetchone()
            return None if row is None else self._job(row)

        return await self._run(fn)

    async def claim_slot(self, job_id: str, slot: float, ref: str, conv: ConvKey,
                         payload: str, *, last: bool = False) -> bool:
        """Claim the run for `slot` and record its inbound, in one commit.

        False if this slot (or a later one) was already claimed, so a slot never runs
        twice, also after a crash mid-run. `last` retires a one-shot job.
        """
        def fn(db: sqlite3.Connection) -> bool:
            claimed = db.execute(
                "UPDATE jobs SET last_slot=?, active=? WHERE id=? AND active=1 AND"
                " (last_slot IS NULL OR last_slot < ?)",
                (slot, 0 if last else 1, job_id, slot)).rowcount == 1
            if claimed:
                db.execute("INSERT OR IGNORE INTO inbound (ref, conv, kind, payload, done,"
                           " received_at) VALUES (?,?,?,?,0,?)",
                           (ref, str(conv), "trigger", payload, time.time()))
            return claimed

        return await self._tx(fn)

    async def deactivate_job(self, job_id: str) -> bool:
        return await self._run(lambda db: db.execute(
            "UPDATE jobs SET active=0 WHERE id=? AND active=1", (job_id,)).rowcount == 1)

    # -- tool processes ---------------------------------------------------------------

    async def track_process(self, pid: int, owner: str = "") -> None:
        await self._run(lambda db: db.execute(
            "INSERT OR REPLACE INTO processes (pid, owner, started_at) VALUES (?,?,?)",
            (pid, owner, time.time())))

    async def untrack_process(self, pid: int, owner: str = "") -> None:
        await self._run(lambda db: db.execute("DELETE FROM processes WHERE pid=? AND owner=?",
                                              (pid, owner)))

    async def tracked_processes(self, owner: str = "") -> list[int]:
        return await self._run(lambda db: [r[0] for r in db.execute(
            "SELECT pid FROM processes WHERE owner=? ORDER BY pid", (owner,))])

    async def forget_processes(self, owner: str = "") -> None:
        await self._run(lambda db: db.execute("DELETE FROM processes WHERE owner=?", (owner,)))
