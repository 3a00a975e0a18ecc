"""Fault suite: the model, the platforms and the database misbehave; nothing is lost.

The model answers 429 (with retry-after), 500, never answers (hang, with a short
`llm.timeout_s`) or drops the stream mid-answer. Telegram and Slack answer 429 and 5xx.
The database is locked by another connection for about a second during a turn (and, as
a harder case, for longer than the store's 5 s busy timeout).

In every case the user ends up with the answer (after a retry) or a short, clear message;
the history stays valid (the strict fake model records no violation and a following turn
works); and the chat finally shows every final answer, with no button left on it.
Everything is real: litellm, python-telegram-bot, slack-bolt and SQLite, against the
loopback fakes.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.core.errors import USER_MESSAGES, ModelRateLimited, ModelStreamCut, StoreError
from bot.core.events import ApprovalRequested, Decision, Notice, TurnEnded, Verdict
from tests.conftest import Core, said
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.suites.harness import (
    ANN,
    FaultySlack,
    FaultyTelegram,
    SlackRig,
    integrity,
    tg_rig,
)

SERVER_500, NO_ANSWER = "the server answered 500", "no answer within 0.5 s"


def unreachable(model: FakeModelServer, why: str = SERVER_500) -> str:
    """What the chat shows when the model keeps failing: why, and where."""
    return f"The model call failed: {why} ({model.api_base}). Please try again in a moment."


RATE_LIMITED = USER_MESSAGES[ModelRateLimited]
CUT_OFF = USER_MESSAGES[ModelStreamCut].format(cause="the connection was lost")
LIST = ToolCallSpec("list_dir", {"path": "."})
ECHO = ToolCallSpec("shell", {"command": "echo hi > out.txt"})


def fault(kind: str) -> Reply:
    """One failed model answer; "drop" cuts a long streamed answer half way."""
    if kind == "drop":
        return Reply(text="partial " * 60, fault="drop")
    return Reply(fault=kind, retry_after=1)


def roles(model: FakeModelServer, index: int = -1) -> list[str]:
    """The roles of a request's messages, without its final state note."""
    messages = model.requests[index]["messages"]
    assert said(messages[-1:]) == [], "the state note must be the last message"
    return [m["role"] for m in messages[:-1]]


def user_texts(model: FakeModelServer, index: int = -1) -> list[str]:
    return said(model.requests[index]["messages"])


