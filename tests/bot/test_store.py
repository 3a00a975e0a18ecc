"""The store's contract, written against the `Store` protocol only.

Every test runs once per backend in `BACKENDS`: SQLite in a file of its own, PostgreSQL
in one database per session, its tables emptied for each test (`tests/pg.py`; set
`TANDEM_TEST_PG` to the server, which the PostgreSQL tests need: they fail without it).
The migration tests at the end are each backend's own, then come PostgreSQL's tests of
several processes on one database.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from bot.core.errors import StoreConflict, StoreError, user_message
from bot.core.events import ConvKey
from bot.core.history import CallState, Media, Msg, Outcome, ToolCall, tool_result
from bot.store import (
    ApprovalRow,
    AuditRow,
    ConvRow,
    JobRow,
    Spent,
    Store,
    TalkRow,
    TurnRow,
    new_id,
)
from bot.store.backends import open_store
from bot.store.postgres import PostgresStore, migrate
from bot.store.postgres_base import fail
from bot.store.postgres_schema import MIGRATIONS as PG_MIGRATIONS
from bot.store.postgres_schema import VERSION_TABLE
from bot.store.sqlite import SQLiteStore
from bot.store.sqlite_schema import MIGRATIONS as SQLITE_MIGRATIONS
from tests import pg

PG = pg.SessionDatabase()


@pytest.fixture(scope="session", autouse=True)
def _drop_the_session_database() -> Iterator[None]:
    yield
    PG.drop()


async def _sqlite(tmp_path: Path) -> Store:
    return open_store(str(tmp_path / "store.db"))


async def _postgresql(tmp_path: Path) -> Store:
    """The session database, emptied when this test first asks (so a store the test
    reopens finds its data)."""
    return open_store(await PG.shared(str(tmp_path)))


BACKENDS: dict[str, Callable[[Path], Awaitable[Store]]] = {
    "sqlite": _sqlite,
    "postgresql": _postgresql,
}


@pytest.fixture(params=sorted(BACKENDS))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend = await BACKENDS[request.param](tmp_path)
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


KEY = ConvKey("console", "alice")


def call(call_id: str, name: str = "shell", arguments: str = '{"command": "ls"}') -> ToolCall:
    return ToolCall(call_id, name, arguments)


def asks(turn: int, *calls: ToolCall, text: str = "") -> Msg:
    return Msg("assistant", text, turn, tuple(calls))


def approval(conv: ConvRow, call_id: str, *, session: int | None = None,
             created_at: float = 100.0, status: str = "pending") -> ApprovalRow:
    return ApprovalRow(new_id(), conv.id, conv.session if session is None else session,
                       call_id, "shell", "run ls", "u1", status, created_at, created_at + 60)


def job(conv: ConvRow, *, kind: str = "interval") -> JobRow:
    return JobRow(new_id(), conv.id, conv.key, "every 1h", kind, "check the build", "u1",
                  None, True, 1000.0)


async def started(store: Store, key: ConvKey = KEY, turn: int = 1,
                  text: str = "hi") -> ConvRow:
    conv = await store.conversation(key)
    await store.begin_turn(conv.id, conv.session, [Msg("user", text, turn)], "u1", False, [])
    return conv


# -- ids and plumbing -----------------------------------------------------------------


def test_new_id_is_short_hex_and_unique() -> None:
    ids = {new_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 12 and int(i, 16) >= 0 for i in ids)


async def test_a_closed_store_refuses_work_and_can_be_closed_twice(tmp_path: Path) -> None:
    for make in BACKENDS.values():
        store = await make(tmp_path)
        with pytest.raises(StoreError):
            await store.conversation(KEY)
        await store.open()
        await store.conversation(KEY)
        await store.close()
        await store.close()
        with pytest.raises(StoreError):
            await store.conversation(KEY)


async def test_integrity_check(store: Store) -> None:
    assert await store.integrity_check() == "ok"


async def test_data_survives_reopening(tmp_path: Path) -> None:
    for make in BACKENDS.values():
        first = await make(tmp_path)
        await first.open()
        conv = await started(first)
        await first.close()
        again = await make(tmp_path)
        await again.open()
        try:
            assert (await again.conversation(KEY)).id == conv.id
            assert [m.content for m in await again.history(conv.id, 1)] == ["hi"]
        finally:
            await again.close()


# -- conversations --------------------------------------------------------------------


async def test_conversation_is_created_once_per_key(store: Store) -> None:
    conv = await store.conversation(KEY)
    assert conv.key == KEY and conv.session == 1
    assert (conv.prompt_tokens, conv.completion_tokens, conv.cost) == (0, 0, 0.0)
    assert (await store.conversation(KEY)).id == conv.id
    thread = await store.conversation(ConvKey("console", "alice", "t1"))
    other = await store.conversation(ConvKey("slack", "alice"))
    assert len({conv.id, thread.id, other.id}) == 3
    assert (await store.conversation_by_id(thread.id)) == thread
    assert (await store.conversation_by_id(conv.id)) == conv
    assert (await store.conversation_by_id(conv.id + 1000)) is None


async def test_new_session(store: Store) -> None:
    conv = await store.conversation(KEY)
    assert await store.new_session(conv.id) == 2
    assert await store.new_session(conv.id) == 3
    assert (await store.conversation(KEY)).session == 3
    assert (await store.conversation_by_id(conv.id)) == ConvRow(conv.id, KEY, 3)


# -- turns, calls and history ---------------------------------------------------------


async def test_begin_turn_stores_messages_and_a_running_turn(store: Store) -> None:
    conv = await store.conversation(KEY)
    assert await store.last_turn(conv.id, conv.session) is None
    assert await store.accept_inbound("in-1", KEY, "message", "{}")
    msgs = [Msg("user", "[Ann] hello", 1), Msg("user", "[Bob] and me", 1)]
    stored = await store.begin_turn(conv.id, conv.session, msgs, "ann", True, ["in-1"])
    assert stored == msgs
    assert all(m.id is not None for m in stored)
    assert stored[0].id is not None and stored[1].id is not None
    assert stored[0].id < stored[1].id
    assert await store.history(conv.id, conv.session) == msgs
    assert [m.id for m in await store.history(conv.id, conv.session)] == [m.id for m in stored]
    assert await store.last_turn(conv.id, conv.session) == TurnRow(
        conv.id, conv.session, 1, "running", 0, "ann", True, None)
    assert await store.unprocessed_inbound() == []


async def test_inbound_already_processed_begins_no_turn(store: Store) -> None:
    conv = await store.conversation(KEY)
    assert await store.accept_inbound("in-1", KEY, "message", "{}")
    first = await store.begin_turn(conv.id, conv.session, [Msg("user", "hi", 1)], "u1", False,
                                   ["in-1"])
    assert first is not None
    again = await store.begin_turn(conv.id, conv.session, [Msg("user", "hi", 2)], "u1", False,
                                   ["in-1"])
    assert again is None
    assert await store.history(conv.id, conv.session) == first
    assert (await store.last_turn(conv.id, conv.session)) == TurnRow(
        conv.id, conv.session, 1, "running", 0, "u1", False, None)


async def test_begin_turn_twice_for_one_turn_is_an_error(store: Store) -> None:
    conv = await started(store)
    with pytest.raises(StoreError):
        await store.begin_turn(conv.id, conv.session, [Msg("user", "again", 1)], "u1",
                               False, [])
    assert [m.content for m in await store.history(conv.id, conv.session)] == ["hi"]
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and last.status == "running"


async def test_append_assistant_stores_the_step_its_calls_and_usage(store: Store) -> None:
    conv = await started(store)
    step = asks(1, call("call_0"), call("call_1", "read_file", '{"path": "a"}'),
                text="let me look")
    stored = await store.append_assistant(conv.id, conv.session, step, 1, (100, 20, 0.5))
    assert stored == step and stored.id is not None
    assert (await store.history(conv.id, conv.session))[-1] == step
    rows = await store.turn_calls(conv.id, conv.session, 1)
    assert [(r.call, r.turn, r.state, r.outcome) for r in rows] == [
        (call("call_0"), 1, CallState.PENDING, None),
        (call("call_1", "read_file", '{"path": "a"}'), 1, CallState.PENDING, None)]
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and last.steps == 1
    await store.append_assistant(conv.id, conv.session, asks(1, call("call_2")), 2)
    row = await store.conversation(KEY)
    assert (row.prompt_tokens, row.completion_tokens, row.cost) == (100, 20, 0.5)
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and last.steps == 2


async def test_set_call_moves_state_and_stores_the_result(store: Store) -> None:
    conv = await started(store)
    c = call("call_0")
    await store.append_assistant(conv.id, conv.session, asks(1, c), 1)
    assert await store.set_call(conv.id, conv.session, c.id, CallState.ASKING) is None
    assert (await store.turn_calls(conv.id, conv.session, 1))[0].state is CallState.ASKING
    await store.set_call(conv.id, conv.session, c.id, CallState.ALLOWED)
    await store.set_call(conv.id, conv.session, c.id, CallState.SUBMITTED)
    result = tool_result(c, "a.txt", 1)
    stored = await store.set_call(conv.id, conv.session, c.id, CallState.FINISHED,
                                  Outcome.OK, result)
    assert stored == result and stored is not None and stored.id is not None
    [row] = await store.turn_calls(conv.id, conv.session, 1)
    assert (row.state, row.outcome) == (CallState.FINISHED, Outcome.OK)
    history = await store.history(conv.id, conv.session)
    assert history[-1] == result and history[-1].id == stored.id


async def test_turn_calls_in_creation_order_per_turn(store: Store) -> None:
    conv = await started(store)
    names = ["call_9", "call_1", "zz", "aa", "call_5"]
    await store.append_assistant(conv.id, conv.session, asks(1, *map(call, names[:3])), 1)
    await store.append_assistant(conv.id, conv.session, asks(1, *map(call, names[3:])), 2)
    await store.end_turn(conv.id, conv.session, 1, "done", "completed")
    await store.begin_turn(conv.id, conv.session, [Msg("user", "more", 2)], "u1", False, [])
    await store.append_assistant(conv.id, conv.session, asks(2, call("next")), 1)
    assert [r.call.id for r in await store.turn_calls(conv.id, conv.session, 1)] == names
    assert [r.call.id for r in await store.turn_calls(conv.id, conv.session, 2)] == ["next"]
    assert await store.turn_calls(conv.id, conv.session, 3) == []


async def test_end_turn_alone(store: Store) -> None:
    conv = await started(store)
    assert await store.end_turn(conv.id, conv.session, 1, "suspended", None) is None
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and (last.status, last.reason) == ("suspended", None)
    await store.end_turn(conv.id, conv.session, 1, "done", "cancelled")
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and (last.status, last.reason) == ("done", "cancelled")
    assert [m.content for m in await store.history(conv.id, conv.session)] == ["hi"]


async def test_end_turn_with_a_partial_answer(store: Store) -> None:
    conv = await started(store)
    partial = Msg("assistant", "half an ans", 1)
    stored = await store.end_turn(conv.id, conv.session, 1, "done", "cancelled", partial)
    assert stored == partial and stored is not None and stored.id is not None
    assert (await store.history(conv.id, conv.session))[-1] == partial
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and (last.status, last.reason, last.steps) == (
        "done", "cancelled", 0)


async def test_end_turn_with_the_final_step(store: Store) -> None:
    conv = await started(store)
    await store.append_assistant(conv.id, conv.session, asks(1, call("call_0")), 1, (5, 1, 0.1))
    final = Msg("assistant", "all done", 1)
    stored = await store.end_turn(conv.id, conv.session, 1, "done", "completed", final,
                                  step=(2, (10, 4, 0.25)))
    assert stored == final and stored is not None and stored.id is not None
    assert (await store.history(conv.id, conv.session))[-1] == final
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and (last.status, last.reason, last.steps) == (
        "done", "completed", 2)
    row = await store.conversation(KEY)
    assert (row.prompt_tokens, row.completion_tokens) == (15, 5)
    assert row.cost == pytest.approx(0.35)
    # a final step without usage still counts the step
    await store.begin_turn(conv.id, conv.session, [Msg("user", "again", 2)], "u1", False, [])
    await store.end_turn(conv.id, conv.session, 2, "done", "max_steps",
                         asks(2, call("call_7")), step=(3, None))
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and (last.turn, last.steps, last.reason) == (2, 3, "max_steps")
    [row7] = await store.turn_calls(conv.id, conv.session, 2)
    assert (row7.call.id, row7.state) == ("call_7", CallState.PENDING)
    assert (await store.conversation(KEY)).prompt_tokens == 15


async def test_last_turn_is_the_highest_of_the_session(store: Store) -> None:
    conv = await started(store)
    await store.end_turn(conv.id, conv.session, 1, "done", "completed")
    await store.begin_turn(conv.id, conv.session, [Msg("user", "two", 2)], "bob", False, [])
    assert await store.last_turn(conv.id, conv.session) == TurnRow(
        conv.id, conv.session, 2, "running", 0, "bob", False, None)
    assert await store.last_turn(conv.id, conv.session + 1) is None
    other = await store.conversation(ConvKey("console", "other"))
    assert await store.last_turn(other.id, other.session) is None


async def test_open_turns_are_running_and_suspended_turns_everywhere(store: Store) -> None:
    running = await started(store, ConvKey("console", "a"))
    suspended = await started(store, ConvKey("console", "b"))
    done = await started(store, ConvKey("console", "c"))
    await store.end_turn(suspended.id, suspended.session, 1, "suspended", None)
    await store.end_turn(done.id, done.session, 1, "done", "completed")
    # an older session's turn left suspended is still open
    old = await started(store, ConvKey("console", "d"))
    await store.end_turn(old.id, 1, 1, "suspended", None)
    assert await store.new_session(old.id) == 2
    await store.begin_turn(old.id, 2, [Msg("user", "fresh", 1)], "u1", False, [])
    await store.end_turn(old.id, 2, 1, "done", "completed")
    found = await store.open_turns()
    assert sorted((t.conv_id, t.session, t.turn, t.status) for t in found) == sorted([
        (running.id, 1, 1, "running"), (suspended.id, 1, 1, "suspended"),
        (old.id, 1, 1, "suspended")])
    assert all(t.requester == "u1" and not t.unattended for t in found)


async def test_an_end_is_kept_until_it_was_shown(store: Store) -> None:
    conv = await started(store)
    await store.set_live(conv.id, conv.session, 1, '{"message_id": 7}')
    await store.end_turn(conv.id, conv.session, 1, "done", "completed",
                         Msg("assistant", "the answer", 1), show="the answer")
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and (last.status, last.unshown, last.live) == (
        "done", "the answer", '{"message_id": 7}')
    # a turn that ended without being shown is open: the next start shows it
    assert [(t.conv_id, t.turn, t.unshown) for t in await store.open_turns()] == [
        (conv.id, 1, "the answer")]
    await store.shown(conv.id, conv.session, 1)
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and last.unshown is None
    assert await store.open_turns() == []
    # a turn going on again has nothing to show
    await store.begin_turn(conv.id, conv.session, [Msg("user", "two", 2)], "u1", False, [])
    await store.end_turn(conv.id, conv.session, 2, "suspended", None, show="never")
    await store.end_turn(conv.id, conv.session, 2, "running", None)
    last = await store.last_turn(conv.id, conv.session)
    assert last is not None and last.unshown is None


async def test_history_is_per_session(store: Store) -> None:
    conv = await started(store, text="first session")
    assert await store.new_session(conv.id) == 2
    assert await store.history(conv.id, 2) == []
    await store.begin_turn(conv.id, 2, [Msg("user", "second session", 1)], "u1", False, [])
    assert [m.content for m in await store.history(conv.id, 1)] == ["first session"]
    assert [m.content for m in await store.history(conv.id, 2)] == ["second session"]
    other = await store.conversation(ConvKey("console", "other"))
    assert await store.history(other.id, 1) == []


async def test_media_references_are_kept_with_their_message(store: Store) -> None:
    picture = Media("image", "cat.jpg", "uploads/2026-12-02/cat.jpg", "/w/uploads/cat.jpg",
                    12_345, "image/jpeg", seen=True, tokens=1600)
    voice = Media("audio", "voice-7.ogg", "uploads/2026-12-02/voice-7.ogg", "/w/v.ogg", 999,
                  "audio/ogg", transcript="buy milk")
    conv = await store.conversation(KEY)
    [stored] = await store.begin_turn(conv.id, 1, [Msg("user", "[Ann] look", 1,
                                                       media=(picture, voice))],
                                      "u1", False, []) or [None]
    assert stored is not None and stored.media == (picture, voice)
    [loaded] = await store.history(conv.id, 1)
    assert loaded.media == (picture, voice) and loaded.tokens == stored.tokens
    assert loaded.media[1].transcript == "buy milk"


async def test_sessions_reuse_turn_numbers_and_call_ids_without_collision(
        store: Store) -> None:
    conv = await started(store, text="old question")
    c = call("call_0", arguments='{"command": "old"}')
    await store.append_assistant(conv.id, 1, asks(1, c), 1)
    await store.set_call(conv.id, 1, c.id, CallState.ASKING)
    await store.add_approval(approval(conv, c.id, session=1))
    await store.end_turn(conv.id, 1, 1, "suspended", None)
    before = await store.last_turn(conv.id, 1)

    assert await store.new_session(conv.id) == 2
    new_c = call("call_0", arguments='{"command": "new"}')
    await store.begin_turn(conv.id, 2, [Msg("user", "new question", 1)], "bob", True, [])
    await store.append_assistant(conv.id, 2, asks(1, new_c), 1)
    await store.add_approval(approval(conv, new_c.id, session=2, created_at=50.0))
    [asked] = await store.turn_calls(conv.id, 2, 1)
    assert asked.state is CallState.ASKING  # the approval and the call's state: one commit
    await store.set_call(conv.id, 2, new_c.id, CallState.FINISHED, Outcome.OK,
                         tool_result(new_c, "new output", 1))

    # the older session is untouched: its turn row, its call and its approval
    assert await store.last_turn(conv.id, 1) == before
    assert before == TurnRow(conv.id, 1, 1, "suspended", 1, "u1", False, None)
    [old_row] = await store.turn_calls(conv.id, 1, 1)
    assert (old_row.call, old_row.state, old_row.outcome) == (c, CallState.ASKING, None)
    old_approval = await store.approval_for_call(conv.id, 1, "call_0")
    assert old_approval is not None and old_approval.session == 1
    assert [m.content for m in await store.history(conv.id, 1)] == ["old question", ""]

    # the new session has its own
    assert await store.last_turn(conv.id, 2) == TurnRow(
        conv.id, 2, 1, "running", 1, "bob", True, None)
    [new_row] = await store.turn_calls(conv.id, 2, 1)
    assert (new_row.call, new_row.state, new_row.outcome) == (
        new_c, CallState.FINISHED, Outcome.OK)
    new_approval = await store.approval_for_call(conv.id, 2, "call_0")
    assert new_approval is not None and new_approval.id != old_approval.id
    assert [m.content for m in await store.history(conv.id, 2)] == [
        "new question", "", "new output"]
    assert [r.call for r in await store.finished_calls(conv.id, 2, 10)] == [new_c]
    assert await store.finished_calls(conv.id, 1, 10) == []
    assert [(t.session, t.status) for t in await store.open_turns()] == [
        (1, "suspended"), (2, "running")]


async def test_finished_calls_latest_first_limited_oldest_first(store: Store) -> None:
    conv = await started(store)
    ids = [f"call_{i}" for i in range(6)]
    await store.append_assistant(conv.id, 1, asks(1, *map(call, ids[:3])), 1)
    await store.append_assistant(conv.id, 1, asks(1, *map(call, ids[3:5])), 2)
    outcomes = [Outcome.OK, Outcome.ERROR, Outcome.SKIPPED, Outcome.DENIED, Outcome.OK]
    for call_id, outcome in zip(ids[:5], outcomes, strict=True):
        if call_id == "call_2":
            continue  # still running: not finished
        await store.set_call(conv.id, 1, call_id, CallState.FINISHED, outcome,
                             tool_result(call(call_id), "out", 1))
    await store.set_call(conv.id, 1, "call_2", CallState.SUBMITTED)
    await store.end_turn(conv.id, 1, 1, "done", "completed")
    await store.begin_turn(conv.id, 1, [Msg("user", "next", 2)], "u1", False, [])
    await store.append_assistant(conv.id, 1, asks(2, call(ids[5])), 1)
    await store.set_call(conv.id, 1, ids[5], CallState.FINISHED, Outcome.EXPIRED)
    other = await started(store, ConvKey("console", "other"))
    await store.append_assistant(other.id, 1, asks(1, call("call_0")), 1)
    await store.set_call(other.id, 1, "call_0", CallState.FINISHED, Outcome.OK)

    every = await store.finished_calls(conv.id, 1, 100)
    assert [(r.call.id, r.turn, r.outcome) for r in every] == [
        ("call_0", 1, Outcome.OK), ("call_1", 1, Outcome.ERROR),
        ("call_3", 1, Outcome.DENIED), ("call_4", 1, Outcome.OK),
        ("call_5", 2, Outcome.EXPIRED)]
    assert all(r.state is CallState.FINISHED for r in every)
    assert [r.call.id for r in await store.finished_calls(conv.id, 1, 2)] == [
        "call_4", "call_5"]
    assert await store.finished_calls(conv.id, 1, 0) == []
    assert await store.finished_calls(conv.id, 2, 10) == []


async def test_summaries_are_one_per_session_and_upsert(store: Store) -> None:
    conv = await store.conversation(KEY)
    assert await store.summary(conv.id, 1) is None
    await store.set_summary(conv.id, 1, 10, "they talked about the build")
    assert await store.summary(conv.id, 1) == (10, "they talked about the build")
    await store.set_summary(conv.id, 1, 25, "the build, then the deploy")
    assert await store.summary(conv.id, 1) == (25, "the build, then the deploy")
    assert await store.summary(conv.id, 2) is None
    await store.set_summary(conv.id, 2, 30, "a new session")
    assert await store.summary(conv.id, 1) == (25, "the build, then the deploy")
    assert await store.summary(conv.id, 2) == (30, "a new session")
    other = await store.conversation(ConvKey("console", "other"))
    assert await store.summary(other.id, 1) is None


# -- inbound --------------------------------------------------------------------------


async def test_inbound_is_accepted_once(store: Store) -> None:
    assert await store.accept_inbound("m1", KEY, "message", '{"text": "hi"}')
    assert not await store.accept_inbound("m1", KEY, "message", '{"text": "hi"}')
    assert not await store.accept_inbound("m1", KEY, "cancel", "{}")
    assert await store.accept_inbound("t1", KEY, "trigger", '{"job": 1}')
    assert await store.accept_inbound("c1", KEY, "cancel", "{}")
    assert not await store.accept_inbound("c1", KEY, "cancel", "{}")
    # messages and triggers stay open until their turn begins; the rest are done at once
    assert await store.unprocessed_inbound() == [
        ("m1", "message", '{"text": "hi"}'), ("t1", "trigger", '{"job": 1}')]
    await store.mark_inbound_done(["m1"])
    assert await store.unprocessed_inbound() == [("t1", "trigger", '{"job": 1}')]
    await store.mark_inbound_done([])
    await store.mark_inbound_done(["t1", "unknown"])
    assert await store.unprocessed_inbound() == []
    assert not await store.accept_inbound("t1", KEY, "trigger", "{}")


async def test_a_press_stays_open_until_it_was_applied(store: Store) -> None:
    assert await store.accept_inbound("p1", KEY, "decision", '{"approval_id": "a1"}')
    assert await store.inbound_open("p1")
    assert await store.unprocessed_inbound() == [("p1", "decision", '{"approval_id": "a1"}')]
    await store.mark_inbound_done(["p1"])
    assert not await store.inbound_open("p1")
    assert not await store.inbound_open("never-heard")
    assert await store.accept_inbound("c1", KEY, "cancel", "{}")
    assert not await store.inbound_open("c1")


async def test_open_inbound_of_a_conversation_in_the_order_received(store: Store) -> None:
    other = ConvKey("console", "other")
    for ref, conv, kind in [("m1", KEY, "message"), ("o1", other, "message"),
                            ("c1", KEY, "cancel"), ("p1", KEY, "decision"),
                            ("m2", KEY, "message")]:
        assert await store.accept_inbound(ref, conv, kind, f'"{ref}"')
    await store.mark_inbound_done(["m1"])
    assert await store.open_inbound(KEY) == [("p1", "decision", '"p1"'),
                                             ("m2", "message", '"m2"')]
    assert await store.open_inbound(ConvKey("console", "nobody")) == []


async def test_heard_in_a_conversation_by_its_inbound(store: Store) -> None:
    thread = ConvKey("slack", "C1", "1700000000.000100")
    assert not await store.heard_in(thread)
    assert await store.accept_inbound("slack:C1:1700000000.000100", thread, "message", "{}")
    assert await store.heard_in(thread)
    assert not await store.heard_in(ConvKey("slack", "C1", "1700000000.000200"))
    assert not await store.heard_in(ConvKey("slack", "C1"))


# -- approvals ------------------------------------------------------------------------


async def test_approvals(store: Store) -> None:
    conv = await store.conversation(KEY)
    other = await store.conversation(ConvKey("console", "other"))
    first = approval(conv, "call_0", created_at=100.0)
    await store.add_approval(first)
    assert await store.approval(first.id) == first
    assert await store.approval("missing") is None
    assert await store.approval_for_call(conv.id, 1, "call_0") == first
    assert await store.approval_for_call(conv.id, 2, "call_0") is None
    assert await store.approval_for_call(conv.id, 1, "call_1") is None
    assert await store.approval_for_call(other.id, 1, "call_0") is None
    # asked again for the same call: the newest one is found
    again = approval(conv, "call_0", created_at=200.0)
    await store.add_approval(again)
    assert await store.approval_for_call(conv.id, 1, "call_0") == again
    elsewhere = approval(other, "call_9", created_at=150.0)
    await store.add_approval(elsewhere)
    assert await store.pending_approvals() == [first, elsewhere, again]
    assert await store.pending_approvals(conv.id) == [first, again]
    assert await store.pending_approvals(other.id) == [elsewhere]


async def test_a_card_is_found_by_its_approval_from_any_store(store: Store) -> None:
    conv = await store.conversation(KEY)
    row = approval(conv, "call_0")
    await store.add_approval(row)
    assert await store.card(row.id) is None
    await store.set_card(row.id, '{"chat": 42, "message_id": 7}')
    assert await store.card(row.id) == '{"chat": 42, "message_id": 7}'
    await store.decide(row.id, "approved", "ann")
    assert await store.card(row.id) == '{"chat": 42, "message_id": 7}'  # kept after
    assert await store.approval(row.id) is not None
    assert await store.card("missing") is None


async def test_decide_is_idempotent(store: Store) -> None:
    conv = await store.conversation(KEY)
    row = approval(conv, "call_0")
    await store.add_approval(row)
    assert await store.decide(row.id, "approved", "ann")
    assert not await store.decide(row.id, "approved", "ann")
    assert not await store.decide(row.id, "denied", "bob")
    assert not await store.decide(row.id, "expired", None)
    decided = await store.approval(row.id)
    assert decided is not None and (decided.status, decided.decided_by) == ("approved", "ann")
    assert await store.pending_approvals() == []
    assert not await store.decide("missing", "approved", "ann")
    timed_out = approval(conv, "call_1")
    await store.add_approval(timed_out)
    assert await store.decide(timed_out.id, "expired", None)
    expired = await store.approval(timed_out.id)
    assert expired is not None and (expired.status, expired.decided_by) == ("expired", None)


# -- rules ----------------------------------------------------------------------------


async def test_rules(store: Store) -> None:
    conv = await store.conversation(KEY)
    other = await store.conversation(ConvKey("console", "other"))
    assert await store.rules(conv.id) == []
    await store.add_rule(conv.id, "shell", "ls -la")
    await store.add_rule(conv.id, "shell", "ls -la")
    await store.add_rule(conv.id, "write_file", "notes.md")
    assert await store.has_rule(conv.id, "shell", "ls -la")
    assert not await store.has_rule(conv.id, "shell", "ls")
    assert not await store.has_rule(conv.id, "read_file", "ls -la")
    assert not await store.has_rule(other.id, "shell", "ls -la")
    rules = await store.rules(conv.id)
    assert [(r.conv_id, r.tool, r.key) for r in rules] == [
        (conv.id, "shell", "ls -la"), (conv.id, "write_file", "notes.md")]
    assert len({r.id for r in rules}) == 2
    assert await store.rules(other.id) == []
    assert not await store.delete_rule(other.id, rules[0].id)
    assert await store.delete_rule(conv.id, rules[0].id)
    assert not await store.delete_rule(conv.id, rules[0].id)
    assert not await store.has_rule(conv.id, "shell", "ls -la")
    assert [r.key for r in await store.rules(conv.id)] == ["notes.md"]


async def test_rules_with_a_scope(store: Store) -> None:
    """A rule for one session, for one person, with an expiry; each records its author."""
    conv = await store.conversation(KEY)
    now = time.time()
    await store.add_rule(conv.id, "shell", "make", author="42", author_name="Ann", session=1)
    await store.add_rule(conv.id, "shell", "deploy", author="42", user="42",
                         expires_at=now + 3600)
    await store.add_rule(conv.id, "shell", "deploy", author="43", user="43")  # Bob's own
    assert await store.has_rule(conv.id, "shell", "make", session=1)
    assert not await store.has_rule(conv.id, "shell", "make", session=2)  # after /new
    assert await store.has_rule(conv.id, "shell", "deploy", user="42")
    assert await store.has_rule(conv.id, "shell", "deploy", user="43")
    assert not await store.has_rule(conv.id, "shell", "deploy", user="44")
    assert not await store.has_rule(conv.id, "shell", "deploy", user="42", now=now + 3601)
    listed = await store.rules(conv.id, session=1)
    assert [(r.key, r.session, r.user, r.author, r.author_name) for r in listed] == [
        ("make", 1, "", "42", "Ann"), ("deploy", None, "42", "42", ""),
        ("deploy", None, "43", "43", "")]
    assert listed[1].expires_at is not None and abs(listed[1].expires_at - now - 3600) < 1
    assert [r.key for r in await store.rules(conv.id, session=2)] == ["deploy", "deploy"]
    assert len(await store.rules(conv.id, session=2, now=now + 3601)) == 1  # Ann's expired
    # the same scope again replaces the rule: its author and expiry are the new ones
    await store.add_rule(conv.id, "shell", "deploy", author="44", user="42")
    mine = [r for r in await store.rules(conv.id, session=1) if r.user == "42"]
    assert [(r.author, r.expires_at) for r in mine] == [("44", None)]


# -- jobs -----------------------------------------------------------------------------


async def test_jobs(store: Store) -> None:
    conv = await store.conversation(ConvKey("slack", "C1", "1700.1"))
    other = await store.conversation(ConvKey("console", "other"))
    a, b, c = job(conv), job(conv, kind="cron"), job(other, kind="date")
    for row in (a, b, c):
        await store.add_job(row)
    assert await store.job(a.id) == a
    assert await store.job("missing") is None
    assert await store.jobs() == [a, b, c]
    assert await store.jobs(conv.id) == [a, b]
    assert await store.jobs(other.id) == [c]
    assert await store.deactivate_job(b.id)
    assert not await store.deactivate_job(b.id)
    assert not await store.deactivate_job("missing")
    assert await store.jobs(conv.id) == [a]
    retired = await store.job(b.id)
    assert retired is not None and not retired.active


async def test_claim_slot_runs_each_slot_once(store: Store) -> None:
    conv = await store.conversation(KEY)
    row = job(conv)
    await store.add_job(row)
    assert await store.claim_slot(row.id, 2000.0, "job-1", KEY, '{"slot": 1}')
    assert not await store.claim_slot(row.id, 2000.0, "job-1b", KEY, "{}")
    assert not await store.claim_slot(row.id, 1500.0, "job-0", KEY, "{}")
    assert await store.claim_slot(row.id, 3000.0, "job-2", KEY, '{"slot": 2}')
    assert await store.unprocessed_inbound() == [
        ("job-1", "trigger", '{"slot": 1}'), ("job-2", "trigger", '{"slot": 2}')]
    claimed = await store.job(row.id)
    assert claimed is not None and (claimed.last_slot, claimed.active) == (3000.0, True)
    # a one-shot job's only slot retires it
    once = job(conv, kind="date")
    await store.add_job(once)
    assert await store.claim_slot(once.id, 4000.0, "job-3", KEY, "{}", last=True)
    done = await store.job(once.id)
    assert done is not None and (done.last_slot, done.active) == (4000.0, False)
    assert not await store.claim_slot(once.id, 5000.0, "job-4", KEY, "{}")
    assert [j.id for j in await store.jobs()] == [row.id]
    assert not await store.claim_slot("missing", 1.0, "job-5", KEY, "{}")
    assert [r for r, _, _ in await store.unprocessed_inbound()] == ["job-1", "job-2", "job-3"]


# -- tool processes -------------------------------------------------------------------


async def test_tracked_processes(store: Store) -> None:
    assert await store.tracked_processes() == []
    await store.track_process(101)
    await store.track_process(202)
    await store.track_process(101)
    assert sorted(await store.tracked_processes()) == [101, 202]
    await store.untrack_process(101)
    await store.untrack_process(999)
    assert await store.tracked_processes() == [202]
    await store.track_process(303)
    await store.forget_processes()
    assert await store.tracked_processes() == []


async def test_each_worker_has_its_own_processes(store: Store) -> None:
    await store.track_process(101, owner="host/1")
    await store.track_process(101, owner="host/2")  # the same pid on another host
    await store.track_process(202, owner="host/2")
    await store.track_process(303)
    assert await store.tracked_processes("host/1") == [101]
    assert await store.tracked_processes("host/2") == [101, 202]
    await store.untrack_process(101, owner="host/2")
    assert await store.tracked_processes("host/1") == [101]
    await store.forget_processes("host/1")  # a restarted worker clears only its own
    assert await store.tracked_processes("host/1") == []
    assert await store.tracked_processes("host/2") == [202]
    assert await store.tracked_processes() == [303]


# -- SQLite: the schema migration -----------------------------------------------------

# Today's v1 and v2 schema, copied so this test keeps describing a real v2 database.
V2_SCHEMA = [
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

CALLS_0 = '[["call_0", "shell", "{\\"command\\": \\"ls\\"}"]]'
CALLS_1 = '[["call_1", "shell", "{\\"command\\": \\"rm x\\"}"]]'

# What the v2 store left: alice's session 1 ran turn 1 (call_0, with its result) and
# turns 2 and 3 (call_2 of turn 3 left no message, only its turn row); session 2 reused
# turn number 1, which replaced session 1's turn 1 row, and waits for approval of call_1.
# Bob (now in session 3) has a call with neither messages nor a turn row.
V2_ROWS = [
    "INSERT INTO conversations (id, platform, chat_id, thread_id, session, prompt_tokens,"
    " completion_tokens, cost, created_at) VALUES (1, 'console', 'alice', '', 2, 30, 7,"
    " 0.5, 1.0)",
    "INSERT INTO conversations (id, platform, chat_id, session, created_at) VALUES (2,"
    " 'console', 'bob', 3, 1.0)",
    "INSERT INTO messages (conv_id, session, turn, role, content, tool_calls, tool_call_id,"
    " name, created_at) VALUES (1, 1, 1, 'user', 'list files', NULL, NULL, NULL, 2.0),"
    f" (1, 1, 1, 'assistant', '', '{CALLS_0}', NULL, NULL, 3.0),"
    " (1, 1, 1, 'tool', 'a.txt', NULL, 'call_0', 'shell', 4.0),"
    " (1, 1, 1, 'assistant', 'there is a.txt', NULL, NULL, NULL, 5.0),"
    " (1, 1, 2, 'user', 'and now?', NULL, NULL, NULL, 6.0),"
    " (1, 1, 3, 'user', 'third', NULL, NULL, NULL, 6.5),"
    " (1, 2, 1, 'user', 'remove x', NULL, NULL, NULL, 7.0),"
    f" (1, 2, 1, 'assistant', '', '{CALLS_1}', NULL, NULL, 8.0),"
    " (2, 3, 1, 'user', 'hello from bob', NULL, NULL, NULL, 9.0)",
    "INSERT INTO turns (conv_id, turn, session, status, steps, requester, unattended,"
    " reason, started_at) VALUES (1, 1, 2, 'suspended', 1, 'alice', 0, NULL, 7.0),"
    " (1, 3, 1, 'done', 1, 'alice', 1, 'interrupted', 6.5),"
    " (2, 1, 3, 'running', 0, 'bob', 0, NULL, 9.0)",
    "INSERT INTO tool_calls (conv_id, call_id, turn, name, arguments, state, outcome,"
    " updated_at) VALUES (1, 'call_0', 1, 'shell', '{\"command\": \"ls\"}', 'finished',"
    " 'ok', 4.0), (1, 'call_2', 3, 'shell', '{}', 'finished', 'interrupted', 6.6),"
    " (1, 'call_1', 1, 'shell', '{\"command\": \"rm x\"}', 'asking', NULL, 8.0),"
    " (2, 'call_9', 4, 'shell', '{}', 'pending', NULL, 9.5)",
    "INSERT INTO approvals (id, conv_id, call_id, tool, summary, requester, status,"
    " decided_by, created_at, expires_at) VALUES ('ap1', 1, 'call_1', 'shell', 'rm x',"
    " 'alice', 'pending', NULL, 8.0, 68.0), ('ap0', 1, 'call_0', 'shell', 'ls', 'alice',"
    " 'approved', 'alice', 3.5, 63.5)",
    "INSERT INTO rules (id, conv_id, tool, key, created_at) VALUES ('r1', 1, 'shell',"
    " 'ls', 3.6)",
    "INSERT INTO inbound (ref, conv, kind, payload, done, received_at) VALUES"
    " ('m1', 'console:alice', 'message', '{}', 1, 7.0)",
    "INSERT INTO jobs (id, conv_id, spec, kind, anchor, prompt, created_by, last_slot,"
    " active, created_at) VALUES ('j1', 1, 'every 1h', 'interval', 1.0, 'check', 'alice',"
    " NULL, 1, 1.0)",
]


def make_v2(path: Path) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        for script in V2_SCHEMA:
            db.executescript(script)
        db.execute("BEGIN")
        for sql in V2_ROWS:
            db.execute(sql)
        db.execute("PRAGMA user_version=2")
        db.execute("COMMIT")
    finally:
        db.close()


def user_version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


async def test_a_v2_database_upgrades_without_losing_history(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    make_v2(path)
    store = open_store(str(path))
    await store.open()
    try:
        assert user_version(path) == len(SQLITE_MIGRATIONS)
        assert await store.integrity_check() == "ok"
        alice = await store.conversation(ConvKey("console", "alice"))
        assert (alice.id, alice.session, alice.prompt_tokens, alice.cost) == (1, 2, 30, 0.5)
        one = await store.history(1, 1)
        assert [(m.turn, m.role, m.content) for m in one] == [
            (1, "user", "list files"), (1, "assistant", ""), (1, "tool", "a.txt"),
            (1, "assistant", "there is a.txt"), (2, "user", "and now?"), (3, "user", "third")]
        assert one[1].tool_calls == (ToolCall("call_0", "shell", '{"command": "ls"}'),)
        two = await store.history(1, 2)
        assert [(m.turn, m.role, m.content) for m in two] == [
            (1, "user", "remove x"), (1, "assistant", "")]
        assert two[1].tool_calls == (ToolCall("call_1", "shell", '{"command": "rm x"}'),)
        assert [m.content for m in await store.history(2, 3)] == ["hello from bob"]

        # turns keep the session they had
        assert await store.last_turn(1, 2) == TurnRow(1, 2, 1, "suspended", 1, "alice", False)
        assert await store.last_turn(1, 1) == TurnRow(1, 1, 3, "done", 1, "alice", True,
                                                      "interrupted")
        assert sorted((t.conv_id, t.session, t.turn) for t in await store.open_turns()) == [
            (1, 2, 1), (2, 3, 1)]

        # calls: from the tool result message, the assistant message, the turn row,
        # else the conversation's current session
        [c0] = await store.turn_calls(1, 1, 1)
        assert (c0.call.id, c0.state, c0.outcome) == ("call_0", CallState.FINISHED, Outcome.OK)
        [c1] = await store.turn_calls(1, 2, 1)
        assert (c1.call.id, c1.state) == ("call_1", CallState.ASKING)
        [c2] = await store.turn_calls(1, 1, 3)
        assert (c2.call.id, c2.outcome) == ("call_2", Outcome.INTERRUPTED)
        [c9] = await store.turn_calls(2, 3, 4)
        assert c9.call.id == "call_9"
        assert [c.call.id for c in await store.finished_calls(1, 1, 10)] == ["call_0", "call_2"]
        assert await store.finished_calls(1, 2, 10) == []

        # approvals: the pending one is found for its call in its session
        pending = await store.approval_for_call(1, 2, "call_1")
        assert pending is not None and (pending.id, pending.session, pending.status) == (
            "ap1", 2, "pending")
        assert await store.approval_for_call(1, 1, "call_1") is None
        old = await store.approval_for_call(1, 1, "call_0")
        assert old is not None and (old.id, old.decided_by) == ("ap0", "alice")
        assert [a.id for a in await store.pending_approvals()] == ["ap1"]
        assert await store.decide("ap1", "approved", "alice")

        # everything else came along
        assert await store.has_rule(1, "shell", "ls")
        assert [j.id for j in await store.jobs(1)] == ["j1"]
        assert not await store.accept_inbound("m1", ConvKey("console", "alice"), "message",
                                              "{}")
        assert await store.summary(1, 2) is None

        # and the upgraded store works: session 2 reuses call_0 beside session 1's
        await store.set_call(1, 2, "call_1", CallState.FINISHED, Outcome.OK)
        await store.end_turn(1, 2, 1, "done", "completed")
        await store.begin_turn(1, 2, [Msg("user", "again", 2)], "alice", False, [])
        await store.append_assistant(1, 2, asks(2, call("call_0")), 1)
        assert [c.call.id for c in await store.turn_calls(1, 2, 2)] == ["call_0"]
        [c0_again] = await store.turn_calls(1, 1, 1)
        assert c0_again == c0
        await store.set_summary(1, 2, two[-1].id or 0, "they removed x")
        assert await store.summary(1, 2) == (two[-1].id, "they removed x")
    finally:
        await store.close()
    # opening again migrates nothing more
    again = open_store(str(path))
    await again.open()
    try:
        assert user_version(path) == len(SQLITE_MIGRATIONS)
        assert len(await again.history(1, 1)) == 6
    finally:
        await again.close()


async def test_a_fresh_database_is_current(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    store = open_store(str(path))
    await store.open()
    await store.close()
    assert user_version(path) == len(SQLITE_MIGRATIONS)
    db = sqlite3.connect(path)
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        keys = {table: [r[1] for r in sorted(db.execute(f"PRAGMA table_info({table})"),
                                             key=lambda r: r[5]) if r[5]]
                for table in ("turns", "tool_calls", "summaries")}
    finally:
        db.close()
    assert {"turns", "tool_calls", "approvals", "summaries"} <= tables
    assert not any(t.endswith("_v3") for t in tables)
    assert keys == {"turns": ["conv_id", "session", "turn"],
                    "tool_calls": ["conv_id", "session", "call_id"],
                    "summaries": ["conv_id", "session"]}


async def test_a_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    store = open_store(str(path))
    with pytest.raises(StoreError, match="newer"):
        await store.open()
    await store.close()


# -- choosing the backend -------------------------------------------------------------


def test_open_store_chooses_the_backend_by_its_url(tmp_path: Path) -> None:
    for target in ("postgresql://db.example/tandem", "postgres://u@db.example/tandem",
                   "PostgreSQL://db.example/tandem"):
        chosen = open_store(target, pool_size=3)
        assert isinstance(chosen, PostgresStore) and chosen.max_size == 3
    found = {target: open_store(target) for target in (
        f"sqlite://{tmp_path}/a.db", "sqlite://rel/b.db", "plain/c.db", ":memory:")}
    assert {t: (type(s), str(getattr(s, "path", ""))) for t, s in found.items()} == {
        f"sqlite://{tmp_path}/a.db": (SQLiteStore, f"{tmp_path}/a.db"),
        "sqlite://rel/b.db": (SQLiteStore, "rel/b.db"),
        "plain/c.db": (SQLiteStore, "plain/c.db"),
        ":memory:": (SQLiteStore, ":memory:")}


def test_a_sqlite_store_never_imports_psycopg(tmp_path: Path) -> None:
    code = ("import sys; from bot.store.backends import open_store;"
            f" open_store({str(tmp_path / 'x.db')!r});"
            " print(sorted(m for m in sys.modules if m.startswith('psycopg')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], check=True)
    assert done.stdout.strip() == "[]"


# -- PostgreSQL: the schema migration -------------------------------------------------


def _schema_of(tmp_path: Path) -> str:
    return "t_" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:16]


@pytest.fixture
async def pg_url(tmp_path: Path) -> str:
    """A URL of an empty schema of its own for this test."""
    return await PG.schema(_schema_of(tmp_path))


async def _sql(url: str, statement: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(statement, args)
        return await cur.fetchall() if cur.description else []


async def test_postgresql_two_stores_opening_at_once_migrate_once(pg_url: str) -> None:
    first, second = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        await asyncio.gather(first.open(), second.open())
        versions = await _sql(pg_url, "SELECT version FROM schema_version ORDER BY version")
        assert [v for v, in versions] == list(range(1, len(PG_MIGRATIONS) + 1))
        assert await first.integrity_check() == await second.integrity_check() == "ok"
        assert (await first.conversation(KEY)).id == (await second.conversation(KEY)).id
    finally:
        await first.close()
        await second.close()
    assert await migrate(pg_url) == 0


STRICT = "default_transaction_isolation=serializable"
"""A server default that the store overrides: at this level, a second migrator or writer
would fail instead of finding its work done."""


async def test_postgresql_migrate_applies_what_is_pending_once(tmp_path: Path) -> None:
    url = await PG.schema(_schema_of(tmp_path), STRICT)
    assert sorted(await asyncio.gather(migrate(url), migrate(url))) == [0, len(PG_MIGRATIONS)]
    assert await migrate(url) == 0


async def test_postgresql_a_newer_schema_is_refused(pg_url: str) -> None:
    await _sql(pg_url, VERSION_TABLE)
    await _sql(pg_url, "INSERT INTO schema_version VALUES (99, 0)")
    store = PostgresStore(pg_url)
    with pytest.raises(StoreError, match="newer"):
        await store.open()
    await store.close()
    with pytest.raises(StoreError, match="v99 is newer than this Tandem"):
        await migrate(pg_url)
    assert await _sql(pg_url, "SELECT to_regclass('conversations')") == [(None,)]


async def test_postgresql_integrity_check_says_what_is_wrong(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    try:
        await _sql(pg_url, "INSERT INTO schema_version VALUES (%s, 0)",
                   (len(PG_MIGRATIONS) + 1,))
        await _sql(pg_url, "DROP TABLE processes")
        assert await store.integrity_check() == (
            f"missing tables: processes; schema v{len(PG_MIGRATIONS) + 1},"
            f" this Tandem expects v{len(PG_MIGRATIONS)}")
    finally:
        await store.close()


# -- PostgreSQL: a password never shows -----------------------------------------------

SECRET = "Sup3r-S3cret"


def _texts(exc: BaseException | None) -> list[str]:
    """The messages of `exc` and of every exception a traceback of it would show."""
    found = []
    while exc is not None:
        found.append(str(exc))
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return found


def _with_password(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


@pytest.mark.parametrize("password", [SECRET, "p%40ss%2Fw0rd"])
async def test_postgresql_a_password_never_shows_in_a_failed_open(pg_url: str,
                                                                   password: str) -> None:
    refused = "postgresql://tandem:{}@127.0.0.1:1/tandem"
    unknown = _with_password(pg_url, "no_such_role", "{}")
    for url in (refused.format(password), unknown.format(password),
                f"postgresql://127.0.0.1:1/tandem?user=tandem&password={password}"):
        store = PostgresStore(url)
        with pytest.raises(StoreError) as caught:
            await store.open()
        await store.close()
        with pytest.raises(StoreError) as migrating:
            await migrate(url)
        for text in _texts(caught.value) + _texts(migrating.value):
            assert password not in text and "p@ss/w0rd" not in text
        assert "cannot open the database postgresql://" in str(caught.value)
        assert "***" in str(caught.value)


async def test_postgresql_a_password_never_shows_in_a_database_error(pg_url: str) -> None:
    parts = urlsplit(pg_url)
    if parts.password:  # the server wants one: that is the one to hide
        secret, url = parts.password, pg_url
    else:  # a server that trusts us ignores a password given anyway
        [(user,)] = await _sql(pg_url, "SELECT current_user")
        secret, url = SECRET, _with_password(pg_url, user, SECRET)
    store = PostgresStore(url)
    await store.open()
    try:
        conv = await store.conversation(KEY)
        row = ApprovalRow(secret, conv.id, 1, "call_0", "shell", "ls", "u1", "pending", 1.0, 2.0)
        await store.add_approval(row)
        with pytest.raises(StoreError) as caught:  # its detail names the key: the secret
            await store.add_approval(row)
    finally:
        await store.close()
    assert "duplicate key" in str(caught.value)
    assert all(secret not in text for text in _texts(caught.value))


def test_the_postgresql_helper_fails_clearly_without_a_server() -> None:
    with pytest.raises(pytest.fail.Exception) as caught, pg.database(
            f"postgresql://tandem:{SECRET}@127.0.0.1:1/test"):
        pass
    message = str(caught.value.msg)
    assert "not reachable at postgresql://tandem:***@127.0.0.1:1/test" in message
    assert "TANDEM_TEST_PG=" in message and SECRET not in message


# -- PostgreSQL: several processes on one database ------------------------------------


@pytest.fixture
async def two_stores(pg_url: str, tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores on one database (`pg_url`'s schema), as two processes would have, on a
    server whose default isolation level is stricter than the store's."""
    url = await PG.schema(_schema_of(tmp_path), STRICT)
    first, second = PostgresStore(url), PostgresStore(url)
    await first.open()
    await second.open()
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def _race(url: str, lock: str, args: tuple[Any, ...],
                *calls: Coroutine[Any, Any, Any]) -> list[Any]:
    """Run `calls` while a third transaction holds the row lock `lock` takes, and let it
    go once every call waits for it: the calls then contend for the row, rather than
    happening to run one after the other."""
    async with (await psycopg.AsyncConnection.connect(url) as holder,
                await psycopg.AsyncConnection.connect(url, autocommit=True) as watcher):
        await holder.execute(lock, args)
        tasks = [asyncio.create_task(c) for c in calls]
        try:
            async with asyncio.timeout(10):
                while await _waiting_for_locks(watcher) < len(calls):
                    await asyncio.sleep(0.01)
            await holder.rollback()
            return await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()


