"""Press fuzz: thousands of approval-button presses on Telegram and Slack, and nothing
runs or is edited that should not be.

One rig per platform (hub, real adapter, loopback fake platform, fake model) serves every
Hypothesis example. Each example asks for a fresh approval in a conversation of its own
(a new DM, group or forum topic on Telegram; a new DM or channel thread on Slack): the
model calls `mark`, a tool that asks first and, when it runs, records its token. Then
the card is pressed in batches (the presses of a batch arrive together and are handled
concurrently, as the platforms deliver them). A press is drawn from: who (the requester,
an approver, another allowed user, a stranger), where (the card, another message of the
card's conversation, a forged message id, another DM, a group, another thread, an older
card), what (this approval with every verdict, an unknown id, the id of an older
approval of another conversation, Cancel for no turn / this turn / another turn, other
buttons, junk), a forged message text, another Slack workspace, and replays of an
earlier press. Some examples expire the approval between batches; some Telegram examples
restart the adapter between the card and the presses (it then knows the card only from
the presses on it).

Checked after every batch, once the core and the adapter are idle:

* The approval leaves `pending` only in a batch holding a press that may decide it (the
  requester or an approver, this approval, in its own conversation, from this workspace)
  or a Cancel of its turn (by its requester or an approver: README, Who may do what),
  and to a status one of them asked for, `decided_by` one of those people; such a batch
  does decide it. An older approval never changes.
* `mark` runs only for an approval that is approved (or allowed for the conversation, or
  always allowed), at most once
  per call, never for another example's call.
* A batch with no deciding press edits nothing at all; any edit goes to the card or to a
  message of the card's own conversation, and only the card ever shows an outcome.
* At the end the card shows its own text and outcome, with no buttons, once decided,
  and keeps its buttons while pending.

`TANDEM_PRESS_FUZZ=N` multiplies the number of examples (default: at least 10,000
presses per platform).
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import copy
import itertools
import re
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from adapters import slack_render, telegram_render
from adapters.telegram import TelegramAdapter
from adapters.telegram import create as create_telegram
from bot.core.buttons import ApprovalButton, CancelButton, ItemButton, pack, unpack
from bot.core.config import Config
from bot.core.events import ConvKey, Verdict
from bot.run.app import Dispatch, build
from bot.serve.hub import Hub
from bot.tools import Tool, ToolContext
from tests.conftest import STATE_NOTE
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.fakes.slack_server import APP_ID, TEAM_ID, VERIFICATION_TOKEN, block_text
from tests.suites.harness import (
    ANN,
    BOB,
    FAST,
    GROUP,
    STRANGER,
    FaultySlack,
    FaultyTelegram,
    SlackRig,
    tg_config,
)

JSON = dict[str, Any]
T = TypeVar("T")
SCALE = max(1, int(os.environ.get("TANDEM_PRESS_FUZZ", "1")))
TARGET = 10_000 * SCALE
"""Presses per platform the run must reach."""
MIN_PRESSES, MAX_PRESSES = 50, 64
EXAMPLES = -(-TARGET // MIN_PRESSES)
APPROVER, REQUESTERS = 50, 100_000
FORUM, DECOY_THREAD = -100777, 5
FOREIGN_TEAM = "T2"
EDIT_METHODS = {"editMessageText", "editMessageReplyMarkup", "chat.update"}
OUTCOME_MARKS = tuple(sorted({line.split("{by}")[0].strip() for line in
                              [*telegram_render.OUTCOMES.values(),
                               *slack_render.OUTCOMES.values()]}))
"""What only a decided card shows (the outcome line without its `by`)."""
DECIDED = {Verdict.APPROVE: "approved", Verdict.DENY: "denied", Verdict.ALWAYS: "always",
           Verdict.SESSION: "session"}
RUNS: list[str] = []
"""The tokens of the `mark` calls that ran, in order."""

# ---- the observable tool and the model -----------------------------------------------


async def _mark(_ctx: ToolContext, args: dict[str, Any]) -> str:
    RUNS.append(str(args.get("token")))
    return "marked"


MARK = Tool("mark", "Mark a token as done.",
            {"type": "object", "properties": {"token": {"type": "string"}},
             "required": ["token"]}, _mark, policy="ask", summary_key="token")
ASK = re.compile(r"\bmark ([a-z]+\d+)\b")


def respond(messages: list[dict[str, Any]]) -> Reply:
    """Asks for `mark <token>` when the user says so; answers "Done." after any result."""
    for message in reversed(messages):
        content = str(message.get("content") or "")
        if message.get("role") == "tool":
            return Reply(text="Done.")
        if message.get("role") == "user" and not content.startswith(STATE_NOTE):
            found = ASK.search(content)
            if found is None:
                return Reply(text="ok")
            return Reply(tool_calls=[ToolCallSpec("mark", {"token": found[1]})])
    return Reply(text="ok")


# ---- what a press is --------------------------------------------------------------------

WHO = ("requester", "approver", "other", "stranger")
WHERE = ("card", "card", "card", "conv_other", "forged_id", "other_dm", "group",
         "other_thread", "old_card")
WHAT = ("real", "real", "real", "unknown", "unknown", "old", "old", "old", "cancel",
        "cancel_turn", "cancel_other", "item", "junk", "junk", "junk", "junk")
JUNK = ("", "zz", "ap::a", "ap:../../x:a", "ap:a:b:c", "cx:", "cx:-1", "jc:", "rr:../x",
        "ap:" + "9" * 70 + ":a", "\u202eap:x:a", "{}", "null")


@dataclass(frozen=True, slots=True)
class Press:
    who: str
    where: str
    what: str
    verdict: Verdict
    pick: int
    """Chooses among alternatives (which older card, which junk, which message)."""
    forged_text: bool = False
    foreign: bool = False
    """Slack: the payload names another workspace."""
    replay: int | None = None
    """Sent again: an earlier press of the example (index modulo their number)."""


PRESS = st.builds(
    Press, who=st.sampled_from(WHO), where=st.sampled_from(WHERE), what=st.sampled_from(WHAT),
    verdict=st.sampled_from(list(Verdict)), pick=st.integers(0, 15),
    forged_text=st.sampled_from([False] * 7 + [True]),
    foreign=st.sampled_from([False] * 7 + [True]),
    replay=st.one_of(*[st.none()] * 6, st.integers(0, 60)))


@dataclass(frozen=True, slots=True)
class Plan:
    place: int
    """Which kind of conversation the card is in (platform-specific, modulo)."""
    restart: bool
    """Telegram: restart the adapter between the card and the presses."""
    expire_before: int | None
    """Expire the approval before this batch (if it is still pending)."""
    batches: tuple[tuple[Press, ...], ...]

    @property
    def presses(self) -> int:
        return sum(len(b) for b in self.batches)


def _plan(place: int, restart: bool, expire: int | None, presses: list[Press],
          sizes: list[int]) -> Plan:
    batches: list[tuple[Press, ...]] = []
    rest, cycle = list(presses), itertools.cycle(sizes)
    while rest:
        size = next(cycle)
        batches.append(tuple(rest[:size]))
        rest = rest[size:]
    return Plan(place, restart, expire, tuple(batches))


PLANS = st.builds(
    _plan, place=st.integers(0, 5), restart=st.sampled_from([False] * 5 + [True]),
    expire=st.sampled_from([None] * 12 + [0, 1, 2, 3]),
    presses=st.lists(PRESS, min_size=MIN_PRESSES, max_size=MAX_PRESSES),
    sizes=st.lists(st.integers(1, 16), min_size=1, max_size=8))


# ---- what each platform driver provides -------------------------------------------------


@dataclass(slots=True)
class Card:
    approval_id: str
    token: str
    conv: ConvKey
    chat: str
    ref: str
    """The card's message id (Telegram) or ts (Slack)."""
    requester: str
    turn: int
    text: str
    """What the card showed when posted (its own words, kept when it is decided)."""