class Lock:
    """A second connection holding `BEGIN EXCLUSIVE` on the database for `seconds`."""

    def __init__(self, db: Path, seconds: float) -> None:
        self.db, self.seconds = db, seconds
        self.taken, self.released = threading.Event(), threading.Event()

    def _hold(self) -> None:
        conn = sqlite3.connect(self.db, timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            self.taken.set()
            time.sleep(self.seconds)
            conn.execute("COMMIT")
        finally:
            conn.close()
            self.released.set()

    async def __aenter__(self) -> Lock:
        threading.Thread(target=self._hold, daemon=True).start()
        await asyncio.to_thread(self.taken.wait, 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.released.wait, 30)


# ---- the terminal core: model faults ------------------------------------------------------


@pytest.mark.parametrize("kind", ["429", "500", "hang", "drop"])
async def test_one_model_fault_is_retried_and_the_answer_arrives(
        kind: str, model: FakeModelServer, config_factory: Callable[..., Any]) -> None:
    model.script(fault(kind), Reply(text="The answer."), Reply(text="Next answer."))
    async with Core(config_factory(llm__timeout_s=0.5 if kind == "hang" else 5)) as core:
        started = time.monotonic()
        await core.say("question one")
        [ended] = await core.sink.ended(timeout=15)
        took = time.monotonic() - started
        await core.say("question two")
        second = (await core.sink.ended(2))[-1]
    assert (ended.text, ended.reason) == ("The answer.", "completed")
    assert not core.sink.of(Notice)
    if kind == "429":
        assert took >= 0.75, "retry-after: 1 was not honoured"
    assert second.text == "Next answer."
    assert user_texts(model)[:-1] == ["[Ann] question one"]
    assert roles(model)[1:] == ["user", "assistant", "user"]  # the failure left nothing behind


@pytest.mark.parametrize(("kind", "message"), [("429", RATE_LIMITED), ("500", SERVER_500),
                                               ("hang", NO_ANSWER), ("drop", CUT_OFF)])
async def test_a_persistent_model_fault_ends_with_a_short_clear_message(
        kind: str, message: str, model: FakeModelServer,
        config_factory: Callable[..., Any]) -> None:
    model.script(fault(kind), fault(kind), Reply(text="Back again."))
    async with Core(config_factory(llm__timeout_s=0.5 if kind == "hang" else 5)) as core:
        started = time.monotonic()
        await core.say("question one")
        [ended] = await core.sink.ended(timeout=15)
        took = time.monotonic() - started
        await core.say("question two")
        second = (await core.sink.ended(2))[-1]
    if kind in ("500", "hang"):
        message = unreachable(model, message)
    assert (ended.text, ended.reason) == (message, "error")
    assert len(ended.text) < 120 and "partial" not in ended.text
    assert took < 10
    assert second.text == "Back again."
    assert user_texts(model)[-2].startswith("[Ann] question one")  # still in the history


async def test_a_dropped_tool_call_is_not_recorded_half(model: FakeModelServer,
                                                        config_factory: Callable[..., Any]
                                                        ) -> None:
    model.script(Reply(tool_calls=[LIST], fault="drop", chunk_size=2), Reply(tool_calls=[LIST]),
                 Reply(text="Listed."), Reply(text="Next."))
    async with Core(config_factory()) as core:
        await core.say("list it")
        [ended] = await core.sink.ended()
        await core.say("and now?")
        await core.sink.ended(2)
    assert ended.text == "Listed."
    last = model.requests[-1]["messages"]
    calls = [m for m in last if m["role"] == "assistant" and m.get("tool_calls")]
    assert len(calls) == 1 and len(calls[0]["tool_calls"]) == 1
    assert sum(m["role"] == "tool" for m in last) == 1


async def test_the_model_failing_after_a_tool_call_keeps_the_history_valid(
        model: FakeModelServer, config_factory: Callable[..., Any]) -> None:
    model.script(Reply(tool_calls=[LIST]), Reply(fault="500"), Reply(fault="500"),
                 Reply(text="Recovered."))
    async with Core(config_factory()) as core:
        await core.say("list it")
        [ended] = await core.sink.ended()
        await core.say("try again")
        second = (await core.sink.ended(2))[-1]
    assert (ended.text, ended.reason) == (unreachable(model), "error")
    assert second.text == "Recovered."
    assert roles(model)[1:] == ["user", "assistant", "tool", "user"]


async def test_a_model_fault_while_an_approval_resumes(model: FakeModelServer,
                                                       config_factory: Callable[..., Any],
                                                       tmp_path: Path) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(fault="500"), Reply(fault="500"),
                 Reply(text="Done now."))
    async with Core(config_factory()) as core:
        await core.say("write it")
        await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        approval = core.sink.of(ApprovalRequested)[0]
        await core.hub.submit(Decision(core.key, core.user, approval.approval_id,
                                       Verdict.APPROVE))
        ended = await core.sink.ended(1)
        await core.say("and?")
        last = (await core.sink.ended(2))[-1]
    assert ended[-1].text == unreachable(model)
    assert (tmp_path / "workspace" / "out.txt").read_text() == "hi\n"
    assert last.text == "Done now."


# ---- the terminal core: the database is locked -------------------------------------------


async def test_a_locked_database_during_a_turn_only_delays_it(
        model: FakeModelServer, config_factory: Callable[..., Any], tmp_path: Path) -> None:
    model.script(Reply(text="slow " * 40, chunk_delay=0.01), Reply(text="Second."))
    db = tmp_path / "tandem.db"
    async with Core(config_factory()) as core:
        await core.say("first")
        await model.wait_requests(1)
        async with Lock(db, 1.0):  # the answer must be stored while the lock is held
            [ended] = await core.sink.ended()
        async with Lock(db, 1.0):  # and a message arriving under the lock waits for it
            await core.say("second")
        second = (await core.sink.ended(2))[-1]
    assert ended.text.split() == ["slow"] * 40 and ended.reason == "completed"
    assert second.text == "Second." and not core.sink.of(Notice)
    assert integrity(db) == "ok"


