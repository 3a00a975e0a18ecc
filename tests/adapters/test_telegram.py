"""The Telegram adapter end to end: real python-telegram-bot against FakeTelegram, the
real litellm client against FakeModelServer, a real SQLite store in tmp_path."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import copy
import html
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import litellm  # noqa: F401 - loaded up front, not inside the first test's event loop
import pytest

from adapters.live import QUEUED
from adapters.telegram import TelegramAdapter, create
from bot.core.buttons import ApprovalButton, CancelButton, pack, unpack
from bot.core.errors import ConfigError
from bot.core.events import ConvKey, Verdict
from bot.run.app import build
from bot.serve.hub import Hub
from tests.conftest import make_config, said
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.fakes.telegram_server import FakeMessage, FakeTelegram
from tests.suites.harness import tg_settled

ANN, BOB, CAROL, STRANGER = 42, 43, 44, 77
GROUP, FORUM = -100555, -100666
FAST = {"min_edit_interval": 0.05, "placeholder_delay": 0.0, "typing_delay": 0.0,
        "typing_interval": 0.2}


class Rig:
    """One process: hub + Telegram adapter on the test's database and fake servers."""

    def __init__(self, hub: Hub, adapter: TelegramAdapter, fake: FakeTelegram,
                 workspace: Path) -> None:
        self.hub, self.adapter, self.fake, self.workspace = hub, adapter, fake, workspace

    def bot(self, chat: int, thread: int | None = None) -> list[FakeMessage]:
        return [m for m in self.fake.chat(chat, thread) if m.from_bot]

    async def until(self, predicate: Any, timeout: float = 10.0) -> None:
        await self.fake.wait_for(predicate, timeout)

    async def answered(self, chat: int, text: str, thread: int | None = None) -> FakeMessage:
        """Wait for a bot message showing `text` with no buttons left; return it."""
        def done() -> bool:
            return any(m.text == text and not m.reply_markup for m in self.bot(chat, thread))
        await self.until(done)
        return next(m for m in self.bot(chat, thread) if m.text == text)

    async def card(self, chat: int) -> tuple[FakeMessage, str]:
        await self.until(lambda: any(m.text.startswith("🔐") and m.reply_markup
                                     for m in self.bot(chat)))
        card = next(m for m in self.bot(chat) if m.text.startswith("🔐") and m.reply_markup)
        assert card.reply_markup is not None
        data = card.reply_markup["inline_keyboard"][0][0]["callback_data"]
        button = unpack(data)
        assert isinstance(button, ApprovalButton)
        return card, button.approval_id

    def press(self, chat: int, user: int, message: FakeMessage, approval_id: str,
              verdict: Verdict, name: str = "Ann") -> str:
        data = pack(ApprovalButton(approval_id, verdict))
        return self.fake.push_callback(chat, user, message.message_id, data, first_name=name)

    async def settle(self) -> None:
        """Every queued update fetched and handled, and every conversation idle."""
        await tg_settled(self.fake, self.adapter, self.hub)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(flood=False) as server:
        yield server
        assert server.internal_errors == []


def tg_config(tmp_path: Path, model: FakeModelServer, fake: FakeTelegram,
              **telegram: Any) -> Any:
    settings = {"enabled": True, "token": fake.token, "base_url": f"{fake.url}/bot",
                "allowed_users": [ANN], "drafts": False, **telegram}
    extra = {k: settings.pop(k) for k in ("approvals", "limits", "persona__places", "busy")
             if k in settings}
    return make_config(tmp_path, model, telegram=settings, **extra)


@asynccontextmanager
async def rig(tmp_path: Path, model: FakeModelServer, fake: FakeTelegram,
              adapter_args: dict[str, Any] | None = None, **telegram: Any) -> AsyncIterator[Rig]:
    config = tg_config(tmp_path, model, fake, **telegram)
    hub, dispatch = build(config)
    await hub.d.store.open()
    adapter = create(config, hub, dispatch)
    for key, value in {**FAST, **(adapter_args or {})}.items():
        setattr(adapter, key, value)
    try:
        await adapter.start()
        await hub.recover()
        yield Rig(hub, adapter, fake, Path(config.workspace.dir))
    finally:
        await adapter.stop()
        await hub.close()
        await hub.d.store.close()


def user_texts(model: FakeModelServer) -> list[str]:
    """The user messages of every model request, flattened."""
    return [text for r in model.requests for text in said(r["messages"])]


# -- conversations ---------------------------------------------------------------------


async def test_dm_answer_replaces_placeholder(tmp_path: Path, model: FakeModelServer,
                                              fake: FakeTelegram) -> None:
    model.script(Reply(text="Hello **Ann**, try `ls -l`."))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "hi")
        final = await r.answered(ANN, "Hello Ann, try ls -l.")
        await r.hub.idle()
    assert len(r.bot(ANN)) == 1
    assert final.history[0] == "⏳ Thinking…" and final.edits >= 1
    assert {e["type"] for e in final.entities} == {"bold", "code"}
    assert fake.commands and {c["command"] for c in fake.commands} >= {"start", "stop", "new"}
    assert fake.chat_actions and fake.chat_actions[0][1] == "typing"
    assert len(model.requests) == 1 and "hi" in user_texts(model)[-1]
    assert model.violations == []