async def _waiting_for_locks(conn: psycopg.AsyncConnection[tuple[Any, ...]]) -> int:
    cur = await conn.execute("SELECT count(*) FROM pg_stat_activity"
                             " WHERE datname = current_database() AND wait_event_type = 'Lock'")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def test_postgresql_two_copies_of_an_inbound_at_once_accept_one(
        two_stores: tuple[Store, Store], pg_url: str) -> None:
    a, b = two_stores
    results = await _race(
        pg_url, "INSERT INTO inbound (ref, conv, kind, payload, received_at)"
        " VALUES ('m1', 'x', 'message', '{}', 0)", (),
        a.accept_inbound("m1", KEY, "message", '{"copy": "a"}'),
        b.accept_inbound("m1", KEY, "message", '{"copy": "b"}'))
    assert sorted(results) == [False, True]
    [(ref, kind, payload)] = await a.unprocessed_inbound()
    assert (ref, kind) == ("m1", "message")
    assert payload == ('{"copy": "a"}' if results[0] else '{"copy": "b"}')


async def test_postgresql_two_decisions_at_once_decide_once(
        two_stores: tuple[Store, Store], pg_url: str) -> None:
    a, b = two_stores
    row = approval(await a.conversation(KEY), "call_0")
    await a.add_approval(row)
    results = await _race(pg_url, "SELECT 1 FROM approvals WHERE id = %s FOR UPDATE", (row.id,),
                          a.decide(row.id, "approved", "ann"), b.decide(row.id, "denied", "bob"))
    assert sorted(results) == [False, True]
    decided = await b.approval(row.id)
    assert decided is not None
    assert (decided.status, decided.decided_by) == (
        ("approved", "ann") if results[0] else ("denied", "bob"))


