"""The SQLite store (aiosqlite, WAL): the embedded default behind `bot.store.Store`.

The plumbing (one thread hop per call, transactions, migrations) is in
`sqlite_base`; rules, jobs and tool processes in `sqlite_standing`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from bot.core.events import ConvKey
from bot.core.history import (
    CallState,
    Msg,
    Outcome,
    ToolCall,
    calls_from_json,
    calls_to_json,
    media_from_json,
    media_to_json,
)
from bot.store import (
    OPEN_KINDS,
    ApprovalRow,
    CallRow,
    ConvRow,
    TurnRow,
    Usage,
)
from bot.store.sqlite_base import conv_key
from bot.store.sqlite_choices import SQLiteChoices
from bot.store.sqlite_standing import SQLiteStanding
from bot.store.sqlite_talk import SQLiteTalk

T = TypeVar("T")



def _msg(row: tuple[Any, ...]) -> Msg:
    row_id, turn, role, content, calls, call_id, name, media = row
    return Msg(role, content, turn, calls_from_json(calls), call_id, name, row_id,
               media=media_from_json(media))


def _call(r: tuple[Any, ...]) -> CallRow:
    call_id, name, arguments, turn, state, outcome = r
    return CallRow(ToolCall(call_id, name, arguments), turn, CallState(state),
                   Outcome(outcome) if outcome else None)


def _turn(r: tuple[Any, ...]) -> TurnRow:
    conv_id, session, turn, status, steps, requester, unattended, reason, unshown, live = r
    return TurnRow(conv_id, session, turn, status, steps, requester, bool(unattended), reason,
                   unshown, live)


_CALL_COLS = "call_id, name, arguments, turn, state, outcome"
_TURN_COLS = "conv_id, session, turn, status, steps, requester, unattended, reason, unshown, live"


def _insert_msg(db: sqlite3.Connection, conv_id: int, session: int, m: Msg, now: float) -> Msg:
    cur = db.execute(
        "INSERT INTO messages (conv_id, session, turn, role, content, tool_calls, tool_call_id,"
        " name, media, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (conv_id, session, m.turn, m.role, m.content, calls_to_json(m.tool_calls),
         m.tool_call_id, m.name, media_to_json(m.media), now))
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
        "INSERT INTO tool_calls (conv_id, session, call_id, turn, name, arguments, state,"
        " updated_at) VALUES (?,?,?,?,?,?,?,?)",
        [(conv_id, session, c.id, msg.turn, c.name, c.arguments, CallState.PENDING.value, now)
         for c in msg.tool_calls])
    db.execute("UPDATE turns SET steps=? WHERE conv_id=? AND session=? AND turn=?",
               (steps, conv_id, session, msg.turn))
    return stored


class SQLiteStore(SQLiteStanding, SQLiteTalk, SQLiteChoices):
    """Conversations, history, turns, calls, approvals and inbound records."""

    # -- conversations ----------------------------------------------------------------

    async def conversation(self, key: ConvKey) -> ConvRow:
        def fn(db: sqlite3.Connection) -> ConvRow:
            args = (key.platform, key.chat_id, key.stored_thread())
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
            return None if row is None else ConvRow(row[3], conv_key(row), *row[4:])

        return await self._run(fn)

    async def new_session(self, conv_id: int) -> int:
        def fn(db: sqlite3.Connection) -> int:
            db.execute("UPDATE conversations SET session = session + 1, prompt_tokens = 0,"
                       " completion_tokens = 0, cost = 0 WHERE id=?", (conv_id,))
            return int(db.execute("SELECT session FROM conversations WHERE id=?",
                                  (conv_id,)).fetchone()[0])

        return await self._tx(fn)

    # -- history and turns ------------------------------------------------------------

    async def history(self, conv_id: int, session: int) -> list[Msg]:
        def fn(db: sqlite3.Connection) -> list[Msg]:
            rows = db.execute(
                "SELECT id, turn, role, content, tool_calls, tool_call_id, name, media"
                " FROM messages WHERE conv_id=? AND session=? ORDER BY id",
                (conv_id, session)).fetchall()
            return [_msg(r) for r in rows]

        return await self._run(fn)

    async def last_turn(self, conv_id: int, session: int) -> TurnRow | None:
        def fn(db: sqlite3.Connection) -> TurnRow | None:
            row = db.execute(
                f"SELECT {_TURN_COLS} FROM turns WHERE conv_id=? AND session=?"
                " ORDER BY turn DESC LIMIT 1", (conv_id, session)).fetchone()
            return None if row is None else _turn(row)

        return await self._run(fn)

    async def open_turns(self) -> list[TurnRow]:
        """Turns a stopped process left running or suspended (waiting for an approval),
        or ended without showing their end."""
        return await self._run(lambda db: [_turn(r) for r in db.execute(
            f"SELECT {_TURN_COLS} FROM turns WHERE status <> 'done' OR unshown IS NOT NULL"
            " ORDER BY started_at, conv_id, session, turn")])

    async def turn_calls(self, conv_id: int, session: int, turn: int) -> list[CallRow]:
        return await self._run(lambda db: [_call(r) for r in db.execute(
            f"SELECT {_CALL_COLS} FROM tool_calls WHERE conv_id=? AND session=? AND turn=?"
            " ORDER BY rowid", (conv_id, session, turn))])

    async def finished_calls(self, conv_id: int, session: int, limit: int) -> list[CallRow]:
        """The latest `limit` finished calls of the session, oldest first (in the order
        they were made)."""
        def fn(db: sqlite3.Connection) -> list[CallRow]:
            rows = db.execute(
                f"SELECT {_CALL_COLS} FROM tool_calls WHERE conv_id=? AND session=? AND"
                " state=? ORDER BY rowid DESC LIMIT ?",
                (conv_id, session, CallState.FINISHED.value, max(limit, 0))).fetchall()
            return [_call(r) for r in reversed(rows)]

        return await self._run(fn)

    async def summary(self, conv_id: int, session: int) -> tuple[int, str] | None:
        def fn(db: sqlite3.Connection) -> tuple[int, str] | None:
            row = db.execute("SELECT through_id, text FROM summaries WHERE conv_id=? AND"
                             " session=?", (conv_id, session)).fetchone()
            return None if row is None else (int(row[0]), str(row[1]))

        return await self._run(fn)

    async def set_summary(self, conv_id: int, session: int, through_id: int,
                          text: str) -> None:
        await self._run(lambda db: db.execute(
            "INSERT INTO summaries (conv_id, session, through_id, text, updated_at)"
            " VALUES (?,?,?,?,?) ON CONFLICT (conv_id, session) DO UPDATE SET"
            " through_id=excluded.through_id, text=excluded.text,"
            " updated_at=excluded.updated_at",
            (conv_id, session, through_id, text, time.time())))

    async def accept_inbound(self, ref: str, conv: ConvKey, kind: str, payload: str) -> bool:
        """Record an inbound id; False if it was seen before. Messages and triggers stay
        open until their turn begins, so a crash in between replays them at start."""
        done = 0 if kind in OPEN_KINDS else 1

        def fn(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "INSERT OR IGNORE INTO inbound (ref, conv, kind, payload, done, received_at)"
                " VALUES (?,?,?,?,?,?)", (ref, str(conv), kind, payload, done, time.time()))
            return cur.rowcount == 1

        return await self._run(fn)

    async def unprocessed_inbound(self) -> list[tuple[str, str, str]]:
        return await self._run(lambda db: [tuple(r) for r in db.execute(
            "SELECT ref, kind, payload FROM inbound WHERE done=0 ORDER BY received_at")])

    async def open_inbound(self, conv: ConvKey) -> list[tuple[str, str, str]]:
        return await self._run(lambda db: [tuple(r) for r in db.execute(
            "SELECT ref, kind, payload FROM inbound WHERE conv=? AND done=0"
            " ORDER BY received_at, rowid", (str(conv),))])

    async def inbound_open(self, ref: str) -> bool:
        return await self._run(lambda db: db.execute(
            "SELECT 1 FROM inbound WHERE ref=? AND done=0", (ref,)).fetchone() is not None)

    async def heard_in(self, conv: ConvKey) -> bool:
        return await self._run(lambda db: db.execute(
            "SELECT 1 FROM inbound WHERE conv=? LIMIT 1", (str(conv),)).fetchone() is not None)

    async def mark_inbound_done(self, refs: Sequence[str]) -> None:
        await self._run(lambda db: db.executemany(
            "UPDATE inbound SET done=1 WHERE ref=?", [(r,) for r in refs]))

    async def begin_turn(self, conv_id: int, session: int, messages: Sequence[Msg],
                         requester: str, unattended: bool,
                         refs: Sequence[str]) -> list[Msg] | None:
        def fn(db: sqlite3.Connection) -> list[Msg] | None:
            if refs:
                marks = ",".join("?" * len(refs))
                opened = db.execute(f"UPDATE inbound SET done=1 WHERE done=0 AND ref IN"
                                    f" ({marks})", tuple(refs)).rowcount
                if opened == 0:
                    return None
            now = time.time()
            stored = [_insert_msg(db, conv_id, session, m, now) for m in messages]
            db.execute(
                "INSERT INTO turns (conv_id, session, turn, status, steps, requester,"
                " unattended, started_at) VALUES (?,?,?,?,?,?,?,?)",
                (conv_id, session, messages[0].turn, "running", 0, requester,
                 int(unattended), now))
            return stored

        return await self._tx(fn)

    async def add_to_turn(self, conv_id: int, session: int, messages: Sequence[Msg],
                          refs: Sequence[str]) -> list[Msg] | None:
        def fn(db: sqlite3.Connection) -> list[Msg] | None:
            marks = ",".join("?" * len(refs))
            if refs and db.execute(f"UPDATE inbound SET done=1 WHERE done=0 AND ref IN"
                                   f" ({marks})", tuple(refs)).rowcount == 0:
                return None
            return [_insert_msg(db, conv_id, session, m, time.time()) for m in messages]

        return await self._tx(fn)

    async def append_assistant(self, conv_id: int, session: int, msg: Msg, steps: int,
                               usage: Usage | None = None) -> Msg:
        """The model's step, its tool calls (PENDING) and its token usage, in one commit."""
        return await self._tx(
            lambda db: _insert_step(db, conv_id, session, msg, steps, usage, time.time()))

    async def set_call(self, conv_id: int, session: int, call_id: str, state: CallState,
                       outcome: Outcome | None = None,
                       result: Msg | None = None) -> Msg | None:
        def fn(db: sqlite3.Connection) -> Msg | None:
            now = time.time()
            db.execute("UPDATE tool_calls SET state=?, outcome=?, updated_at=?"
                       " WHERE conv_id=? AND session=? AND call_id=?",
                       (state.value, outcome.value if outcome else None, now, conv_id, session,
                        call_id))
            return None if result is None else _insert_msg(db, conv_id, session, result, now)

        if result is None:
            return await self._run(fn)
        return await self._tx(fn)

    async def end_turn(self, conv_id: int, session: int, turn: int, status: str,
                       reason: str | None, last: Msg | None = None, *,
                       step: tuple[int, Usage | None] | None = None,
                       show: str | None = None) -> Msg | None:
        """End the turn; `last` (a partial answer, or with `step` the model's final step,
        its step count and usage) and `show` are stored in the same commit. Returns
        `last` as stored."""
        def fn(db: sqlite3.Connection) -> Msg | None:
            stored = None
            if last is not None and step is not None:
                stored = _insert_step(db, conv_id, session, last, *step, time.time())
            elif last is not None:
                stored = _insert_msg(db, conv_id, session, last, time.time())
            db.execute("UPDATE turns SET status=?, reason=?, unshown=? WHERE conv_id=? AND"
                       " session=? AND turn=?", (status, reason, show, conv_id, session, turn))
            return stored

        return await (self._run(fn) if last is None else self._tx(fn))

    async def shown(self, conv_id: int, session: int, turn: int) -> None:
        await self._run(lambda db: db.execute(
            "UPDATE turns SET unshown=NULL WHERE conv_id=? AND session=? AND turn=?",
            (conv_id, session, turn)))

    async def set_live(self, conv_id: int, session: int, turn: int, where: str) -> None:
        await self._run(lambda db: db.execute(
            "UPDATE turns SET live=? WHERE conv_id=? AND session=? AND turn=?",
            (where, conv_id, session, turn)))

    # -- approvals and rules ----------------------------------------------------------

    _APPROVAL_COLS = ("id, conv_id, session, call_id, tool, summary, requester, status,"
                      " created_at, expires_at, decided_by")

    async def add_approval(self, row: ApprovalRow) -> None:
        def fn(db: sqlite3.Connection) -> None:
            db.execute(
                f"INSERT INTO approvals ({self._APPROVAL_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (row.id, row.conv_id, row.session, row.call_id, row.tool, row.summary,
                 row.requester, row.status, row.created_at, row.expires_at, row.decided_by))
            db.execute("UPDATE tool_calls SET state=?, updated_at=? WHERE conv_id=? AND"
                       " session=? AND call_id=?", (CallState.ASKING.value, row.created_at,
                                                    row.conv_id, row.session, row.call_id))

        await self._tx(fn)

    async def approval(self, approval_id: str) -> ApprovalRow | None:
        def fn(db: sqlite3.Connection) -> ApprovalRow | None:
            row = db.execute(f"SELECT {self._APPROVAL_COLS} FROM approvals WHERE id=?",
                             (approval_id,)).fetchone()
            return None if row is None else ApprovalRow(*row)

        return await self._run(fn)

    async def approval_for_call(self, conv_id: int, session: int,
                                call_id: str) -> ApprovalRow | None:
        def fn(db: sqlite3.Connection) -> ApprovalRow | None:
            row = db.execute(f"SELECT {self._APPROVAL_COLS} FROM approvals WHERE conv_id=? AND"
                             " session=? AND call_id=? ORDER BY created_at DESC, rowid DESC",
                             (conv_id, session, call_id)).fetchone()
            return None if row is None else ApprovalRow(*row)

        return await self._run(fn)

    async def decide(self, approval_id: str, status: str, by: str | None) -> bool:
        """Move a pending approval to `status`; False when it was already decided."""
        def fn(db: sqlite3.Connection) -> bool:
            cur = db.execute("UPDATE approvals SET status=?, decided_by=? WHERE id=? AND"
                             " status='pending'", (status, by, approval_id))
            return cur.rowcount == 1

        return await self._run(fn)

    async def set_card(self, approval_id: str, card: str) -> None:
        await self._run(lambda db: db.execute("UPDATE approvals SET card=? WHERE id=?",
                                              (card, approval_id)))

    async def card(self, approval_id: str) -> str | None:
        def fn(db: sqlite3.Connection) -> str | None:
            row = db.execute("SELECT card FROM approvals WHERE id=?", (approval_id,)).fetchone()
            return row[0] if row else None

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
