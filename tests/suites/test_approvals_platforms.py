"""Approvals a team lives with, through both platforms (the real adapters against the
fakes): rules on arguments, the scopes of a decision (once, this conversation, always;
expiring, per person), `/rules` and `/revoke`, and the who-may table (`/stop` of
another's turn, `/revoke`, `/canceljob` of another's task, `/new` in a group).

Each test runs in a group on Telegram and in a channel's thread on Slack, with two
people: Ann and Bob (Dana, the approver, where the test says so).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import pytest

from bot.core.buttons import ApprovalButton, CancelButton, ItemButton, pack, unpack
from bot.core.events import ConvKey, Verdict
from bot.serve.hub import Hub
from bot.serve.permissions import Action, refusal
from bot.store import ConvRow, JobRow
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.fakes.slack_server import FakeSlackMessage, block_text
from tests.fakes.telegram_server import FakeMessage
from tests.suites.harness import GROUP, FaultySlack, FaultyTelegram, SlackRig, TgRig, tg_rig

PLATFORMS = ("telegram", "slack")
PEOPLE: dict[str, dict[str, Any]] = {"telegram": {"ann": 42, "bob": 43, "dana": 44},
          "slack": {"ann": "U1", "bob": "U2", "dana": "U3"}}
NAMES = {"ann": "Ann", "bob": "Bob", "dana": "Dana"}
SLACK_VERDICTS = {Verdict.APPROVE: "tandem_approve", Verdict.DENY: "tandem_deny",
                  Verdict.SESSION: "tandem_session", Verdict.ALWAYS: "tandem_always"}


def shell(command: str) -> Reply:
    return Reply(tool_calls=[ToolCallSpec("shell", {"command": command})])


class Card(Protocol):
    text: str

    async def press(self, who: str, verdict: Verdict) -> None: ...


class Room(Protocol):
    """A group conversation with Tandem on one platform."""

    hub: Hub
    workspace: Path

    @property
    def key(self) -> ConvKey: ...

    async def say(self, who: str, text: str) -> None: ...

    async def card(self, n: int) -> Card: ...

    def cards(self) -> int: ...

    async def shows(self, needle: str, timeout: float = 10.0) -> None:
        """Wait until a message of Tandem's here shows `needle`."""

    async def told(self, who: str, needle: str) -> None:
        """Wait until `who` was told `needle` (here, privately, or as a press's answer)."""

    async def press_item(self, who: str, button: ItemButton) -> None: ...

    async def press_cancel(self, who: str) -> None: ...

    async def settle(self) -> None: ...


# -- Telegram: a supergroup -----------------------------------------------------------------


class TelegramCard:
    def __init__(self, room: TelegramRoom, message: FakeMessage, approval_id: str) -> None:
        self.room, self.message, self.approval_id = room, message, approval_id
        self.text = message.text

    async def press(self, who: str, verdict: Verdict) -> None:
        self.room.rig.press(GROUP, PEOPLE["telegram"][who], self.message, self.approval_id,
                            verdict, NAMES[who])


