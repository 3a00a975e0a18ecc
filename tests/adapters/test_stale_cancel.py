"""A ⏹ Cancel from an earlier session (before `/new`) stops nothing, on each platform:
turn numbers start at 1 again, so the button carries its session too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.core.buttons import CancelButton, pack, unpack
from tests.adapters.test_slack import Rig as SlackRig
from tests.adapters.test_slack import buttons as slack_buttons
from tests.adapters.test_telegram import ANN, rig
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.slack_server import FakeSlackServer
from tests.fakes.telegram_server import FakeTelegram

WORDS = 150
SLOW = Reply(text=" ".join(f"word{i}" for i in range(WORDS)), chunk_size=8,
             chunk_delay=0.01)
LAST = f"word{WORDS - 1}"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(flood=False) as server:
        yield server
        assert server.internal_errors == []


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer(rate_limit=False) as server:
        yield server


async def test_telegram_an_old_sessions_cancel_leaves_the_new_turn(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(SLOW, SLOW)
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "talk a lot")
        await r.until(lambda: any(m.text.startswith("word") and m.reply_markup
                                  for m in r.bot(ANN)))
        old = r.bot(ANN)[0]
        assert old.reply_markup is not None
        data = old.reply_markup["inline_keyboard"][0][0]["callback_data"]
        assert unpack(data) == CancelButton(1, 1)
        await r.until(lambda: not fake.message(ANN, old.message_id).reply_markup)
        fake.push_message(ANN, ANN, "/new")
        await r.settle()
        fake.push_message(ANN, ANN, "talk a lot again")
        await r.until(lambda: any(m.text.startswith("word") and m.reply_markup
                                  and m.message_id != old.message_id for m in r.bot(ANN)))
        new = next(m for m in r.bot(ANN) if m.reply_markup and m.message_id != old.message_id)
        assert new.reply_markup is not None
        assert unpack(new.reply_markup["inline_keyboard"][0][0]["callback_data"]) \
            == CancelButton(1, 2)
        query = fake.push_callback(ANN, ANN, old.message_id, data, forged=True)
        await r.until(lambda: query in fake.callback_answers)
        await r.until(lambda: not fake.message(ANN, new.message_id).reply_markup)
        await r.settle()
    assert fake.callback_answers[query]["text"] == "That turn is already over."
    shown = fake.message(ANN, new.message_id).text
    assert shown.endswith(LAST) and "Cancelled" not in shown


async def test_slack_an_old_sessions_cancel_leaves_the_new_turn(
        fake_slack: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    model.script(SLOW, SLOW)
    async with SlackRig(fake_slack, model, tmp_path, "socket") as r:
        await r.say("D1", "U1", "write a lot")
        live = await fake_slack.wait_for(lambda: next(
            (m for m in fake_slack.bot_messages("D1") if "word" in m.text), None))
        assert live is not None and slack_buttons(live) == ["tandem_cancel"]
        [value] = [e["value"] for b in live.blocks or [] if b["type"] == "actions"
                   for e in b["elements"]]
        assert value == pack(CancelButton(1, 1))
        await r.settle()
        await r.say("D1", "U1", "/new")
        await r.settle()
        await r.say("D1", "U1", "write a lot again")
        again = await fake_slack.wait_for(lambda: next(
            (m for m in fake_slack.bot_messages("D1") if "word" in m.text
             and m.ts != live.ts and slack_buttons(m)), None))
        await r.press("D1", "U1", live.ts, "tandem_cancel", value)
        await r.settle()
        final = fake_slack.message("D1", again.ts)
    assert final is not None and "Cancelled" not in final.text
    assert final.text.endswith(LAST)