async def test_a_turn_the_store_gives_up_on_still_ends(
        model: FakeModelServer, config_factory: Callable[..., Any], tmp_path: Path) -> None:
    """A lock longer than the 5 s busy timeout: every TurnStarted must get its TurnEnded
    (adapters only close the live message on it), with the database message."""
    model.script(Reply(text="slow " * 40, chunk_delay=0.005), Reply(text="Second."))
    async with Core(config_factory()) as core:
        await core.say("first")
        await model.wait_requests(1)
        async with Lock(tmp_path / "tandem.db", 5.9):  # storing the answer gives up at ~5.3 s
            await asyncio.sleep(0)
        await core.hub.idle()
        ended = list(core.sink.of(TurnEnded))
        notices = [n.text for n in core.sink.of(Notice)]
        await core.say("second")
        await core.sink.wait(lambda: any(e.text == "Second." for e in core.sink.of(TurnEnded)))
    assert [e.reason for e in ended] == ["error"], (ended, notices)
    assert ended[0].text == USER_MESSAGES[StoreError], (ended, notices)


# ---- Telegram ----------------------------------------------------------------------------


@pytest.fixture
async def tg() -> Any:
    async with FaultyTelegram(flood=False) as server:
        yield server
        assert server.internal_errors == []


async def test_telegram_shows_a_model_failure_in_place_of_the_answer(
        tmp_path: Path, model: FakeModelServer, tg: FaultyTelegram) -> None:
    model.script(fault("500"), fault("500"), Reply(text="Fine now."))
    async with tg_rig(tmp_path, model, tg) as r:
        tg.push_message(ANN, ANN, "hi")
        await r.answered(ANN, unreachable(model))
        tg.push_message(ANN, ANN, "again")
        await r.answered(ANN, "Fine now.")
        await r.hub.idle()
    assert tg.bot_texts(ANN) == [unreachable(model), "Fine now."]


async def test_telegram_5xx_on_the_placeholder_and_the_final_edit(
        tmp_path: Path, model: FakeModelServer, tg: FaultyTelegram) -> None:
    model.script(Reply(text="streamed " * 30, chunk_delay=0.01), Reply(text="Second."))
    async with tg_rig(tmp_path, model, tg) as r:
        tg.fail("sendMessage", status=500)
        tg.fail("editMessageText", status=502,
                when=lambda p: "reply_markup" not in p)  # the final edit (buttons removed)
        tg.push_message(ANN, ANN, "stream please")
        await r.until(lambda: any(not m.reply_markup and m.text.count("streamed") == 30
                                  for m in r.bot(ANN)), timeout=20)
        tg.push_message(ANN, ANN, "again")
        await r.answered(ANN, "Second.")
        await r.hub.idle()
    assert tg.injected == [("sendMessage", 500), ("editMessageText", 502)]
    assert [t.split()[0] for t in tg.bot_texts(ANN)] == ["streamed", "Second."]


async def test_telegram_429_on_send_is_waited_out(tmp_path: Path, model: FakeModelServer,
                                                  tg: FaultyTelegram) -> None:
    model.script(Reply(text="After the wait."))
    async with tg_rig(tmp_path, model, tg) as r:
        tg.fail("sendMessage", status=429, retry_after=1)
        started = time.monotonic()
        tg.push_message(ANN, ANN, "hi")
        await r.answered(ANN, "After the wait.")
        took = time.monotonic() - started
        await r.hub.idle()
    assert took >= 1.0
    assert tg.bot_texts(ANN) == ["After the wait."]


async def test_telegram_flood_control_while_streaming_loses_nothing(
        tmp_path: Path, model: FakeModelServer) -> None:
    answer = " ".join(f"t{i}" for i in range(200))
    model.script(Reply(text=answer, chunk_size=6, chunk_delay=0.01), Reply(text="Next."))
    async with FaultyTelegram(edit_interval=1.0, burst=1, retry_after=1) as fake, \
            tg_rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "stream")
        await r.answered(ANN, answer, timeout=20)
        fake.push_message(ANN, ANN, "next")
        await r.answered(ANN, "Next.", timeout=10)
        await r.hub.idle()
        assert fake.rate_limited and fake.internal_errors == []
    assert fake.bot_texts(ANN) == [answer, "Next."]


