"""The SQLite store (aiosqlite, WAL).

Each public method is one round trip to aiosqlite's worker thread: a multi-statement
change runs there as one function inside `BEGIN IMMEDIATE ... COMMIT`, so it is atomic
and costs one thread hop. The connection is always closed (`close()`), since
aiosqlite's worker thread would otherwise keep the interpreter alive.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from bot.errors import StoreError
from bot.events import ConvKey
from bot.history import CallState, Msg, Outcome, calls_from_json, calls_to_json
from bot.store import ApprovalRow, CallRow, ConvRow, JobRow, RuleRow, TurnRow, Usage

T = TypeVar("T")

MIGRATIONS: list[str] = [
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY, platform TEXT NOT NULL, chat_id TEXT NOT NULL,
        thread_id TEXT NOT NULL DEFAULT '', session INTEGER NOT NULL DEFAULT 1,
        prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
        cost REAL NOT NULL DEFAULT 0, created_at REAL NOT NULL,
        UNIQUE (platform, chat_id, thread_id));
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY, conv_id INTEGER NOT NULL REFERENCES conversations(id),
        session INTEGER NOT NULL, turn INTEGER NOT NULL, role TEXT NOT NULL,
        content TEXT NOT NULL, tool_calls TEXT, tool_call_id TEXT, name TEXT,
        created_at REAL NOT NULL);
    CREATE INDEX messages_by_conv ON messages (conv_id, session, id);
    CREATE TABLE turns (
        conv_id INTEGER NOT NULL, turn INTEGER NOT NULL, session INTEGER NOT NULL,
        status TEXT NOT NULL, steps INTEGER NOT NULL DEFAULT 0, requester TEXT NOT NULL,
        unattended INTEGER NOT NULL DEFAULT 0, reason TEXT, started_at REAL NOT NULL,
        PRIMARY KEY (conv_id, turn));
    CREATE TABLE tool_calls (
        conv_id INTEGER NOT NULL, call_id TEXT NOT NULL, turn INTEGER NOT NULL,
        name TEXT NOT NULL, arguments TEXT NOT NULL, state TEXT NOT NULL, outcome TEXT,
        updated_at REAL NOT NULL, PRIMARY KEY (conv_id, call_id));
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY, conv_id INTEGER NOT NULL, call_id TEXT NOT NULL,
        tool TEXT NOT NULL, summary TEXT NOT NULL, requester TEXT NOT NULL,
        status TEXT NOT NULL, decided_by TEXT, created_at REAL NOT NULL,
        expires_at REAL NOT NULL);
    CREATE INDEX approvals_pending ON approvals (status, conv_id);
    CREATE TABLE rules (
        id TEXT PRIMARY KEY, conv_id INTEGER NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
        created_at REAL NOT NULL, UNIQUE (conv_id, tool, key));
    CREATE TABLE inbound (
        ref TEXT PRIMARY KEY, conv TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
        done INTEGER NOT NULL DEFAULT 0, received_at REAL NOT NULL);
    CREATE INDEX inbound_open ON inbound (done) WHERE done = 0;
    """,
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY, conv_id INTEGER NOT NULL, spec TEXT NOT NULL, kind TEXT NOT NULL,
        anchor REAL NOT NULL, prompt TEXT NOT NULL, created_by TEXT NOT NULL, last_slot REAL,
        active INTEGER NOT NULL DEFAULT 1, created_at REAL NOT NULL);
    CREATE TABLE processes (pid INTEGER PRIMARY KEY, started_at REAL NOT NULL);
    """,
]


def _key(row: sqlite3.Row | tuple[Any, ...], offset: int = 0) -> ConvKey:
    platform, chat, thread = row[offset], row[offset + 1], row[offset + 2]
    return ConvKey(platform, chat, thread or None)


def _msg(row: tuple[Any, ...]) -> Msg:
    row_id, turn, role, content, calls, call_id, name = row
    return Msg(role, content, turn, calls_from_json(calls), call_id, name, row_id)


def short_id() -> str:
    return uuid.uuid4().hex[:12]


def _insert_msg(db: sqlite3.Connection, conv_id: int, session: int, m: Msg, now: float) -> Msg:
    cur = db.execute(
        "INSERT INTO messages (conv_id, session, turn, role, content, tool_calls, tool_call_id,"
        " name, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
        (conv_id, session, m.turn, m.role, m.content, calls_to_json(m.tool_calls),
         m.tool_call_id, m.name, now))
    assert cur.lastrowid is not None
    return m.with_id(cur.lastrowid)


def _insert_step(db: sqlite3.Connection, conv_id: int, session: int, msg: Msg, steps: int,
                 usage: Usage | None, now: float) -> Msg:
    """A model step: the message, its tool calls (PENDING), the step count and usage."""
    if usage is not None:
        db.execute(
            "UPDATE conversations SET prompt_tokens = prompt_tokens + ?,"
            " completion_tokens = completion_tokens + ?, cost = cost + ? WHERE id=?",
            (*usage, conv_id))
    stored = _insert_msg(db, conv_id, session, msg, now)
    db.executemany(
        "INSERT INTO tool_calls (conv_id, call_id, turn, name, arguments, state,"
        " updated_at) VALUES (?,?,?,?,?,?,?)",
        [(conv_id, c.id, msg.turn, c.name, c.arguments, CallState.PENDING.value, now)
         for c in msg.tool_calls])
    db.execute("UPDATE turns SET steps=? WHERE conv_id=? AND turn=?",
               (steps, conv_id, msg.turn))
    return stored


class SQLiteStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db: aiosqlite.Connection | None = None

    # -- plumbing ---------------------------------------------------------------------

    async def open(self) -> None:
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = await aiosqlite.connect(self.path, isolation_level=None)
            await self._run(self._setup)
        except (sqlite3.Error, OSError) as exc:
            await self.close()
            raise StoreError(f"cannot open the database {self.path}: {exc}") from exc

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

    async def __aenter__(self) -> SQLiteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` on the connection in aiosqlite's worker thread (one hop)."""
        if self._db is None:
            raise StoreError("the store is closed")
        conn = self._db
        try:
            result: T = await conn._execute(lambda: fn(conn._conn))  # type: ignore[no-untyped-call]
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc
        return result

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
                for statement in script.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={number}")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    async def integrity_check(self) -> str:
        return await self._run(lambda db: str(db.execute("PRAGMA integrity_check").fetchone()[0]))

    # -- conversations ----------------------------------------------------------------

    async def conversation(self, key: ConvKey) -> ConvRow:
        def fn(db: sqlite3.Connection) -> ConvRow:
            args = (key.platform, key.chat_id, key.thread_id or "")
            db.execute("INSERT OR IGNORE INTO conversations (platform, chat_id, thread_id,"
                       " created_at) VALUES (?,?,?,?)", (*args, time.time()))
            row = db.execute(
                "SELECT id, session, prompt_tokens, completion_tokens, cost FROM conversations"
                " WHERE platform=? AND chat_id=? AND thread_id=?", args).fetchone()
            return ConvRow(row[0], key, row[1], row[2], row[3], row[4])

        return await self._run(fn)

    async def conversation_by_id(self, conv_id: int) -> ConvRow | None:
        def fn(db: sqlite3.Connection) -> ConvRow | None:
            row = db.execute(
                "SELECT platform, chat_id, thread_id, id, session, prompt_tokens,"
                " completion_tokens, cost FROM conversations WHERE id=?", (conv_id,)).fetchone()
            return None if row is None else ConvRow(row[3], _key(row), *row[4:])

        return await self._run(fn)

    async def new_session(self, conv_id: int) -> int:
        def fn(db: sqlite3.Connection) -> int:
            db.execute("UPDATE conversations SET session = session + 1 WHERE id=?", (conv_id,))
            return int(db.execute("SELECT session FROM conversations WHERE id=?",
                                  (conv_id,)).fetchone()[0])

        return await self._tx(fn)

    async def add_usage(self, conv_id: int, prompt: int, completion: int, cost: float) -> None:
        await self._run(lambda db: db.execute(
            "UPDATE conversations SET prompt_tokens = prompt_tokens + ?, completion_tokens ="
            " completion_tokens + ?, cost = cost + ? WHERE id=?",
            (prompt, completion, cost, conv_id)))

    # -- history and turns ------------------------------------------------------------

    async def history(self, conv_id: int, session: int) -> list[Msg]:
        def fn(db: sqlite3.Connection) -> list[Msg]:
            rows = db.execute(
                "SELECT id, turn, role, content, tool_calls, tool_call_id, name FROM messages"
                " WHERE conv_id=? AND session=? ORDER BY id", (conv_id, session)).fetchall()
            return [_msg(r) for r in rows]

        return await self._run(fn)

    async def last_turn(self, conv_id: int, session: int) -> TurnRow | None:
        def fn(db: sqlite3.Connection) -> TurnRow | None:
            row = db.execute(
                "SELECT turn, status, steps, requester, unattended, reason FROM turns"
                " WHERE conv_id=? AND session=? ORDER BY turn DESC LIMIT 1",
                (conv_id, session)).fetchone()
            return None if row is None else TurnRow(row[0], row[1], row[2], row[3],
                                                    bool(row[4]), row[5])

        return await self._run(fn)

    async def turn_calls(self, conv_id: int, turn: int) -> list[CallRow]:
        from bot.history import ToolCall

        def fn(db: sqlite3.Connection) -> list[CallRow]:
            rows = db.execute(
                "SELECT call_id, name, arguments, turn, state, outcome FROM tool_calls"
                " WHERE conv_id=? AND turn=? ORDER BY rowid", (conv_id, turn)).fetchall()
            return [CallRow(ToolCall(r[0], r[1], r[2]), r[3], CallState(r[4]),
                            Outcome(r[5]) if r[5] else None) for r in rows]

        return await self._run(fn)

    async def accept_inbound(self, ref: str, conv: ConvKey, kind: str, payload: str) -> bool:
        """Record an inbound id; False if it was seen before. Messages and triggers stay
        open until their turn begins, so a crash in between replays them at start."""
        done = 0 if kind in ("message", "trigger") else 1

        def fn(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "INSERT OR IGNORE INTO inbound (ref, conv, kind, payload, done, received_at)"
                " VALUES (?,?,?,?,?,?)", (ref, str(conv), kind, payload, done, time.time()))
            return cur.rowcount == 1

        return await self._run(fn)

    async def unprocessed_inbound(self) -> list[tuple[str, str, str]]:
        return await self._run(lambda db: [tuple(r) for r in db.execute(
            "SELECT ref, kind, payload FROM inbound WHERE done=0 ORDER BY received_at")])

    async def mark_inbound_done(self, refs: Sequence[str]) -> None:
        await self._run(lambda db: db.executemany(
            "UPDATE inbound SET done=1 WHERE ref=?", [(r,) for r in refs]))

    async def begin_turn(self, conv_id: int, session: int, messages: Sequence[Msg],
                         requester: str, unattended: bool, refs: Sequence[str]) -> list[Msg]:
        def fn(db: sqlite3.Connection) -> list[Msg]:
            now = time.time()
            stored = [_insert_msg(db, conv_id, session, m, now) for m in messages]
            db.execute(
                "INSERT OR REPLACE INTO turns (conv_id, turn, session, status, steps, requester,"
                " unattended, started_at) VALUES (?,?,?,?,?,?,?,?)",
                (conv_id, messages[0].turn, session, "running", 0, requester, int(unattended),
                 now))
            if refs:
                db.executemany("UPDATE inbound SET done=1 WHERE ref=?", [(r,) for r in refs])
            return stored

        return await self._tx(fn)

    async def append_assistant(self, conv_id: int, session: int, msg: Msg, steps: int,
                               usage: Usage | None = None) -> Msg:
        """The model's step, its tool calls (PENDING) and its token usage, in one commit."""
        return await self._tx(
            lambda db: _insert_step(db, conv_id, session, msg, steps, usage, time.time()))

    async def set_call(self, conv_id: int, call_id: str, state: CallState,
                       outcome: Outcome | None = None, result: Msg | None = None,
                       session: int = 0) -> Msg | None:
        def fn(db: sqlite3.Connection) -> Msg | None:
            now = time.time()
            db.execute("UPDATE tool_calls SET state=?, outcome=?, updated_at=?"
                       " WHERE conv_id=? AND call_id=?",
                       (state.value, outcome.value if outcome else None, now, conv_id, call_id))
            return None if result is None else _insert_msg(db, conv_id, session, result, now)

        if result is None:
            return await self._run(fn)
        return await self._tx(fn)

    async def end_turn(self, conv_id: int, turn: int, status: str, reason: str | None,
                       last: Msg | None = None, session: int = 0, *,
                       step: tuple[int, Usage | None] | None = None) -> Msg | None:
        """End the turn; `last` (a partial answer, or with `step` the model's final step,
        its step count and usage) is stored in the same commit. Returns it as stored."""
        def fn(db: sqlite3.Connection) -> Msg | None:
            stored = None
            if last is not None and step is not None:
                stored = _insert_step(db, conv_id, session, last, *step, time.time())
            elif last is not None:
                stored = _insert_msg(db, conv_id, session, last, time.time())
            db.execute("UPDATE turns SET status=?, reason=? WHERE conv_id=? AND turn=?",
                       (status, reason, conv_id, turn))
            return stored

        return await (self._run(fn) if last is None else self._tx(fn))

    async def open_turns(self) -> list[tuple[int, int]]:
        """(conv_id, turn) of turns that were running when the process stopped."""
        return await self._run(lambda db: [(r[0], r[1]) for r in db.execute(
            "SELECT conv_id, turn FROM turns WHERE status='running'")])

    # -- approvals and rules ----------------------------------------------------------

    _APPROVAL_COLS = ("id, conv_id, call_id, tool, summary, requester, status, created_at,"
                      " expires_at, decided_by")

    async def add_approval(self, row: ApprovalRow) -> None:
        await self._run(lambda db: db.execute(
            f"INSERT INTO approvals ({self._APPROVAL_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (row.id, row.conv_id, row.call_id, row.tool, row.summary, row.requester,
             row.status, row.created_at, row.expires_at, row.decided_by)))

    async def approval(self, approval_id: str) -> ApprovalRow | None:
        def fn(db: sqlite3.Connection) -> ApprovalRow | None:
            row = db.execute(f"SELECT {self._APPROVAL_COLS} FROM approvals WHERE id=?",
                             (approval_id,)).fetchone()
            return None if row is None else ApprovalRow(*row)

        return await self._run(fn)

    async def approval_for_call(self, conv_id: int, call_id: str) -> ApprovalRow | None:
        def fn(db: sqlite3.Connection) -> ApprovalRow | None:
            row = db.execute(f"SELECT {self._APPROVAL_COLS} FROM approvals WHERE conv_id=? AND"
                             " call_id=? ORDER BY created_at DESC", (conv_id, call_id)).fetchone()
            return None if row is None else ApprovalRow(*row)

        return await self._run(fn)

    async def decide(self, approval_id: str, status: str, by: str | None) -> bool:
        """Move a pending approval to `status`; False when it was already decided."""
        def fn(db: sqlite3.Connection) -> bool:
            cur = db.execute("UPDATE approvals SET status=?, decided_by=? WHERE id=? AND"
                             " status='pending'", (status, by, approval_id))
            return cur.rowcount == 1

        return await self._run(fn)

    async def pending_approvals(self, conv_id: int | None = None) -> list[ApprovalRow]:
        def fn(db: sqlite3.Connection) -> list[ApprovalRow]:
            sql = f"SELECT {self._APPROVAL_COLS} FROM approvals WHERE status='pending'"
            args: tuple[Any, ...] = ()
            if conv_id is not None:
                sql += " AND conv_id=?"
                args = (conv_id,)
            return [ApprovalRow(*r) for r in db.execute(sql + " ORDER BY created_at", args)]

        return await self._run(fn)

    async def add_rule(self, conv_id: int, tool: str, key: str) -> None:
        await self._run(lambda db: db.execute(
            "INSERT OR IGNORE INTO rules (id, conv_id, tool, key, created_at) VALUES (?,?,?,?,?)",
            (short_id(), conv_id, tool, key, time.time())))

    async def has_rule(self, conv_id: int, tool: str, key: str) -> bool:
        return await self._run(lambda db: db.execute(
            "SELECT 1 FROM rules WHERE conv_id=? AND tool=? AND key=?",
            (conv_id, tool, key)).fetchone() is not None)

    async def rules(self, conv_id: int) -> list[RuleRow]:
        return await self._run(lambda db: [RuleRow(*r) for r in db.execute(
            "SELECT id, conv_id, tool, key FROM rules WHERE conv_id=? ORDER BY created_at",
            (conv_id,))])

    async def delete_rule(self, conv_id: int, rule_id: str) -> bool:
        return await self._run(lambda db: db.execute(
            "DELETE FROM rules WHERE conv_id=? AND id=?", (conv_id, rule_id)).rowcount == 1)

    # -- jobs -------------------------------------------------------------------------

    _JOB_SQL = ("SELECT j.id, j.conv_id, c.platform, c.chat_id, c.thread_id, j.spec, j.kind,"
                " j.prompt, j.created_by, j.last_slot, j.active, j.anchor FROM jobs j"
                " JOIN conversations c ON c.id = j.conv_id")

    @staticmethod
    def _job(r: tuple[Any, ...]) -> JobRow:
        return JobRow(r[0], r[1], _key(r, 2), r[5], r[6], r[7], r[8], r[9], bool(r[10]), r[11])

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

    async def track_process(self, pid: int) -> None:
        await self._run(lambda db: db.execute(
            "INSERT OR REPLACE INTO processes (pid, started_at) VALUES (?,?)", (pid, time.time())))

    async def untrack_process(self, pid: int) -> None:
        await self._run(lambda db: db.execute("DELETE FROM processes WHERE pid=?", (pid,)))

    async def tracked_processes(self) -> list[int]:
        return await self._run(lambda db: [r[0] for r in db.execute("SELECT pid FROM processes")])

    async def forget_processes(self) -> None:
        await self._run(lambda db: db.execute("DELETE FROM processes"))