@dataclass(slots=True)
class Sent:
    press: Press
    user: str
    conv: ConvKey
    """The conversation the press names."""
    target: tuple[str, str]
    """(chat, message) the press is on."""
    data: str
    decides: Verdict | None
    """Would decide this approval while it is pending."""
    cancels: bool
    """Would end this approval's waiting turn."""
    old: str | None = None
    """The older approval whose id it names."""
    ends_old: str | None = None
    """The older approval whose waiting turn it would end (a Cancel in its conversation)."""
    raw: Any = field(default=None, repr=False)
    """The platform's update or payload (sent again by a replay)."""


@dataclass(frozen=True, slots=True)
class Edit:
    chat: str
    ref: str
    text: str


class Driver(Protocol):
    @property
    def hub(self) -> Hub: ...

    async def ask(self, plan: Plan, n: int) -> Card: ...
    async def restart(self) -> bool:
        """Restart the adapter if the platform's examples do; True when it did."""
        ...
    def resolve(self, press: Press, card: Card, earlier: list[Sent], older: list[Card]) -> Sent: ...
    async def send(self, batch: list[Sent]) -> None: ...
    async def settle(self) -> None: ...
    def edit_mark(self) -> int: ...
    def edits(self, since: int) -> list[Edit]: ...
    def conv_messages(self, card: Card) -> set[tuple[str, str]]: ...
    def card_state(self, card: Card) -> tuple[bool, str]:
        """(shows buttons, visible text) of the card now."""
        ...