class TelegramRoom:
    def __init__(self, rig: TgRig) -> None:
        self.rig, self.hub, self.fake = rig, rig.hub, rig.fake
        self.workspace = rig.workspace

    @property
    def key(self) -> ConvKey:
        return ConvKey("telegram", str(GROUP))

    async def say(self, who: str, text: str) -> None:
        text = text if text.startswith("/") else f"@tandem_bot {text}"
        self.fake.push_message(GROUP, PEOPLE["telegram"][who], text, chat_type="supergroup",
                               first_name=NAMES[who])

    def _cards(self) -> list[FakeMessage]:
        return [m for m in self.rig.bot(GROUP) if m.text.startswith("🔐")]

    async def card(self, n: int) -> Card:
        await self.rig.until(lambda: len(self._cards()) >= n and
                             self._cards()[n - 1].reply_markup is not None)
        message = self._cards()[n - 1]
        assert message.reply_markup is not None
        button = unpack(message.reply_markup["inline_keyboard"][0][0]["callback_data"])
        assert isinstance(button, ApprovalButton)
        return TelegramCard(self, message, button.approval_id)

    def cards(self) -> int:
        return len(self._cards())

    async def shows(self, needle: str, timeout: float = 10.0) -> None:
        await self.rig.until(lambda: any(needle in m.text for m in self.rig.bot(GROUP)),
                             timeout)

    async def told(self, who: str, needle: str) -> None:
        uid = PEOPLE["telegram"][who]

        def seen() -> bool:
            texts = [m.text for m in self.rig.bot(GROUP) + self.rig.bot(uid)]
            texts += [str(a.get("text", "")) for a in self.fake.callback_answers.values()]
            return any(needle in t for t in texts)

        await self.rig.until(seen)

    async def press_item(self, who: str, button: ItemButton) -> None:
        data = pack(button)
        message = next(m for m in reversed(self.rig.bot(GROUP))
                       if data in json.dumps(m.reply_markup or {}))
        self.fake.push_callback(GROUP, PEOPLE["telegram"][who], message.message_id, data,
                                first_name=NAMES[who])

    async def press_cancel(self, who: str) -> None:
        def found() -> tuple[int, str] | None:
            for message in self.rig.bot(GROUP):
                for row in (message.reply_markup or {}).get("inline_keyboard", []):
                    for button in row:
                        if isinstance(unpack(button.get("callback_data", "")), CancelButton):
                            return message.message_id, button["callback_data"]
            return None

        await self.rig.until(lambda: found() is not None)
        where = found()
        assert where is not None
        self.fake.push_callback(GROUP, PEOPLE["telegram"][who], *where, first_name=NAMES[who])

    async def settle(self) -> None:
        await self.rig.settle()


# -- Slack: a thread in a channel -----------------------------------------------------------


class SlackCard:
    def __init__(self, room: SlackRoom, message: FakeSlackMessage) -> None:
        self.room, self.ts = room, message.ts
        self.text = block_text(message.blocks)

    async def press(self, who: str, verdict: Verdict) -> None:
        await self.room.rig.press("C1", PEOPLE["slack"][who], self.ts, SLACK_VERDICTS[verdict])


class SlackRoom:
    def __init__(self, rig: SlackRig) -> None:
        self.rig, self.hub, self.fake = rig, rig.hub, rig.fake
        self.workspace = rig.workspace
        self.thread: str | None = None

    @property
    def key(self) -> ConvKey:
        return ConvKey("slack", "C1", self.thread)

    async def say(self, who: str, text: str) -> None:
        uid = PEOPLE["slack"][who]
        if self.thread is None:
            root = await self.rig.say("C1", uid, text, channel_type="channel", mention=True)
            self.thread = str(root["ts"])
        else:
            await self.rig.say("C1", uid, text, channel_type="channel", thread_ts=self.thread)

    async def card(self, n: int) -> Card:
        return SlackCard(self, await self.rig.card("C1", n))

    def cards(self) -> int:
        return sum("wants to run" in block_text(m.blocks)
                   for m in self.fake.bot_messages("C1"))

    def _texts(self) -> list[str]:
        return [f"{m.visible_text}\n{json.dumps(m.blocks or [], ensure_ascii=False)}"
                for m in self.fake.bot_messages("C1")]

    async def shows(self, needle: str, timeout: float = 10.0) -> None:
        await self.fake.wait_for(lambda: any(needle in t for t in self._texts()), timeout)

    async def told(self, who: str, needle: str) -> None:
        uid = PEOPLE["slack"][who]

        def seen() -> bool:
            texts = self._texts() + [json.dumps(e) for e in self.fake.ephemerals_for(uid)]
            texts += [json.dumps(r) for r in self.fake.responses]
            return any(needle in t for t in texts)

        await self.fake.wait_for(seen)

    async def press_item(self, who: str, button: ItemButton) -> None:
        data = pack(button)
        message = next(m for m in reversed(self.fake.bot_messages("C1"))
                       if data in json.dumps(m.blocks or []))
        action = next(e["action_id"] for b in message.blocks or [] if b["type"] == "actions"
                      for e in b["elements"] if e.get("value") == data)
        await self.rig.press("C1", PEOPLE["slack"][who], message.ts, action, data)

    async def press_cancel(self, who: str) -> None:
        def live() -> FakeSlackMessage | None:
            return next((m for m in self.fake.bot_messages("C1")
                         if "tandem_cancel" in json.dumps(m.blocks or [])), None)

        message = await self.fake.wait_for(live)
        assert message is not None
        await self.rig.press("C1", PEOPLE["slack"][who], message.ts, "tandem_cancel")

    async def settle(self) -> None:
        await self.rig.settle()


