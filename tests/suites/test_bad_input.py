"""Bad-input suite: junk, forgeries and oversize input never crash or approve anything.

* Hypothesis-generated Telegram updates and Slack payloads (missing fields, wrong types,
  unicode, huge text, nested junk) go through the adapters' normalization: Telegram's
  `Update.de_json` may refuse junk, but an update it accepts must never raise out of the
  adapter's handlers; Slack's `extract_message` and the adapter's listeners must never raise.
  Only allowed users' input ever reaches the hub.
* Malformed updates driven through the real fake servers: the adapter keeps serving the
  next valid message.
* Forged, replayed, other-chat, other-user and expired button presses never approve
  anything: no file appears in the workspace and the approval stays as it was.
* Slack HTTP mode refuses bad signatures, stale or future timestamps, missing headers and
  tampered bodies with 401, before anything is processed.
* Oversize messages get a clear answer: 1 MB through the core, the largest Telegram text
  and a very long Slack message through the adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from telegram import Update

from adapters.slack import SlackAdapter
from adapters.slack_inbound import Incoming, extract_message, parse_command, slack_text
from adapters.telegram import TelegramAdapter
from adapters.telegram_render import parse_command as tg_parse_command
from adapters.telegram_render import strip_mention
from bot.core.buttons import ApprovalButton, pack, unpack
from bot.core.events import Decision, Notice, TurnEnded, UserMessage, Verdict
from bot.core.watch import Watch
from bot.serve.access import Access
from bot.serve.hub import Receipt
from tests.conftest import Core, make_config, said
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.suites.harness import (
    ANN,
    BOB,
    GROUP,
    SECRET,
    STRANGER,
    FaultyTelegram,
    SlackRig,
    TgRig,
    tg_rig,
)
from tests.suites.harness import FaultySlack as SlackServer

JSON = dict[str, Any]
APPEND = ToolCallSpec("shell", {"command": "echo ran >> out.txt"})
FUZZ = settings(max_examples=150, deadline=None, database=None, report_multiple_bugs=False,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- strategies ------------------------------------------------------------------------

JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() |
    st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=3),
    max_leaves=6)
TEXT = st.one_of(
    st.text(max_size=200),
    st.sampled_from(["@tandem_bot hi", "/help", "/help@tandem_bot", "/stop", "/new x",
                     "/approvals@other_bot", "hi @TANDEM_BOT, there", "<@UBOT> hi",
                     "\u202e\u0000\ud7ff𝕏\U0010ffff", "/", "@", "<@UBOT>", "&lt;&gt;"]),
    st.integers(4000, 60_000).map(lambda n: "é" * n))


def maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the valid value, sometimes junk of any type."""
    return st.one_of(valid, valid, valid, JUNK)


TG_USER = st.fixed_dictionaries(
    {"id": maybe(st.sampled_from([ANN, BOB, STRANGER, 999])), "is_bot": maybe(st.booleans()),
     "first_name": maybe(st.text(max_size=20))},
    optional={"username": maybe(st.text(max_size=12)),
              "language_code": maybe(st.text(max_size=3))})
TG_CHAT = st.fixed_dictionaries(
    {"id": maybe(st.sampled_from([ANN, STRANGER, GROUP])),
     "type": maybe(st.sampled_from(["private", "group", "supergroup", "channel"]))},
    optional={"is_forum": maybe(st.booleans()), "title": maybe(st.text(max_size=10)),
              "first_name": maybe(st.text(max_size=10))})
TG_ENTITY = st.fixed_dictionaries(
    {"type": maybe(st.sampled_from(["mention", "bot_command", "text_mention", "bold", "url"])),
     "offset": maybe(st.integers(-3, 60)), "length": maybe(st.integers(-3, 60))},
    optional={"user": maybe(TG_USER)})
TG_REPLIED = st.fixed_dictionaries(
    {"message_id": maybe(st.integers(1, 10**6)), "date": maybe(st.integers(0, 2**31)),
     "chat": maybe(TG_CHAT)},
    optional={"from": maybe(TG_USER), "text": maybe(TEXT),
              "forum_topic_created": maybe(st.fixed_dictionaries(
                  {"name": st.text(max_size=5), "icon_color": st.integers(0, 2**24)}))})
