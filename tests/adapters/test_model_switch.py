"""`/model` on both platforms: the models as buttons, a press or `/model NAME` switching
the conversation, kept across a restart; in a DM anyone allowed may switch, in a group or
channel only an approver.

Real python-telegram-bot and slack-bolt against their fakes, the real litellm client
against the fake model (the other model is the same endpoint under another name, so the
request's `model` says which one answered).
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import litellm  # noqa: F401 - loaded up front, not inside the first test's event loop
import pytest

from bot.core.buttons import ItemButton, unpack
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.slack_server import FakeSlackMessage, FakeSlackServer
from tests.fakes.telegram_server import FakeMessage, FakeTelegram
from tests.suites.harness import ANN, BOB, GROUP, SlackRig, TgRig, tg_rig

CAROL = 44
LISTING = "This conversation uses"
REFUSED = "Only an approver can do that here."


def other(model: FakeModelServer) -> dict[str, Any]:
    return {"model": "openai/other", "api_base": model.api_base, "api_key": "sk-other"}


def asked(model: FakeModelServer) -> list[str]:
    """Which model each request named, in order."""
    return [str(r["model"]) for r in model.requests]


# -- Telegram -------------------------------------------------------------------------------

@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(flood=False) as server:
        yield server
        assert server.internal_errors == []


def telegram(tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> Any:
    return tg_rig(tmp_path, model, fake, overrides={"llm__models": [other(model)]},
                  allowed_users=[ANN, BOB], approvers=[CAROL])


async def listing(r: TgRig, chat: int, n: int = 1) -> FakeMessage:
    def found() -> list[FakeMessage]:
        return [m for m in r.bot(chat) if m.text.startswith(LISTING) and m.reply_markup]
    await r.until(lambda: len(found()) >= n)
    return found()[n - 1]


def keys(message: FakeMessage) -> list[tuple[str, str]]:
    assert message.reply_markup is not None
    return [(b["text"], b["callback_data"]) for row in message.reply_markup["inline_keyboard"]
            for b in row]


async def test_telegram_model_buttons_switch_a_dm_and_the_choice_outlives_a_restart(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.responder = lambda messages: Reply(text="ok")
    async with telegram(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "/model")
        shown = await listing(r, ANN)
        buttons = keys(shown)
        assert [label for label, _ in buttons] == ["✓ openai/fake", "openai/other"]
        assert isinstance(unpack(buttons[1][1]), ItemButton)
        fake.push_callback(ANN, ANN, shown.message_id, buttons[1][1], first_name="Ann")
        switched = "This conversation now uses openai/other (switched by Ann)."
        await r.until(lambda: switched in fake.bot_texts(ANN))
        fake.push_message(ANN, ANN, "hello")
        await r.answered(ANN, "ok")
        await r.settle()
    assert asked(model) == ["other"]
    async with telegram(tmp_path, model, fake) as r:  # a restart: the choice is kept
        fake.push_message(ANN, ANN, "/status")
        await r.until(lambda: any(m.text.startswith("Model: openai/other (chosen with /model)")
                                  for m in r.bot(ANN)))
        fake.push_message(ANN, ANN, "/model")
        assert keys(await listing(r, ANN, 2))[1][0] == "✓ openai/other"
        fake.push_message(ANN, ANN, "again")
        await r.until(lambda: fake.bot_texts(ANN).count("ok") == 2)
        await r.settle()
    assert asked(model) == ["other", "other"]


async def test_telegram_only_an_approver_switches_a_group(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.responder = lambda messages: Reply(text="ok")
    async with telegram(tmp_path, model, fake) as r:
        fake.push_message(GROUP, BOB, "/model other", chat_type="supergroup")
        await r.until(lambda: REFUSED in fake.bot_texts(GROUP))
        fake.push_message(GROUP, BOB, "/model", chat_type="supergroup")  # looking is fine
        shown = await listing(r, GROUP)
        data = keys(shown)[1][1]
        fake.push_callback(GROUP, BOB, shown.message_id, data, first_name="Bob")
        await r.until(lambda: fake.bot_texts(GROUP).count(REFUSED) == 2)  # said in the group
        await r.settle()
        fake.push_message(GROUP, BOB, "@tandem_bot hi", chat_type="supergroup")
        await r.until(lambda: "ok" in fake.bot_texts(GROUP))
        await r.settle()
        assert asked(model) == ["fake"]
        fake.push_callback(GROUP, CAROL, shown.message_id, data, first_name="Carol")
        await r.until(lambda: "This conversation now uses openai/other (switched by Carol)."
                      in fake.bot_texts(GROUP))
        fake.push_message(GROUP, BOB, "@tandem_bot and now?", chat_type="supergroup")
        await r.until(lambda: fake.bot_texts(GROUP).count("ok") == 2)
        await r.settle()
    assert asked(model) == ["fake", "other"]


# -- Slack ------------------------------------------------------------------------------------

@pytest.fixture
async def slack() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer(rate_limit=False) as server:
        yield server


def slack_rig(slack: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> SlackRig:
    return SlackRig(slack, model, tmp_path, "socket", llm__models=[other(model)],
                    slack__approvers=["U1"])


async def slack_listing(rig: SlackRig, channel: str, n: int = 1) -> FakeSlackMessage:
    def found() -> list[FakeSlackMessage] | None:
        shown = [m for m in rig.fake.bot_messages(channel) if LISTING in m.text]
        return shown if len(shown) >= n else None
    messages = await rig.fake.wait_for(found)
    assert messages is not None
    return messages[n - 1]


def labels(message: FakeSlackMessage) -> list[str]:
    return [e["text"]["text"] for b in message.blocks or [] if b["type"] == "actions"
            for e in b["elements"]]


async def test_slack_model_buttons_switch_a_dm_and_the_choice_outlives_a_restart(
        slack: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    model.responder = lambda messages: Reply(text="ok")
    async with slack_rig(slack, model, tmp_path) as rig:
        await rig.say("D1", "U2", "/model")
        shown = await slack_listing(rig, "D1")
        assert labels(shown) == ["✓ openai/fake", "openai/other"]
        await rig.press("D1", "U2", shown.ts, "tandem_button_1")
        await rig.wait_text("D1", "now uses openai/other")
        await rig.say("D1", "U2", "hello")
        await rig.wait_text("D1", "ok")
        await rig.settle()
        assert asked(model) == ["other"]
        await rig.restart()
        await rig.say("D1", "U2", "/status")
        await rig.wait_text("D1", "Model: openai/other (chosen with /model)")
        await rig.say("D1", "U2", "again")
        await rig.fake.wait_for(lambda: rig.texts("D1").count("ok") == 2)
        await rig.settle()
    assert asked(model) == ["other", "other"]


async def test_slack_only_an_approver_switches_a_channel(
        slack: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    model.responder = lambda messages: Reply(text="ok")
    async with slack_rig(slack, model, tmp_path) as rig:
        await rig.say("C1", "U2", "/model")
        shown = await slack_listing(rig, "C1")
        await rig.press("C1", "U2", shown.ts, "tandem_button_1")
        await rig.fake.wait_for(lambda: rig.fake.ephemerals_for("U2"))
        await rig.settle()
        assert rig.fake.ephemerals_for("U2")[0]["text"] == REFUSED
        assert not any("now uses" in t for t in rig.texts("C1"))
        await rig.press("C1", "U1", shown.ts, "tandem_button_1")
        await rig.wait_text("C1", "now uses openai/other")
        await rig.settle()