async def test_postgresql_two_schedulers_on_one_slot_claim_it_once(
        two_stores: tuple[Store, Store], pg_url: str) -> None:
    a, b = two_stores
    row = job(await a.conversation(KEY))
    await a.add_job(row)
    results = await _race(pg_url, "SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (row.id,),
                          a.claim_slot(row.id, 2000.0, "job-a", KEY, "{}"),
                          b.claim_slot(row.id, 2000.0, "job-b", KEY, "{}"))
    assert sorted(results) == [False, True]
    assert [r for r, _, _ in await a.unprocessed_inbound()] == [
        "job-a" if results[0] else "job-b"]
    claimed = await b.job(row.id)
    assert claimed is not None and claimed.last_slot == 2000.0


async def test_postgresql_one_inbound_begins_one_turn_from_two_workers(
        two_stores: tuple[Store, Store], pg_url: str) -> None:
    a, b = two_stores
    conv = await a.conversation(KEY)
    assert await a.accept_inbound("in-1", KEY, "message", "{}")
    assert await a.accept_inbound("in-2", KEY, "message", "{}")
    results = await _race(
        pg_url, "SELECT 1 FROM inbound WHERE ref = ANY(%s) FOR UPDATE", (["in-1", "in-2"],),
        a.begin_turn(conv.id, 1, [Msg("user", "from a", 1)], "u1", False, ["in-2", "in-1"]),
        b.begin_turn(conv.id, 1, [Msg("user", "from b", 1)], "u1", False, ["in-1", "in-2"]))
    assert sorted(r is None for r in results) == [False, True]
    [began] = [r for r in results if r is not None]
    assert await b.history(conv.id, 1) == began
    assert await a.unprocessed_inbound() == []
    last = await b.last_turn(conv.id, 1)
    assert last is not None and (last.turn, last.status) == (1, "running")