TG_MESSAGE = st.fixed_dictionaries(
    {"message_id": maybe(st.integers(1, 10**6)), "date": maybe(st.integers(0, 2**31)),
     "chat": maybe(TG_CHAT)},
    optional={"from": maybe(TG_USER), "text": maybe(TEXT),
              "entities": maybe(st.lists(TG_ENTITY, max_size=3)),
              "message_thread_id": maybe(st.integers(-1, 100)),
              "is_topic_message": maybe(st.booleans()),
              "reply_to_message": maybe(TG_REPLIED), "caption": maybe(TEXT),
              "sender_chat": maybe(TG_CHAT)})
CALLBACK_DATA = st.one_of(
    st.text(max_size=80),
    st.from_regex(r"ap:[A-Za-z0-9]{0,20}:[adwx]", fullmatch=True),
    st.sampled_from(["cx", "jc:abc", "rr:xyz", "ap::a", "ap:../../x:a", "ap:a:b:c",
                     "ap:" + "z" * 70 + ":a"]))
TG_CALLBACK = st.fixed_dictionaries(
    {"id": maybe(st.text(min_size=1, max_size=12)), "from": maybe(TG_USER),
     "chat_instance": maybe(st.text(max_size=6))},
    optional={"message": maybe(TG_MESSAGE), "data": maybe(CALLBACK_DATA),
              "inline_message_id": maybe(st.text(max_size=5))})
TG_UPDATE = st.fixed_dictionaries(
    {"update_id": maybe(st.integers(1, 2**31))},
    optional={"message": maybe(TG_MESSAGE), "callback_query": maybe(TG_CALLBACK),
              "edited_message": maybe(TG_MESSAGE)})

SLACK_FILE = st.fixed_dictionaries({}, optional={"name": maybe(st.text(max_size=10)),
                                                 "mimetype": maybe(st.text(max_size=10)),
                                                 "size": maybe(st.integers(0, 2**40))})
SLACK_EVENT = st.fixed_dictionaries(
    {"type": maybe(st.sampled_from(["message", "app_mention"]))},
    optional={"user": maybe(st.sampled_from(["U1", "U2", "U9", "UBOT", ""])),
              "channel": maybe(st.sampled_from(["D1", "C1", "G1"])),
              "ts": maybe(st.sampled_from(["1700000000.000100", "1700000001.000200", "x"])),
              "thread_ts": maybe(st.sampled_from(["1700000000.000100", "1699999999.000001"])),
              "text": maybe(TEXT), "channel_type": maybe(st.sampled_from(["im", "channel"])),
              "subtype": maybe(st.sampled_from(["file_share", "message_changed",
                                                "bot_message", "thread_broadcast"])),
              "bot_id": maybe(st.sampled_from(["B1", ""])), "team": maybe(st.text(max_size=4)),
              "user_team": maybe(st.text(max_size=4)),
              "files": maybe(st.lists(maybe(SLACK_FILE), max_size=2)),
              "blocks": JUNK})
SLACK_ACTION = st.fixed_dictionaries(
    {"type": maybe(st.just("block_actions"))},
    optional={"user": maybe(st.fixed_dictionaries(
                  {"id": maybe(st.sampled_from(["U1", "U2", "U9"]))},
                  optional={"team_id": maybe(st.text(max_size=3))})),
              "container": maybe(st.fixed_dictionaries(
                  {}, optional={"channel_id": maybe(st.sampled_from(["D1", "C1"])),
                                "message_ts": maybe(st.text(max_size=20)),
                                "thread_ts": maybe(st.text(max_size=20))})),
              "channel": maybe(st.fixed_dictionaries({"id": maybe(st.text(max_size=4))})),
              "actions": maybe(st.lists(maybe(st.fixed_dictionaries(
                  {}, optional={"value": maybe(CALLBACK_DATA),
                                "action_ts": maybe(st.text(max_size=12)),
                                "action_id": maybe(st.text(max_size=20))})), max_size=2))})
