"""The Slack adapter end to end: real slack-bolt/slack-sdk against the fake Slack, the real
litellm client against the fake model, real SQLite. Every scenario runs in Socket Mode and
in HTTP mode."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import litellm  # noqa: F401 - once up front, not inside the first test's timeouts
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slack_bolt.request.payload_utils import to_action
from slack_bolt.response import BoltResponse

from adapters.live import QUEUED
from adapters.slack import SlackUnavailable, create
from adapters.slack_http import on_bolt_error as _on_bolt_error
from adapters.slack_http import signed_only as _signed_only
from adapters.slack_inbound import teams
from bot.core.buttons import CancelButton, pack
from bot.core.errors import ConfigError
from bot.core.events import ApprovalRequested, ConvKey, User
from bot.run.app import build
from tests.conftest import make_config, said
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.fakes.slack_server import FakeSlackMessage, FakeSlackServer, block_text
from tests.suites.harness import SECRET, SlackRig

JSON = dict[str, Any]
FOREIGN = "T-OTHER"


class Rig(SlackRig):
    """SlackRig that checks on a clean exit: every ack within 3 s and none given twice,
    and no invalid request to the model."""

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        await super().__aexit__(exc_type, *exc)
        if exc_type is None:
            self.check()

    def check(self) -> None:
        assert self.acks and max(self.acks) < 3.0, self.acks
        assert not self.fake.duplicate_acks
        assert self.model.violations == []

    async def send(self, kind: str, payload: JSON) -> None:
        """`payload` as a Socket Mode envelope of `kind` (`events_api`, `interactive`) or as
        its signed HTTP post; waits for the ack (HTTP: a 200)."""
        if self.mode == "socket":
            envelope = await self.fake.push(kind, payload)
            self.acks.append(await self.fake.wait_ack(envelope))
            return
        post = self.fake.post_event if kind == "events_api" else self.fake.post_action
        got = await post(self.url, payload, signing_secret=SECRET)
        assert got.status == 200, got
        self.acks.append(got.latency)


@pytest.fixture(params=["socket", "http"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlackServer]:
    """Rate limits off, except in the test about them (they only make the others slow)."""
    async with FakeSlackServer(rate_limit=False) as server:
        yield server


@pytest.fixture
def rig_factory(fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path,
                mode: str) -> Callable[..., Rig]:
    def factory(**overrides: Any) -> Rig:
        return Rig(fake, model, tmp_path, mode, **overrides)

    return factory


@pytest.fixture
async def rig(rig_factory: Callable[..., Rig]) -> AsyncIterator[Rig]:
    async with rig_factory() as started:
        yield started


def shell(cmd: str) -> Reply:
    return Reply(tool_calls=[ToolCallSpec("shell", {"command": cmd})])


def user_texts(model: FakeModelServer, index: int = -1) -> list[str]:
    return said(model.requests[index]["messages"])


def buttons(message: FakeSlackMessage) -> list[str]:
    return [e["action_id"] for b in message.blocks or [] if b["type"] == "actions"
            for e in b["elements"]]


# ---- conversations -------------------------------------------------------------------------


async def test_a_dm_conversation(rig: Rig, model: FakeModelServer) -> None:
    model.script(Reply(text="**Hello** U1 & <friends>, see [docs](https://x.test/?a=1&b=2)"),
                 Reply(text="Again."))
    await rig.say("D1", "U1", "hi")
    await rig.wait_text("D1", "Hello")
    await rig.settle()
    await rig.say("D1", "U1", "and again")
    texts = await rig.wait_text("D1", "Again.")
    await rig.settle()
    assert texts == ["*Hello* U1 &amp; &lt;friends&gt;, see <https://x.test/?a=1&amp;b=2|docs>",
                     "Again."]
    assert all(m.thread_ts is None for m in rig.fake.bot_messages("D1"))
    assert all(not buttons(m) for m in rig.fake.bot_messages("D1"))  # Cancel removed at the end
    assert user_texts(model)[0].startswith("[user_u1] hi")  # same conversation, with its name
    assert len(model.requests) == 2


async def test_a_mention_and_the_thread_that_follows(rig: Rig, model: FakeModelServer) -> None:
    model.script(Reply(text="First answer."), Reply(text="Second answer."))
    root = await rig.say("C1", "U1", "what is up?", channel_type="channel", mention=True)
    await rig.wait_text("C1", "First answer.", thread=root["ts"])
    await rig.settle()
    # A reply in that thread, without a mention, continues the conversation.
    await rig.say("C1", "U2", "tell me more", channel_type="channel", thread_ts=root["ts"])
    await rig.wait_text("C1", "Second answer.", thread=root["ts"])
    await rig.settle()
    assert rig.texts("C1", root["ts"]) == ["First answer.", "Second answer."]
    assert "[user_u1] what is up?" in user_texts(model)[0]
    assert any(t.startswith("[user_u2] tell me more") for t in user_texts(model))
    # Channel talk without a mention, and replies in threads Tandem is not part of: ignored.
    await rig.say("C1", "U1", "just chatting", channel_type="channel")
    other = rig.fake.message_event("C1", "U2", "unrelated root", channel_type="channel")
    await rig.say("C1", "U1", "a reply elsewhere", channel_type="channel",
                  thread_ts=other["ts"])
    await rig.settle()
    assert len(model.requests) == 2 and len(rig.fake.bot_messages("C1")) == 2
    assert len(rig.fake.calls_to("conversations.replies")) == 1  # only for the unknown thread


async def test_a_mention_inside_an_existing_thread_reads_it_once(rig: Rig,
                                                                 model: FakeModelServer) -> None:
    model.script(Reply(text="Looks like a null pointer."), Reply(text="Yes, patch it."))
    root = rig.fake.message_event("C2", "U3", "prod is down", channel_type="channel")
    rig.fake.message_event("C2", "U4", "stack trace says NPE in Foo", channel_type="channel",
                           thread_ts=root["ts"])
    await rig.say("C2", "U1", "any idea?", channel_type="channel", mention=True,
                  thread_ts=root["ts"])
    await rig.wait_text("C2", "null pointer", thread=root["ts"])
    await rig.settle()
    first = user_texts(model, 0)[0]
    assert "[Earlier in this thread]" in first
    assert "prod is down" in first and "stack trace says NPE in Foo" in first
    assert first.index("prod is down") < first.index("[user_u1] any idea?")
    await rig.say("C2", "U1", "should I patch?", channel_type="channel", thread_ts=root["ts"])
    await rig.wait_text("C2", "patch it", thread=root["ts"])
    await rig.settle()
    assert len(rig.fake.calls_to("conversations.replies")) == 1
    assert "Earlier in this thread" not in user_texts(model)[-1]


async def test_strangers_get_one_reply_with_their_id(rig: Rig, model: FakeModelServer) -> None:
    await rig.say("D9", "U9", "hello?")
    texts = await rig.wait_text("D9", "U9")
    await rig.say("D9", "U9", "hello again?")
    await rig.say("C1", "U9", "hey bot", channel_type="channel", mention=True)
    await rig.settle()
    assert len(texts) == 1 and "slack.allowed_users" in texts[0]
    assert rig.texts("D9") == texts and rig.texts("C1") == []
    assert model.requests == []


async def test_a_star_allows_everyone_in_the_workspace(rig_factory: Callable[..., Rig],
                                                       model: FakeModelServer) -> None:
    rig = rig_factory(slack__allowed_users=["*"])
    await rig.start()
    try:
        model.script(Reply(text="Hi stranger."))
        await rig.say("D9", "U9", "hello?")
        await rig.wait_text("D9", "Hi stranger.")
        await rig.settle()
        outsider = rig.fake.message_event("D8", "U8", "from another org")
        outsider["user_team"] = FOREIGN
        await rig.deliver(outsider)
        await rig.settle()
    finally:
        await rig.stop()
    rig.check()
    assert len(model.requests) == 1
    assert rig.texts("D8") == [] and rig.fake.ephemerals_for("U8") == []


async def test_another_workspace_never_reaches_the_core(rig_factory: Callable[..., Rig],
                                                        model: FakeModelServer,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    rig = rig_factory(slack__allowed_users=["*"])
    await rig.start()
    try:
        model.script(Reply(text="Hello, member."))
        for i in range(5):  # installed elsewhere: only the envelope names the workspace
            event = rig.fake.message_event("D8", "U8", f"from afar {i}", team=None)
            await rig.send("events_api", rig.fake.event_body(event, team_id=FOREIGN))
        # A channel shared with another workspace: the event names the user's.
        shared = rig.fake.message_event("C5", "U7", "hi bot", channel_type="channel",
                                        mention=True, team=FOREIGN)
        shared["user_team"] = FOREIGN
        await rig.send("events_api", rig.fake.event_body(shared))
        await rig.say("D1", "U1", "hello")
        await rig.wait_text("D1", "Hello, member.")
        await rig.settle()
    finally:
        await rig.stop()
    rig.check()
    assert len(model.requests) == 1 and "hello" in user_texts(model)[0]
    assert rig.texts("D8") == [] and rig.texts("C5") == [] and rig.fake.ephemerals == []
    assert {c.params.get("user") for c in rig.fake.calls_to("users.info")} == {"U1"}
    assert rig.fake.calls_to("conversations.replies") == []
    told = [r for r in caplog.records if FOREIGN in r.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.WARNING, caplog.text


async def test_a_listed_id_from_another_workspace_is_dropped(rig: Rig,
                                                             model: FakeModelServer) -> None:
    model.script(Reply(text="Only for T1's U1."))
    elsewhere = rig.fake.message_event("D1", "U1", "same id, other org", team=None)
    await rig.send("events_api", rig.fake.event_body(elsewhere, team_id=FOREIGN))
    shared = rig.fake.message_event("C5", "U1", "same id, shared channel",
                                    channel_type="channel", mention=True, team=FOREIGN)
    shared["user_team"] = FOREIGN
    await rig.send("events_api", rig.fake.event_body(shared))
    await rig.settle()
    assert model.requests == [] and rig.texts("D1") == [] and rig.texts("C5") == []
    assert rig.fake.ephemerals == []
    await rig.say("D1", "U1", "from home")
    await rig.wait_text("D1", "Only for T1's U1.")
    await rig.settle()
    assert len(model.requests) == 1


async def test_a_press_from_another_workspace_changes_nothing(rig: Rig, model: FakeModelServer,
                                                              tmp_path: Path) -> None:
    model.script(shell("echo hi > x.txt"), Reply(text="Done."))
    await rig.say("D1", "U1", "make x")
    card = await rig.card("D1")
    await rig.wait_text("D1", "⏸ Waiting for approval")
    value = next(e["value"] for b in card.blocks or [] if b["type"] == "actions"
                 for e in b["elements"] if e["action_id"] == "tandem_approve")
    foreign = rig.fake.block_actions("D1", "U1", card.ts, "tandem_approve", value,
                                     team_id=FOREIGN)
    await rig.send("interactive", foreign)
    member_elsewhere = rig.fake.block_actions("D1", "U1", card.ts, "tandem_approve", value)
    member_elsewhere["user"]["team_id"] = FOREIGN
    await rig.send("interactive", member_elsewhere)
    await rig.settle()
    assert not (tmp_path / "workspace" / "x.txt").exists()
    assert buttons(card) == ["tandem_approve", "tandem_deny", "tandem_session", "tandem_always"]
    assert rig.fake.ephemerals == [] and len(model.requests) == 1
    await rig.press("D1", "U1", card.ts, "tandem_approve")
    await rig.wait_text("D1", "Done.")
    await rig.settle()
    assert (tmp_path / "workspace" / "x.txt").exists()


async def test_a_strangers_mention_in_a_thread_does_not_join_it(rig: Rig,
                                                                 model: FakeModelServer) -> None:
    model.script(Reply(text="Read the thread."))
    root = rig.fake.message_event("C2", "U3", "prod is down", channel_type="channel")
    await rig.say("C2", "U9", "bot, fix it", channel_type="channel", mention=True,
                  thread_ts=root["ts"])
    await rig.fake.wait_for(lambda: rig.fake.ephemerals_for("U9"))
    await rig.settle()
    assert rig.fake.calls_to("conversations.replies") == []  # no thread read for a stranger
    assert rig.fake.calls_to("users.info") == []
    assert "`U9`" in rig.fake.ephemerals_for("U9")[0]["text"]
    await rig.say("C2", "U1", "any idea?", channel_type="channel", mention=True,
                  thread_ts=root["ts"])
    await rig.wait_text("C2", "Read the thread.", thread=root["ts"])
    await rig.settle()
    assert "prod is down" in user_texts(model, 0)[0]  # Tandem joins with the first allowed user
    assert rig.texts("C2", thread=root["ts"]) == ["Read the thread."]


async def test_a_strangers_cancel_press_changes_nothing(rig: Rig, model: FakeModelServer) -> None:
    model.script(Reply(text="word " * 80, chunk_size=5, chunk_delay=0.02))
    await rig.say("D1", "U1", "write a lot")
    live = await rig.fake.wait_for(
        lambda: next((m for m in rig.fake.bot_messages("D1") if "word" in m.text), None))
    assert live is not None
    await rig.press("D1", "U9", live.ts, "tandem_cancel")
    await rig.fake.wait_for(lambda: rig.fake.ephemerals_for("U9"))
    await rig.fake.wait_for(lambda: not buttons(rig.fake.bot_messages("D1")[0]))
    await rig.settle()
    [message] = rig.fake.bot_messages("D1")
    assert block_text(message.blocks).count("word") == 80 and "Cancelled" not in message.text
    assert "`U9`" in rig.fake.ephemerals_for("U9")[0]["text"]


async def test_the_same_event_retried_is_answered_once(rig: Rig, model: FakeModelServer) -> None:
    model.script(Reply(text="Only once."))
    event = rig.fake.message_event("D1", "U1", "are you there?")
    event_id = await rig.deliver(event)
    for attempt in (1, 2, 3):
        await rig.deliver(event, event_id=event_id, retry=attempt)
    await rig.wait_text("D1", "Only once.")
    await rig.settle()
    await rig.restart()
    await rig.deliver(event, event_id=event_id, retry=3)
    await rig.settle()
    assert rig.texts("D1") == ["Only once."]
    assert len(model.requests) == 1


async def test_commands_as_text(rig: Rig, model: FakeModelServer) -> None:
    model.script(Reply(text="Remembered."), Reply(text="Fresh start."))
    await rig.say("D1", "U1", "remember 42")
    await rig.wait_text("D1", "Remembered.")
    await rig.settle()
    await rig.say("D1", "U1", "/status")
    await rig.wait_text("D1", "Model: openai/fake")
    await rig.say("D1", "U1", "/new")
    await rig.wait_text("D1", "Started a new conversation")
    await rig.settle()
    await rig.say("D1", "U1", "what was it?")
    await rig.wait_text("D1", "Fresh start.")
    await rig.settle()
    assert not any("remember 42" in t for t in user_texts(model))
    root = await rig.say("C1", "U1", "/help", channel_type="channel", mention=True)
    await rig.wait_text("C1", "/stop", thread=root["ts"])
    await rig.settle()
    assert len(model.requests) == 2


async def test_a_message_during_a_turn_is_queued_with_eyes(rig: Rig,
                                                           model: FakeModelServer) -> None:
    model.script(Reply(text="slow " * 30, chunk_delay=0.02), Reply(text="Both answered."))
    await rig.say("D1", "U1", "first")
    await rig.fake.wait_for(lambda: any("slow" in t for t in rig.texts("D1")))
    second = await rig.say("D1", "U1", "second")
    await rig.wait_text("D1", "Both answered.")
    await rig.settle()
    assert rig.fake.reactions == [("D1", second["ts"], "eyes")]
    assert "second" in user_texts(model)[-1]


async def test_without_reactions_a_queued_message_is_acknowledged_in_words(
        rig: Rig, model: FakeModelServer) -> None:
    del rig.fake._handlers["reactions.add"]  # a workspace (or a server) without reactions
    model.script(Reply(text="slow " * 30, chunk_delay=0.02), Reply(text="Both answered."))
    await rig.say("D1", "U1", "first")
    await rig.fake.wait_for(lambda: any("slow" in t for t in rig.texts("D1")))
    await rig.say("D1", "U1", "second")
    await rig.wait_text("D1", "Both answered.")
    await rig.settle()
    assert rig.fake.reactions == []
    assert rig.texts("D1").count(QUEUED) == 1
    assert "second" in user_texts(model)[-1]


# ---- streaming -----------------------------------------------------------------------------


async def test_cancel_during_streaming(rig: Rig, model: FakeModelServer) -> None:
    model.script(Reply(text="word " * 400, chunk_size=5, chunk_delay=0.02))
    await rig.say("D1", "U1", "write a lot")
    live = await rig.fake.wait_for(
        lambda: next((m for m in rig.fake.bot_messages("D1") if "word" in m.text), None))
    assert live is not None
    assert buttons(live) == ["tandem_cancel"]
    await rig.press("D1", "U1", live.ts, "tandem_cancel")
    await rig.wait_text("D1", "⏹ Cancelled.")
    await rig.settle()
    [message] = rig.fake.bot_messages("D1")
    assert not buttons(message)
    assert block_text(message.blocks).count("word") < 400
    assert len(message.edits) >= 2


async def test_the_placeholder_shows_only_for_a_turn_that_takes_a_while(
        rig_factory: Callable[..., Rig], model: FakeModelServer) -> None:
    model.script(Reply(text="Quick."), Reply(text="slow " * 20, chunk_size=5, chunk_delay=0.1))
    async with rig_factory(placeholder_delay=0.5) as rig:
        await rig.say("D1", "U1", "hi")
        await rig.wait_text("D1", "Quick.")
        await rig.settle()
        [quick] = rig.fake.bot_messages("D1")
        assert quick.edits == [] and not buttons(quick)  # one post, no placeholder
        await rig.say("D1", "U1", "take your time")
        live = await rig.fake.wait_for(lambda: next(
            (m for m in rig.fake.bot_messages("D1")[1:] if buttons(m)), None))
        assert live is not None and buttons(live) == ["tandem_cancel"]
        await rig.wait_text("D1", "slow " * 19)
        await rig.settle()
        assert len(rig.fake.bot_messages("D1")) == 2
        assert not any(buttons(m) for m in rig.fake.bot_messages("D1"))


async def test_edits_are_at_most_about_one_a_second_by_default(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    async with Rig(fake, model, tmp_path, "socket", edit_interval=None) as rig:
        model.script(Reply(text="tock " * 100, chunk_size=5, chunk_delay=0.025))  # ~2.5 s
        await rig.say("D1", "U1", "stream slowly")
        await rig.wait_text("D1", "tock " * 99)
        await rig.settle()
        [message] = rig.fake.bot_messages("D1")
        assert 2 <= len(message.edits) <= 5  # ~1 a second, then the final text at once
        assert fake.max_update_rate("D1") <= 2


async def test_a_long_answer_is_split_and_nothing_is_lost(rig: Rig,
                                                          model: FakeModelServer) -> None:
    rig.fake.rate_limit, rig.fake.post_interval = True, 0.2  # some parts wait their turn
    paragraphs = [f"Paragraph {i}: " + " ".join(f"w{i}x{j}" for j in range(60))
                  for i in range(40)]
    code = "```python\n" + "\n".join(f"print({i})  # line {i}" for i in range(150)) + "\n```"
    answer = "\n\n".join(paragraphs[:20]) + "\n\n" + code + "\n\n" + "\n\n".join(paragraphs[20:])
    model.script(Reply(text=answer, chunk_size=400))
    await rig.say("D1", "U1", "long please")
    await rig.wait_text("D1", "Paragraph 39")
    await rig.settle()
    messages = rig.fake.bot_messages("D1")
    assert len(messages) > 4
    for m in messages:
        assert m.blocks and not buttons(m)
        assert all(len(b["text"]["text"]) <= 3000 for b in m.blocks if b["type"] == "section")
    shown = "\n".join(rig.texts("D1"))
    for i in range(40):
        assert " ".join(f"w{i}x{j}" for j in range(60)) in " ".join(shown.split())
    for i in range(150):
        assert f"print({i})  # line {i}" in shown
    assert shown.count("Paragraph 0:") == 1


async def test_rate_limits_delay_but_never_drop_the_answer(rig_factory: Callable[..., Rig],
                                                           fake: FakeSlackServer,
                                                           model: FakeModelServer) -> None:
    fake.rate_limit, fake.burst = True, 1
    rig = rig_factory()
    await rig.start()
    try:
        model.script(Reply(text="tick " * 200, chunk_size=10, chunk_delay=0.01))
        await rig.say("D1", "U1", "stream")
        await rig.wait_text("D1", "tick " * 199)
        await rig.settle()
    finally:
        await rig.stop()
    rig.check()
    assert fake.rate_limited
    assert " ".join(rig.texts("D1")[-1].split()) == " ".join(["tick"] * 200)


# ---- approvals -----------------------------------------------------------------------------


async def test_approve_deny_and_always(rig: Rig, model: FakeModelServer, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    model.script(shell("echo yes > a.txt"), Reply(text="Wrote a."),
                 shell("echo no > b.txt"), Reply(text="Not written."),
                 shell("echo again >> c.txt"), Reply(text="Always then."),
                 shell("echo again >> c.txt"), Reply(text="Ran without asking."))
    await rig.say("D1", "U1", "write a")
    card = await rig.card("D1")
    assert "🔐 Tandem wants to run `shell`" in block_text(card.blocks)
    assert "```\necho yes &gt; a.txt\n```" in block_text(card.blocks)
    assert "Requested by <@U1> · expires in 30 min" in str(card.blocks)
    assert buttons(card) == ["tandem_approve", "tandem_deny", "tandem_session", "tandem_always"]
    assert not (workspace / "a.txt").exists()
    await rig.wait_text("D1", "⏸ Waiting for approval")
    await rig.press("D1", "U1", card.ts, "tandem_approve")
    await rig.wait_text("D1", "Wrote a.")
    await rig.settle()
    assert (workspace / "a.txt").read_text() == "yes\n"
    assert "✅ Approved by <@U1>" in str(card.blocks) and not buttons(card)
    assert "Requested by <@U1>" in str(card.blocks) and "expires in" not in str(card.blocks)

    await rig.say("D1", "U1", "write b")
    card = await rig.card("D1", 2)
    await rig.press("D1", "U1", card.ts, "tandem_deny")
    await rig.wait_text("D1", "Not written.")
    await rig.settle()
    assert not (workspace / "b.txt").exists()
    assert "❌ Denied by <@U1>" in str(card.blocks) and not buttons(card)

    await rig.say("D1", "U1", "append c")
    card = await rig.card("D1", 3)
    await rig.press("D1", "U1", card.ts, "tandem_always")
    await rig.wait_text("D1", "Always then.")
    await rig.settle()
    assert "✅ Always allowed in this chat by <@U1>" in str(card.blocks)
    await rig.say("D1", "U1", "append c again")
    await rig.wait_text("D1", "Ran without asking.")
    await rig.settle()
    assert (workspace / "c.txt").read_text() == "again\nagain\n"
    assert len([t for t in rig.texts("D1") if "wants to run" in t]) == 3
    # The standing rule, listed with a button that revokes it.
    await rig.say("D1", "U1", "/approvals")
    listing = await rig.fake.wait_for(lambda: next(
        (m for m in rig.fake.bot_messages("D1") if "Standing" in m.text), None))
    assert listing is not None
    await rig.press("D1", "U1", listing.ts, "tandem_button_0")
    await rig.wait_text("D1", "Rule revoked")
    await rig.settle()


async def test_someone_elses_press_changes_nothing(rig: Rig, model: FakeModelServer,
                                                   tmp_path: Path) -> None:
    model.script(shell("echo hi > x.txt"), Reply(text="Done."))
    root = await rig.say("C1", "U1", "make x", channel_type="channel", mention=True)
    card = await rig.card("C1")
    assert card.thread_ts == root["ts"]
    await rig.press("C1", "U2", card.ts, "tandem_approve")  # allowed, but not the requester
    await rig.fake.wait_for(lambda: rig.fake.ephemerals_for("U2"))
    await rig.press("C1", "U9", card.ts, "tandem_approve")  # a stranger
    await rig.fake.wait_for(lambda: rig.fake.ephemerals_for("U9"))
    await rig.settle()
    assert "not yours" in rig.fake.ephemerals_for("U2")[0]["text"]
    assert "U9" in rig.fake.ephemerals_for("U9")[0]["text"]
    assert not (tmp_path / "workspace" / "x.txt").exists()
    assert buttons(card) == ["tandem_approve", "tandem_deny", "tandem_session", "tandem_always"]
    assert len(model.requests) == 1
    await rig.press("C1", "U1", card.ts, "tandem_approve")
    await rig.wait_text("C1", "Done.", thread=root["ts"])
    await rig.settle()
    assert (tmp_path / "workspace" / "x.txt").exists()


async def test_an_unanswered_approval_expires(rig_factory: Callable[..., Rig],
                                              model: FakeModelServer, tmp_path: Path) -> None:
    rig = rig_factory(approvals__expire_after_s=1)
    await rig.start()
    try:
        model.script(shell("echo late > late.txt"), Reply(text="It expired, so I did not."))
        await rig.say("D1", "U1", "do it")
        card = await rig.card("D1")
        assert "expires in 1 s" in str(card.blocks)
        value = next(e["value"] for b in card.blocks or [] if b["type"] == "actions"
                     for e in b["elements"] if e["action_id"] == "tandem_approve")
        await rig.wait_text("D1", "It expired, so I did not.", timeout=10)
        await rig.settle()
        assert "⌛ Expired — not run" in str(card.blocks) and not buttons(card)
        await rig.press("D1", "U1", card.ts, "tandem_approve", value)  # too late: no effect
        await rig.fake.wait_for(lambda: rig.fake.ephemerals_for("U1"))
        await rig.settle()
    finally:
        await rig.stop()
    rig.check()
    assert "Already decided" in rig.fake.ephemerals_for("U1")[0]["text"]
    assert not (tmp_path / "workspace" / "late.txt").exists()


async def test_a_press_after_a_restart(rig: Rig, model: FakeModelServer, tmp_path: Path) -> None:
    model.script(shell("echo after > r.txt"), Reply(text="Ran after the restart."))
    root = await rig.say("C1", "U1", "run it", channel_type="channel", mention=True)
    card = await rig.card("C1")
    await rig.wait_text("C1", "⏸ Waiting for approval", thread=root["ts"])
    await rig.restart()
    await rig.press("C1", "U1", card.ts, "tandem_approve")
    await rig.wait_text("C1", "Ran after the restart.", thread=root["ts"])
    await rig.settle()
    assert (tmp_path / "workspace" / "r.txt").read_text() == "after\n"
    # The new process finds the card in the store and edits it: the outcome, no buttons.
    edited = rig.fake.message("C1", card.ts)
    assert edited is not None and "✅ Approved by <@U1>" in str(edited.blocks), rig.fake.dump()
    assert not buttons(edited)
    assert not any("✅ Approved" in t for t in rig.texts("C1", root["ts"]))


async def test_a_long_command_is_never_truncated_on_the_card(rig: Rig, model: FakeModelServer,
                                                             tmp_path: Path) -> None:
    command = "echo " + " ".join(f"arg{i}" for i in range(1500)) + " > long.txt"
    call = shell(command)
    call.chunk_size = 500
    model.script(call, Reply(text="Done long."))
    await rig.say("D1", "U1", "long command")
    card = await rig.card("D1")
    assert card.blocks is not None
    sections = [b["text"]["text"] for b in card.blocks if b["type"] == "section"]
    assert all(len(s) <= 3000 for s in sections) and len(sections) == 5
    code = [s.removeprefix("```\n").removesuffix("\n```") for s in sections[1:]]
    assert "".join(code) == command.replace(">", "&gt;")  # every character, in order
    await rig.press("D1", "U1", card.ts, "tandem_approve")
    await rig.wait_text("D1", "Done long.")
    await rig.settle()
    assert (tmp_path / "workspace" / "long.txt").exists()


# ---- HTTP mode only ------------------------------------------------------------------------


async def test_bad_signatures_and_stale_requests_are_refused(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    async with Rig(fake, model, tmp_path, "http") as rig:
        await _refused(rig, model)


async def _refused(rig: Rig, model: FakeModelServer) -> None:
    body = rig.fake.event_body(rig.fake.message_event("D1", "U1", "forged"))
    bad = await rig.fake.post_event(rig.url, body, signing_secret=SECRET, bad_signature=True)
    stale = await rig.fake.post_event(rig.url, body, signing_secret=SECRET,
                                      timestamp=int(time.time()) - 400)
    wrong = await rig.fake.post_event(rig.url, body, signing_secret="not-the-secret")
    assert (bad.status, stale.status, wrong.status) == (401, 401, 401)
    payload = rig.fake.block_actions  # a forged press is refused the same way
    message = await rig.adapter.client.chat_postMessage(channel="D1", text="x")
    forged = await rig.fake.post_action(
        rig.url, payload("D1", "U1", str(message["ts"]), "tandem_cancel", pack(CancelButton())),
        signing_secret=SECRET, bad_signature=True)
    assert forged.status == 401
    await rig.deliver(rig.fake.message_event("D2", "U1", "real"))  # for rig.check()
    await rig.settle()
    assert rig.texts("D1") == ["x"]
    assert len(model.requests) == 1 and "real" in user_texts(model)[-1]


MESSAGE: JSON = {"type": "message", "channel": "D1", "user": "U1", "ts": "1.1", "text": "hi"}
PRESS: JSON = {"type": "block_actions", "user": {"id": "U1"}, "channel": {"id": "D1"},
               "actions": [{"action_id": "tandem_cancel", "value": "x"}]}
ODD_SHAPES: list[JSON] = [  # JSON bodies slack-bolt reads as objects of the wrong type
    {"type": "event_callback", "event": "x"},
    {"type": "event_callback", "event": None},
    {"type": "event_callback", "event": {"type": 5}},
    {"type": "event_callback", "event": {**MESSAGE, "channel": 5}},
    {"type": "event_callback", "event": {**MESSAGE, "user": 5}},
    {"type": "event_callback", "event": {**MESSAGE, "channel": []}},
    {"type": "event_callback", "event": {**MESSAGE, "item": {"channel": 7}}},
    {"type": "event_callback", "event": {**MESSAGE, "subtype": "message_changed",
                                         "message": {"user": 5}}},
    {"type": "event_callback", "authorizations": "x", "event": MESSAGE},
    {"type": "event_callback", "authorizations": [5], "event": MESSAGE},
    {"type": "event_callback", "authorizations": {"a": 1}, "event": MESSAGE},
    {"type": "event_callback", "enterprise": 5, "event": MESSAGE},
    {"type": "event_callback", "team": 5, "event": MESSAGE},
    {"type": "event_callback", "team": {"id": 5}, "event": MESSAGE},
    {"type": "event_callback", "team_id": ["T1"], "event": MESSAGE},
    {"type": "event_callback", "is_ext_shared_channel": True, "event": {**MESSAGE, "user": 5}},
    {"type": "block_actions", "event": "x", "actions": PRESS["actions"]},
    {"type": "block_actions", "actions": "y"},
    {"type": "block_actions", "actions": []},
    {"type": "block_actions", "actions": [5]},
    {"type": "block_actions", "actions": [{}]},
    {"type": "block_actions", "actions": [{"action_id": 5}]},
    {**PRESS, "user": 5},
    {**PRESS, "channel": []},
    {**PRESS, "team": []},
    {**PRESS, "user": {"id": "U1", "team_id": 5}},
    {**PRESS, "enterprise": {"id": 5}},
    {**PRESS, "response_urls": "x"},
    {**PRESS, "view": {"team_id": 5}},
    {"type": "view_submission", "view": 5},
    {"type": "view_submission", "view": {"callback_id": "v"}},
    {"type": "interactive_message", "callback_id": "c"},
    {"type": "dialog_submission", "callback_id": 5},
    {"type": "workflow_step_edit", "callback_id": "c"},
]
MALFORMED = [
    ("application/json", b"{not json"),
    ("application/json", b"[1, 2]"),
    ("application/json", b'"just a string"'),
    ("application/json", b'{"event": {"type": "message"}}'),
    ("application/json", b'{"type": 7}'),
    ("application/json; charset=x-no-such-charset", b"{}"),
    ("application/x-www-form-urlencoded", b"payload=%7Bnot+json"),
    ("application/x-www-form-urlencoded", b"payload=%5B%5D"),
    ("application/x-www-form-urlencoded", b"payload=%7B%22user%22%3A+%7B%7D%7D"),
    *[("application/json", json.dumps(body).encode()) for body in ODD_SHAPES],
    ("application/x-www-form-urlencoded",
     urlencode({"payload": json.dumps({"type": "block_actions", "user": 5})}).encode()),
]


async def test_a_signed_but_malformed_body_is_a_400_and_one_log_line(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with Rig(fake, model, tmp_path, "http") as rig:
        for content_type, raw in MALFORMED:
            caplog.clear()
            got = await fake.post_raw(rig.url, raw, content_type=content_type,
                                      signing_secret=SECRET)
            await rig.settle()
            assert got.status == 400, (raw, got)
            lines = [r for r in caplog.records if not r.name.startswith(("aiosqlite", "asyncio"))]
            assert len(lines) == 1, (raw, caplog.text)
            assert lines[0].levelno <= logging.WARNING and lines[0].exc_info is None
            assert "Traceback" not in caplog.text
        command = {"token": "t", "team_id": "T1", "channel_id": "D1", "user_id": "U1",
                   "command": "/tandem", "text": "help", "trigger_id": "1.2.3",
                   "response_url": f"{fake.url}/response/none"}
        fake.add_user("U1")
        form = "&".join(f"{k}={v}" for k, v in command.items()).replace("/", "%2F")
        slash = await fake.post_raw(rig.url, form.encode(), signing_secret=SECRET,
                                    content_type="application/x-www-form-urlencoded")
        assert slash.status == 200, slash
        await rig.wait_text("D1", "/status")
        unsigned = await fake.post_raw(rig.url, b"{not json", content_type="application/json",
                                       signing_secret="not-the-secret")
        not_utf8 = await fake.post_raw(rig.url, b"\xff\xfe{}", content_type="application/json",
                                       signing_secret=SECRET)  # never from Slack: unverifiable
        assert (unsigned.status, not_utf8.status) == (401, 401)
        assert "Traceback" not in caplog.text
        await rig.deliver(fake.message_event("D2", "U1", json.dumps({"still": "fine"})))
        await rig.settle()
    assert len(model.requests) == 1


ID = st.sampled_from(["T1", "U9", "D9", "E1", ""])
NAMED = st.one_of(ID, st.fixed_dictionaries(
    {}, optional={"id": ID, "team_id": ID, "enterprise_id": ID, "app_installed_team_id": ID}))
"""What bolt reads as an id or as an object with one (`user`, `team`, `channel`...)."""


def slack_part(kinds: list[str] | None = None,
               **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[JSON]:
    """A payload, or a part of one bolt looks into for ids, with some of those fields (and
    a `type` of `kinds`)."""
    ids = dict.fromkeys(("enterprise_id", "team_id", "user_id", "channel_id"), ID)
    named = dict.fromkeys(("enterprise", "team", "user", "channel"), NAMED)
    view = st.fixed_dictionaries({"type": st.just("modal")}, optional={
        "team_id": ID, "app_installed_team_id": ID, "callback_id": ID})
    kind = {"type": st.sampled_from(kinds)} if kinds else {}
    return st.fixed_dictionaries(kind, optional={**ids, **named, "view": view, **fields})


AUTHORIZATIONS = st.lists(slack_part(is_enterprise_install=st.booleans()), max_size=2)
EVENT = slack_part(["message", "app_mention", "reaction_added"],
                   **dict.fromkeys(("message", "previous_message", "item", "assistant_thread"),
                                   slack_part()),
                   channel_type=st.sampled_from(["im", "channel"]), ts=ID, thread_ts=ID,
                   text=st.just("hi"))
BODY = slack_part(
    ["event_callback", "block_actions", "view_submission", "view_closed", "interactive_message",
     "dialog_submission", "workflow_step_edit", "shortcut", "block_suggestion",
     "url_verification"],
    event=EVENT, authorizations=AUTHORIZATIONS, callback_id=ID,
    workflow_step=st.fixed_dictionaries({}),
    actions=st.lists(st.fixed_dictionaries({"action_id": ID}, optional={"value": ID}),
                     min_size=1, max_size=2),
    response_urls=st.lists(st.fixed_dictionaries({"response_url": ID}), max_size=1),
    is_ext_shared_channel=st.booleans(), function_execution_id=ID, command=ID)
"""Payloads of the shapes Slack sends, for every type and field bolt reads."""
ODD = st.one_of(st.none(), st.booleans(), st.integers(-1, 7), st.text(max_size=3),
                st.lists(st.integers(0, 1), max_size=2),
                st.fixed_dictionaries({}, optional={"id": st.just(5)}))
"""Any JSON value."""


def _slots(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in a JSON value, nested ones included."""
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    return [slot for key, item in items for slot in [(value, key), *_slots(item)]]