@asynccontextmanager
async def room(platform: str, tmp_path: Path, model: FakeModelServer, *,
               approvers: tuple[str, ...] = (), **approvals: Any) -> AsyncIterator[Room]:
    people = PEOPLE[platform]
    allowed = [people["ann"], people["bob"]]
    found = [people[a] for a in approvers]
    if platform == "telegram":
        async with FaultyTelegram(flood=False) as fake, tg_rig(
                tmp_path, model, fake, allowed_users=allowed, approvers=found,
                overrides={"approvals": approvals}) as rig:
            yield TelegramRoom(rig)
        return
    async with FaultySlack(rate_limit=False) as slack:
        for uid, name in (("U1", "ann"), ("U2", "bob"), ("U3", "dana")):
            slack.add_user(uid, name=NAMES[name], real_name=NAMES[name])
        async with SlackRig(slack, model, tmp_path, "socket", slack__allowed_users=allowed,
                            slack__approvers=found, approvals=approvals) as rig:
            yield SlackRoom(rig)


async def conv_row(r: Room) -> ConvRow:
    return await r.hub.d.store.conversation(r.key)


# -- rules on arguments ---------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_rules_allow_ask_and_deny_by_pattern(platform: str, tmp_path: Path,
                                                   model: FakeModelServer) -> None:
    rules = [{"tool": "shell", "match": "make test*", "verdict": "allow"},
             {"tool": "shell", "match": "make deploy*", "verdict": "deny"}]
    model.script(shell("make test > /dev/null; cat README.md"), Reply(text="tested"),
                 shell("make deploy"), Reply(text="refused"),
                 shell("make test; touch pwned"), Reply(text="asked"))
    async with room(platform, tmp_path, model, rules=rules) as r:
        (r.workspace / "README.md").write_text("hi")
        await r.say("ann", "test it")
        await r.shows("tested")
        await r.say("ann", "deploy it")
        await r.shows("refused")
        assert r.cards() == 0  # allowed by a rule and the defaults; denied by a rule
        await r.say("ann", "test and touch")
        card = await r.card(1)  # a compound command: `make test*` does not cover `touch`
        assert "touch pwned" in card.text
        await card.press("ann", Verdict.DENY)
        await r.shows("asked")
        await r.settle()
    tool_results = [m["content"] for req in model.requests for m in req["messages"]
                    if m["role"] == "tool"]
    assert any("denied: Tandem's rules" in str(c) for c in tool_results)
    assert not (r.workspace / "pwned").exists()


# -- scopes --------------------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_this_conversation_ends_with_new_and_always_stays(
        platform: str, tmp_path: Path, model: FakeModelServer) -> None:
    model.script(shell("echo a"), Reply(text="one"), shell("echo a"), Reply(text="two"),
                 Reply(text="fresh"), shell("echo a"), Reply(text="three"),
                 Reply(text="fresh again"), shell("echo a"), Reply(text="four"),
                 shell("echo a"), Reply(text="five"))
    async with room(platform, tmp_path, model, always_for="30d") as r:
        await r.say("ann", "first")
        card = await r.card(1)
        await card.press("ann", Verdict.SESSION)
        await r.shows("one")
        await r.shows("Allowed for this conversation by")
        await r.say("ann", "second")
        await r.shows("two")
        assert r.cards() == 1  # the same command in the same conversation: not asked
        await r.say("ann", "/rules")
        await r.shows("until /new")
        await r.say("ann", "/new")
        await r.shows("standing rules stay")
        await r.settle()
        await r.say("ann", "hello")
        await r.shows("fresh")
        await r.say("ann", "third")
        card = await r.card(2)  # asked again after /new
        await card.press("ann", Verdict.ALWAYS)
        await r.shows("three")
        await r.say("ann", "/rules")
        await r.shows("1. shell: echo a — by Ann on")
        await r.shows("(in 30 d)")
        await r.say("ann", "/new")
        await r.settle()
        await r.say("ann", "hi again")
        await r.shows("fresh again")
        await r.say("ann", "fourth")
        await r.shows("four")
        assert r.cards() == 2  # "always" outlived /new
        await r.say("ann", "/revoke 1")
        await r.shows("Rule revoked")
        await r.say("ann", "fifth")
        await r.card(3)
        await r.settle()


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_always_per_person_and_expiring(platform: str, tmp_path: Path,
                                              model: FakeModelServer) -> None:
    model.script(shell("echo b"), Reply(text="ann ran"), shell("echo b"),
                 Reply(text="bob asked"), shell("echo b"), Reply(text="ann again"))
    async with room(platform, tmp_path, model, always_scope="user", always_for="1h") as r:
        await r.say("ann", "run")
        card = await r.card(1)
        await card.press("ann", Verdict.ALWAYS)
        await r.shows("ann ran")
        await r.settle()
        await r.say("bob", "run too")
        card = await r.card(2)  # Ann's "always" is hers alone
        await card.press("bob", Verdict.APPROVE)
        await r.shows("bob asked")
        await r.settle()
        store = r.hub.d.store
        row = await conv_row(r)
        [rule] = await store.rules(row.id, session=row.session)
        assert rule.user == str(PEOPLE[platform]["ann"]) and rule.author_name == "Ann"
        assert rule.expires_at is not None and 3500 < rule.expires_at - time.time() <= 3600
        assert not await store.has_rule(row.id, "shell", "echo b", session=row.session,
                                        user=rule.user, now=rule.expires_at + 1)
        await r.say("ann", "again")
        await r.shows("ann again")
        assert r.cards() == 2
        await r.settle()


