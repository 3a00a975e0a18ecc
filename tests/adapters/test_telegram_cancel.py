"""⏹ Cancel on every Telegram path, end to end: real python-telegram-bot against
FakeTelegram, the real hub and SQLite, the real litellm client against FakeModelServer.

A turn still running after `cancel_delay` whose live surface has no ⏹ of its own (a draft
in a private chat) gets a "⏳ Working on it…" status message with ⏹ Cancel; it is deleted
when the turn ends, pauses for an approval or is cancelled. An edited placeholder (drafts
off, or a group) carries ⏹ itself, and a quick answer costs no extra call.

Timings are measured from the press (the moment the fake queues the callback query, so
the long poll's delivery is included) to the turn's end as the core emits it, to the cut
of the model's stream at the fake model server, and to the death of a tool's process.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import litellm  # noqa: F401 - loaded up front, not inside the first test's event loop
import pytest

from adapters.edge.turns import WORKING
from bot.core.buttons import CancelButton, pack
from bot.core.events import Verdict
from tests.adapters.cancel_watch import Watch, slow_reply
from tests.adapters.test_telegram import ANN, BOB, ECHO, GROUP, Rig, rig
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.fakes.telegram_server import Call, FakeMessage, FakeTelegram

CANCEL_DELAY = 0.5
"""The adapter's cancel_delay in these tests (the default, 1.5 s, only slows them)."""
STOP_WITHIN = 1.0
"""A press stops the turn, the model's stream and a tool's process within this."""
ARGS = {"cancel_delay": CANCEL_DELAY}


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(flood=False) as server:
        yield server
        assert server.internal_errors == []


def to_chat(call: Call, chat: int) -> bool:
    return str((call.params or {}).get("chat_id")) == str(chat)


def status_posts(fake: FakeTelegram, chat: int | None = None) -> list[Call]:
    """Every accepted sendMessage of the "Working on it" status (deleted ones too)."""
    return [c for c in fake.calls_to("sendMessage")
            if c.ok and (c.params or {}).get("text") == WORKING
            and (chat is None or to_chat(c, chat))]


def status_messages(fake: FakeTelegram, chat: int) -> list[FakeMessage]:
    return [fake.message(chat, c.result["message_id"]) for c in status_posts(fake, chat)]


def deletes(fake: FakeTelegram, chat: int | None = None) -> list[Call]:
    return [c for c in fake.calls_to("deleteMessage") if chat is None or to_chat(c, chat)]


def buttons(message: FakeMessage) -> list[str]:
    markup = message.reply_markup or {}
    return [b["callback_data"] for row in markup.get("inline_keyboard", []) for b in row]


def with_buttons(r: Rig, chat: int) -> list[FakeMessage]:
    return [m for m in r.bot(chat) if m.reply_markup]