async def test_postgresql_a_write_another_process_won_is_a_conflict_not_unavailable(
        two_stores: tuple[Store, Store]) -> None:
    a, b = two_stores
    conv = await a.conversation(KEY)
    await a.begin_turn(conv.id, conv.session, [Msg("user", "from a", 1)], "u1", False, [])
    with pytest.raises(StoreConflict) as caught:  # b did not know a began turn 1
        await b.begin_turn(conv.id, conv.session, [Msg("user", "from b", 1)], "u1", False, [])
    assert "turns_pkey" in str(caught.value)
    told = user_message(caught.value)
    assert "unavailable" not in told and "Another Tandem process" in told
    assert told != user_message(StoreError("database error: connection refused"))
    for exc in (psycopg.errors.SerializationFailure("could not serialize access"),
                psycopg.errors.DeadlockDetected("deadlock detected")):
        with pytest.raises(StoreConflict):
            fail("database error", exc, "postgresql://db/t")
    with pytest.raises(StoreError) as other:  # the database itself failing is not one
        fail("database error", psycopg.OperationalError("server closed"), "postgresql://db/t")
    assert not isinstance(other.value, StoreConflict)


# -- the audit log and the spending ledger -------------------------------------------


async def _raw(store: Store, sql: str) -> None:
    """A statement on the store's own connection (what a bug in the store would run)."""
    if isinstance(store, SQLiteStore):
        await store._run(lambda db: db.execute(sql))
    else:
        assert isinstance(store, PostgresStore)
        await store._count(sql)


