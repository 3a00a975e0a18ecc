"""The edges of a turn as both chats show them: odd model output, a card lost to a kill, an
old button in a new session. Real python-telegram-bot and slack-bolt against the strict
fakes, the real hub, SQLite and litellm against the fake model."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import litellm  # noqa: F401 - loaded up front, not inside the first test's event loop
import pytest

from bot.core.events import ApprovalRequested, Event, Verdict
from tests.adapters.test_slack import Rig as SlackRig
from tests.adapters.test_slack import buttons
from tests.adapters.test_telegram import ANN, ECHO, GROUP, rig
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.slack_server import BOT_USER_ID, FakeSlackServer
from tests.fakes.telegram_server import FakeTelegram
from tests.suites.harness import FaultyTelegram, tg_rig

EMPTY = "(The model returned an empty answer.)"
QUIET = {"cancel_delay": 60.0}
"""No ⏹ status message, however slow the machine: the test counts every message."""


def quiet(rig: SlackRig) -> SlackRig:
    rig.options.update(QUIET)
    return rig


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(flood=False) as server:
        server.me["can_read_all_group_messages"] = True  # privacy mode off: every message
        yield server
        assert server.internal_errors == []


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer(rate_limit=False) as server:
        yield server


# ---- an answer with no visible text --------------------------------------------------


@pytest.mark.parametrize("chat, drafts", [(ANN, True), (ANN, False), (GROUP, False)])
@pytest.mark.parametrize("answer", ["", "\n\n", " \t\n "])
async def test_telegram_an_answer_without_visible_text_says_so(
        tmp_path: Path, model: FakeModelServer, tg: FakeTelegram, chat: int, drafts: bool,
        answer: str) -> None:
    model.script(Reply(text=answer))
    async with rig(tmp_path, model, tg, QUIET, drafts=drafts,
                   allowed_users=[ANN], groups={"require_mention": False}) as r:
        tg.push_message(chat, ANN, "say nothing")
        final = await r.answered(chat, EMPTY)
        await r.hub.idle()
        assert final.reply_markup is None
        assert all(m.reply_markup is None for m in r.bot(chat)), "a live ⏹ was left"
        assert [m.text for m in r.bot(chat)] == [EMPTY]


@pytest.mark.parametrize("answer", ["\n\n", " \t\n "])
async def test_slack_an_answer_without_visible_text_says_so(
        slack: FakeSlackServer, model: FakeModelServer, tmp_path: Path, answer: str) -> None:
    model.script(Reply(text=answer))
    async with quiet(SlackRig(slack, model, tmp_path, "socket")) as r:
        await r.say("D1", "U1", "say nothing")
        await r.wait_text("D1", EMPTY)
        await r.settle()
        messages = r.fake.bot_messages("D1")
        assert [m.text for m in messages] == [EMPTY]
        assert all(not buttons(m) for m in messages)


@pytest.mark.parametrize("chat, drafts", [(ANN, True), (GROUP, False)])
async def test_telegram_an_answer_that_starts_with_blank_lines_streams_as_usual(
        tmp_path: Path, model: FakeModelServer, tg: FakeTelegram, chat: int,
        drafts: bool) -> None:
    model.script(Reply(text="\n\nThe answer, after two blank lines.", chunk_size=2,
                       chunk_delay=0.15))
    async with rig(tmp_path, model, tg, drafts=drafts,
                   allowed_users=[ANN], groups={"require_mention": False}) as r:
        tg.push_message(chat, ANN, "go on")
        await r.answered(chat, "The answer, after two blank lines.")
        await r.hub.idle()
        assert r.adapter.chat.no_drafts == set(), "a blank draft was taken for drafts refused"
        refused = [(c.method, c.status) for c in tg.calls if c.status >= 400]
        assert refused == [], refused


# ---- a card lost to a kill -------------------------------------------------------------


def cards_lost(adapter: Any) -> list[ApprovalRequested]:
    """The adapter never shows a card: as if the process stopped between storing the
    approval and posting its card. The cards it was given, in order."""
    lost: list[ApprovalRequested] = []
    emit = adapter.emit

    async def dying(event: Event) -> None:
        if isinstance(event, ApprovalRequested):
            lost.append(event)
            return
        await emit(event)

    adapter.emit = dying
    return lost


async def test_telegram_a_card_never_posted_before_a_stop_is_posted_at_the_restart(
        tmp_path: Path, model: FakeModelServer, tg: FakeTelegram) -> None:
    """One process dies between storing the approval and posting its card (here: its
    chat never saw the card); the next start posts it, so someone can press it."""
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Wrote out.txt."))
    async with rig(tmp_path, model, tg) as r:
        lost = cards_lost(r.adapter)
        tg.push_message(ANN, ANN, "write hi to out.txt")
        await tg.wait_for(lambda: bool(lost))
        await r.hub.idle()
        assert not any(m.text.startswith("🔐") for m in r.bot(ANN))
    async with rig(tmp_path, model, tg) as again:
        card, approval_id = await again.card(ANN)
        assert approval_id == lost[0].approval_id
        again.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await again.answered(ANN, "Wrote out.txt.")
        await again.hub.idle()
    assert (again.workspace / "out.txt").read_text() == "hi\n"
    cards = [m for m in again.bot(ANN) if m.text.startswith("🔐")]
    assert len(cards) == 1, "the card was posted more than once"


async def test_telegram_a_card_on_screen_is_not_posted_again_at_the_restart(
        tmp_path: Path, model: FakeModelServer, tg: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Wrote out.txt."))
    async with rig(tmp_path, model, tg) as r:
        tg.push_message(ANN, ANN, "write hi to out.txt")
        card, approval_id = await r.card(ANN)
        await r.hub.idle()
    async with rig(tmp_path, model, tg) as again:
        again.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await again.answered(ANN, "Wrote out.txt.")
        await again.hub.idle()
        assert len([m for m in again.bot(ANN) if m.text.startswith("🔐")]) == 1


async def test_slack_a_card_never_posted_before_a_stop_is_posted_at_the_restart(
        slack: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Wrote out.txt."))
    async with SlackRig(slack, model, tmp_path, "socket") as r:
        lost = cards_lost(r.adapter)
        await r.say("D1", "U1", "write hi to out.txt")
        await slack.wait_for(lambda: bool(lost))
        await r.settle()
        await r.restart()
        card = await r.card("D1")
        await r.press("D1", "U1", card.ts, "tandem_approve")
        await r.wait_text("D1", "Wrote out.txt.")
        await r.settle()
        cards = [m for m in slack.bot_messages("D1") if "wants to run" in str(m.blocks)]
        assert len(cards) == 1, "the card was posted more than once"
    assert (r.workspace / "out.txt").read_text() == "hi\n"


# ---- the final answer's patience ------------------------------------------------------


async def test_telegram_a_drafted_answer_outlasts_network_trouble_like_a_placeholder(
        tmp_path: Path, model: FakeModelServer) -> None:
    """Telegram answers 502 to the final send for longer than the Bot API client's own
    retries last (about 7.5 s): the answer still arrives, once."""
    answer = "The answer that must arrive."
    async with FaultyTelegram(flood=False) as faulty:
        model.script(Reply(text=answer))
        async with tg_rig(tmp_path, model, faulty, drafts=True) as r:
            faulty.fail("sendMessage", status=502, times=6,
                        when=lambda p: "must arrive" in str(p.get("text")))
            faulty.push_message(ANN, ANN, "answer me")
            await r.answered(ANN, answer, timeout=30)
            await r.hub.idle()
            assert [m.text for m in r.bot(ANN)] == [answer]
        assert faulty.injected == [("sendMessage", 502)] * 6


# ---- Slack: Tandem's own messages in a thread ------------------------------------------


async def test_slack_a_thread_where_tandem_has_posted_is_one_it_takes_part_in(
        slack: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    """A reply without a mention in a thread that holds a message of Tandem's own (posted
    before the store knew the thread) is for Tandem; its own message is not "earlier
    messages of this thread" from someone else."""
    model.script(Reply(text="Still on it."))
    async with SlackRig(slack, model, tmp_path, "socket") as r:
        root = slack.message_event("C2", "U3", "deploy is stuck", channel_type="channel")
        slack.message_event("C2", BOT_USER_ID, "I restarted the deploy.",
                            channel_type="channel", thread_ts=root["ts"])
        await r.say("C2", "U1", "any news?", channel_type="channel", thread_ts=root["ts"])
        await r.wait_text("C2", "Still on it.", thread=root["ts"])
        await r.settle()
    asked = [call.params.get("user") for call in slack.calls_to("users.info")]
    assert BOT_USER_ID not in asked