async def test_quick_answer_is_one_message_when_placeholder_is_due_later(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(text="Quick."))
    args = {"placeholder_delay": 5.0, "min_edit_interval": 1.0}
    async with rig(tmp_path, model, fake, args) as r:
        fake.push_message(ANN, ANN, "hi")
        final = await r.answered(ANN, "Quick.")
        await r.hub.idle()
    assert final.edits == 0 and len(r.bot(ANN)) == 1
    assert fake.calls_to("editMessageText") == []
    assert model.violations == []


async def test_group_answers_only_when_addressed(tmp_path: Path, model: FakeModelServer,
                                                 fake: FakeTelegram) -> None:
    model.script(Reply(text="first answer"), Reply(text="second answer"))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(GROUP, ANN, "talking among ourselves", chat_type="supergroup")
        fake.push_message(GROUP, ANN, "/help@some_other_bot", chat_type="supergroup")
        await r.settle()
        assert r.bot(GROUP) == [] and model.requests == []
        fake.push_message(GROUP, ANN, "@tandem_bot what's up?", chat_type="supergroup")
        first = await r.answered(GROUP, "first answer")
        fake.push_message(GROUP, ANN, "and then?", chat_type="supergroup",
                          reply_to_message_id=first.message_id)
        await r.answered(GROUP, "second answer")
        fake.push_message(GROUP, ANN, "/help@tandem_bot", chat_type="supergroup")
        await r.until(lambda: any(m.text.startswith("Tandem answers here")
                                  for m in r.bot(GROUP)))
        await r.hub.idle()
    texts = user_texts(model)
    assert len(model.requests) == 2
    assert not any("among ourselves" in t for t in texts)
    assert "what's up?" in texts[0] and "@tandem_bot" not in texts[0]
    assert "[Ann]" in texts[0]
    assert model.violations == []


async def test_forum_topic_is_its_own_conversation(tmp_path: Path, model: FakeModelServer,
                                                   fake: FakeTelegram) -> None:
    model.script(Reply(text="in topic 7"), Reply(text="in topic 9"))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(FORUM, ANN, "@tandem_bot one", chat_type="supergroup", thread_id=7)
        await r.answered(FORUM, "in topic 7", thread=7)
        fake.push_message(FORUM, ANN, "@tandem_bot two", chat_type="supergroup", thread_id=9)
        await r.answered(FORUM, "in topic 9", thread=9)
        await r.hub.idle()
        convs = {str(await r.hub.d.store.conversation_by_id(i)) for i in (1, 2)}
    assert r.bot(FORUM, 7)[0].thread_id == 7
    second = model.requests[1]["messages"]
    assert not any("one" in str(m.get("content")) for m in second if m["role"] == "user")
    assert len(convs) == 2
    assert model.violations == []


async def test_require_mention_off_answers_every_group_message(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(text="sure"))
    fake.me["can_read_all_group_messages"] = True  # privacy mode off in BotFather
    async with rig(tmp_path, model, fake, groups={"require_mention": False}) as r:
        fake.push_message(GROUP, ANN, "anyone?", chat_type="supergroup")
        await r.answered(GROUP, "sure")
        await r.hub.idle()
    assert model.violations == []