async def test_audit_entries_append_and_read_back_by_conversation_and_time(
        store: Store) -> None:
    now = time.time()
    await store.append_audit([
        AuditRow(now - 10, "asked", "telegram:1", "42", "shell", '{"call": "ls"}'),
        AuditRow(now - 5, "decided", "telegram:1", "7", "shell", '{"status": "approved"}'),
        AuditRow(now, "refused", "", "99", "", '{"what": "access"}')])
    rows = await store.audit()
    assert [r.kind for r in rows] == ["asked", "decided", "refused"]
    assert rows[1].actor == "7" and rows[1].detail == '{"status": "approved"}'
    assert [r.kind for r in await store.audit(conv="telegram:1")] == ["asked", "decided"]
    assert [r.kind for r in await store.audit(since=now - 6)] == ["decided", "refused"]
    assert [r.kind for r in await store.audit(limit=1)] == ["refused"]


async def test_the_audit_log_refuses_updates_and_early_deletes(store: Store) -> None:
    now = time.time()
    await store.append_audit([AuditRow(now - 3 * 86400, "tool", "c", "1", "shell", "{}"),
                              AuditRow(now, "tool", "c", "1", "shell", "{}")])
    with pytest.raises(StoreError, match="append-only"):
        await _raw(store, "UPDATE audit SET kind = 'nothing'")
    with pytest.raises(StoreError, match="append-only"):
        await _raw(store, "DELETE FROM audit")
    assert len(await store.audit()) == 2
    with pytest.raises(StoreError, match="append-only"):  # pruning cannot reach today
        await store.prune_audit(now + 1)
    assert await store.prune_audit(now - 86400) == 1
    assert [r.at for r in await store.audit()] == [now]