def _live(params: dict[str, Any]) -> bool:
    return "reply_markup" in params  # the placeholder, with its Cancel button


async def test_telegram_slow_reply_to_the_placeholder_is_waited_for(
        tmp_path: Path, model: FakeModelServer, tg: FaultyTelegram) -> None:
    # Slower than the transport's 5 s read timeout: a send waits longer for its reply,
    # so the placeholder is known and becomes the answer.
    model.script(Reply(text="Here it is.", chunk_delay=0.3))
    async with tg_rig(tmp_path, model, tg, adapter_args={"placeholder_delay": 0.01}) as r:
        tg.stall("sendMessage", 6.0, when=_live)
        tg.push_message(ANN, ANN, "hi")
        await r.answered(ANN, "Here it is.", timeout=20)
        await r.until(lambda: tg.stalling == 0)
        await r.hub.idle()
    assert tg.injected == [("sendMessage", 200)]
    assert [(m.text, m.reply_markup) for m in r.bot(ANN)] == [("Here it is.", None)]


async def test_telegram_lost_placeholder_reply_leaves_no_live_cancel_button(
        tmp_path: Path, model: FakeModelServer, tg: FaultyTelegram) -> None:
    # The reply never comes in time: the answer follows as a new message, and the
    # orphaned placeholder's Cancel button goes away when pressed, cancelling nothing.
    model.script(Reply(text="Here it is.", chunk_delay=0.2), Reply(text="Still here."))
    async with tg_rig(tmp_path, model, tg, adapter_args={"placeholder_delay": 0.01}) as r:
        r.adapter.api.send_timeout = 0.5
        tg.stall("sendMessage", 1.5, when=_live)
        tg.push_message(ANN, ANN, "hi")
        await r.answered(ANN, "Here it is.", timeout=20)
        await r.until(lambda: tg.stalling == 0)  # the stalled placeholder lands late
        orphan = next(m for m in r.bot(ANN) if m.text != "Here it is.")
        assert orphan.reply_markup is not None
        cancel = orphan.reply_markup["inline_keyboard"][0][0]["callback_data"]
        tg.push_callback(ANN, ANN, orphan.message_id, cancel)
        await r.until(lambda: tg.message(ANN, orphan.message_id).reply_markup is None)
        await r.settle()
        tg.push_message(ANN, ANN, "again")
        await r.answered(ANN, "Still here.")
        await r.hub.idle()
    texts = tg.bot_texts(ANN)
    assert texts.count("Here it is.") == 1 and texts[-1] == "Still here."
    assert not any(m.reply_markup for m in r.bot(ANN))
    assert len(model.requests) == 2  # the press cancelled nothing and asked nothing


async def test_telegram_polling_survives_5xx(tmp_path: Path, model: FakeModelServer,
                                             tg: FaultyTelegram) -> None:
    model.script(Reply(text="Got it."))
    async with tg_rig(tmp_path, model, tg) as r:
        tg.fail("getUpdates", status=502, times=2)
        tg.push_message(ANN, ANN, "hello")
        await r.answered(ANN, "Got it.", timeout=15)
        await r.hub.idle()
    assert ("getUpdates", 502) in tg.injected


async def test_telegram_approval_card_survives_a_5xx(tmp_path: Path, model: FakeModelServer,
                                                     tg: FaultyTelegram) -> None:
    """A card lost to one 5xx leaves an approval nobody can press for 30 minutes."""
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Wrote it."))
    async with tg_rig(tmp_path, model, tg) as r:
        tg.fail("sendMessage", status=502, when=lambda p: str(p.get("text")).startswith("🔐"))
        tg.push_message(ANN, ANN, "write it")
        card, approval_id = await r.card(ANN, timeout=4.5)
        r.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await r.answered(ANN, "Wrote it.")
        await r.hub.idle()
    assert (r.workspace / "out.txt").exists()