def user_of(press: Press, requester: str, ids: dict[str, str]) -> str:
    return requester if press.who == "requester" else ids[press.who]


def data_of(press: Press, card: Card, older: list[Card]) -> tuple[str, str | None]:
    """The button data a press carries, and the older approval it names."""
    match press.what:
        case "real":
            return pack(ApprovalButton(card.approval_id, press.verdict)), None
        case "old" if older and (press.where != "old_card" or len(older) > 1):
            # never the approval of the older card the press may be on (`old_card`)
            old = older[(press.pick + 1) % len(older)].approval_id
            return pack(ApprovalButton(old, press.verdict)), old
        case "old" | "unknown":
            return pack(ApprovalButton(f"zz{press.pick}q{card.token}", press.verdict)), None
        case "cancel":
            return pack(CancelButton()), None
        case "cancel_turn":
            return pack(CancelButton(card.turn)), None
        case "cancel_other":
            return pack(CancelButton(card.turn + 1 + press.pick)), None
        case "item":
            return pack(ItemButton("job" if press.pick % 2 else "rule", f"x{press.pick}")), None
    return JUNK[press.pick % len(JUNK)], None


def classify(sent: Sent, card: Card, older: list[Card], approvers: set[str],
             strangers: set[str], *, foreign: bool) -> Sent:
    """Fill in what the press would do; `foreign`: it comes from another workspace."""
    press, user = sent.press, sent.user
    cancel = not foreign and user not in strangers and press.what in ("cancel", "cancel_turn")
    if sent.conv == card.conv and not foreign:
        sent.cancels = cancel and (user == card.requester or user in approvers)  # who may
        if press.what == "real" and (user == card.requester or user in approvers):
            sent.decides = press.verdict
    if cancel and press.where == "old_card":
        sent.ends_old = next((o.approval_id for o in older if o.conv == sent.conv
                              and (user == o.requester or user in approvers)), None)
    return sent


# ---- the properties -----------------------------------------------------------------------


@dataclass
class Stats:
    presses: int = 0
    examples: int = 0
    restarts: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