SLACK_COMMAND = st.fixed_dictionaries(
    {}, optional={"user_id": maybe(st.sampled_from(["U1", "U9"])),
                  "channel_id": maybe(st.sampled_from(["D1", "C1"])), "text": maybe(TEXT),
                  "trigger_id": maybe(st.text(max_size=8)),
                  "team_id": maybe(st.text(max_size=3))})


# ---- unit rigs: the adapters' handlers with a recording hub ----------------------------


class RecordingHub:
    """Stands in for the hub: the one access check first, as the hub does, then records
    what the adapter hands over."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self.items: list[Any] = []
        self.d = SimpleNamespace(watch=Watch())  # what the adapters report failed calls to

    async def submit(self, item: Any) -> Receipt:
        return await self.cancel(item)

    async def cancel(self, item: Any) -> Receipt:
        if (refusal := self.access.check(item)) is not None:
            return Receipt(False, refusal)
        self.items.append(item)
        return Receipt(True)


def offline_config(tmp: Path, **overrides: Any) -> Any:
    model = SimpleNamespace(api_base="http://127.0.0.1:9/v1")
    return make_config(tmp, model, **overrides)  # type: ignore[arg-type]


def telegram_unit(tmp: Path) -> tuple[TelegramAdapter, RecordingHub, list[str]]:
    config = offline_config(tmp, telegram={"enabled": True, "token": "123:ABC",
                                           "base_url": "http://127.0.0.1:9/bot",
                                           "allowed_users": [ANN]})
    hub = RecordingHub(Access(config))
    adapter = TelegramAdapter(config, hub)  # type: ignore[arg-type]
    adapter.username, adapter.bot_id = "tandem_bot", 999
    said: list[str] = []

    async def reply(_message: Any, text: str) -> None:
        said.append(text)

    async def answer(_query: Any, text: str | None, *, alert: bool) -> None:
        said.append(text or "")

    adapter._reply = reply  # type: ignore[method-assign]  # no network in unit runs
    adapter._answer = answer  # type: ignore[method-assign]
    return adapter, hub, said


class OfflineSlackClient:
    """The few Web API calls the Slack listeners make, answered locally."""

    def __init__(self) -> None:
        self.posts: list[JSON] = []

    async def users_info(self, **kw: Any) -> JSON:
        return {"user": {"name": "x", "profile": {"display_name": "X"}}}

    async def conversations_replies(self, **kw: Any) -> JSON:
        return {"messages": []}

    async def chat_postEphemeral(self, **kw: Any) -> JSON:
        self.posts.append(kw)
        return {"message_ts": "1.0"}

    async def chat_postMessage(self, **kw: Any) -> JSON:
        self.posts.append(kw)
        return {"ts": "1.0", "channel": kw.get("channel")}


def slack_unit(tmp: Path) -> tuple[SlackAdapter, RecordingHub]:
    config = offline_config(tmp, slack__enabled=True, slack__bot_token="xoxb-test",
                            slack__app_token="xapp-test", slack__allowed_users=["U1"])
    hub = RecordingHub(Access(config))
    adapter = SlackAdapter(config, hub)  # type: ignore[arg-type]
    adapter._client = OfflineSlackClient()  # type: ignore[assignment]
    adapter.bot_user, adapter.bot_id, adapter.team = "UBOT", "BBOT", "T1"
    hub.access.set_home_team("slack", "T1")
    return adapter, hub


async def _noop_ack(*args: Any, **kwargs: Any) -> None:
    return None


def only_allowed(items: list[Any], allowed: set[str]) -> None:
    for item in items:
        assert item.user.id in allowed, f"a stranger's input reached the hub: {item!r}"
        assert isinstance(getattr(item, "text", ""), str)


# ---- fuzzing the normalizers ---------------------------------------------------------


@dataclass
class Units:
    loop: asyncio.AbstractEventLoop
    telegram: TelegramAdapter
    tg_hub: RecordingHub
    slack: SlackAdapter
    slack_hub: RecordingHub


@pytest.fixture(scope="module")
def units(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Units]:
    """One adapter per platform and one event loop for all the generated examples."""
    loop = asyncio.new_event_loop()
    telegram, tg_hub, _ = telegram_unit(tmp_path_factory.mktemp("tg"))
    slack, slack_hub = slack_unit(tmp_path_factory.mktemp("slack"))
    try:
        yield Units(loop, telegram, tg_hub, slack, slack_hub)
    finally:
        loop.close()


def route_telegram(units: Units, update: JSON) -> None:
    """As python-telegram-bot does: parse, pick the handler whose filter matches, call it."""
    adapter = units.telegram
    units.tg_hub.items.clear()
    try:
        parsed = Update.de_json(copy.deepcopy(update), adapter.app.bot)
    except Exception:  # de_json may refuse junk; the library then never routes it
        return

    async def route() -> None:
        for handler in adapter.app.handlers[0]:
            try:
                check = handler.check_update(parsed)
            except Exception:  # the library's own filters, not the adapter's code
                continue
            if check is not None and check is not False:
                await handler.callback(parsed, None)  # type: ignore[arg-type]

    units.loop.run_until_complete(route())
    only_allowed(units.tg_hub.items, {str(ANN)})
    for item in units.tg_hub.items:
        if isinstance(item, Decision):
            assert item.approval_id.isalnum()


def _from(**sender: Any) -> JSON:
    """A private message to Tandem from `sender` (Ann's fields unless overridden)."""
    return {"message_id": 1, "date": 0, "chat": {"id": ANN, "type": "private"},
            "from": {"id": ANN, "is_bot": False, "first_name": "Ann", **sender}, "text": "hi"}


@FUZZ
@given(message=TG_MESSAGE, update_id=maybe(st.integers(1, 2**31)))
@example(message=_from(id=[ANN]), update_id=1)  # found by the generator, kept as regressions
@example(message=_from(first_name=["Ann"]), update_id=1)
def test_telegram_message_updates_never_crash_the_handler(units: Units, message: JSON,
                                                          update_id: Any) -> None:
    route_telegram(units, {"update_id": update_id, "message": message})


@FUZZ
@given(query=TG_CALLBACK, update_id=maybe(st.integers(1, 2**31)))
def test_telegram_button_updates_never_crash_the_handler(units: Units, query: JSON,
                                                         update_id: Any) -> None:
    route_telegram(units, {"update_id": update_id, "callback_query": query})


@FUZZ
@given(event=SLACK_EVENT)
def test_slack_extract_message_never_raises(event: JSON) -> None:
    found = extract_message(event, "UBOT")
    assert found is None or isinstance(found, Incoming)
    if found is not None:
        assert found.user != "UBOT" and isinstance(found.text, str)


def run_slack(units: Units, listener: Any) -> None:
    units.slack_hub.items.clear()
    units.loop.run_until_complete(listener())
    only_allowed(units.slack_hub.items, {"U1"})


@FUZZ
@given(event=SLACK_EVENT)
def test_slack_events_never_crash_the_listener(units: Units, event: JSON) -> None:
    run_slack(units, lambda: units.slack._on_event(event))


@FUZZ
@given(action=SLACK_ACTION)
def test_slack_button_payloads_never_crash_the_listener(units: Units, action: JSON) -> None:
    run_slack(units, lambda: units.slack._press(action))


@FUZZ
@given(command=SLACK_COMMAND)
def test_slack_slash_commands_never_crash_the_listener(units: Units, command: JSON) -> None:
    run_slack(units, lambda: units.slack._on_command(_noop_ack, command))  # type: ignore[arg-type]


@given(text=TEXT)
@settings(max_examples=200, deadline=None, database=None)
def test_text_helpers_never_raise(text: str) -> None:
    assert isinstance(slack_text(text, "UBOT"), str)
    parse_command(text)
    tg_parse_command(text)
    assert len(strip_mention(text, "tandem_bot")) <= len(text)
    data = unpack(text)
    if data is not None:
        assert pack(data) == text


# ---- malformed updates through the real fake Telegram ----------------------------------

CHAT = {"id": ANN, "type": "private", "first_name": "Ann"}
FROM = {"id": ANN, "is_bot": False, "first_name": "Ann"}
MALFORMED: dict[str, JSON] = {
    "text is a number": {"message": {"message_id": 900, "date": 0, "chat": CHAT, "from": FROM,
                                     "text": 12345}},
    "no chat": {"message": {"message_id": 901, "date": 0, "from": FROM, "text": "hi"}},
    "no sender in a group": {"message": {"message_id": 902, "date": 0, "text": "@tandem_bot x",
                                         "chat": {"id": GROUP, "type": "supergroup"}}},
    "mention entity outside the text": {"message": {
        "message_id": 903, "date": 0, "chat": {"id": GROUP, "type": "supergroup"},
        "from": FROM, "text": "hi", "entities": [{"type": "mention", "offset": 50,
                                                  "length": 900}]}},
    "button data is an object": {"callback_query": {"id": "5", "from": FROM,
                                                    "chat_instance": "1", "data": {"x": 1}}},
    "button press without a message": {"callback_query": {
        "id": "6", "from": FROM, "chat_instance": "1", "data": "ap:abc:a"}},
    "no date (the library cannot parse it)": {"message": {
        "message_id": 904, "chat": CHAT, "from": FROM, "text": "hi"}},
    "sender without a name (the library cannot parse it)": {"message": {
        "message_id": 905, "date": 0, "chat": CHAT, "from": {"id": ANN}, "text": "hi"}},
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_update_does_not_stop_the_bot(case: str, tmp_path: Path,
                                                        model: FakeModelServer) -> None:
    model.responder = lambda messages: Reply(text="Still here.")
    async with FaultyTelegram(flood=False) as fake, tg_rig(tmp_path, model, fake) as r:
        fake.add_chat(ANN)
        fake._push_update(copy.deepcopy(MALFORMED[case]))
        fake.push_message(ANN, ANN, "are you there?")
        with contextlib.suppress(AssertionError):
            await r.answered(ANN, "Still here.", timeout=4)
        polls = len(fake.calls_to("getUpdates"))
        answered = fake.bot_texts(ANN)
        assert answered == ["Still here."], \
            f"the next valid message was not answered ({polls} getUpdates calls so far)"
        await r.settle()
        assert fake.internal_errors == []
    assert polls < 20, f"{polls} getUpdates calls: the poller spins on the bad update"


# ---- button presses that must not approve anything -----------------------------------


@pytest.fixture
async def tgfake() -> AsyncIterator[FaultyTelegram]:
    async with FaultyTelegram(flood=False) as server:
        yield server
        assert server.internal_errors == []


async def status(r: TgRig, approval_id: str) -> str:
    row = await r.hub.d.store.approval(approval_id)
    assert row is not None
    return row.status


async def alerted(r: TgRig, query: str) -> str:
    await r.until(lambda: query in r.fake.callback_answers)
    answer = r.fake.callback_answers[query]
    assert answer["show_alert"], answer
    return str(answer["text"])


async def test_forged_and_foreign_presses_approve_nothing(tmp_path: Path, model: FakeModelServer,
                                                          tgfake: FaultyTelegram) -> None:
    fake = tgfake
    model.script(Reply(tool_calls=[APPEND]), Reply(text="Appended."))
    async with tg_rig(tmp_path, model, fake, allowed_users=[ANN, BOB]) as r:
        fake.push_message(ANN, ANN, "append please")
        card, approval_id = await r.card(ANN)
        fake.push_message(GROUP, ANN, "@tandem_bot /help", chat_type="supergroup")
        await r.until(lambda: any(m.text.startswith("Tandem answers") for m in r.bot(GROUP)))
        elsewhere = r.bot(GROUP)[0]
        notes = []
        for data in ["ap:../../x:a", "ap::a", f"ap:{approval_id}:x", f"ap:{approval_id}:a:b",
                     "zz", "ap:" + "9" * 60 + ":a", f"ap:{approval_id[::-1]}:a",
                     "\u202e" + pack(ApprovalButton(approval_id, Verdict.APPROVE))]:
            query = fake.push_callback(ANN, ANN, card.message_id, data, forged=True)
            notes.append(await alerted(r, query))
        # the right id, pressed in another chat (a group where Ann is allowed)
        query = fake.push_callback(GROUP, ANN, elsewhere.message_id,
                                   pack(ApprovalButton(approval_id, Verdict.APPROVE)), forged=True)
        notes.append(await alerted(r, query))
        # people who may not decide: an allowed user who did not ask, and a stranger
        notes.append(await alerted(r, r.press(ANN, BOB, card, approval_id, Verdict.APPROVE,
                                              "Bob")))
        notes.append(await alerted(r, r.press(ANN, STRANGER, card, approval_id,
                                              Verdict.ALWAYS, "Eve")))
        await r.settle()
        assert not (r.workspace / "out.txt").exists()
        assert await status(r, approval_id) == "pending"
        assert fake.message(ANN, card.message_id).reply_markup is not None
        # the card still works for the right person
        r.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await r.answered(ANN, "Appended.")
        await r.hub.idle()
        assert await status(r, approval_id) == "approved"
    assert all(notes), notes
    assert (r.workspace / "out.txt").read_text() == "ran\n"
    assert "another conversation" in notes[-3] and "not yours" in notes[-2]


async def test_replayed_presses_run_the_call_once(tmp_path: Path, model: FakeModelServer,
                                                  tgfake: FaultyTelegram) -> None:
    fake = tgfake
    model.script(Reply(tool_calls=[APPEND]), Reply(text="Appended."))
    async with tg_rig(tmp_path, model, fake) as r:
        fake.push_message(ANN, ANN, "append please")
        card, approval_id = await r.card(ANN)
        first = r.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        fake._updates.append(copy.deepcopy(fake._updates[-1]))  # the same update, twice
        await r.answered(ANN, "Appended.")
        await r.settle()
        # a later press on the decided card (a stale client still shows the buttons)
        again = fake.push_callback(ANN, ANN, card.message_id,
                                   pack(ApprovalButton(approval_id, Verdict.APPROVE)),
                                   forged=True)
        deny = fake.push_callback(ANN, ANN, card.message_id,
                                  pack(ApprovalButton(approval_id, Verdict.DENY)), forged=True)
        late = [await alerted(r, again), await alerted(r, deny)]
        await r.settle()
        assert await status(r, approval_id) == "approved"
    assert (r.workspace / "out.txt").read_text() == "ran\n"
    assert first in fake.callback_answers
    assert all("Already decided" in n for n in late), late
    assert len([m for m in model.requests if m["messages"][-2]["role"] == "tool"]) == 1


async def test_a_press_on_an_expired_approval_runs_nothing(tmp_path: Path,
                                                           model: FakeModelServer,
                                                           tgfake: FaultyTelegram) -> None:
    fake = tgfake
    model.script(Reply(tool_calls=[APPEND]), Reply(text="Nobody approved it."))
    async with tg_rig(tmp_path, model, fake, overrides={"approvals": {"expire_after_s": 1}}) as r:
        fake.push_message(ANN, ANN, "append please")
        card, approval_id = await r.card(ANN)
        await r.answered(ANN, "Nobody approved it.")
        await r.hub.idle()
        query = fake.push_callback(ANN, ANN, card.message_id,
                                   pack(ApprovalButton(approval_id, Verdict.APPROVE)),
                                   forged=True)
        note = await alerted(r, query)
        await r.settle()
        assert await status(r, approval_id) == "expired"
    assert "Already decided" in note
    assert not (r.workspace / "out.txt").exists()


async def test_slack_forged_and_foreign_presses_approve_nothing(
        model: FakeModelServer, tmp_path: Path) -> None:
    model.script(Reply(tool_calls=[APPEND]), Reply(text="Appended."))
    async with SlackServer(rate_limit=False) as fake, \
            SlackRig(fake, model, tmp_path, "socket") as rig:
        await rig.say("D1", "U1", "append please")
        card = await rig.card("D1")
        value = next(e["value"] for b in card.blocks or [] if b["type"] == "actions"
                     for e in b["elements"] if e["action_id"] == "tandem_approve")
        button = unpack(value)
        assert isinstance(button, ApprovalButton)
        other = await rig.adapter.client.chat_postMessage(channel="D2", text="elsewhere")
        for forged in ["ap:../../x:a", "ap::a", value.replace(":a", ":q"), "{}", ""]:
            await rig.press("D1", "U1", card.ts, "tandem_approve", forged)
        await rig.press("D2", "U1", str(other["ts"]), "tandem_approve", value)  # other channel
        await rig.press("D1", "U2", card.ts, "tandem_approve")  # allowed, did not ask
        await rig.press("D1", "U9", card.ts, "tandem_approve")  # a stranger
        await rig.fake.wait_for(lambda: len(fake.ephemerals) >= 8)
        await rig.settle()
        row = await rig.hub.d.store.approval(button.approval_id)
        assert row is not None and row.status == "pending"
        assert not (rig.workspace / "out.txt").exists()
        await rig.press("D1", "U1", card.ts, "tandem_approve")
        await rig.wait_text("D1", "Appended.")
        await rig.settle()
        await rig.press("D1", "U1", card.ts, "tandem_approve", value)  # replayed
        await rig.fake.wait_for(lambda: len(fake.ephemerals) >= 9)
        await rig.settle()
    assert (rig.workspace / "out.txt").read_text() == "ran\n"
    assert "Already decided" in fake.ephemerals[-1]["text"]


# ---- Slack request signing (HTTP mode) --------------------------------------------------


async def post_raw(url: str, raw: bytes, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as session, \
            session.post(url, data=raw, headers=headers) as resp:
        await resp.read()
        return resp.status


async def test_slack_refuses_unsigned_stale_and_tampered_requests(model: FakeModelServer,
                                                                 tmp_path: Path) -> None:
    async with SlackServer(rate_limit=False) as fake, \
            SlackRig(fake, model, tmp_path, "http") as rig:
        body = fake.event_body(fake.message_event("D1", "U1", "forged"))
        raw = json.dumps(body).encode()
        now = int(time.time())
        signed = {"Content-Type": "application/json", "X-Slack-Request-Timestamp": str(now),
                  "X-Slack-Signature": fake.sign(raw, signing_secret=SECRET, timestamp=now)}
        statuses = {
            "bad signature": (await fake.post_event(rig.url, body, signing_secret=SECRET,
                                                    bad_signature=True)).status,
            "wrong secret": (await fake.post_event(rig.url, body,
                                                   signing_secret="other")).status,
            "301 s old": (await fake.post_event(rig.url, body, signing_secret=SECRET,
                                                timestamp=now - 301)).status,
            "301 s ahead": (await fake.post_event(rig.url, body, signing_secret=SECRET,
                                                  timestamp=now + 301)).status,
            "no headers": await post_raw(rig.url, raw, {"Content-Type": "application/json"}),
            "no signature": await post_raw(rig.url, raw, {
                k: v for k, v in signed.items() if k != "X-Slack-Signature"}),
            "no timestamp": await post_raw(rig.url, raw, {
                k: v for k, v in signed.items() if k != "X-Slack-Request-Timestamp"}),
            "one byte changed": await post_raw(rig.url, raw.replace(b"forged", b"forgeD"),
                                               signed),
            "signature upper-cased": await post_raw(rig.url, raw, {
                **signed, "X-Slack-Signature": signed["X-Slack-Signature"].upper()}),
        }
        action = fake.block_actions  # a forged button press is refused the same way
        message = await rig.adapter.client.chat_postMessage(channel="D1", text="x")
        statuses["forged press"] = (await fake.post_action(
            rig.url, action("D1", "U1", str(message["ts"]), "tandem_cancel", "cx"),
            signing_secret=SECRET, bad_signature=True)).status
        assert await post_raw(rig.url, raw, signed) == 200  # the control: accepted
        await rig.wait_text("D1", "ok")
        await rig.settle()
    assert statuses == dict.fromkeys(statuses, 401), statuses
    assert len(model.requests) == 1  # only the correctly signed request reached the model


async def test_slack_junk_timestamp_is_refused_with_401(model: FakeModelServer,
                                                        tmp_path: Path) -> None:
    """A non-numeric X-Slack-Request-Timestamp is refused like any bad signature: 401, not
    an internal error with a stack trace in the log."""
    async with SlackServer(rate_limit=False) as fake, \
            SlackRig(fake, model, tmp_path, "http") as rig:
        raw = json.dumps(fake.event_body(fake.message_event("D1", "U1", "forged"))).encode()
        got = await post_raw(rig.url, raw, {
            "Content-Type": "application/json", "X-Slack-Request-Timestamp": "soon",
            "X-Slack-Signature": fake.sign(raw, signing_secret=SECRET, timestamp=0)})
        await rig.settle()
    assert model.requests == [] and rig.texts("D1") == []
    assert got == 401


# ---- oversize messages ------------------------------------------------------------------


async def test_a_1_mb_message_gets_a_clear_answer(model: FakeModelServer, config_factory: Any,
                                                  tmp_path: Path) -> None:
    text = ("Ünïcødé ✓ line of a very long paste\n" * 30_000)[:1_048_576]
    model.script(Reply(text="I read the start of it."), Reply(text="Next."))
    async with Core(config_factory()) as core:
        await core.hub.submit(UserMessage(core.key, core.user, text, ref="big-1"))
        [ended] = await core.sink.ended()
        await core.say("short one")
        await core.sink.ended(2)
    [note] = [n.text for n in core.sink.of(Notice)]
    assert "1,048,576 characters" in note and "inbox/" in note and len(note) < 400
    assert ended.text == "I read the start of it."
    saved = list((tmp_path / "workspace" / "inbox").glob("*/message-*.txt"))
    assert len(saved) == 1 and saved[0].read_text(encoding="utf-8") == text.strip()
    sent = said(model.requests[0]["messages"])
    assert len(sent[-1]) < 10_000 and "read_file" in sent[-1]
    assert [e.reason for e in core.sink.of(TurnEnded)] == ["completed", "completed"]


async def test_telegram_largest_message_and_an_over_limit_one(tmp_path: Path,
                                                              model: FakeModelServer,
                                                              tgfake: FaultyTelegram) -> None:
    """Telegram caps a message at 4096 characters: the largest one goes through, and with
    a lower `limits.max_message_chars` it takes the oversize path (saved, clear note)."""
    fake = tgfake
    biggest = ("ж🙂x" * 1400)[:4096]
    under = biggest[:3990]
    model.script(Reply(text="Read it all."), Reply(text="Read the start."))
    async with tg_rig(tmp_path, model, fake,
                      overrides={"limits": {"max_message_chars": 4000}}) as r:
        fake.push_message(ANN, ANN, under)
        await r.answered(ANN, "Read it all.")
        fake.push_message(ANN, ANN, biggest)
        await r.answered(ANN, "Read the start.")
        await r.hub.idle()
    texts = fake.bot_texts(ANN)
    assert texts[0] == "Read it all." and texts[-1] == "Read the start."
    assert any("4,096 characters" in t and "inbox/" in t for t in texts), texts
    first = said(model.requests[0]["messages"])
    assert first[-1].startswith("[Ann] " + under)
    saved = list((tmp_path / "workspace" / "inbox").glob("*/message-*.txt"))
    assert [p.read_text(encoding="utf-8") for p in saved] == [biggest]


async def test_slack_very_long_message_gets_a_clear_answer(model: FakeModelServer,
                                                           tmp_path: Path) -> None:
    long_text = "word " * 50_000  # 250,000 characters, over the 200,000 passed on
    model.script(Reply(text="Read the start."))
    async with SlackServer(rate_limit=False) as fake, \
            SlackRig(fake, model, tmp_path, "http") as rig:
        await rig.say("D1", "U1", long_text)
        await rig.wait_text("D1", "Read the start.")
        await rig.settle()
    texts = rig.texts("D1")
    assert any("250,000 characters" in t or "249,999 characters" in t for t in texts), texts
    assert texts[-1] == "Read the start."
    sent = said(model.requests[0]["messages"])
    assert len(sent[-1]) < 10_000