async def test_telegram_approval_outcome_survives_a_5xx(tmp_path: Path,
                                                        model: FakeModelServer,
                                                        tg: FaultyTelegram) -> None:
    """The card's outcome edit failing once leaves live buttons on a decided card."""
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Wrote it."))
    async with tg_rig(tmp_path, model, tg) as r:
        tg.fail("editMessageText", status=500, when=lambda p: "Approved by" in str(p.get("text")))
        tg.push_message(ANN, ANN, "write it")
        card, approval_id = await r.card(ANN)
        r.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await r.answered(ANN, "Wrote it.")
        await r.until(lambda: "✅ Approved by Ann" in tg.message(ANN, card.message_id).text,
                      timeout=4.5)
        await r.hub.idle()
    assert tg.message(ANN, card.message_id).reply_markup is None


async def test_telegram_command_reply_survives_a_5xx(tmp_path: Path, model: FakeModelServer,
                                                     tg: FaultyTelegram) -> None:
    """Notices (command output, "approval expired", error notes) go out once, unretried."""
    async with tg_rig(tmp_path, model, tg) as r:
        tg.fail("sendMessage", status=500)
        tg.push_message(ANN, ANN, "/help")
        await r.until(lambda: any(t.startswith("Tandem answers here")
                                  for t in tg.bot_texts(ANN)), timeout=4.5)
        await r.hub.idle()
    assert model.requests == []


async def test_telegram_locked_database_for_a_moment(tmp_path: Path, model: FakeModelServer,
                                                     tg: FaultyTelegram) -> None:
    model.script(Reply(text="slow " * 30, chunk_delay=0.01), Reply(text="Second."))
    db = tmp_path / "tandem.db"
    async with tg_rig(tmp_path, model, tg) as r:
        tg.push_message(ANN, ANN, "first")
        await model.wait_requests(1)
        async with Lock(db, 1.0):
            await r.until(lambda: any(m.text.count("slow") == 30 and not m.reply_markup
                                      for m in r.bot(ANN)))
        async with Lock(db, 1.0):
            tg.push_message(ANN, ANN, "second")
            await r.answered(ANN, "Second.")
        await r.hub.idle()
    assert len(tg.bot_texts(ANN)) == 2
    assert integrity(db) == "ok"


async def test_telegram_message_under_a_lock_longer_than_busy_timeout_is_not_lost(
        tmp_path: Path, model: FakeModelServer, tg: FaultyTelegram) -> None:
    """The store gives up after 5 s; the user must get the answer or a clear message."""
    model.script(Reply(text="Answered after all."))
    async with tg_rig(tmp_path, model, tg) as r:
        async with Lock(tmp_path / "tandem.db", 5.6):  # recording it gives up at ~5.1 s
            tg.push_message(ANN, ANN, "hello?")
            await r.until(lambda: not tg.pending_updates)
        await r.until(lambda: bool(tg.bot_texts(ANN)) and not any(m.reply_markup
                                                                  for m in r.bot(ANN)),
                      timeout=3)
        await r.hub.idle()
    shown = tg.bot_texts(ANN)
    assert shown in (["Answered after all."], [USER_MESSAGES[StoreError]]), shown


async def test_telegram_turn_broken_by_a_long_lock_does_not_leave_a_live_placeholder(
        tmp_path: Path, model: FakeModelServer, tg: FaultyTelegram) -> None:
    """A turn that dies on the store must still end on screen (no Cancel button, no
    'Thinking…' left), and the next message must work."""
    model.script(Reply(text="slow " * 40, chunk_delay=0.005), Reply(text="Second."))
    async with tg_rig(tmp_path, model, tg) as r:
        tg.push_message(ANN, ANN, "first")
        await model.wait_requests(1)
        async with Lock(tmp_path / "tandem.db", 5.9):  # storing the answer gives up at ~5.3 s
            await asyncio.sleep(0)
        await r.hub.idle()
        await r.until(lambda: all(c.status for c in tg.calls_to("sendChatAction")))  # landed
        typing = len(tg.chat_actions)
        # a fixed wait: typing that goes on would show within it (typing_interval is 0.2 s
        # here); its absence sends no signal
        await asyncio.sleep(0.5)
        still_typing = len(tg.chat_actions) - typing
        live = [m.text[:40] for m in r.bot(ANN) if m.reply_markup]
        tg.push_message(ANN, ANN, "second")
        await r.answered(ANN, "Second.")
        await r.hub.idle()
    assert live == [], f"a finished turn still shows a live message: {live}"
    assert still_typing == 0, "the dead turn still sends 'typing…'"


# ---- Slack ---------------------------------------------------------------------------------