class Fuzz:
    """Runs plans against one platform's driver and checks every batch."""

    def __init__(self, driver: Driver, loop: asyncio.AbstractEventLoop) -> None:
        self.d, self.loop = driver, loop
        self.stats = Stats()
        self.older: list[Card] = []
        self.failing = False
        self.asked = 0
        """Approvals asked for, failed examples included: every example gets fresh ids."""

    def run(self, plan: Plan) -> None:
        try:
            self.loop.run_until_complete(asyncio.wait_for(self._run(plan), 60))
        except BaseException:
            self.failing = True
            raise

    async def status(self, approval_id: str) -> tuple[str, str | None]:
        row = await self.d.hub.d.store.approval(approval_id)
        assert row is not None, approval_id
        return row.status, row.decided_by

    async def _run(self, plan: Plan) -> None:
        n = self.asked
        self.asked += 1
        card = await self.d.ask(plan, n)
        if plan.restart and await self.d.restart():
            self.stats.restarts += 1
        status, sent = "pending", list[Sent]()
        located = not plan.restart
        """After a restart the adapter knows the card only from an accepted press on it."""
        for i, batch in enumerate(plan.batches):
            if plan.expire_before == i and status == "pending":
                self.d.hub.worker.due(card.conv, card.approval_id)
                await self.d.settle()
                status = (await self.status(card.approval_id))[0]
                assert status == "expired", status
            mark, runs = self.d.edit_mark(), len(RUNS)
            resolved = [self.d.resolve(p, card, sent, self.older) for p in batch]
            olds = {s.old for s in resolved if s.old} | {s.ends_old for s in resolved
                                                         if s.ends_old}
            before = {old: await self.status(old) for old in olds}
            await self.d.send(resolved)
            await self.d.settle()
            self.stats.presses += len(resolved)
            new, by = await self.status(card.approval_id)
            context = f"batch {i}: status {status} -> {new}\n" + "\n".join(map(repr, resolved))
            self.check_decision(status, new, by, resolved, context)
            for old in olds:
                now = await self.status(old)
                cancelled = before[old][0] == "pending" and now[0] == "cancelled" and \
                    any(s.ends_old == old for s in resolved)
                assert now == before[old] or cancelled, f"{old} changed to {now}\n{context}"
            self.check_runs(card, new, RUNS[runs:], resolved, context)
            # a turn a Cancel ended while it waited: its card, and its placeholder, which
            # becomes the turn's end
            ended = {where for o in self.older if any(
                s.ends_old == o.approval_id for s in resolved)
                for where in {(o.chat, o.ref)} | self.d.conv_messages(o)}
            self.check_edits(card, status == "pending" and any(
                s.decides or s.cancels for s in resolved), ended, self.d.edits(mark), context)
            located = located or (status == "pending" and any(
                s.decides and s.target == (card.chat, card.ref) for s in resolved))
            status = new
            sent.extend(resolved)
        self.check_card(card, status, located)
        self.stats.outcomes[status] += 1
        self.stats.examples += 1
        self.older.append(card)

    @staticmethod
    def check_decision(status: str, new: str, by: str | None, batch: list[Sent],
                       context: str) -> None:
        if status != "pending":
            assert new == status, f"a decided approval changed\n{context}"
            return
        deciding = [s for s in batch if s.decides is not None]
        if not deciding and not any(s.cancels for s in batch):
            assert new == "pending", f"decided without a press that may decide it\n{context}"
            return
        assert new != "pending", f"a press that may decide it did not\n{context}"
        if new == "cancelled":
            assert any(s.cancels for s in batch), context
            return
        askers = {s.user for s in deciding if s.decides is not None and DECIDED[s.decides] == new}
        assert askers, f"{new}, but nobody pressed for it\n{context}"
        assert by in askers, f"{new} by {by}, not by one who pressed for it\n{context}"

    @staticmethod
    def check_runs(card: Card, status: str, ran: list[str], batch: list[Sent],
                   context: str) -> None:
        assert set(ran) <= {card.token}, f"another call ran: {ran}\n{context}"
        count = RUNS.count(card.token)
        assert count <= 1, f"the call ran {count} times\n{context}"
        if status not in ("approved", "always", "session"):
            assert count == 0, f"the call ran while {status}\n{context}"
        elif not ran and not any(s.cancels for s in batch) \
                and status in ("approved", "always", "session"):
            assert count == 1, f"{status}, but the call did not run\n{context}"

    def check_edits(self, card: Card, may_edit: bool, ended: set[tuple[str, str]],
                    edits: list[Edit], context: str) -> None:
        """`ended`: older cards whose waiting turn a Cancel of this batch may have ended."""
        edits = [e for e in edits if (e.chat, e.ref) not in ended]
        if not may_edit:
            assert edits == [], f"refused presses edited messages: {edits}\n{context}"
            return
        own = self.d.conv_messages(card)
        for edit in edits:
            where = (edit.chat, edit.ref)
            if where == (card.chat, card.ref):
                continue
            assert where in own, f"edited a message outside the card's conversation: " \
                f"{edit}\n{context}"
            assert not any(m in edit.text for m in OUTCOME_MARKS), \
                f"an outcome shown on a message that is not the card: {edit}\n{context}"

    def check_card(self, card: Card, status: str, located: bool) -> None:
        """`located`: the adapter knows where the card is. After a restart it learns that
        only from an accepted press on the card (a refused press may not teach it), so a
        card whose approval ended otherwise (expired, its turn cancelled) keeps its
        buttons; a press on them is answered "already decided" and changes nothing."""
        buttons, text = self.d.card_state(card)
        if status == "pending":
            assert buttons, f"the pending card lost its buttons: {text!r}"
            return
        if not located:
            return
        assert not buttons, f"the card kept its buttons once {status}: {text!r}"
        assert any(m in text for m in OUTCOME_MARKS), f"the card shows no outcome: {text!r}"
        own = card.text.split(" · expires in ")[0]  # a decided card drops its expiry
        assert own in text and "expires in" not in text, \
            f"the card no longer shows its own text, or still its expiry: {text!r}"


def drive(fuzz: Fuzz, name: str, regressions: tuple[Plan, ...]) -> None:
    """Run `regressions`, then the Hypothesis plans, on one platform; report the presses."""
    started = time.monotonic()
    RUNS.clear()  # tokens restart at t0 on each platform

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(plan=PLANS)
    def presses(plan: Plan) -> None:
        fuzz.run(plan)

    for plan in regressions:
        presses = example(plan=plan)(presses)

    presses()
    fuzz.stats.seconds = time.monotonic() - started
    s = fuzz.stats
    print(f"\n{name}: {s.presses} presses in {s.examples} examples, {s.seconds:.1f} s; "
          f"{s.restarts} restarts; outcomes {dict(s.outcomes)}")
    assert s.presses >= TARGET, s


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def run_in(loop: asyncio.AbstractEventLoop, coro: Awaitable[T]) -> T:
    return loop.run_until_complete(asyncio.wait_for(coro, 60))


# ---- Telegram ---------------------------------------------------------------------------