# -- who may do what -----------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_stop_revoke_and_new_follow_the_table(platform: str, tmp_path: Path,
                                                    model: FakeModelServer) -> None:
    model.script(shell("echo c"), Reply(text="made"), shell("sleep 30"), Reply(text="slept"))
    async with room(platform, tmp_path, model, approvers=("dana",)) as r:
        await r.say("ann", "make a rule")
        card = await r.card(1)
        await card.press("ann", Verdict.ALWAYS)
        await r.shows("made")
        await r.settle()
        await r.say("bob", "/revoke 1")  # Ann's rule: not Bob's to revoke
        await r.told("bob", refusal(Action.REVOKE))
        await r.say("bob", "/new")  # a group's conversation: approvers only
        await r.told("bob", refusal(Action.NEW))
        await r.settle()
        row = await conv_row(r)
        assert len(await r.hub.d.store.rules(row.id, session=row.session)) == 1
        assert (await r.hub.d.store.conversation(row.key)).session == row.session
        await r.say("ann", "sleep")
        card = await r.card(2)
        await card.press("ann", Verdict.APPROVE)
        await r.press_cancel("bob")  # Ann's turn: Bob may not stop it
        await r.told("bob", refusal(Action.STOP))
        assert r.hub.running(row.key)
        await r.say("ann", "/stop")  # her own turn
        await r.shows("Cancelled")
        await r.settle()
        await r.say("ann", "/revoke 1")  # her own rule
        await r.shows("Rule revoked")
        await r.settle()


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_canceljob_and_approvers(platform: str, tmp_path: Path,
                                       model: FakeModelServer) -> None:
    model.script(shell("echo d"), Reply(text="made"))
    async with room(platform, tmp_path, model, approvers=("dana",)) as r:
        await r.say("ann", "hello")
        card = await r.card(1)
        await card.press("dana", Verdict.ALWAYS)  # an approver decides anyone's call
        await r.shows("made")
        await r.settle()
        row = await conv_row(r)
        store = r.hub.d.store
        now = time.time()
        await store.add_job(JobRow("jobann1", row.id, row.key, "every day at 9", "cron",
                                   "report", str(PEOPLE[platform]["ann"]), None, True, now))
        await r.say("bob", "/canceljob jobann1")
        await r.told("bob", refusal(Action.CANCEL_JOB))
        await r.settle()
        job = await store.job("jobann1")
        assert job is not None and job.active
        await r.say("dana", "/canceljob jobann1")  # approvers may cancel anyone's
        await r.shows("Cancelled the task jobann1")
        await r.say("dana", "/revoke 1")
        await r.shows("Rule revoked")
        await r.say("dana", "/new")
        await r.shows("Started a new conversation")
        await r.settle()