@st.composite
def odd_bodies(draw: st.DrawFn) -> JSON:
    """A payload Slack could send, or one with a single field of any type anywhere."""
    body: JSON = draw(BODY)
    corrupt: bool = draw(st.booleans())
    slots = _slots(body)
    if corrupt and slots:
        container, key = draw(st.sampled_from(slots))
        container[key] = draw(ODD)
    return body


async def test_signed_bodies_of_any_shape_are_a_200_or_a_400_and_never_a_traceback(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    # Only strangers (U9) and other channels, so nothing reaches the model.
    caplog.set_level(logging.INFO)
    async with Rig(fake, model, tmp_path, "http") as rig:
        loop = asyncio.get_running_loop()

        async def post(body: JSON, form: bool) -> int:
            raw, kind = json.dumps(body).encode(), "application/json"
            if form:
                raw = urlencode({"payload": json.dumps(body)}).encode()
                kind = "application/x-www-form-urlencoded"
            got = await fake.post_raw(rig.url, raw, content_type=kind, signing_secret=SECRET)
            await rig.settle()
            return got.status

        @settings(max_examples=120, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(body=odd_bodies(), form=st.booleans())
        def any_shape(body: JSON, form: bool) -> None:
            caplog.clear()
            status = asyncio.run_coroutine_threadsafe(post(body, form), loop).result(30)
            assert status in (200, 400), (status, body)
            failed = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert not [r for r in failed if r.exc_info], (body, caplog.text)
            assert "Traceback" not in caplog.text, body

        await asyncio.to_thread(any_shape)
        await rig.deliver(fake.message_event("D2", "U9", "hi"))  # for rig.check()
        await rig.settle()
    assert model.requests == []


async def test_a_payload_nothing_handles_is_acked(rig: Rig, caplog: pytest.LogCaptureFixture,
                                                 model: FakeModelServer) -> None:
    # Bolt's default is a 404 (Slack sends it again) with a warning of many lines.
    caplog.set_level(logging.INFO)
    reaction = {"type": "reaction_added", "user": "U1", "reaction": "eyes",
                "item": {"type": "message", "channel": "D1", "ts": "1.1"}}
    await rig.send("events_api", rig.fake.event_body(reaction))
    await rig.send("interactive", {"type": "view_closed", "team": {"id": "T1"},
                                   "user": {"id": "U1"}, "view": {"callback_id": "v"}})
    await rig.settle()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert model.requests == []


async def test_what_bolt_raises_is_a_400_and_tandems_own_bug_a_500_with_its_traceback(
        fake: FakeSlackServer, caplog: pytest.LogCaptureFixture) -> None:
    # The last line, behind `odd_shape`: bolt's own error handler, and the aiohttp
    # middleware for what escapes bolt. Real errors: one raised inside bolt's code, one
    # inside Tandem's.
    async def from_bolt(_request: web.Request) -> web.Response:
        to_action({"type": "block_actions", "actions": []})
        return web.Response()

    async def from_tandem(_request: web.Request) -> web.Response:
        teams(None)  # type: ignore[arg-type]
        return web.Response()

    caplog.set_level(logging.DEBUG)
    server = web.Application(middlewares=[_signed_only(SECRET)])
    server.add_routes([web.post("/bolt", from_bolt), web.post("/tandem", from_tandem)])
    runner = web.AppRunner(server, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        for path, status, level in (("bolt", 400, logging.WARNING),
                                    ("tandem", 500, logging.ERROR)):
            caplog.clear()
            got = await fake.post_raw(f"http://{host}:{port}/{path}", b'{"type": "x"}',
                                      content_type="application/json", signing_secret=SECRET)
            assert got.status == status, got
            [line] = caplog.records
            assert line.levelno == level and (line.exc_info is not None) == (status == 500)
    finally:
        await runner.cleanup()
    for caught, status in ((_raising(to_action, {"type": "block_actions", "actions": []}), 400),
                           (_raising(teams, None), 500)):
        caplog.clear()
        answer = await _on_bolt_error(caught, {}, BoltResponse(status=500))
        assert answer is not None and answer.status == status
        assert await _on_bolt_error(caught, {}, None) is None  # a listener's, after its ack
        assert [r.levelno for r in caplog.records] == [logging.WARNING if status == 400
                                                       else logging.ERROR] * 2


def _raising(function: Callable[[Any], Any], argument: Any) -> Exception:
    try:
        function(argument)
    except Exception as exc:
        return exc
    raise AssertionError(f"{function.__name__} did not raise")


async def test_an_approval_card_says_why_it_asks(fake: FakeSlackServer, model: FakeModelServer,
                                                 tmp_path: Path) -> None:
    reason = ("Asked because this conversation has read content from web_fetch of "
              "https://pages.example/<!here>.")
    conv, ann = ConvKey("slack", "D1", None), User("U1", "Ann", "T1")
    async with SlackRig(fake, model, tmp_path, "socket") as rig:
        await rig.adapter.emit(ApprovalRequested(conv, "ap1", "shell", "ls", ann, 1800,
                                                 reason=reason))
        await rig.adapter.emit(ApprovalRequested(conv, "ap2", "shell", "pwd", ann, 1800))
        asked, plain = await rig.card("D1", 1), await rig.card("D1", 2)
    shown = reason.replace("<", "&lt;").replace(">", "&gt;")
    text = block_text(asked.blocks)
    assert shown in text and text.index(shown) < text.index("```\nls")  # above the call
    assert shown in asked.text and "<!here>" not in str(asked.blocks) + asked.text
    assert "Asked because" not in block_text(plain.blocks) + plain.text
    lines = block_text(plain.blocks).split("\n")
    assert all(line.strip() for line in lines), lines
    assert plain.text == "🔐 Tandem wants to run `shell`: approve or deny"


# ---- Socket Mode only ----------------------------------------------------------------------


async def test_the_slash_command(fake: FakeSlackServer, model: FakeModelServer,
                                 tmp_path: Path) -> None:
    async with Rig(fake, model, tmp_path, "socket") as rig:
        await _slash(rig, model)


async def _slash(rig: Rig, model: FakeModelServer) -> None:
    payload = {"token": "t", "team_id": "T1", "channel_id": "D1", "user_id": "U1",
               "command": "/tandem", "text": "help", "trigger_id": "1.2.3",
               "response_url": f"{rig.fake.url}/response/none"}
    envelope = await rig.fake.push("slash_commands", payload)
    rig.acks.append(await rig.fake.wait_ack(envelope))
    await rig.wait_text("D1", "/status")
    await rig.settle()
    assert model.requests == []


async def test_a_strangers_slash_command_is_refused(fake: FakeSlackServer,
                                                    model: FakeModelServer,
                                                    tmp_path: Path) -> None:
    async with Rig(fake, model, tmp_path, "socket") as rig:
        payload = {"token": "t", "team_id": "T1", "channel_id": "D9", "user_id": "U9",
                   "command": "/tandem", "text": "status", "trigger_id": "9.9.9",
                   "response_url": f"{rig.fake.url}/response/none"}
        envelope = await rig.fake.push("slash_commands", payload)
        rig.acks.append(await rig.fake.wait_ack(envelope))
        await rig.fake.wait_for(lambda: rig.fake.ephemerals_for("U9"))
        await rig.settle()
    [told] = rig.fake.ephemerals_for("U9")
    assert "`U9`" in told["text"] and "slack.allowed_users" in told["text"]
    assert rig.texts("D9") == [] and model.requests == []


async def test_a_forged_button_is_refused(rig: Rig, model: FakeModelServer) -> None:
    message = await rig.adapter.client.chat_postMessage(
        channel="D1", text="x", blocks=[{"type": "actions", "elements": [
            {"type": "button", "action_id": "tandem_approve", "value": "ap:../../x:z",
             "text": {"type": "plain_text", "text": "Approve"}}]}])
    await rig.press("D1", "U1", str(message["ts"]), "tandem_approve")
    await rig.fake.wait_for(lambda: rig.fake.ephemerals_for("U1"))
    assert rig.fake.ephemerals_for("U1")[0]["text"] == "This button is no longer valid."


# ---- configuration -------------------------------------------------------------------------


async def test_missing_secrets_and_a_bad_token(fake: FakeSlackServer, model: FakeModelServer,
                                               tmp_path: Path) -> None:
    base = {"slack__enabled": True, "slack__bot_token": "xoxb-test",
            "slack__base_url": fake.api_url}
    for mode, key in (("socket", "slack.app_token"), ("http", "slack.signing_secret")):
        config = make_config(tmp_path, model, slack__mode=mode, **base)
        hub, dispatch = build(config)
        with pytest.raises(ConfigError) as err:
            create(config, hub, dispatch)
        assert err.value.key == key
    config = make_config(tmp_path, model, **{**base, "slack__bot_token": "xoxb-wrong",
                                             "slack__app_token": "xapp-test"})
    hub, dispatch = build(config)
    adapter = create(config, hub, dispatch)
    with pytest.raises(ConfigError) as bad:
        await adapter.start()
    assert bad.value.key == "slack.bot_token" and "invalid_auth" in str(bad.value)
    assert "xoxb-wrong" not in str(bad.value)

    with socket.socket() as taken:  # HTTP mode on a port already in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = make_config(tmp_path, model, **{**base, "slack__mode": "http",
                                                 "slack__signing_secret": SECRET,
                                                 "slack__http__port": taken.getsockname()[1]})
        hub, dispatch = build(config)
        with pytest.raises(ConfigError) as busy:
            await create(config, hub, dispatch).start()
        assert busy.value.key == "slack.http.port"
    config = make_config(tmp_path, model, **{**base, "slack__app_token": "xapp-test",
                                             "slack__base_url": "http://127.0.0.1:9/api/"})
    hub, dispatch = build(config)
    with pytest.raises(SlackUnavailable):
        await create(config, hub, dispatch).start()


async def test_the_workspace_is_known_before_any_event(fake: FakeSlackServer,
                                                      model: FakeModelServer,
                                                      tmp_path: Path) -> None:
    base = {"slack__enabled": True, "slack__bot_token": "xoxb-test",
            "slack__app_token": "xapp-test", "slack__base_url": fake.api_url}
    fake.team_id = None  # auth.test does not say
    config = make_config(tmp_path, model, **base)
    hub, dispatch = build(config)
    with pytest.raises(ConfigError) as unknown:
        await create(config, hub, dispatch).start()
    assert unknown.value.key == "slack.team_id" and "auth.test" in str(unknown.value)
    async with Rig(fake, model, tmp_path, "socket", slack__team_id="T1",
                   slack__allowed_users=["*"]) as rig:
        model.script(Reply(text="Served."))
        elsewhere = rig.fake.message_event("D8", "U8", "hi", team=None)
        await rig.send("events_api", rig.fake.event_body(elsewhere, team_id=FOREIGN))
        await rig.say("D1", "U1", "hi")
        await rig.wait_text("D1", "Served.")
        await rig.settle()
    assert len(model.requests) == 1 and rig.texts("D8") == []
    fake.team_id = "T1"
    config = make_config(tmp_path, model, slack__team_id="T2", **base)
    hub, dispatch = build(config)
    with pytest.raises(ConfigError) as other:
        await create(config, hub, dispatch).start()
    assert other.value.key == "slack.team_id" and "T1" in str(other.value)


async def test_an_end_shown_by_another_process_finishes_the_placeholder_it_left(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    """A worker posted the placeholder, stored the answer and died; the process that
    shows the answer edits that placeholder (its Cancel button goes) and posts nothing."""
    from bot.core.events import TurnEnded

    conv = ConvKey("slack", "D1", None)
    async with SlackRig(fake, model, tmp_path, "socket") as rig:
        left = await rig.adapter.client.chat_postMessage(channel="D1", text="⏳ Thinking…",
                                                         blocks=[])
        ts = str(left["ts"])
        await rig.adapter.emit(TurnEnded(conv, 4, "The answer.", "completed",
                                         live={"ts": ts}))
        [message] = fake.bot_messages("D1")
    assert message.ts == ts and block_text(message.blocks) == "The answer."
    assert "actions" not in json.dumps(message.blocks)


# ---- streaming, the assistant surface and what the chat keeps -----------------------------


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def _message_calls(fake: FakeSlackServer, channel: str) -> list[tuple[str, float]]:
    """The answer's calls in `channel`: posts, updates, deletes and stream calls."""
    kinds = {"chat.postMessage", "chat.update", "chat.delete", "chat.startStream",
             "chat.appendStream", "chat.stopStream"}
    return [(c.method, c.time) for c in fake.calls
            if c.method in kinds and c.params.get("channel") == channel and c.error is None]


LONG = " ".join(f"word{i}" for i in range(150))


@pytest.mark.parametrize("channel", ["D1", "C1"])
async def test_a_thread_answer_streams_at_most_once_a_second(
        model: FakeModelServer, tmp_path: Path, channel: str) -> None:
    model.script(Reply(text="First."), Reply(text=LONG, chunk_size=12, chunk_delay=0.03))
    kind = "im" if channel == "D1" else "channel"
    async with FakeSlackServer() as fake, \
            Rig(fake, model, tmp_path, "socket", edit_interval=1.0,
                placeholder_delay=0.5) as rig:  # Slack's rate limits on
        root = await rig.say(channel, "U1", "start", channel_type=kind, mention=kind != "im")
        thread = root["ts"]
        await rig.wait_text(channel, "First.", thread=thread if kind != "im" else None)
        await rig.settle()
        await rig.say(channel, "U1", "tell me a lot", channel_type=kind, thread_ts=thread)
        await rig.wait_text(channel, "word149", thread=thread)
        await rig.settle()
    [streamed] = [m for m in fake.bot_messages(channel) if m.stream is not None]
    assert streamed.text == LONG and streamed.appends and not streamed.edits
    assert rig.texts(channel, thread)[-1] == LONG
    [start] = fake.calls_to("chat.startStream")
    if kind == "im":
        assert "recipient_user_id" not in start.params
    else:
        assert (start.params["recipient_team_id"], start.params["recipient_user_id"]) == \
            ("T1", "U1")
    calls = [t for method, t in _message_calls(fake, channel)
             if method in ("chat.startStream", "chat.appendStream", "chat.stopStream")]
    assert min(_gaps(calls)) >= 0.95  # the stop too
    assert fake.rate_limited == []


async def test_a_refused_stream_falls_back_to_updates_paced_to_the_last(
        model: FakeModelServer, tmp_path: Path) -> None:
    model.script(Reply(text="First."), Reply(text=LONG, chunk_size=12, chunk_delay=0.03),
                 Reply(text="Again."))
    async with FakeSlackServer() as fake, \
            Rig(fake, model, tmp_path, "socket", edit_interval=1.0,
                placeholder_delay=0.5) as rig:  # Slack's rate limits on
        fake.refuse_streams = True
        root = await rig.say("D1", "U1", "start")
        await rig.wait_text("D1", "First.")
        await rig.settle()
        await rig.say("D1", "U1", "tell me a lot", thread_ts=root["ts"])
        await rig.wait_text("D1", "word149", thread=root["ts"])
        await rig.settle()
        await rig.say("D1", "U1", "again", thread_ts=root["ts"])
        await rig.wait_text("D1", "Again.", thread=root["ts"])
        await rig.settle()
    assert len(fake.calls_to("chat.startStream")) == 1  # remembered: no stream tried again
    answer = next(m for m in fake.bot_messages("D1") if "word149" in m.text)
    assert answer.stream is None and len(answer.edits) >= 2
    updates = [c.time for c in fake.calls_to("chat.update") if c.params.get("ts") == answer.ts]
    assert len(updates) >= 2 and min(_gaps(updates)) >= 0.95  # the final one too
    assert fake.rate_limited == []


@pytest.mark.parametrize("refused", [False, True])
async def test_stop_mid_stream_marks_the_partial_answer_cancelled(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path, refused: bool) -> None:
    fake.refuse_streams = refused
    model.script(Reply(text="First."), Reply(text="word " * 400, chunk_size=5, chunk_delay=0.02))
    async with Rig(fake, model, tmp_path, "socket", edit_interval=0.3) as rig:
        root = await rig.say("D1", "U1", "start")
        thread = root["ts"]
        await rig.wait_text("D1", "First.")
        await rig.settle()
        await rig.say("D1", "U1", "talk a lot", thread_ts=thread)
        await rig.wait_text("D1", "word word", thread=thread)
        await rig.say("D1", "U1", "/stop", thread_ts=thread)
        await rig.wait_text("D1", "⏹ Cancelled.", thread=thread)
        await rig.settle()
    [shown] = [t for t in rig.texts("D1", thread) if "⏹ Cancelled." in t]
    assert shown.startswith("word") and shown.count("word") < 400
    assert shown.rstrip().endswith("⏹ Cancelled.")


async def test_the_assistant_thread_shows_status_and_offers_prompts(
        model: FakeModelServer, tmp_path: Path) -> None:
    model.script(Reply(text="Hi."),
                 Reply(tool_calls=[ToolCallSpec("shell", {"command": "sleep 0.3"})]),
                 Reply(text="Done."))
    async with FakeSlackServer(rate_limit=False, assistant=True) as fake, \
            Rig(fake, model, tmp_path, "socket", slack__assistant__enabled=True,
                approvals__tools={"shell": "allow"}) as rig:
        await rig.send("events_api", {"type": "event_callback", "team_id": "T1", "event": {
            "type": "assistant_thread_started", "assistant_thread": {
                "user_id": "U1", "channel_id": "D1", "thread_ts": "1700000000.000001",
                "context": {}}}})
        await fake.wait_for(lambda: fake.suggested_prompts)
        root = await rig.say("D1", "U1", "hello")
        await rig.wait_text("D1", "Hi.")
        await rig.settle()
        await rig.say("D1", "U1", "run it", thread_ts=root["ts"])
        card = await rig.card("D1")  # asked: the thread's earlier messages were read
        await rig.press("D1", "U1", card.ts, "tandem_approve")
        await rig.wait_text("D1", "Done.", thread=root["ts"])
        await rig.settle()
    statuses = [s for (_, _, s) in fake.statuses]
    assert "is thinking…" in statuses and any(s.startswith("is running `shell`") for s in statuses)
    assert fake.suggested_prompts
    shown = rig.texts("D1", root["ts"])
    assert not any("Thinking" in t or "Waiting" in t for t in shown)  # the status says it


async def test_a_reply_then_a_mention_reads_the_thread_once(rig: Rig,
                                                           model: FakeModelServer) -> None:
    model.script(Reply(text="Here to help."))
    root = rig.fake.message_event("C3", "U3", "deploy failed", channel_type="channel")
    await rig.say("C3", "U1", "any logs?", channel_type="channel", thread_ts=root["ts"])
    await rig.settle()
    await rig.say("C3", "U2", "see build 42", channel_type="channel", thread_ts=root["ts"])
    await rig.say("C3", "U1", "can you look?", channel_type="channel", mention=True,
                  thread_ts=root["ts"])
    await rig.wait_text("C3", "Here to help.", thread=root["ts"])
    await rig.settle()
    assert len(rig.fake.calls_to("conversations.replies")) == 1
    first = user_texts(model, 0)[0]
    assert "deploy failed" in first and "any logs?" in first and "see build 42" in first


async def test_a_decided_approval_leaves_no_waiting_placeholder(rig: Rig,
                                                               model: FakeModelServer) -> None:
    model.script(shell("echo hi"), Reply(text="Ran it."))
    await rig.say("D1", "U1", "run it")
    card = await rig.card("D1")
    await rig.wait_text("D1", "Waiting for approval")
    await rig.press("D1", "U1", card.ts, "tandem_approve")
    await rig.wait_text("D1", "Ran it.")
    await rig.settle()
    assert not any("Waiting for approval" in t for t in rig.texts("D1"))


async def test_a_press_without_data_on_a_decided_card_gets_the_cores_answer(
        rig: Rig, model: FakeModelServer) -> None:
    model.script(shell("echo hi"), Reply(text="Ran it."))
    await rig.say("D1", "U1", "run it")
    card = await rig.card("D1")
    await rig.press("D1", "U1", card.ts, "tandem_approve")
    await rig.wait_text("D1", "Ran it.")
    await rig.settle()
    await rig.press("D1", "U1", card.ts, "tandem_approve", value="")  # a stale client's view
    await rig.fake.wait_for(lambda: rig.fake.ephemerals_for("U1"))
    assert rig.fake.ephemerals_for("U1")[-1]["text"] == "Already decided: approved."


async def test_a_stranger_is_told_once_in_each_chat(rig: Rig, model: FakeModelServer) -> None:
    await rig.say("C1", "U9", "hello?", channel_type="channel", mention=True)
    await rig.say("C1", "U9", "hello??", channel_type="channel", mention=True)
    await rig.say("D9", "U9", "hi")
    await rig.say("D9", "U9", "hi?")
    await rig.fake.wait_for(lambda: rig.fake.ephemerals_for("U9") and rig.texts("D9"))
    await rig.settle()
    assert len(rig.fake.ephemerals_for("U9")) == 1 and len(rig.texts("D9")) == 1
    assert "`U9`" in rig.texts("D9")[0] and model.requests == []