_APPROVE = Press("requester", "card", "real", Verdict.APPROVE, 0)
TG_REGRESSIONS = (
    # After a restart, a press naming the real approval from another chat arrives with the
    # requester's press on the card: the other chat's message must not become the card.
    Plan(0, True, None, ((Press("requester", "group", "real", Verdict.APPROVE, 0),
                          _APPROVE),)),
    Plan(1, True, None, ((Press("requester", "other_dm", "real", Verdict.APPROVE, 0),
                          _APPROVE),)),
)


class TgDriver:
    """The hub and the Telegram adapter on a `FaultyTelegram`; presses are callback queries
    put in the update queue as Telegram would deliver them (forged ones included)."""

    def __init__(self, tmp: Path, model: FakeModelServer, fake: FaultyTelegram) -> None:
        self.fake, self.model = fake, model
        self.config: Config = tg_config(
            tmp, model, fake, allowed_users=[ANN, BOB, *range(REQUESTERS, REQUESTERS + EXAMPLES
                                                              * 3)],
            approvers=[APPROVER])
        self.hub: Hub
        self.dispatch: Dispatch
        self.adapter: TelegramAdapter
        self.ids = {"approver": str(APPROVER), "other": str(BOB), "stranger": str(STRANGER)}
        self.decoys: dict[str, JSON] = {}
        self._queries = itertools.count(1)

    async def start(self) -> None:
        self.hub, self.dispatch = build(self.config, tools=[MARK])
        await self.hub.d.store.open()
        await self._start_adapter()
        await self.hub.recover()
        for key, chat, user, text, kind, thread in [
                ("dm:42", ANN, ANN, "/help", "private", None),
                ("dm:43", BOB, BOB, "/help", "private", None),
                ("dm:50", APPROVER, APPROVER, "/help", "private", None),
                ("dm:77", STRANGER, STRANGER, "hello", "private", None),
                ("group", GROUP, ANN, "@tandem_bot /help", "supergroup", None),
                ("thread", FORUM, ANN, "@tandem_bot /help", "supergroup", DECOY_THREAD)]:
            self.fake.push_message(chat, user, text, chat_type=kind, thread_id=thread)

            def answered(c: int = chat) -> bool:
                return any(m.from_bot for m in self.fake.chat(c))

            await self.fake.wait_for(answered)
            message = next(m for m in self.fake.chat(chat) if m.from_bot)
            self.decoys[key] = self.fake._message_json(message)
        await self.settle()

    async def _start_adapter(self) -> None:
        self.adapter = create_telegram(self.config, self.hub, self.dispatch)
        for key, value in FAST.items():
            setattr(self.adapter, key, value)
        await self.adapter.start()

    async def restart(self) -> bool:
        await self.adapter.stop()
        await self._start_adapter()
        return True

    async def stop(self) -> None:
        try:
            await self.adapter.stop()
        finally:
            await self.hub.close()
            await self.hub.d.store.close()

    async def ask(self, plan: Plan, n: int) -> Card:
        requester, token = REQUESTERS + n, f"tg{n}"
        name = f"R{n}"
        match plan.place % 3:
            case 0:
                chat, thread = requester, None
                self.fake.push_message(chat, requester, f"mark {token}", first_name=name)
            case 1:
                chat, thread = -2_000_000_000 - n, None
                self.fake.push_message(chat, requester, f"@tandem_bot mark {token}",
                                       chat_type="supergroup", first_name=name)
            case _:
                chat, thread = FORUM, 1000 + n
                self.fake.push_message(chat, requester, f"@tandem_bot mark {token}",
                                       chat_type="supergroup", thread_id=thread,
                                       first_name=name)

        def cards() -> list[Any]:
            return [m for m in self.fake.chat(chat, thread)
                    if m.from_bot and m.text.startswith("🔐") and m.reply_markup]

        await self.fake.wait_for(lambda: bool(cards()), 10)
        await self.settle()
        [card] = cards()
        assert card.reply_markup is not None
        button = unpack(card.reply_markup["inline_keyboard"][0][0]["callback_data"])
        assert isinstance(button, ApprovalButton)
        conv = ConvKey("telegram", str(chat), str(thread) if thread else None)
        cached = self.hub.convs.cached(conv)
        assert cached is not None and cached.turn is not None
        return Card(button.approval_id, token, conv, str(chat), str(card.message_id),
                    str(requester), cached.turn.turn, card.text)

    def _message(self, press: Press, card: Card, older: list[Card], user: str) -> JSON:
        chat, ref = int(card.chat), int(card.ref)
        match press.where:
            case "card":
                return self.fake._message_json(self.fake.message(chat, ref))
            case "conv_other":
                thread = int(card.conv.thread_id) if card.conv.thread_id else None
                others = [m for m in self.fake.chat(chat, thread) if m.message_id != ref]
                return self.fake._message_json(others[press.pick % len(others)])
            case "forged_id":
                # Telegram attaches the message the button is really on: data forged for
                # the card arrives with another real message of the chat, never the card's
                # content under another id (that takes a forged update, which polling and a
                # webhook with `secret_token` never accept)
                thread = int(card.conv.thread_id) if card.conv.thread_id else None
                others = [m for m in self.fake.chat(chat, thread) if m.message_id != ref]
                return self.fake._message_json(others[(press.pick + 1) % len(others)])
            case "other_dm":
                return self.decoys[f"dm:{user}" if f"dm:{user}" in self.decoys else "dm:42"]
            case "group":
                return self.decoys["group"]
            case "other_thread":
                return self.decoys["thread"]
        if older:
            old = older[press.pick % len(older)]
            return self.fake._message_json(self.fake.message(int(old.chat), int(old.ref)))
        return self.decoys["group"]

    def resolve(self, press: Press, card: Card, earlier: list[Sent],
                older: list[Card]) -> Sent:
        if press.replay is not None and earlier:
            first = earlier[press.replay % len(earlier)]
            return Sent(press, first.user, first.conv, first.target, first.data, None, False,
                        first.old, first.ends_old, first.raw)
        user = user_of(press, card.requester, self.ids)
        message = copy.deepcopy(self._message(press, card, older, user))
        # (a forged text is not tried here: Telegram attaches the message's real text)
        data, old = data_of(press, card, older)
        chat = message["chat"]
        thread = str(message["message_thread_id"]) if chat["type"] != "private" and \
            message.get("is_topic_message") and message.get("message_thread_id") else None
        conv = ConvKey("telegram", str(chat["id"]), thread)
        query = {"id": f"q{next(self._queries)}", "chat_instance": f"ci{chat['id']}",
                 "from": {"id": int(user), "is_bot": False, "first_name": f"U{user}"},
                 "message": message, "data": data}
        sent = Sent(press, user, conv, (str(chat["id"]), str(message["message_id"])), data,
                    None, False, old, raw=query)
        return classify(sent, card, older, {str(APPROVER)}, {str(STRANGER)}, foreign=False)

    async def send(self, batch: list[Sent]) -> None:
        self._mark = len(self.fake.calls)
        self._expected = Counter(str(s.raw["id"]) for s in batch)
        for s in batch:
            self.fake._open_queries.add(str(s.raw["id"]))
            self.fake._push_update({"callback_query": s.raw})

    def _answered(self) -> bool:
        done = Counter(str(c.params.get("callback_query_id")) for c in self.fake.calls[self._mark:]
                       if c.method == "answerCallbackQuery" and c.status)
        return all(done[q] >= n for q, n in self._expected.items())

    async def settle(self) -> None:
        if getattr(self, "_expected", None):
            await self.fake.wait_for(self._answered, 20)
            self._expected = Counter()
        while self.fake.pending_updates or self.hub.lanes._lanes:
            await self.fake.wait_for(lambda: not self.fake.pending_updates, 20)
            await self.hub.idle()
            await asyncio.sleep(0)

    def edit_mark(self) -> int:
        return len(self.fake.calls)

    def edits(self, since: int) -> list[Edit]:
        return [Edit(str(c.params.get("chat_id")), str(c.params.get("message_id")),
                     str(c.params.get("text") or ""))
                for c in self.fake.calls[since:] if c.method in EDIT_METHODS]

    def conv_messages(self, card: Card) -> set[tuple[str, str]]:
        thread = int(card.conv.thread_id) if card.conv.thread_id else None
        return {(card.chat, str(m.message_id)) for m in self.fake.chat(int(card.chat), thread)
                if m.from_bot}

    def card_state(self, card: Card) -> tuple[bool, str]:
        message = self.fake.message(int(card.chat), int(card.ref))
        return bool(message.reply_markup), message.text