async def test_stranger_gets_their_id_once_and_no_model_call(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(STRANGER, STRANGER, "hello?", first_name="Eve")
        await r.until(lambda: len(r.bot(STRANGER)) == 1)
        fake.push_message(STRANGER, STRANGER, "hello??", first_name="Eve")
        fake.push_message(GROUP, STRANGER, "@tandem_bot hi", chat_type="supergroup")
        fake.push_message(GROUP, STRANGER, "@tandem_bot hi??", chat_type="supergroup")
        await r.settle()
    # once per chat: told in the DM, and told in the group too (once in each)
    assert len(r.bot(STRANGER)) == 1 and str(STRANGER) in r.bot(STRANGER)[0].text
    assert len(r.bot(GROUP)) == 1 and str(STRANGER) in r.bot(GROUP)[0].text
    assert model.requests == [] and model.violations == []


async def test_empty_allowlist_answers_nobody(tmp_path: Path, model: FakeModelServer,
                                              fake: FakeTelegram,
                                              caplog: pytest.LogCaptureFixture) -> None:
    async with rig(tmp_path, model, fake, allowed_users=[]) as r:
        fake.push_message(ANN, ANN, "hi")
        await r.until(lambda: len(r.bot(ANN)) == 1)
        await r.settle()
    assert str(ANN) in r.bot(ANN)[0].text and len(r.bot(ANN)) == 1
    assert "allowed_users is empty" in caplog.text
    assert model.requests == [] and model.violations == []


async def test_a_star_allows_everyone_on_telegram(tmp_path: Path, model: FakeModelServer,
                                                  fake: FakeTelegram) -> None:
    model.script(Reply(text="Hi Eve."))
    async with rig(tmp_path, model, fake, allowed_users=["*"]) as r:
        fake.push_message(STRANGER, STRANGER, "hello?", first_name="Eve")
        await r.answered(STRANGER, "Hi Eve.")
        await r.hub.idle()
    assert len(r.bot(STRANGER)) == 1 and len(model.requests) == 1
    assert model.violations == []


async def test_access_goes_by_id_not_by_name(tmp_path: Path, model: FakeModelServer,
                                             fake: FakeTelegram) -> None:
    async with rig(tmp_path, model, fake) as r:  # Ann (42) is allowed
        fake.push_message(STRANGER, STRANGER, "it is me, Ann", first_name="Ann", username="ann")
        await r.until(lambda: len(r.bot(STRANGER)) == 1)
        await r.settle()
    [refusal] = r.bot(STRANGER)
    assert f"`{STRANGER}`" in refusal.text and "telegram.allowed_users" in refusal.text
    assert model.requests == [] and model.violations == []


async def test_a_strangers_stop_and_cancel_press_change_nothing(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(text="word " * 80, chunk_size=5, chunk_delay=0.02))
    fake.me["can_read_all_group_messages"] = True  # privacy mode off in BotFather
    async with rig(tmp_path, model, fake, groups={"require_mention": False}) as r:
        fake.push_message(GROUP, ANN, "talk a lot", chat_type="supergroup")
        await r.until(lambda: any(m.text.startswith("word") and m.reply_markup
                                  for m in r.bot(GROUP)))
        placeholder = r.bot(GROUP)[0]
        query = fake.push_callback(GROUP, STRANGER, placeholder.message_id,
                                   pack(CancelButton(1, 1)), first_name="Eve")
        fake.push_message(GROUP, STRANGER, "/stop", chat_type="supergroup", first_name="Eve")
        await r.until(lambda: query in fake.callback_answers)
        answer = fake.callback_answers[query]
        assert answer["show_alert"] and f"`{STRANGER}`" in answer["text"]
        await r.until(lambda: not fake.message(GROUP, placeholder.message_id).reply_markup)
        await r.settle()
    final = fake.message(GROUP, placeholder.message_id).text
    assert final.count("word") == 80 and "Cancelled" not in final
    assert [m.text for m in r.bot(GROUP) if str(STRANGER) in m.text] == \
        [answer["text"]]  # the /stop: one reply, the same refusal
    assert model.violations == []


async def test_missing_token_is_a_config_error(tmp_path: Path, model: FakeModelServer,
                                               fake: FakeTelegram) -> None:
    config = tg_config(tmp_path, model, fake, token=None)
    hub, dispatch = build(config)
    with pytest.raises(ConfigError) as err:
        create(config, hub, dispatch)
    assert err.value.key == "telegram.token" and model.violations == []


# -- approvals -------------------------------------------------------------------------

ECHO = ToolCallSpec("shell", {"command": "echo hi > out.txt"})


async def test_approve_runs_the_command(tmp_path: Path, model: FakeModelServer,
                                        fake: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Wrote out.txt."))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "write hi to out.txt")
        card, approval_id = await r.card(ANN)
        assert "echo hi > out.txt" in card.text and "Requested by Ann" in card.text
        assert "expires in 30 min" in card.text
        assert not (r.workspace / "out.txt").exists()
        await r.until(lambda: any("Waiting for approval" in t for t in fake.bot_texts(ANN)))
        query = r.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await r.answered(ANN, "Wrote out.txt.")
        await r.until(lambda: "✅ Approved by Ann" in fake.message(ANN, card.message_id).text)
        decided = fake.message(ANN, card.message_id).text
        assert "Requested by Ann" in decided and "expires in" not in decided
        await r.hub.idle()
    assert (r.workspace / "out.txt").read_text() == "hi\n"
    assert fake.message(ANN, card.message_id).reply_markup is None
    assert query in fake.callback_answers and not fake.callback_answers[query]["show_alert"]
    # the placeholder that said so went once the approval was decided
    assert not any("Waiting for approval" in t for t in fake.bot_texts(ANN))
    assert model.violations == []


async def test_deny_runs_nothing_and_the_model_answers(tmp_path: Path, model: FakeModelServer,
                                                       fake: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="OK, I did not write it."))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "write hi to out.txt")
        card, approval_id = await r.card(ANN)
        r.press(ANN, ANN, card, approval_id, Verdict.DENY)
        await r.answered(ANN, "OK, I did not write it.")
        await r.hub.idle()
    assert not (r.workspace / "out.txt").exists()
    assert "❌ Denied by Ann" in fake.message(ANN, card.message_id).text
    tool_results = [m for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert tool_results and tool_results[-1]["content"].startswith("denied")
    assert model.violations == []


async def test_always_covers_the_same_command_only(tmp_path: Path, model: FakeModelServer,
                                                   fake: FakeTelegram) -> None:
    other = ToolCallSpec("shell", {"command": "echo other > b.txt"})
    model.script(Reply(tool_calls=[ECHO]), Reply(text="one"),
                 Reply(tool_calls=[ECHO]), Reply(text="two"),
                 Reply(tool_calls=[other]))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "write it")
        card, approval_id = await r.card(ANN)
        r.press(ANN, ANN, card, approval_id, Verdict.ALWAYS)
        await r.answered(ANN, "one")
        assert "✅ Always allowed in this chat by Ann" in fake.message(ANN, card.message_id).text
        (r.workspace / "out.txt").unlink()
        fake.push_message(ANN, ANN, "again")
        await r.answered(ANN, "two")
        assert (r.workspace / "out.txt").exists()
        assert sum(m.text.startswith("🔐") for m in r.bot(ANN)) == 1
        fake.push_message(ANN, ANN, "something else")
        await r.until(lambda: sum(m.text.startswith("🔐") for m in r.bot(ANN)) == 2)
        await r.hub.idle()
    assert not (r.workspace / "b.txt").exists()
    assert model.violations == []