async def test_spending_adds_up_per_day_and_scope_and_a_lift_is_kept(store: Store) -> None:
    await store.add_spend("2026-12-03", ["user:telegram:1", "conv:5"], 100, 0.5)
    await store.add_spend("2026-12-03", ["user:telegram:1", "conv:6"], 20, 0.0)
    await store.add_spend("2026-12-04", ["user:telegram:1"], 1, 0.0)
    spent = await store.spent("2026-12-03", ["user:telegram:1", "conv:5", "conv:7"])
    assert spent == {"user:telegram:1": Spent(120, 0.5, False), "conv:5": Spent(100, 0.5, False)}
    await store.lift_budget("2026-12-03", "conv:5")
    await store.lift_budget("2026-12-03", "conv:9")
    spent = await store.spent("2026-12-03", ["conv:5", "conv:9"])
    assert spent == {"conv:5": Spent(100, 0.5, True), "conv:9": Spent(0, 0.0, True)}
    assert (await store.spent("2026-12-04", ["conv:5"])) == {}



# -- the talk around conversations -----------------------------------------------------


def talk(kind: str, message_id: str, text: str, *, place: str = "telegram:-5",
         author: str = "Bob", outside: bool = False) -> TalkRow:
    return TalkRow(place, message_id, kind, "u-" + author, author, outside, text, at=50.0)