async def within(predicate: Callable[[], bool], seconds: float) -> float:
    """Poll `predicate` (something no API call signals) until it holds; the seconds it
    took. Fails after `seconds`."""
    began = time.monotonic()
    while not predicate():
        if time.monotonic() - began > seconds:
            raise AssertionError(f"not within {seconds} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - began


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def offered(r: Rig, watch: Watch, chat: int) -> FakeMessage:
    """Wait for the turn's status message with ⏹; check what it carries and when it came."""
    await r.until(lambda: any(m.reply_markup for m in status_messages(r.fake, chat)))
    [post] = status_posts(r.fake, chat)
    [status] = status_messages(r.fake, chat)
    began, start = [(t, e) for t, e in watch.started() if e.conv.chat_id == str(chat)][-1]
    assert buttons(status) == [pack(CancelButton(start.turn, start.session))]
    assert status.reply_markup is not None
    assert status.reply_markup["inline_keyboard"][0][0]["text"] == "⏹ Cancel"
    after, delay = post.time - began, r.adapter.cancel_delay
    assert delay - 0.05 <= after <= delay + 1.0, (after, delay)
    return status


def timed_press(fake: FakeTelegram, chat: int, message: FakeMessage, data: str,
                user: int = ANN) -> tuple[float, str]:
    return time.monotonic(), fake.push_callback(chat, user, message.message_id, data)


async def cancelled_end(r: Rig, watch: Watch, pressed: float) -> float:
    """Wait for the turn's end; it is cancelled, and within STOP_WITHIN of the press."""
    await r.until(lambda: bool(watch.ended()))
    [(ended, event)] = watch.ended()
    assert event.reason == "cancelled", event
    took = ended - pressed
    assert 0 < took <= STOP_WITHIN, took
    return took


def nothing_stale(r: Rig, chat: int) -> None:
    """No bot message left with a button, every status message gone, no draft shown."""
    assert with_buttons(r, chat) == []
    assert all(m.deleted for m in status_messages(r.fake, chat))
    assert r.fake.draft_of(chat) is None
    assert r.fake.internal_errors == []


# -- drafts: ⏹ beside the draft ----------------------------------------------------------


async def test_a_slow_draft_gets_a_cancel_that_stops_the_stream(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram,
        capsys: pytest.CaptureFixture[str]) -> None:
    model.script(slow_reply())
    async with rig(tmp_path, model, fake, ARGS, drafts=True) as r:
        watch = Watch(r.adapter, model)
        fake.push_message(ANN, ANN, "talk a lot")
        status = await offered(r, watch, ANN)
        assert fake.drafts_in(ANN) and r.bot(ANN) == [status]  # a draft, and ⏹ beside it
        pressed, query = timed_press(fake, ANN, status, buttons(status)[0])
        took = await cancelled_end(r, watch, pressed)
        await r.until(lambda: fake.message(ANN, status.message_id).deleted)
        await r.until(lambda: query in fake.callback_answers)
        await r.hub.idle()
    [cut] = watch.stream_ends
    assert 0 < cut - pressed <= STOP_WITHIN, cut - pressed
    assert not fake.callback_answers[query]["show_alert"]
    [final] = r.bot(ANN)  # the answer is one message, the status message is gone
    assert final.text.startswith("word") and final.text.endswith("⏹ Cancelled.")
    assert final.text.count("word") < 400  # cut, not finished
    assert [c.params["message_id"] for c in deletes(fake, ANN)] == [status.message_id]
    assert fake.calls_to("editMessageReplyMarkup") == []  # the pressed status: deleted only
    nothing_stale(r, ANN)
    with capsys.disabled():
        print(f"\n[drafts] press → turn ended {took * 1000:.0f} ms, "
              f"→ model stream cut {(cut - pressed) * 1000:.0f} ms")


async def test_a_running_tool_is_killed_by_the_cancel_beside_the_draft(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram,
        capsys: pytest.CaptureFixture[str]) -> None:
    sleeper = ToolCallSpec("shell", {"command": "echo $$ > sleep.pid; exec sleep 30"})
    model.script(Reply(tool_calls=[sleeper]))
    async with rig(tmp_path, model, fake, ARGS, drafts=True,
                   approvals={"tools": {"shell": "allow"}}) as r:
        watch = Watch(r.adapter, model)
        pid_file = r.workspace / "sleep.pid"
        fake.push_message(ANN, ANN, "sleep for a while")
        status = await offered(r, watch, ANN)
        await within(lambda: pid_file.exists() and pid_file.read_text().strip() != "", 5.0)
        pid = int(pid_file.read_text())
        assert alive(pid)
        pressed, _ = timed_press(fake, ANN, status, buttons(status)[0])
        gone = await within(lambda: not alive(pid), STOP_WITHIN)
        took = await cancelled_end(r, watch, pressed)
        await r.until(lambda: fake.message(ANN, status.message_id).deleted)
        await r.hub.idle()
    [final] = r.bot(ANN)
    assert final.text.endswith("⏹ Cancelled.")
    assert len(model.requests) == 1  # no model call after the cancel
    nothing_stale(r, ANN)
    with capsys.disabled():
        print(f"\n[drafts+tool] press → process gone {gone * 1000:.0f} ms, "
              f"→ turn ended {took * 1000:.0f} ms")


async def test_a_slow_answer_removes_its_status_message_after_delivering(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    answer = " ".join(f"w{i}" for i in range(120))  # 60 chunks 25 ms apart: 1.5 s
    model.script(Reply(text=answer, chunk_size=8, chunk_delay=0.025))
    async with rig(tmp_path, model, fake, ARGS, drafts=True) as r:
        watch = Watch(r.adapter, model)
        fake.push_message(ANN, ANN, "a longer answer")
        status = await offered(r, watch, ANN)
        await r.until(lambda: fake.message(ANN, status.message_id).deleted)
        await r.hub.idle()
    [(_, end)] = watch.ended()
    assert end.reason == "completed"
    [final] = r.bot(ANN)
    assert final.text == answer and final.edits == 0
    assert len(status_posts(fake)) == 1
    [delete] = deletes(fake)
    assert delete.ok and delete.params["message_id"] == status.message_id
    answer_sent = next(i for i, c in enumerate(fake.calls) if c.method == "sendMessage"
                       and c.ok and c.result["message_id"] == final.message_id)
    assert answer_sent < fake.calls.index(delete)  # the answer first, then the offer goes
    nothing_stale(r, ANN)


@pytest.mark.parametrize("chat", [ANN, GROUP], ids=["drafts-dm", "edits-group"])
async def test_a_quick_answer_costs_no_status_message(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram, chat: int) -> None:
    # The default cancel_delay (1.5 s): a process's first model call alone may take half
    # a second. A later, slow turn in another chat is the clock: its status message is
    # due cancel_delay after a start that follows the quick turn's end, so any offer the
    # quick turn left behind would have been posted by then.
    model.script(Reply(text="Quick."),
                 Reply(text="slow " * 100, chunk_size=5, chunk_delay=0.03))
    async with rig(tmp_path, model, fake, drafts=True, allowed_users=[ANN, BOB]) as r:
        assert r.adapter.cancel_delay == 1.5
        watch = Watch(r.adapter, model)
        if chat == GROUP:
            fake.push_message(GROUP, ANN, "@tandem_bot quick?", chat_type="supergroup")
        else:
            fake.push_message(ANN, ANN, "quick?")
        await r.answered(chat, "Quick.")
        await r.hub.idle()
        [(began, _)], [(ended, _)] = watch.started(), watch.ended()
        assert ended - began < r.adapter.cancel_delay - 0.3, "not a quick answer"
        fake.push_message(BOB, BOB, "take your time", first_name="Bob")
        await offered(r, watch, BOB)
        assert status_posts(fake, chat) == [] and deletes(fake) == []
        await r.until(lambda: all(m.deleted for m in status_messages(fake, BOB)))
        await r.hub.idle()
    assert [e.reason for _, e in watch.ended()] == ["completed", "completed"]
    assert [m.text for m in r.bot(chat)] == ["Quick."]
    sends = [c for c in fake.calls_to("sendMessage") if to_chat(c, chat)]
    assert len(sends) == 1  # the answer (or the placeholder that became it): nothing else
    assert status_posts(fake, chat) == [] and deletes(fake, chat) == []
    assert [c for c in fake.calls_to("editMessageReplyMarkup") if to_chat(c, chat)] == []
    if chat == GROUP:  # a group's turn is an edited placeholder, never a draft
        assert [c for c in fake.calls_to("sendMessageDraft") if to_chat(c, chat)] == []
    nothing_stale(r, chat)


# -- edits: the placeholder carries ⏹ ------------------------------------------------------


@pytest.mark.parametrize(("chat", "drafts"), [(ANN, False), (GROUP, True)],
                         ids=["dm-drafts-off", "group"])
async def test_an_edited_placeholder_carries_its_own_cancel(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram, chat: int, drafts: bool,
        capsys: pytest.CaptureFixture[str]) -> None:
    model.script(slow_reply())
    async with rig(tmp_path, model, fake, ARGS, drafts=drafts) as r:
        watch = Watch(r.adapter, model)
        if chat == GROUP:
            fake.push_message(GROUP, ANN, "@tandem_bot talk a lot", chat_type="supergroup")
        else:
            fake.push_message(ANN, ANN, "talk a lot")
        await r.until(lambda: any(m.text.startswith("word") and m.reply_markup
                                  for m in r.bot(chat)))
        [(began, start)] = watch.started()

        def edits_past_the_delay() -> int:
            return len([c for c in fake.calls_to("editMessageText")
                        if c.ok and to_chat(c, chat) and c.time > began + CANCEL_DELAY])

        # the turn is well past cancel_delay and still streaming into the placeholder
        await r.until(lambda: edits_past_the_delay() >= 3)
        assert status_posts(fake) == []
        [placeholder] = r.bot(chat)
        assert buttons(placeholder) == [pack(CancelButton(start.turn, start.session))]
        assert fake.drafts == []
        pressed, query = timed_press(fake, chat, placeholder, buttons(placeholder)[0])
        took = await cancelled_end(r, watch, pressed)
        await r.until(lambda: fake.message(chat, placeholder.message_id).text
                      .endswith("⏹ Cancelled.")
                      and not fake.message(chat, placeholder.message_id).reply_markup)
        await r.until(lambda: query in fake.callback_answers)
        await r.hub.idle()
    [cut] = watch.stream_ends
    assert 0 < cut - pressed <= STOP_WITHIN, cut - pressed
    [final] = r.bot(chat)
    assert final.message_id == placeholder.message_id
    assert final.text.startswith("word") and final.text.count("word") < 400
    assert status_posts(fake) == [] and deletes(fake) == []
    nothing_stale(r, chat)
    with capsys.disabled():
        print(f"\n[edits {chat}] press → turn ended {took * 1000:.0f} ms, "
              f"→ model stream cut {(cut - pressed) * 1000:.0f} ms")


# -- approvals: the card's buttons, and no other ---------------------------------------


async def test_a_turn_paused_for_approval_drops_its_status_message(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    # The tool call streams for about 2 s, so the status message is up before the card.
    model.script(Reply(text="I will write it.", tool_calls=[ECHO], chunk_size=1,
                       chunk_delay=0.04),
                 Reply(text="Wrote it."))
    async with rig(tmp_path, model, fake, ARGS, drafts=True) as r:
        watch = Watch(r.adapter, model)
        fake.push_message(ANN, ANN, "write hi to out.txt")
        status = await offered(r, watch, ANN)
        card, approval_id = await r.card(ANN)
        assert card.message_id > status.message_id  # the status came first
        await r.until(lambda: fake.message(ANN, status.message_id).deleted)
        assert with_buttons(r, ANN) == [card]  # the card's buttons are the only ones
        assert all(b.startswith(f"ap:{approval_id}:") for b in buttons(card))
        assert len(buttons(card)) == 4  # once, deny, this conversation, always
        assert "I will write it." in fake.bot_texts(ANN)  # what the model said stays
        assert watch.ended() == []  # paused, not over
        r.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await r.answered(ANN, "Wrote it.")
        await r.until(lambda: not fake.message(ANN, card.message_id).reply_markup)
        await r.hub.idle()
    assert (r.workspace / "out.txt").read_text() == "hi\n"
    assert [c.params["message_id"] for c in deletes(fake)] == [status.message_id]
    nothing_stale(r, ANN)