async def test_someone_elses_press_changes_nothing(tmp_path: Path, model: FakeModelServer,
                                                   fake: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="done"))
    async with rig(tmp_path, model, fake, allowed_users=[ANN, BOB]) as r:
        fake.push_message(GROUP, ANN, "@tandem_bot write it", chat_type="supergroup")
        card, approval_id = await r.card(GROUP)
        before = (card.text, card.reply_markup, card.edits)
        query = r.press(GROUP, BOB, card, approval_id, Verdict.APPROVE, name="Bob")
        await r.until(lambda: query in fake.callback_answers)
        answer = fake.callback_answers[query]
        assert answer["show_alert"] and "not yours" in answer["text"]
        stranger = r.press(GROUP, STRANGER, card, approval_id, Verdict.APPROVE, name="Eve")
        await r.until(lambda: stranger in fake.callback_answers)
        assert fake.callback_answers[stranger]["show_alert"]
        await r.settle()
        after = fake.message(GROUP, card.message_id)
        assert (after.text, after.reply_markup, after.edits) == before
        assert not (r.workspace / "out.txt").exists()
        r.press(GROUP, ANN, card, approval_id, Verdict.APPROVE)
        await r.answered(GROUP, "done")
        await r.hub.idle()
    assert (r.workspace / "out.txt").exists()
    assert model.violations == []


async def test_an_approver_may_press(tmp_path: Path, model: FakeModelServer,
                                     fake: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="done"))
    async with rig(tmp_path, model, fake, allowed_users=[ANN], approvers=[CAROL]) as r:
        fake.push_message(GROUP, ANN, "@tandem_bot write it", chat_type="supergroup")
        card, approval_id = await r.card(GROUP)
        r.press(GROUP, CAROL, card, approval_id, Verdict.APPROVE, name="Carol")
        await r.answered(GROUP, "done")
        await r.hub.idle()
    assert "✅ Approved by Carol" in fake.message(GROUP, card.message_id).text
    assert (r.workspace / "out.txt").exists()
    assert model.violations == []


