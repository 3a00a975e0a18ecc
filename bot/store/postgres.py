"""The PostgreSQL store (psycopg 3, async, pooled) behind `bot.store.Store`.

Several processes may share one database. The plumbing (the pool, transactions, errors,
migrations) is in `postgres_base`, the schema in `postgres_schema`; rules, jobs and tool
processes in `postgres_standing`. `migrate(url)` migrates without opening a store.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bot.core.errors import StoreError
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
from bot.store import OPEN_KINDS, ApprovalRow, CallRow, ConvRow, TurnRow, Usage
from bot.store.postgres_base import Conn, Row, conv_key, fetchone, migrate
from bot.store.postgres_choices import PostgresChoices
from bot.store.postgres_standing import PostgresStanding
from bot.store.postgres_talk import PostgresTalk

__all__ = ["PostgresStore", "migrate"]


def _msg(row: Row) -> Msg:
    row_id, turn, role, content, calls, call_id, name, media = row
    return Msg(role, content, turn, calls_from_json(calls), call_id, name, row_id,
               media=media_from_json(media))


def _call(r: Row) -> CallRow:
    call_id, name, arguments, turn, state, outcome = r
    return CallRow(ToolCall(call_id, name, arguments), turn, CallState(state),
                   Outcome(outcome) if outcome else None)


def _turn(r: Row) -> TurnRow:
    return TurnRow(*r)


_CALL_COLS = "call_id, name, arguments, turn, state, outcome"
_TURN_COLS = "conv_id, session, turn, status, steps, requester, unattended, reason, unshown, live"
_APPROVAL_COLS = ("id, conv_id, session, call_id, tool, summary, requester, status,"
                  " created_at, expires_at, decided_by")

_MARK_DONE = (
    "UPDATE inbound SET done = TRUE WHERE ref IN (SELECT ref FROM inbound"
    " WHERE ref = ANY(%s) AND NOT done ORDER BY ref FOR UPDATE)")
"""Mark open inbound rows done; how many it marked. Rows are locked in one order (no
deadlock between two callers), and a second caller waiting on a row finds it done."""


async def _insert_msg(conn: Conn, conv_id: int, session: int, m: Msg, now: float) -> Msg:
    row = await fetchone(
        conn, "INSERT INTO messages (conv_id, session, turn, role, content, tool_calls,"
        " tool_call_id, name, media, created_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
        " RETURNING id",
        (conv_id, session, m.turn, m.role, m.content, calls_to_json(m.tool_calls),
         m.tool_call_id, m.name, media_to_json(m.media), now))
    assert row is not None
    return m.with_id(int(row[0]))


async def _insert_step(conn: Conn, conv_id: int, session: int, msg: Msg, steps: int,
                       usage: Usage | None, now: float) -> Msg:
    """A model step: the message, its tool calls (PENDING), the step count and usage."""
    if usage is not None:
        await conn.execute(
            "UPDATE conversations SET prompt_tokens = prompt_tokens + %s,"
            " completion_tokens = completion_tokens + %s, cost = cost + %s WHERE id=%s",
            (*usage, conv_id))
    stored = await _insert_msg(conn, conv_id, session, msg, now)
    if msg.tool_calls:
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO tool_calls (conv_id, session, call_id, turn, name, arguments,"
                " state, updated_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                [(conv_id, session, c.id, msg.turn, c.name, c.arguments,
                  CallState.PENDING.value, now) for c in msg.tool_calls])
    await conn.execute("UPDATE turns SET steps=%s WHERE conv_id=%s AND session=%s AND turn=%s",
                       (steps, conv_id, session, msg.turn))
    return stored


class PostgresStore(PostgresStanding, PostgresTalk, PostgresChoices):
    """Conversations, history, turns, calls, approvals and inbound records."""

    # -- conversations ----------------------------------------------------------------

    async def conversation(self, key: ConvKey) -> ConvRow:
        args = (key.platform, key.chat_id, key.stored_thread())
        select = ("SELECT id, session, prompt_tokens, completion_tokens, cost FROM conversations"
                  " WHERE platform=%s AND chat_id=%s AND thread_id=%s")
        async with self._connection() as conn:
            row = await fetchone(conn, select, args)
            if row is None:  # insert only when missing: a conflict would still use up an id
                await conn.execute(
                    "INSERT INTO conversations (platform, chat_id, thread_id, created_at)"
                    " VALUES (%s,%s,%s,%s) ON CONFLICT DO NOTHING", (*args, time.time()))
                row = await fetchone(conn, select, args)
        assert row is not None
        return ConvRow(row[0], key, row[1], row[2], row[3], row[4])

    async def conversation_by_id(self, conv_id: int) -> ConvRow | None:
        row = await self._row(
            "SELECT platform, chat_id, thread_id, id, session, prompt_tokens,"
            " completion_tokens, cost FROM conversations WHERE id=%s", (conv_id,))
        return None if row is None else ConvRow(row[3], conv_key(row), *row[4:])

    async def new_session(self, conv_id: int) -> int:
        row = await self._row("UPDATE conversations SET session = session + 1,"
                              " prompt_tokens = 0, completion_tokens = 0, cost = 0"
                              " WHERE id=%s RETURNING session", (conv_id,))
        if row is None:
            raise StoreError(f"no conversation {conv_id}")
        return int(row[0])

    # -- history and turns ------------------------------------------------------------

    async def history(self, conv_id: int, session: int) -> list[Msg]:
        return [_msg(r) for r in await self._rows(
            "SELECT id, turn, role, content, tool_calls, tool_call_id, name, media"
            " FROM messages WHERE conv_id=%s AND session=%s ORDER BY id", (conv_id, session))]

    async def last_turn(self, conv_id: int, session: int) -> TurnRow | None:
        row = await self._row(f"SELECT {_TURN_COLS} FROM turns WHERE conv_id=%s AND session=%s"
                              " ORDER BY turn DESC LIMIT 1", (conv_id, session))
        return None if row is None else _turn(row)

    async def open_turns(self) -> list[TurnRow]:
        """Turns a stopped process left running or suspended (waiting for an approval),
        or ended without showing their end."""
        return [_turn(r) for r in await self._rows(
            f"SELECT {_TURN_COLS} FROM turns WHERE status <> 'done' OR unshown IS NOT NULL"
            " ORDER BY started_at, conv_id, session, turn")]

    async def turn_calls(self, conv_id: int, session: int, turn: int) -> list[CallRow]:
        return [_call(r) for r in await self._rows(
            f"SELECT {_CALL_COLS} FROM tool_calls WHERE conv_id=%s AND session=%s AND turn=%s"
            " ORDER BY seq", (conv_id, session, turn))]

    async def finished_calls(self, conv_id: int, session: int, limit: int) -> list[CallRow]:
        """The latest `limit` finished calls of the session, oldest first (in the order
        they were made)."""
        rows = await self._rows(
            f"SELECT {_CALL_COLS} FROM tool_calls WHERE conv_id=%s AND session=%s AND"
            " state=%s ORDER BY seq DESC LIMIT %s",
            (conv_id, session, CallState.FINISHED.value, max(limit, 0)))
        return [_call(r) for r in reversed(rows)]

    async def summary(self, conv_id: int, session: int) -> tuple[int, str] | None:
        row = await self._row("SELECT through_id, text FROM summaries WHERE conv_id=%s AND"
                              " session=%s", (conv_id, session))
        return None if row is None else (int(row[0]), str(row[1]))

    async def set_summary(self, conv_id: int, session: int, through_id: int,
                          text: str) -> None:
        await self._count(
            "INSERT INTO summaries (conv_id, session, through_id, text, updated_at)"
            " VALUES (%s,%s,%s,%s,%s) ON CONFLICT (conv_id, session) DO UPDATE SET"
            " through_id=excluded.through_id, text=excluded.text,"
            " updated_at=excluded.updated_at",
            (conv_id, session, through_id, text, time.time()))

    async def accept_inbound(self, ref: str, conv: ConvKey, kind: str, payload: str) -> bool:
        """Record an inbound id; False if it was seen before. Messages and triggers stay
        open until their turn begins, so a crash in between replays them at start. Of two
        copies at once, the second waits for the first to commit, then inserts nothing."""
        return await self._count(
            "INSERT INTO inbound (ref, conv, kind, payload, done, received_at)"
            " VALUES (%s,%s,%s,%s,%s,%s) ON CONFLICT (ref) DO NOTHING",
            (ref, str(conv), kind, payload, kind not in OPEN_KINDS,
             time.time())) == 1

    async def unprocessed_inbound(self) -> list[tuple[str, str, str]]:
        return [(r[0], r[1], r[2]) for r in await self._rows(
            "SELECT ref, kind, payload FROM inbound WHERE NOT done ORDER BY received_at, seq")]

    async def open_inbound(self, conv: ConvKey) -> list[tuple[str, str, str]]:
        return [(r[0], r[1], r[2]) for r in await self._rows(
            "SELECT ref, kind, payload FROM inbound WHERE conv=%s AND NOT done"
            " ORDER BY received_at, seq", (str(conv),))]

    async def inbound_open(self, ref: str) -> bool:
        return await self._row("SELECT 1 FROM inbound WHERE ref=%s AND NOT done",
                               (ref,)) is not None

    async def heard_in(self, conv: ConvKey) -> bool:
        return await self._row("SELECT 1 FROM inbound WHERE conv=%s LIMIT 1",
                               (str(conv),)) is not None

    async def mark_inbound_done(self, refs: Sequence[str]) -> None:
        if refs:
            await self._count(_MARK_DONE, (list(refs),))

    async def begin_turn(self, conv_id: int, session: int, messages: Sequence[Msg],
                         requester: str, unattended: bool,
                         refs: Sequence[str]) -> list[Msg] | None:
        async with self._tx() as conn:
            if refs and (await conn.execute(_MARK_DONE, (list(refs),))).rowcount == 0:
                return None
            now = time.time()
            stored = [await _insert_msg(conn, conv_id, session, m, now) for m in messages]
            await conn.execute(
                "INSERT INTO turns (conv_id, session, turn, status, steps, requester,"
                " unattended, started_at) VALUES (%s,%s,%s,'running',0,%s,%s,%s)",
                (conv_id, session, messages[0].turn, requester, unattended, now))
            return stored

    async def add_to_turn(self, conv_id: int, session: int, messages: Sequence[Msg],
                          refs: Sequence[str]) -> list[Msg] | None:
        async with self._tx() as conn:
            if refs and (await conn.execute(_MARK_DONE, (list(refs),))).rowcount == 0:
                return None
            now = time.time()
            return [await _insert_msg(conn, conv_id, session, m, now) for m in messages]

    async def append_assistant(self, conv_id: int, session: int, msg: Msg, steps: int,
                               usage: Usage | None = None) -> Msg:
        """The model's step, its tool calls (PENDING) and its token usage, in one commit."""
        async with self._tx() as conn:
            return await _insert_step(conn, conv_id, session, msg, steps, usage, time.time())

    async def set_call(self, conv_id: int, session: int, call_id: str, state: CallState,
                       outcome: Outcome | None = None,
                       result: Msg | None = None) -> Msg | None:
        update = ("UPDATE tool_calls SET state=%s, outcome=%s, updated_at=%s"
                  " WHERE conv_id=%s AND session=%s AND call_id=%s")
        now = time.time()
        args = (state.value, outcome.value if outcome else None, now, conv_id, session, call_id)
        if result is None:
            await self._count(update, args)
            return None
        async with self._tx() as conn:
            await conn.execute(update, args)
            return await _insert_msg(conn, conv_id, session, result, now)

    async def end_turn(self, conv_id: int, session: int, turn: int, status: str,
                       reason: str | None, last: Msg | None = None, *,
                       step: tuple[int, Usage | None] | None = None,
                       show: str | None = None) -> Msg | None:
        """End the turn; `last` (a partial answer, or with `step` the model's final step,
        its step count and usage) and `show` are stored in the same commit. Returns
        `last` as stored."""
        update = ("UPDATE turns SET status=%s, reason=%s, unshown=%s WHERE conv_id=%s"
                  " AND session=%s AND turn=%s")
        args = (status, reason, show, conv_id, session, turn)
        if last is None:
            await self._count(update, args)
            return None
        async with self._tx() as conn:
            if step is not None:
                stored = await _insert_step(conn, conv_id, session, last, *step, time.time())
            else:
                stored = await _insert_msg(conn, conv_id, session, last, time.time())
            await conn.execute(update, args)
            return stored

    async def shown(self, conv_id: int, session: int, turn: int) -> None:
        await self._count("UPDATE turns SET unshown=NULL WHERE conv_id=%s AND session=%s"
                          " AND turn=%s", (conv_id, session, turn))

    async def set_live(self, conv_id: int, session: int, turn: int, where: str) -> None:
        await self._count("UPDATE turns SET live=%s WHERE conv_id=%s AND session=%s"
                          " AND turn=%s", (where, conv_id, session, turn))

    # -- approvals --------------------------------------------------------------------

    async def add_approval(self, row: ApprovalRow) -> None:
        async with self._tx() as conn:
            await conn.execute(
                f"INSERT INTO approvals ({_APPROVAL_COLS})"
                " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                (row.id, row.conv_id, row.session, row.call_id, row.tool, row.summary,
                 row.requester, row.status, row.created_at, row.expires_at, row.decided_by))
            await conn.execute("UPDATE tool_calls SET state=%s, updated_at=%s WHERE conv_id=%s"
                               " AND session=%s AND call_id=%s",
                               (CallState.ASKING.value, row.created_at, row.conv_id,
                                row.session, row.call_id))

    async def approval(self, approval_id: str) -> ApprovalRow | None:
        row = await self._row(f"SELECT {_APPROVAL_COLS} FROM approvals WHERE id=%s",
                              (approval_id,))
        return None if row is None else ApprovalRow(*row)

    async def approval_for_call(self, conv_id: int, session: int,
                                call_id: str) -> ApprovalRow | None:
        row = await self._row(
            f"SELECT {_APPROVAL_COLS} FROM approvals WHERE conv_id=%s AND session=%s AND"
            " call_id=%s ORDER BY created_at DESC, seq DESC LIMIT 1", (conv_id, session, call_id))
        return None if row is None else ApprovalRow(*row)

    async def decide(self, approval_id: str, status: str, by: str | None) -> bool:
        """Move a pending approval to `status`; False when it was already decided (also
        by a concurrent caller: the second one waits for the row and finds it decided)."""
        return await self._count("UPDATE approvals SET status=%s, decided_by=%s WHERE id=%s"
                                 " AND status='pending'", (status, by, approval_id)) == 1

    async def set_card(self, approval_id: str, card: str) -> None:
        await self._count("UPDATE approvals SET card=%s WHERE id=%s", (card, approval_id))

    async def card(self, approval_id: str) -> str | None:
        row = await self._row("SELECT card FROM approvals WHERE id=%s", (approval_id,))
        return row[0] if row else None

    async def pending_approvals(self, conv_id: int | None = None) -> list[ApprovalRow]:
        sql = f"SELECT {_APPROVAL_COLS} FROM approvals WHERE status='pending'"
        args: tuple[Any, ...] = ()
        if conv_id is not None:
            sql += " AND conv_id=%s"
            args = (conv_id,)
        return [ApprovalRow(*r) for r in await self._rows(sql + " ORDER BY created_at, seq", args)]