@pytest.fixture(scope="module")
def telegram(loop: asyncio.AbstractEventLoop,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[TgDriver]:
    fake = FaultyTelegram(flood=False)
    model = FakeModelServer()
    model.responder = respond
    run_in(loop, fake.start())
    run_in(loop, model.start())
    driver = TgDriver(tmp_path_factory.mktemp("tg"), model, fake)
    try:
        run_in(loop, driver.start())
        yield driver
        run_in(loop, driver.stop())
    finally:
        run_in(loop, model.close())
        run_in(loop, fake.close())
    assert fake.internal_errors == [] and model.violations == []


def test_telegram_presses_run_and_edit_only_what_they_may(
        telegram: TgDriver, loop: asyncio.AbstractEventLoop) -> None:
    drive(Fuzz(telegram, loop), "telegram", TG_REGRESSIONS)


# ---- Slack ------------------------------------------------------------------------------

SLACK_REGRESSIONS = (
    # The requester and an approver pressing from another workspace decide nothing.
    Plan(0, False, None, ((Press("requester", "card", "real", Verdict.APPROVE, 0,
                                 foreign=True),),
                          (Press("approver", "card", "cancel", Verdict.APPROVE, 0,
                                 foreign=True),))),
    Plan(1, False, None, ((Press("approver", "card", "real", Verdict.ALWAYS, 0,
                                 foreign=True),),)),
)


class PressRig(SlackRig):
    """`SlackRig` whose core has the `mark` tool."""

    async def start(self) -> None:
        from adapters.slack import create as create_slack

        self.hub, dispatch = build(self.config, tools=[MARK])
        await self.hub.d.store.open()
        self.adapter = create_slack(self.config, self.hub, dispatch, **self.options)
        await self.adapter.start()
        await self.hub.recover()
        await self.fake.wait_for(lambda: self.fake.open_connections > 0)


class SlackDriver:
    """The hub and the Slack adapter (Socket Mode) on a `FaultySlack`; presses are
    `block_actions` payloads pushed over the socket (forged ones included)."""

    def __init__(self, rig: PressRig) -> None:
        self.rig, self.fake = rig, rig.fake
        self.ids = {"approver": "UA", "stranger": "U9"}
        self.decoys: dict[str, tuple[str, str]] = {}
        self._stamps = itertools.count(1)
        self._envelopes: list[str] = []

    @property
    def hub(self) -> Hub:
        return self.rig.hub

    async def start(self) -> None:
        client = self.rig.adapter.client
        for key, channel in [("dm", "D9"), ("group", "C9")]:
            posted = await client.chat_postMessage(channel=channel, text=f"decoy {key}")
            self.decoys[key] = (channel, str(posted["ts"]))
        root = await client.chat_postMessage(channel="C1", text="decoy thread")
        reply = await client.chat_postMessage(channel="C1", thread_ts=str(root["ts"]),
                                              text="decoy reply")
        self.decoys["thread"] = ("C1", str(reply["ts"]))

    async def restart(self) -> bool:
        return False  # Slack examples do not restart (Telegram's do)

    async def ask(self, plan: Plan, n: int) -> Card:
        requester, token = ("U1", "U2")[n % 2], f"sl{n}"
        if plan.place % 2:
            event = await self.rig.say("C1", requester, f"mark {token}", mention=True,
                                       channel_type="channel")
            channel, thread = "C1", str(event["ts"])
        else:
            channel, thread = f"DX{n}", None
            await self.rig.say(channel, requester, f"mark {token}")

        def card() -> Any:
            return next((m for m in self.fake.bot_messages(channel, thread)
                         if "wants to run" in block_text(m.blocks) and token in
                         block_text(m.blocks)), None)

        found = await self.fake.wait_for(card, 10)
        await self.settle()
        value = next(e["value"] for b in found.blocks if b["type"] == "actions"
                     for e in b["elements"] if e["action_id"] == "tandem_approve")
        button = unpack(value)
        assert isinstance(button, ApprovalButton)
        conv = ConvKey("slack", channel, thread)
        cached = self.hub.convs.cached(conv)
        assert cached is not None and cached.turn is not None
        self.ids["other"] = "U2" if requester == "U1" else "U1"
        return Card(button.approval_id, token, conv, channel, found.ts, requester,
                    cached.turn.turn, block_text([b for b in found.blocks
                                                  if b["type"] != "actions"]))

    def _target(self, press: Press, card: Card, older: list[Card]) -> tuple[str, str, bool]:
        """(channel, ts, the message exists) the press is on."""
        match press.where:
            case "card":
                return card.chat, card.ref, True
            case "conv_other":
                others = [m for m in self.fake.channel(card.chat, card.conv.thread_id)
                          if m.ts != card.ref and (card.conv.thread_id or m.thread_ts in
                                                   (None, m.ts))]
                return card.chat, others[press.pick % len(others)].ts, True
            case "forged_id":
                return card.chat, f"1600000000.{press.pick:06d}", False
            case "other_dm" | "group" | "other_thread":
                channel, ts = self.decoys[{"other_dm": "dm", "group": "group",
                                           "other_thread": "thread"}[press.where]]
                return channel, ts, True
        if older:
            old = older[press.pick % len(older)]
            return old.chat, old.ref, True
        return (*self.decoys["group"], True)

    def resolve(self, press: Press, card: Card, earlier: list[Sent],
                older: list[Card]) -> Sent:
        if press.replay is not None and earlier:
            first = earlier[press.replay % len(earlier)]
            return Sent(press, first.user, first.conv, first.target, first.data, None, False,
                        first.old, first.ends_old, first.raw)
        user = user_of(press, card.requester, self.ids)
        channel, ts, exists = self._target(press, card, older)
        data, old = data_of(press, card, older)
        real = self.fake.message(channel, ts if exists else card.ref) or \
            self.fake.message(card.chat, card.ref)
        assert real is not None
        message = real.to_api()
        message["ts"] = ts
        thread = real.thread_ts if exists else card.conv.thread_id
        if press.forged_text:
            message["text"], message["blocks"] = "forged", []
        team = FOREIGN_TEAM if press.foreign else TEAM_ID
        container: JSON = {"type": "message", "message_ts": ts, "channel_id": channel,
                           "is_ephemeral": False}
        if thread:
            container["thread_ts"] = thread
        action = {"type": "button", "action_id": self._action_id(press), "block_id": "b1",
                  "text": {"type": "plain_text", "text": "Button", "emoji": True},
                  "value": data, "action_ts": f"{1800000000 + next(self._stamps)}.000100"}
        payload: JSON = {
            "type": "block_actions", "api_app_id": APP_ID, "token": VERIFICATION_TOKEN,
            "user": {"id": user, "username": user.lower(), "name": user.lower(),
                     "team_id": team},
            "container": container, "trigger_id": f"{action['action_ts']}.x",
            "team": {"id": team, "domain": "x"}, "enterprise": None,
            "is_enterprise_install": False, "channel": {"id": channel, "name": channel},
            "message": message, "state": {"values": {}},
            "response_url": f"{self.fake.url}/response/none", "actions": [action]}
        conv = ConvKey("slack", channel, thread if thread and thread != ts else None)
        sent = Sent(press, user, conv, (channel, ts), data, None, False, old, raw=payload)
        return classify(sent, card, older, {"UA"}, {"U9"}, foreign=press.foreign)

    @staticmethod
    def _action_id(press: Press) -> str:
        if press.what in ("cancel", "cancel_turn", "cancel_other"):
            return slack_render.CANCEL_ACTION
        if press.what == "item":
            return slack_render.BUTTON_ACTION
        return slack_render.VERDICT_ACTIONS[press.verdict]

    async def send(self, batch: list[Sent]) -> None:
        for user in {s.user for s in batch} - set(self.fake.users):
            self.fake.add_user(user)
        self._envelopes = [await self.fake.push("interactive", s.raw) for s in batch]

    async def settle(self) -> None:
        envelopes, self._envelopes = self._envelopes, []
        await self.fake.wait_for(lambda: all(e in self.fake.acks for e in envelopes), 20)
        while self.rig.adapter._inflight or self.hub.lanes._lanes:
            await self.fake.wait_for(lambda: not self.rig.adapter._inflight, 20)
            await self.hub.idle()
            await asyncio.sleep(0)

    def edit_mark(self) -> int:
        return len(self.fake.calls)

    def edits(self, since: int) -> list[Edit]:
        return [Edit(str(c.params.get("channel")), str(c.params.get("ts")),
                     str(c.params.get("text") or ""))
                for c in self.fake.calls[since:] if c.method in EDIT_METHODS]

    def conv_messages(self, card: Card) -> set[tuple[str, str]]:
        thread = card.conv.thread_id
        return {(card.chat, m.ts) for m in self.fake.bot_messages(card.chat, thread)
                if thread or m.thread_ts in (None, m.ts)}

    def card_state(self, card: Card) -> tuple[bool, str]:
        message = self.fake.message(card.chat, card.ref)
        assert message is not None
        blocks = message.blocks or []
        return any(b["type"] == "actions" for b in blocks), \
            f"{block_text(blocks)}\n{message.text}"


@pytest.fixture(scope="module")
def slack(loop: asyncio.AbstractEventLoop,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlackDriver]:
    fake = FaultySlack(rate_limit=False)
    model = FakeModelServer()
    model.responder = respond
    run_in(loop, fake.start())
    run_in(loop, model.start())
    rig = PressRig(fake, model, tmp_path_factory.mktemp("slack"), "socket",
                   slack__approvers=["UA"])
    try:
        run_in(loop, rig.start())
        driver = SlackDriver(rig)
        run_in(loop, driver.start())
        yield driver
        run_in(loop, rig.stop())
    finally:
        run_in(loop, model.close())
        run_in(loop, fake.close())
    assert model.violations == []


def test_slack_presses_run_and_edit_only_what_they_may(
        slack: SlackDriver, loop: asyncio.AbstractEventLoop) -> None:
    drive(Fuzz(slack, loop), "slack", SLACK_REGRESSIONS)