async def test_expired_approval_runs_nothing(tmp_path: Path, model: FakeModelServer,
                                             fake: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Nobody approved, so I stopped."))
    async with rig(tmp_path, model, fake, approvals={"expire_after_s": 1}) as r:
        fake.push_message(ANN, ANN, "write it")
        card, approval_id = await r.card(ANN)
        assert "expires in 1 s" in card.text
        await r.until(lambda: "⌛ Expired" in fake.message(ANN, card.message_id).text)
        await r.answered(ANN, "Nobody approved, so I stopped.")
        late = r.press(ANN, ANN, card, approval_id, Verdict.APPROVE) \
            if fake.message(ANN, card.message_id).reply_markup else None
        await r.hub.idle()
    assert late is None and fake.message(ANN, card.message_id).reply_markup is None
    assert not (r.workspace / "out.txt").exists()
    assert model.violations == []


async def test_press_after_restart_runs(tmp_path: Path, model: FakeModelServer,
                                        fake: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Done after the restart."))
    async with rig(tmp_path, model, fake) as first:
        fake.push_message(ANN, ANN, "write it")
        card, approval_id = await first.card(ANN)
        await first.hub.idle()
    async with rig(tmp_path, model, fake) as second:
        query = second.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await second.answered(ANN, "Done after the restart.")
        await second.until(lambda: "✅ Approved by Ann" in fake.message(ANN, card.message_id).text)
        await second.hub.idle()
    assert (second.workspace / "out.txt").exists()
    assert not fake.callback_answers[query]["show_alert"]
    assert model.violations == []


@pytest.mark.parametrize(("chat", "presser", "together"),
                         [(BOB, BOB, False), (GROUP, ANN, False), (BOB, BOB, True)],
                         ids=["another-user-in-their-chat", "the-requester-in-another-chat",
                              "arriving-with-the-real-press"])
async def test_a_press_from_another_chat_after_a_restart_edits_nothing(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram, chat: int, presser: int,
        together: bool) -> None:
    # After a restart the adapter knows no card; a forged press naming the real id from
    # another chat is refused, and neither it nor the real press later edits that message.
    model.script(Reply(text="Hello there."), Reply(tool_calls=[ECHO]), Reply(text="Done."))
    kind = "private" if chat > 0 else "supergroup"
    async with rig(tmp_path, model, fake, allowed_users=[ANN, BOB]) as first:
        fake.push_message(chat, presser, "@tandem_bot hello", chat_type=kind)
        elsewhere = await first.answered(chat, "Hello there.")
        fake.push_message(ANN, ANN, "write it")
        card, approval_id = await first.card(ANN)
        await first.hub.idle()
    before = (elsewhere.text, elsewhere.reply_markup, elsewhere.edits)
    forged = fake.push_callback(chat, presser, elsewhere.message_id,
                                pack(ApprovalButton(approval_id, Verdict.APPROVE)), forged=True)
    if together:  # handled at the same time as the forged press
        first.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
    async with rig(tmp_path, model, fake, allowed_users=[ANN, BOB]) as second:
        await second.until(lambda: forged in fake.callback_answers)
        assert fake.callback_answers[forged]["show_alert"]
        if not together:
            await second.settle()
            assert not (second.workspace / "out.txt").exists()
            second.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await second.answered(ANN, "Done.")
        await second.until(lambda: "✅ Approved by Ann" in fake.message(ANN, card.message_id).text)
        await second.hub.idle()
    assert fake.message(ANN, card.message_id).reply_markup is None
    shown = fake.message(chat, elsewhere.message_id)
    assert (shown.text, shown.reply_markup, shown.edits) == before
    assert (second.workspace / "out.txt").exists()
    assert model.violations == []


async def test_a_press_on_another_message_after_a_restart_never_edits_it(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    # The requester's own press in the right chat counts, but the message pressed is not
    # the card: that message is left alone, and the real card (found in the store) shows
    # the outcome.
    model.script(Reply(text="Hello there."), Reply(tool_calls=[ECHO]), Reply(text="Done."))
    async with rig(tmp_path, model, fake) as first:
        fake.push_message(ANN, ANN, "hello")
        other = await first.answered(ANN, "Hello there.")
        fake.push_message(ANN, ANN, "write it")
        card, approval_id = await first.card(ANN)
        await first.hub.idle()
    before = (other.text, other.reply_markup, other.edits)
    async with rig(tmp_path, model, fake) as second:
        fake.push_callback(ANN, ANN, other.message_id,
                           pack(ApprovalButton(approval_id, Verdict.APPROVE)), forged=True)
        await second.answered(ANN, "Done.")
        await second.until(lambda: "✅ Approved by Ann" in
                           fake.message(ANN, card.message_id).text)
        await second.hub.idle()
    shown = fake.message(ANN, other.message_id)
    assert (shown.text, shown.reply_markup, shown.edits) == before
    assert not fake.message(ANN, card.message_id).reply_markup  # its buttons are gone
    assert (second.workspace / "out.txt").exists()
    assert model.violations == []


async def test_long_call_goes_into_a_file(tmp_path: Path, model: FakeModelServer,
                                          fake: FakeTelegram) -> None:
    command = "echo " + " ".join(f"word{i}" for i in range(800)) + " > long.txt"
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": command})], chunk_size=500),
                 Reply(text="done"))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "do the long thing")
        card, approval_id = await r.card(ANN)
        document = next(m for m in r.bot(ANN) if m.document is not None)
        assert document.document is not None
        assert document.document.data.decode() == command
        assert document.document.file_name == "command.txt"
        assert "word799" not in card.text and "command.txt" in card.text
        assert card.reply_to_message_id == document.message_id
        r.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await r.answered(ANN, "done")
        await r.hub.idle()
    assert (r.workspace / "long.txt").exists()
    assert model.violations == []


# -- streaming, cancel, long answers, flood control ------------------------------------


async def test_cancel_while_streaming(tmp_path: Path, model: FakeModelServer,
                                      fake: FakeTelegram) -> None:
    model.script(Reply(text="word " * 300, chunk_size=5, chunk_delay=0.02),
                 Reply(text="fresh start"))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "talk a lot")
        await r.until(lambda: any(m.text.startswith("word") and m.reply_markup
                                  for m in r.bot(ANN)))
        placeholder = r.bot(ANN)[0]
        fake.push_callback(ANN, ANN, placeholder.message_id, pack(CancelButton(1, 1)))
        await r.until(lambda: fake.message(ANN, placeholder.message_id).text
                      .endswith("⏹ Cancelled.") and not fake.message(
                          ANN, placeholder.message_id).reply_markup)
        shown = fake.message(ANN, placeholder.message_id).text
        assert shown.startswith("word") and shown.count("word") < 300
        fake.push_message(ANN, ANN, "next")
        await r.answered(ANN, "fresh start")
        await r.hub.idle()
    assert model.violations == []


async def test_a_cancel_press_on_another_message_leaves_its_buttons(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="done"))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "write it")
        card, approval_id = await r.card(ANN)
        before = (card.text, copy.deepcopy(card.reply_markup), card.edits)
        query = fake.push_callback(ANN, ANN, card.message_id, pack(CancelButton(99)),
                                   forged=True)
        # the core's refusal is the press's own answer, an alert, not a chat message
        await r.until(lambda: query in fake.callback_answers)
        await r.settle()
        assert fake.callback_answers[query]["text"] == "That turn is already over."
        assert fake.callback_answers[query]["show_alert"]
        assert "That turn is already over." not in fake.bot_texts(ANN)
        shown = fake.message(ANN, card.message_id)
        assert (shown.text, shown.reply_markup, shown.edits) == before
        r.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await r.answered(ANN, "done")
        await r.hub.idle()
    assert (r.workspace / "out.txt").exists()
    assert model.violations == []


def long_answer() -> str:
    para = " ".join(f"alpha{i}" for i in range(120))
    code = "\n".join(f"    value_{i} = compute({i}) < {i + 1}" for i in range(90))
    text = "\n\n".join([para] * 8) + "\n\n```python\n" + code + "\n```\n\n" + \
        "\n\n".join([para.replace("alpha", "omega")] * 6)
    assert len(text) >= 10_000
    return text


