"""The edges of a turn as both chats show them: odd model output, a card lost to a kill, an
old button in a new session. Real python-telegram-bot and slack-bolt against the strict
fakes, the real hub, SQLite and litellm against the fake model."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from collections.abc import AsyncIterator
from pathlib import Path

import litellm  # noqa: F401 - loaded up front, not inside the first test's event loop
import pytest

from tests.adapters.test_slack import Rig as SlackRig
from tests.adapters.test_slack import buttons
from tests.adapters.test_telegram import ANN, GROUP, rig
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.slack_server import FakeSlackServer
from tests.fakes.telegram_server import FakeTelegram

EMPTY = "(The model returned an empty answer.)"


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(flood=False) as server:
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
    async with rig(tmp_path, model, tg, drafts=drafts,
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
    async with SlackRig(slack, model, tmp_path, "socket") as r:
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