@pytest.fixture
async def slack() -> Any:
    async with FaultySlack(rate_limit=False) as server:
        yield server


async def test_slack_shows_a_model_failure_in_place_of_the_answer(
        slack: FaultySlack, model: FakeModelServer, tmp_path: Path) -> None:
    model.script(fault("hang"), fault("hang"), Reply(text="Fine now."))
    async with SlackRig(slack, model, tmp_path, "socket", llm__timeout_s=0.5) as rig:
        await rig.say("D1", "U1", "hi")
        await rig.wait_text("D1", "The model call failed: no answer within 0.5 s", timeout=15)
        await rig.settle()
        await rig.say("D1", "U1", "again")
        await rig.wait_text("D1", "Fine now.")
        await rig.settle()
    failed, fine = rig.texts("D1")
    assert failed.startswith(f"The model call failed: {NO_ANSWER} (") and fine == "Fine now."
    assert not any(b["type"] == "actions" for m in slack.bot_messages("D1")
                   for b in m.blocks or [])


async def test_slack_5xx_and_429_on_posts_and_updates(slack: FaultySlack,
                                                      model: FakeModelServer,
                                                      tmp_path: Path) -> None:
    model.script(Reply(text="streamed " * 30, chunk_delay=0.01), Reply(text="Second."))
    async with SlackRig(slack, model, tmp_path, "socket") as rig:
        slack.fail("chat.postMessage", status=429, retry_after=1)  # the placeholder
        slack.fail("chat.postMessage", status=500)  # and again
        slack.fail("chat.update", status=503, when=lambda p: "tandem_cancel" not in str(p))
        slack.fail("chat.update", status=429, retry_after=1)
        await rig.say("D1", "U1", "stream please")
        await rig.fake.wait_for(lambda: any(t.count("streamed") == 30 for t in rig.texts("D1"))
                                and not any("tandem_cancel" in str(m.blocks)
                                            for m in slack.bot_messages("D1")), timeout=20)
        await rig.settle()
        await rig.say("D1", "U1", "again")
        await rig.wait_text("D1", "Second.")
        await rig.settle()
    assert sorted(s for _, s in slack.injected) == [429, 429, 500, 503]
    assert [t.split()[0] for t in rig.texts("D1")] == ["streamed", "Second."]


async def test_slack_approval_card_and_notices_survive_5xx_and_429(
        slack: FaultySlack, model: FakeModelServer, tmp_path: Path) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Wrote it."))
    async with SlackRig(slack, model, tmp_path, "socket") as rig:
        slack.fail("chat.postMessage", status=502, when=lambda p: "wants to run" in str(p))
        await rig.say("D1", "U1", "write it")
        card = await rig.card("D1")
        slack.fail("chat.update", status=500, when=lambda p: "Approved by" in str(p))
        await rig.press("D1", "U1", card.ts, "tandem_approve")
        await rig.wait_text("D1", "Wrote it.")
        await rig.settle()
        slack.fail("chat.postMessage", status=500)
        await rig.say("D1", "U1", "/help")
        await rig.wait_text("D1", "/status")
        await rig.settle()
    assert (rig.workspace / "out.txt").exists()
    card = slack.message("D1", card.ts) or card
    assert "Approved by" in str(card.blocks) and "tandem_approve" not in str(card.blocks)
    assert len(slack.injected) == 3


async def test_slack_locked_database_for_a_moment(slack: FaultySlack, model: FakeModelServer,
                                                  tmp_path: Path) -> None:
    model.script(Reply(text="slow " * 30, chunk_delay=0.01), Reply(text="Second."))
    async with SlackRig(slack, model, tmp_path, "http") as rig:
        await rig.say("D1", "U1", "first")
        await model.wait_requests(1)
        async with Lock(tmp_path / "tandem.db", 1.0):
            await rig.fake.wait_for(lambda: any(t.count("slow") == 30 for t in rig.texts("D1")))
        async with Lock(tmp_path / "tandem.db", 1.0):
            await rig.say("D1", "U1", "second")  # acked at once, processed after the lock
            await rig.wait_text("D1", "Second.")
        await rig.settle()
    assert len(rig.texts("D1")) == 2
    assert integrity(tmp_path / "tandem.db") == "ok"