async def test_long_answer_is_split_without_losing_anything(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    text = long_answer()
    model.script(Reply(text=text, chunk_size=700))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "write a lot")
        await r.until(lambda: any("omega119" in m.text for m in r.bot(ANN)) and
                      not any(m.reply_markup for m in r.bot(ANN)), timeout=15)
        await r.hub.idle()
    messages = r.bot(ANN)
    assert len(messages) >= 3
    assert all(len(m.text) <= 4096 for m in messages)
    assert all(m.parse_mode == "HTML" and "```" not in m.text for m in messages)
    for m in messages:
        if "compute(" in m.text:
            assert any(e["type"] == "pre" for e in m.entities)
    shown = " ".join(m.text for m in messages).split()
    assert set(text.replace("```python", "").replace("```", "").split()) <= set(shown)
    assert model.violations == []


async def test_flood_control_during_streaming(tmp_path: Path, model: FakeModelServer) -> None:
    answer = " ".join(f"token{i}" for i in range(150))
    model.script(Reply(text=answer, chunk_size=8, chunk_delay=0.01))
    async with FakeTelegram(edit_interval=1.0, burst=1, retry_after=1) as flood, \
            rig(tmp_path, model, flood) as r:
        flood.push_message(ANN, ANN, "stream please")
        await r.answered(ANN, answer)
        await r.hub.idle()
        assert flood.rate_limited
        assert flood.internal_errors == []
    assert model.violations == []


async def test_tool_progress_edits_the_one_placeholder(tmp_path: Path, model: FakeModelServer,
                                                       fake: FakeTelegram) -> None:
    slow = ToolCallSpec("shell", {"command": "sleep 0.5; echo done"})
    model.script(Reply(tool_calls=[slow]), Reply(tool_calls=[slow]), Reply(text="Both ran."))
    async with rig(tmp_path, model, fake, approvals={"tools": {"shell": "allow"}}) as r:
        fake.push_message(ANN, ANN, "run it twice")
        final = await r.answered(ANN, "Both ran.")
        await r.hub.idle()
    assert len(r.bot(ANN)) == 1
    assert any(t.startswith("⚙️ Running shell…") for t in final.history)
    assert model.violations == []


# -- exactly once ----------------------------------------------------------------------


def _redeliver(fake: FakeTelegram, update_id: int) -> None:
    """Serve an update again, as Telegram does when its confirmation was lost."""
    served = [u for call in fake.calls_to("getUpdates") for u in (call.result or [])]
    update = next(u for u in served if u["update_id"] == update_id)
    fake._updates.append(copy.deepcopy(update))


async def test_redelivered_update_is_answered_once(tmp_path: Path, model: FakeModelServer,
                                                   fake: FakeTelegram) -> None:
    model.script(Reply(text="only once"))
    update_id = fake.push_message(ANN, ANN, "hello")
    fake._updates.append(copy.deepcopy(fake._updates[-1]))
    async with rig(tmp_path, model, fake) as r:
        await r.answered(ANN, "only once")
        await r.settle()
    _redeliver(fake, update_id)
    async with rig(tmp_path, model, fake) as again:
        await again.settle()
    assert fake.bot_texts(ANN) == ["only once"]
    assert len(model.requests) == 1 and model.violations == []


@pytest.mark.parametrize("served", [True, False], ids=["reactions", "core-methods-only"])
async def test_a_queued_message_is_acknowledged(tmp_path: Path, model: FakeModelServer,
                                                fake: FakeTelegram, served: bool) -> None:
    # With reactions a 👀 on the message; a Bot API server that serves only the core
    # methods (no reactions, no command menu) gets the acknowledgement in words.
    if not served:
        for method in ("setmessagereaction", "setmycommands"):
            del fake._methods[method]
    model.script(Reply(text="slow " * 40, chunk_size=5, chunk_delay=0.02),
                 Reply(text="second answer"))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "first")
        await r.until(lambda: any(m.text.startswith("slow") for m in r.bot(ANN)))
        fake.push_message(ANN, ANN, "also this")
        await r.answered(ANN, "second answer")
        await r.hub.idle()
    if served:
        assert [r[2] for r in fake.reactions] == [[{"type": "emoji", "emoji": "👀"}]]
        assert QUEUED not in fake.bot_texts(ANN)
    else:
        assert fake.reactions == [] and fake.bot_texts(ANN).count(QUEUED) == 1
    assert any("also this" in t for t in user_texts(model))
    assert model.violations == []


async def test_commands(tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "/start")
        await r.until(lambda: any(m.text.startswith("Tandem answers here") for m in r.bot(ANN)))
        fake.push_message(ANN, ANN, "/status")
        await r.until(lambda: any(m.text.startswith("Model: openai/fake") for m in r.bot(ANN)))
        fake.push_message(ANN, ANN, "/stop")
        await r.until(lambda: "Nothing is running." in fake.bot_texts(ANN))
        fake.push_message(ANN, ANN, "/approvals")
        await r.until(lambda: any("No standing" in t for t in fake.bot_texts(ANN)))
        await r.hub.idle()
    assert model.requests == [] and model.violations == []


# -- HTML that Telegram rejects --------------------------------------------------------


async def test_markup_in_the_answer_is_shown_literally(tmp_path: Path, model: FakeModelServer,
                                                       fake: FakeTelegram) -> None:
    answer = "Use <b>unclosed and <foo> tags & **bold** too"
    model.script(Reply(text=answer))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "show html")
        final = await r.answered(ANN, "Use <b>unclosed and <foo> tags & bold too")
        await r.hub.idle()
    assert final.parse_mode == "HTML" and [e["type"] for e in final.entities] == ["bold"]
    assert model.violations == []