async def test_talk_keeps_the_newest_rows_of_each_kind_per_place(store: Store) -> None:
    for n in range(5):
        await store.keep_talk(talk("aside", f"a{n}", f"aside {n}", outside=n == 4), keep=3)
    await store.keep_talk(talk("said", "s1", "to Tandem"), keep=3)
    await store.keep_talk(talk("aside", "x", "elsewhere", place="telegram:-6"), keep=3)

    taken = await store.take_talk(["telegram:-5"])

    assert [r.text for r in taken] == ["aside 2", "aside 3", "aside 4"]  # the said row stays
    assert [r.outside for r in taken] == [False, False, True]
    assert taken[0] == talk("aside", "a2", "aside 2")
    assert await store.take_talk(["telegram:-5"]) == []  # read once
    assert await store.talk_of("telegram:-5", "s1") == talk("said", "s1", "to Tandem")
    assert await store.talk_of("telegram:-5", "a0") is None  # pruned
    assert [r.text for r in await store.take_talk(["telegram:-6", "telegram:-5"])] \
        == ["elsewhere"]


async def test_an_edit_changes_an_unread_aside_and_the_text_of_a_message_tandem_saw(
        store: Store) -> None:
    await store.keep_talk(talk("said", "s1", "draft"), keep=10)
    await store.keep_talk(talk("aside", "a1", "teh plan"), keep=10)
    await store.keep_talk(talk("aside", "a2", "read already"), keep=10)
    await store.take_talk(["telegram:-5"])
    await store.keep_talk(talk("aside", "a3", "unread"), keep=10)

    assert await store.edit_talk("telegram:-5", "a3", "unread, fixed") is True
    assert await store.edit_talk("telegram:-5", "a2", "changed late") is False
    assert await store.edit_talk("telegram:-5", "s1", "final") is False
    assert await store.edit_talk("telegram:-5", "nope", "x") is False

    said = await store.talk_of("telegram:-5", "s1")
    assert said is not None and said.text == "final"
    assert [r.text for r in await store.take_talk(["telegram:-5"])] == ["unread, fixed"]


async def test_the_authors_of_a_place_are_listed_once_first_to_speak_first(
        store: Store) -> None:
    for author in ("Dana", "Bob", "Dana"):
        await store.keep_talk(talk("said", author, "hi", author=author), keep=10)
    await store.keep_talk(talk("aside", "a1", "not to Tandem", author="Eve"), keep=10)
    await store.keep_talk(talk("said", "x", "elsewhere", place="telegram:-6", author="Zed"),
                          keep=10)

    assert await store.talk_authors("telegram:-5") == ["Dana", "Bob"]


async def test_forgetting_a_place_drops_all_it_kept(store: Store) -> None:
    await store.keep_talk(talk("said", "s1", "hi"), keep=10)
    await store.keep_talk(talk("edit", "s1", "hello", author="Dana"), keep=10)
    await store.keep_talk(talk("aside", "a1", "kept", place="telegram:-6"), keep=10)

    await store.forget_talk(["telegram:-5"])

    assert await store.talk_of("telegram:-5", "s1") is None
    assert await store.take_talk(["telegram:-5"]) == []
    assert len(await store.take_talk(["telegram:-6"])) == 1