async def test_rejected_html_falls_back_to_plain_text(tmp_path: Path, model: FakeModelServer,
                                                      fake: FakeTelegram) -> None:
    answer = "Plain **fallback** answer"
    model.script(Reply(text=answer), Reply(text="again"))
    async with rig(tmp_path, model, fake) as r:
        r.adapter.render = lambda text: "<b>" + html.escape(text, quote=False)  # unclosed
        fake.push_message(ANN, ANN, "hi")
        final = await r.answered(ANN, answer)
        fake.push_message(ANN, ANN, "/help")
        await r.until(lambda: any(m.text.startswith("Tandem answers here") for m in r.bot(ANN)))
        await r.hub.idle()
    assert final.parse_mode is None
    assert any("can't parse entities" in (c.description or "")
               for c in fake.calls_to("editMessageText") + fake.calls_to("sendMessage"))
    assert model.violations == []


async def test_rejected_token_is_a_config_error(tmp_path: Path, model: FakeModelServer,
                                                fake: FakeTelegram) -> None:
    config = tg_config(tmp_path, model, fake, token="999:WRONG")
    hub, dispatch = build(config)
    adapter = create(config, hub, dispatch)
    with pytest.raises(ConfigError) as err:
        await adapter.start()
    await adapter.stop()
    assert err.value.key == "telegram.token" and model.violations == []


async def test_an_end_shown_by_another_process_finishes_the_placeholder_it_left(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    """A process posted the placeholder (with ⏹), stored the answer and died; the one that
    shows the answer edits that placeholder and posts nothing new."""
    from bot.core.buttons import CancelButton
    from bot.core.events import TurnEnded

    fake.add_chat(ANN, "private")
    async with rig(tmp_path, model, fake) as r:
        left = await r.adapter.api.send(ANN, None, "⏳ Thinking…", "⏳ Thinking…",
                                        [[("⏹ Cancel", pack(CancelButton(4)))]])
        await r.adapter.emit(TurnEnded(ConvKey("telegram", str(ANN)), 4, "The answer.",
                                       "completed", live={"message_id": left.message_id}))
        [message] = r.bot(ANN)
    assert (message.message_id, message.text) == (left.message_id, "The answer.")
    assert not message.reply_markup


# -- drafts, pacing and what a press is told -------------------------------------------


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def _chat_calls(fake: FakeTelegram, chat: int) -> list[float]:
    """When each call that targets `chat` (every kind the pacer paces) was answered."""
    paced = {"sendMessage", "editMessageText", "editMessageReplyMarkup", "sendMessageDraft",
             "setMessageReaction", "deleteMessage", "sendDocument", "sendPhoto"}
    return [c.time for c in fake.calls
            if c.method in paced and str((c.params or {}).get("chat_id")) == str(chat)]


async def test_a_dm_answer_streams_as_drafts_then_one_message(
        tmp_path: Path, model: FakeModelServer) -> None:
    answer = " ".join(f"word{i}" for i in range(120))
    model.script(Reply(text=answer, chunk_size=12, chunk_delay=0.03))
    async with FakeTelegram(chat_interval=1.0, burst=0) as strict, \
            rig(tmp_path, model, strict, {"min_edit_interval": 1.0}, drafts=True) as r:
        strict.push_message(ANN, ANN, "tell me a lot")
        final = await r.answered(ANN, answer)
        await r.hub.idle()
    drafts = [d for d in strict.drafts if d.chat_id == ANN]
    assert len(drafts) >= 2 and any(d.text.startswith("word0") for d in drafts)
    assert len({d.draft_id for d in drafts}) == 1
    assert len(r.bot(ANN)) == 1 and final.edits == 0  # one message, never edited
    assert strict.rate_limited == []
    assert min(_gaps(_chat_calls(strict, ANN))) >= 0.95  # the final send keeps the pace too
    assert model.violations == []


async def test_a_group_answer_streams_by_edits_at_most_once_a_second(
        tmp_path: Path, model: FakeModelServer) -> None:
    answer = " ".join(f"word{i}" for i in range(120))
    model.script(Reply(text=answer, chunk_size=12, chunk_delay=0.03))
    async with FakeTelegram(chat_interval=1.0, burst=0) as strict, \
            rig(tmp_path, model, strict, {"min_edit_interval": 1.0}, drafts=True) as r:
        strict.push_message(GROUP, ANN, "@tandem_bot tell me a lot", chat_type="supergroup")
        final = await r.answered(GROUP, answer)
        await r.hub.idle()
    assert strict.drafts == [] and final.edits >= 2
    assert strict.rate_limited == []
    assert min(_gaps(_chat_calls(strict, GROUP))) >= 0.95
    assert model.violations == []


async def test_stop_mid_draft_leaves_the_partial_answer_marked_cancelled(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(text="word " * 400, chunk_size=5, chunk_delay=0.02))
    async with rig(tmp_path, model, fake, drafts=True) as r:
        fake.push_message(ANN, ANN, "talk a lot")
        await r.until(lambda: any(d.text.startswith("word") for d in fake.drafts))
        fake.push_message(ANN, ANN, "/stop")
        await r.until(lambda: any(t.endswith("⏹ Cancelled.") for t in fake.bot_texts(ANN)))
        await r.hub.idle()
    [shown] = [t for t in fake.bot_texts(ANN) if t.endswith("⏹ Cancelled.")]
    assert shown.startswith("word") and shown.count("word") < 400
    assert model.violations == []


async def test_refused_drafts_fall_back_to_an_edited_placeholder(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    answer = " ".join(f"word{i}" for i in range(60))
    model.script(Reply(text=answer, chunk_size=10, chunk_delay=0.03), Reply(text="again"))
    fake.refuse_drafts = True
    async with rig(tmp_path, model, fake, drafts=True) as r:
        fake.push_message(ANN, ANN, "tell me")
        final = await r.answered(ANN, answer)
        fake.push_message(ANN, ANN, "once more")
        await r.answered(ANN, "again")
        await r.hub.idle()
    assert final.history[0] == "⏳ Thinking…" and final.edits >= 1
    tried = [c for c in fake.calls if c.method == "sendMessageDraft"]
    assert len(tried) == 1  # the chat is remembered as one without drafts
    assert model.violations == []


async def test_chats_sending_back_to_back_never_meet_flood_control(
        tmp_path: Path, model: FakeModelServer) -> None:
    # Each chat sends its next message as soon as an answer shows, and twice a second
    # message while the first is answered (a queued turn: 👀, then its own answer).
    chats = [ANN, BOB, CAROL]
    for _ in range(len(chats) * 4):
        model.script(Reply(text="answer " * 30, chunk_size=20, chunk_delay=0.01))
    async with FakeTelegram(chat_interval=1.0, burst=0) as strict, \
            rig(tmp_path, model, strict, {"min_edit_interval": 1.0, "placeholder_delay": 0.1},
                allowed_users=chats, drafts=False) as r:
        for round_ in range(2):
            for chat in chats:
                strict.push_message(chat, chat, f"first {round_}")
                strict.push_message(chat, chat, f"second {round_}")
            await r.until(lambda n=round_: all(
                len([t for t in strict.bot_texts(c) if t.startswith("answer")]) >= 2 * (n + 1)
                and not any(m.reply_markup for m in r.bot(c)) for c in chats), timeout=30)
        await r.hub.idle()
    assert strict.rate_limited == []
    for chat in chats:
        assert min(_gaps(_chat_calls(strict, chat))) >= 0.95
    assert model.violations == []


async def test_a_press_on_a_decided_card_is_told_privately(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(tool_calls=[ECHO]), Reply(text="Wrote it."))
    async with rig(tmp_path, model, fake, allowed_users=[ANN, BOB], approvers=[BOB]) as r:
        fake.push_message(GROUP, ANN, "@tandem_bot write it", chat_type="supergroup")
        card, approval_id = await r.card(GROUP)
        first = r.press(GROUP, ANN, card, approval_id, Verdict.APPROVE)
        second = r.press(GROUP, BOB, card, approval_id, Verdict.DENY, name="Bob")
        await r.answered(GROUP, "Wrote it.")
        await r.until(lambda: second in fake.callback_answers)
        # a client still showing the card's buttons
        late = fake.push_callback(GROUP, BOB, card.message_id,
                                  pack(ApprovalButton(approval_id, Verdict.APPROVE)),
                                  first_name="Bob", forged=True)
        await r.until(lambda: late in fake.callback_answers)
        await r.settle()
    answers = [fake.callback_answers[q] for q in (first, second, late)]
    refusals = [a for a in answers if a.get("text")]
    assert len(refusals) == 2 and all(a["show_alert"] for a in refusals)
    assert all(a["text"] == "Already decided: approved." for a in refusals)
    assert not any("Already decided" in t for t in fake.bot_texts(GROUP))
    assert model.violations == []


async def test_a_denied_call_leaves_no_waiting_placeholder(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    model.script(Reply(text="I will write it.", tool_calls=[ECHO]),
                 Reply(text="Not written, then."))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "write it")
        card, approval_id = await r.card(ANN)
        await r.until(lambda: any("Waiting for approval" in t for t in fake.bot_texts(ANN)))
        r.press(ANN, ANN, card, approval_id, Verdict.DENY)
        await r.answered(ANN, "Not written, then.")
        await r.settle()
    texts = fake.bot_texts(ANN)
    assert not any("Waiting for approval" in t for t in texts)
    assert "I will write it." in texts  # what the model said before it asked stays
    assert model.violations == []


async def test_a_finished_part_of_a_long_streamed_answer_is_not_sent_again(
        tmp_path: Path, model: FakeModelServer, fake: FakeTelegram) -> None:
    answer = "\n\n".join(" ".join(f"w{p}x{i}" for i in range(100)) for p in range(12))
    assert len(answer) > 6000
    model.script(Reply(text=answer, chunk_size=200, chunk_delay=0.05))
    async with rig(tmp_path, model, fake) as r:
        fake.push_message(GROUP, ANN, "@tandem_bot a long one", chat_type="supergroup")
        await r.until(lambda: len(r.bot(GROUP)) >= 2 and not any(
            m.reply_markup for m in r.bot(GROUP)), timeout=20)
        await r.hub.idle()
    assert "\n\n".join(m.text for m in r.bot(GROUP)).split() == answer.split()
    unchanged = [c for c in fake.calls if c.method == "editMessageText"
                 and "not modified" in (c.description or "")]
    assert unchanged == []  # every edit changed something
    assert model.violations == []
