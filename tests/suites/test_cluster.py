"""Cluster suite: three `tandem run` workers on one PostgreSQL database, killed at random.

Three worker processes (`tests.suites.cluster_rig`) share a fresh database
(`tests.pg.database()`). Telegram runs in webhook mode: the fake Bot API is the load
balancer (`webhook_targets`: each delivery to the next worker, a failed one retried on
the next with Telegram's backoff). Slack runs in HTTP mode: the test is Slack's sender
(`SlackBalancer`: each event to the next worker; on a connection error or a non-2xx
answer the next one, 0.2-0.5 s later, with `X-Slack-Retry-Num`). The fake model, in
this process, answers by the scenario word in front of each message's token: `echo`,
`stream` (about 3 s of streaming), `slow` (about 9 s), `approve` (a shell call that asks,
then `sleep 1.25`), `tool` (a shell call that asks, then `sleep 37.25`), `schedule`
(`schedule_task` "in 3 seconds"; its run answers "report … fired").

Scenarios, all at once:
- conversations (short: 10 Telegram chats and 5 Slack conversations: 3 DMs and 2 threads
  in a channel, one mentioning Tandem in every reply, one only in its first message;
  long: 50) each get bursts of 2-3 messages sent back to back, and messages whose shell
  call asks for approval, which the user approves; with the balancers' rotation a press
  reaches whichever worker is next (asserted: at least one press reached another worker,
  or another start of it, than the one that asked);
- one kill round per kill, each in a conversation of its own: `kill -9` of the worker
  that streams a turn ("stream"), runs an approved tool ("tool"; the tool must die with
  it), asked for an approval not pressed yet ("approval"; the press then reaches another
  worker), has just answered a press ("press") or a message ("ack") with its 2xx, or leads
  while a scheduled task is due ("leader"). The killed worker starts again 0.3-1.5 s
  later; a kill waits until the two others run. Short mode: stream, tool, approval,
  leader. Long mode: kinds at random while the 50 conversations keep talking;
- every task the model schedules fires exactly once cluster-wide;
- Cancel pressed while a slow turn streams, delivered to another worker than the one
  streaming it: over Telegram, over Slack, and over Telegram to a worker restarted
  (SIGTERM, start) after the turn began.

Checks, once every conversation has settled (each message answered, or nothing of it
queued and nothing new shown for QUIET_S), the queue has drained and every worker
stopped on SIGTERM with status 0:
- every message answered exactly once, and in order within its conversation. A message
  whose turn a kill cut is answered by the interruption notice ("An earlier answer here
  was interrupted…") instead: per conversation the unanswered messages must be exactly
  as many as those notices, and each must have been in a job a kill cut (from the
  workers' logs: not ended, or run again by another worker). So a double answer, a lost
  message, an answer stored but never shown and a turn nobody finished all fail; what
  the store has of each unexplained one is reported, with how its presses went;
- `model.violations == []`; each scheduled task fired exactly once (one claimed slot in
  the store, one "fires" line in all the workers' logs), and its run reached the model
  once (none if a kill cut it: then its notice stands for its answer);
- no tool process outlived its worker (after each "tool" kill, and at the end);
- nothing in a chat that did not speak, no token of one conversation in another;
- the database: a fresh `PostgresStore.integrity_check() == "ok"`, every recorded
  inbound processed, no turn left running or suspended, no job left waiting, running or
  failed.
Every problem is collected and reported at once, followed by the workers' logs.

Printed, not asserted: failover, from each kill to the next message Tandem posts in each
conversation the kill cut, and handoff, from the kill to another worker starting the cut
job (p50/max); cancel latency, from the press to the edit that shows "⏹ Cancelled.";
where presses went; the phases' times.

Short mode (in every run): 4 kills, about a minute on 2 cores. Long mode:
`TANDEM_CLUSTER_KILLS=100 pytest -s tests/suites/test_cluster.py` (that many kills, 50
conversations; about 4 s per kill). `TANDEM_CLUSTER_SEED` (default 7) seeds every choice
the test makes; when the kills land is up to the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bot.core.buttons import ApprovalButton, CancelButton, pack, unpack
from bot.core.events import Verdict
from bot.store.postgres import PostgresStore
from tests.conftest import said
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.fakes.slack_server import FakeSlackServer, block_text
from tests.pg import database
from tests.suites.cluster_rig import (
    BalancerTelegram,
    Job,
    Rig,
    SlackBalancer,
    Worker,
    pgrep,
    write_config,
)
from tests.suites.test_crash import tool_alive, without_note
from tests.waiting import within

# Tests that look for their tool processes by command line (pgrep) run on one xdist worker.
pytestmark = pytest.mark.xdist_group("tool-processes")

SEED = int(os.environ.get("TANDEM_CLUSTER_SEED", "7"))
LONG = "TANDEM_CLUSTER_KILLS" in os.environ
KILLS = int(os.environ.get("TANDEM_CLUSTER_KILLS", "4"))
SHORT_KINDS = ("stream", "tool", "approval", "leader")
KIND_WEIGHTS = {"stream": 3, "tool": 2, "approval": 2, "press": 2, "ack": 2, "leader": 1}
WORKERS = 3
TG_CHATS = 35 if LONG else 10
SLACK_DMS = 13 if LONG else 3
PAUSE = (3.0, 10.0) if LONG else (0.2, 1.0)
"""Between one conversation's bursts."""
SETTLE_S = 90.0
"""How long a conversation may take to show every answer (failover included)."""
QUIET_S = 8.0
"""At the end: nothing queued and no new message for this long means nothing more comes."""
PRESS_AFTER_S = 0.4
"""A user reads a card this long before pressing."""
REPRESS_S = 12.0
"""A card still live this long after its press: the press was lost; press again."""
LOOK_S = 0.1
"""How often the loops that watch every conversation (settle, quiesce) look again: they
press cards as a user would and time the quiet, so they poll rather than wait."""
BUDGET_S = 240.0 + (KILLS * 25.0 if LONG else 0.0)

INTERRUPTED = "An earlier answer here was interrupted"
CANCELLED = "⏹ Cancelled."
TOKEN = re.compile(r"\btok[A-Z0-9]+x\d+\b")
WORDS = " ".join(f"w{i}" for i in range(120))
SLOW = " ".join(f"w{i}" for i in range(500))  # about 9 s of streaming
TOOL_SLEEP = "sleep 37.25"  # what test_crash.tool_alive() looks for
APPROVE_SLEEP = "sleep 1.25"
TG_SCHEDULE, TG_CANCEL, TG_CANCEL_RESTART, TG_QUIET = 2100, 2201, 2202, 2999
TG_KILLERS = (2001, 2002, 2003)
SLACK_KILLERS = ("DK1", "DK2")


# -- the model ------------------------------------------------------------------------


def respond(messages: list[dict[str, Any]]) -> Reply:
    """Answers by the scenario word in front of the message's token."""
    last = without_note(messages)[-1]
    users = said(messages)
    text = users[-1] if users else ""
    tokens = TOKEN.findall(text)
    tok = tokens[-1] if tokens else "?"
    if last["role"] == "tool":
        return Reply(text=f"scheduled {tok}" if "schedule " in text else f"done {tok}")
    if "[Scheduled task" in text:
        return Reply(text=f"report {tok} fired")
    before = text.split(tok)[0].split()
    match before[-1] if before else "":
        case "stream":
            return Reply(text=f"stream {tok} {WORDS}", chunk_delay=0.02)
        case "slow":
            return Reply(text=f"slow {tok} {SLOW}", chunk_delay=0.015)
        case "approve":
            return Reply(tool_calls=[ToolCallSpec("shell", {
                "command": f"{APPROVE_SLEEP} && echo {tok}"})])
        case "tool":
            return Reply(tool_calls=[ToolCallSpec("shell", {
                "command": f"{TOOL_SLEEP}; echo {tok}"})])
        case "schedule":
            return Reply(tool_calls=[ToolCallSpec("schedule_task", {
                "when": "in 3 seconds", "prompt": f"report {tok}"})])
    return Reply(text=f"echo {tok}")


def is_answer(scenario: str, tok: str, text: str) -> bool:
    match scenario:
        case "stream":
            return text == f"stream {tok} {WORDS}"
        case "slow":
            return text == f"slow {tok} {SLOW}" or (
                text.startswith(f"slow {tok}") and text.endswith(CANCELLED))
        case "approve" | "tool":
            return text == f"done {tok}"
        case "schedule":
            return text == f"scheduled {tok}"
        case "fire":
            return text == f"report {tok.removesuffix('!')} fired"
    return text == f"echo {tok}"


# -- conversations ----------------------------------------------------------------------


@dataclass
class Shown:
    """One of Tandem's messages as the chat shows it now."""

    text: str
    live: bool
    """It still has buttons: a running turn's message (Cancel) or an undecided card."""
    ident: Any


@dataclass
class Card:
    tok: str
    approval_id: str
    ident: Any
    value: str


@dataclass
class Press:
    conv: Conv
    tok: str
    approval_id: str
    at: float
    asker: tuple[int, int] | None
    """(worker, start) that ran the turn which asked."""
    receiver: tuple[int, int] | None = None
    update_id: int | None = None
    query: str | None = None
    """Telegram: the callback query's id (its answer is what the presser was told)."""


@dataclass
class Outcome:
    answered: dict[str, list[int]]
    """Each token's answers: their positions among the finished messages."""
    interrupted: list[int]
    finished: list[str]


class Conv:
    platform = ""

    def __init__(self, suite: Suite, tag: str, label: str) -> None:
        self.suite, self.tag, self.label = suite, tag, label
        self.expect: dict[str, str] = {}
        """Token -> scenario, in the order they were sent (`<tok>!`: a scheduled run)."""
        self.busy = False
        self.said_at = 0.0
        self.pressed: dict[str, float] = {}
        """Approval id -> when it was last pressed."""
        self.presses: dict[str, int] = {}
        """Approval id -> how often it was pressed."""
        self.seen: dict[str, float] = {}
        """Approval id -> when its card was first seen."""

    def __repr__(self) -> str:
        return self.label

    @property
    def key(self) -> str:
        """The conversation as Tandem names it (its jobs' lock)."""
        return self.label

    def new(self, scenario: str) -> str:
        tok = f"tok{self.tag}x{sum(not t.endswith('!') for t in self.expect)}"
        self.expect[tok] = scenario
        if scenario == "schedule":
            self.expect[tok + "!"] = "fire"
        return tok

    async def say(self, scenario: str) -> tuple[str, Worker | None]:
        tok = self.new(scenario)
        self.said_at = time.monotonic()
        return tok, await self.send(f"{scenario} {tok}")

    @property
    def spoke(self) -> bool:
        return bool(self.expect)

    def outcome(self) -> Outcome:
        finished = [s.text for s in self.shown() if not s.live]
        answered: dict[str, list[int]] = {tok: [] for tok in self.expect}
        for i, text in enumerate(finished):
            for tok, scenario in self.expect.items():
                if is_answer(scenario, tok, text):
                    answered[tok].append(i)
        interrupted = [i for i, t in enumerate(finished) if t.startswith(INTERRUPTED)]
        return Outcome(answered, interrupted, finished)

    def settled(self) -> bool:
        o = self.outcome()
        unanswered = sum(not found for found in o.answered.values())
        return unanswered <= len(o.interrupted) and not self.cards()

    def live_slow(self, tok: str) -> Shown | None:
        """The running turn's message of `slow <tok>`, once it streams."""
        return next((s for s in self.shown()
                     if s.live and s.text.startswith(f"slow {tok} w")), None)

    def tokens_shown(self) -> set[str]:
        return {t for s in self.shown() for t in TOKEN.findall(s.text)}

    # platform specifics
    async def send(self, text: str) -> Worker | None:
        raise NotImplementedError

    def shown(self) -> list[Shown]:
        raise NotImplementedError

    def cards(self) -> list[Card]:
        raise NotImplementedError

    async def press(self, card: Card) -> Press:
        raise NotImplementedError

    async def press_cancel(self, live: Shown, to: Worker) -> tuple[float, str | None]:
        """Cancel on `live`, delivered to `to`; (when it was pressed, the press's answer)."""
        raise NotImplementedError

    def posts(self) -> list[float]:
        """When Tandem posted each new message here (time.monotonic())."""
        raise NotImplementedError

    def cancelled_at(self) -> float | None:
        raise NotImplementedError


class TgConv(Conv):
    platform = "telegram"

    def __init__(self, suite: Suite, chat: int) -> None:
        super().__init__(suite, f"T{chat}", f"telegram:{chat}")
        self.chat = chat

    async def send(self, text: str) -> Worker | None:
        self.suite.tg.push_message(self.chat, self.chat, text)
        return None

    def shown(self) -> list[Shown]:
        return [Shown(m.text, bool(m.reply_markup), m.message_id)
                for m in self.suite.tg.chat(self.chat) if m.from_bot]

    def cards(self) -> list[Card]:
        found = []
        for m in self.suite.tg.chat(self.chat):
            if not (m.from_bot and m.text.startswith("🔐") and m.reply_markup):
                continue
            data = m.reply_markup["inline_keyboard"][0][0]["callback_data"]
            button = unpack(data)
            if isinstance(button, ApprovalButton):
                toks = TOKEN.findall(m.text)
                found.append(Card(toks[0] if toks else "?", button.approval_id,
                                  m.message_id, data))
        return found

    async def press(self, card: Card) -> Press:
        tg = self.suite.tg
        query = tg.push_callback(self.chat, self.chat, card.ident,
                                 pack(ApprovalButton(card.approval_id, Verdict.APPROVE)))
        return Press(self, card.tok, card.approval_id, time.monotonic(),
                     self.suite.asker(card.tok), update_id=tg.pending_updates[-1],
                     query=query)

    async def press_cancel(self, live: Shown, to: Worker) -> tuple[float, str | None]:
        tg = self.suite.tg
        message = tg.message(self.chat, live.ident)
        assert message.reply_markup is not None
        data = message.reply_markup["inline_keyboard"][0][0]["callback_data"]
        assert isinstance(unpack(data), CancelButton), data
        targets = tg.webhook_targets
        tg.webhook_targets = [to.tg_url]  # the balancer sends this one to `to`
        try:
            sent = time.monotonic()
            query = tg.push_callback(self.chat, self.chat, live.ident, data)
            uid = tg.pending_updates[-1]
            await tg.wait_for(lambda: any(d.update_id == uid and d.ok
                                          for d in tg.deliveries), timeout=20)
        finally:
            tg.webhook_targets = targets
        with contextlib.suppress(AssertionError):
            await tg.wait_for(lambda: query in tg.callback_answers, timeout=5)
        answer = tg.callback_answers.get(query, {}).get("text")
        return sent, answer

    def _calls(self, method: str) -> list[Any]:
        return [c for c in self.suite.tg.calls_to(method)
                if c.ok and str(c.params.get("chat_id")) == str(self.chat)]

    def posts(self) -> list[float]:
        return [c.time for c in self._calls("sendMessage")]

    def cancelled_at(self) -> float | None:
        return next((c.time for c in self._calls("editMessageText")
                     if CANCELLED in str(c.params.get("text"))), None)


def _has_actions(blocks: list[dict[str, Any]] | None) -> bool:
    return any(b.get("type") == "actions" for b in blocks or [])


def _action_value(blocks: list[dict[str, Any]] | None, action_id: str) -> str | None:
    for b in blocks or []:
        for e in b.get("elements", []) if b.get("type") == "actions" else []:
            if e.get("action_id") == action_id:
                return str(e.get("value"))
    return None


class SlackConv(Conv):
    """A DM (`channel` D…), or a thread in a channel started by a mention (`thread`);
    `mention_all`: every reply in the thread mentions Tandem, else only the first."""

    platform = "slack"

    def __init__(self, suite: Suite, channel: str, user: str, *, thread: bool = False,
                 mention_all: bool = True, tag: str | None = None) -> None:
        super().__init__(suite, tag or f"S{channel}", f"slack:{channel}")
        self.channel, self.user = channel, user
        self.threaded, self.mention_all = thread, mention_all
        self.root: str | None = None

    def __repr__(self) -> str:
        return f"{self.label}/{self.root}" if self.threaded else self.label

    @property
    def key(self) -> str:
        return repr(self)

    async def send(self, text: str) -> Worker | None:
        slack, lb = self.suite.slack, self.suite.lb
        first = self.threaded and self.root is None
        mention = self.threaded and (first or self.mention_all)
        event = slack.message_event(self.channel, self.user, text, thread_ts=self.root,
                                    channel_type="channel" if self.threaded else "im",
                                    mention=mention)
        if first:
            self.root = str(event["ts"])
        took = await lb.event(event, f"{self!r} {text}")
        if mention:  # Slack sends a mention twice: as app_mention and as message
            await lb.event(dict(event, type="message", channel_type="channel"),
                           f"{self!r} {text} (twin)")
        return took

    def _messages(self) -> list[Any]:
        if self.threaded and self.root is None:
            return []
        return self.suite.slack.bot_messages(self.channel, self.root if self.threaded
                                             else None)

    def shown(self) -> list[Shown]:
        return [Shown(block_text(m.blocks) or m.text, _has_actions(m.blocks), m.ts)
                for m in self._messages()]

    def cards(self) -> list[Card]:
        found = []
        for m in self._messages():
            value = _action_value(m.blocks, "tandem_approve")
            button = unpack(value) if value else None
            if isinstance(button, ApprovalButton):
                toks = TOKEN.findall(block_text(m.blocks) or m.text)
                found.append(Card(toks[0] if toks else "?", button.approval_id, m.ts,
                                  str(value)))
        return found

    async def press(self, card: Card) -> Press:
        press = Press(self, card.tok, card.approval_id, time.monotonic(),
                      self.suite.asker(card.tok))
        payload = self.suite.slack.block_actions(self.channel, self.user, card.ident,
                                                 "tandem_approve", card.value)
        took = await self.suite.lb.action(payload, f"{self!r} approve {card.tok}")
        press.receiver = (took.index, took.start_no)
        return press

    async def press_cancel(self, live: Shown, to: Worker) -> tuple[float, str | None]:
        message = self.suite.slack.message(self.channel, live.ident)
        assert message is not None
        value = _action_value(message.blocks, "tandem_cancel")
        assert value is not None, message
        payload = self.suite.slack.block_actions(self.channel, self.user, live.ident,
                                                 "tandem_cancel", value)
        sent = time.monotonic()  # the 200 may come back after the cancel: time the sending
        took = await self.suite.lb.action(payload, f"{self!r} cancel", to=to)
        assert took is to, f"the cancel went to {took}, not {to}"
        return sent, None

    def _calls(self, method: str) -> list[Any]:
        thread = self.root if self.threaded else None
        return [c for c in self.suite.slack.calls_to(method)
                if c.error is None and c.params.get("channel") == self.channel
                and (c.params.get("thread_ts") or None) == thread]

    def posts(self) -> list[float]:
        return [c.time for c in self._calls("chat.postMessage")]

    def cancelled_at(self) -> float | None:
        updates = [c for c in self.suite.slack.calls_to("chat.update")
                   if c.error is None and c.params.get("channel") == self.channel]
        return next((c.time for c in updates if CANCELLED in json.dumps(
            c.params, ensure_ascii=False)), None)


# -- the suite --------------------------------------------------------------------------


@dataclass
class Kill:
    kind: str
    worker: int
    start: int
    at: float
    wall: float
    """`at` as epoch seconds (what the workers' logs use)."""


@dataclass
class Figures:
    failover: list[tuple[float, str]] = field(default_factory=list)
    handoff: list[float] = field(default_factory=list)
    cancels: list[tuple[str, float | None]] = field(default_factory=list)
    represses: list[str] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    """Conversations that took over 15 s to settle (a failover, or what the checks find)."""
    notes: list[str] = field(default_factory=list)
    phases: list[tuple[str, float]] = field(default_factory=list)

    def phase(self, name: str) -> None:
        self.phases.append((name, time.monotonic()))


def asked(conv: Conv, tok: str, notices: int) -> bool:
    """`tok`'s card is out, or its turn is over (answered, or a new interruption notice)."""
    outcome = conv.outcome()
    return any(c.tok == tok for c in conv.cards()) or bool(outcome.answered[tok]) \
        or len(outcome.interrupted) > notices


async def until(predicate: Callable[[], Any], timeout: float, step: float = 0.05) -> Any:
    """`predicate()`'s first truthy value within `timeout`, else None."""
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(step)
    return found


class Suite:
    def __init__(self, tmp: Path, url: str, tg: BalancerTelegram, slack: FakeSlackServer,
                 model: FakeModelServer) -> None:
        self.tmp, self.url, self.tg, self.slack, self.model = tmp, url, tg, slack, model
        self.rng = random.Random(SEED)
        self.restart_rng = random.Random(SEED + 2)
        self.problems: list[str] = []
        self.kills: list[Kill] = []
        self.presses: list[Press] = []
        self.figures = Figures()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.background = [TgConv(self, 1001 + i) for i in range(TG_CHATS)]
        self.background += [SlackConv(self, f"D{i + 1}", f"U{i + 1}") for i in range(SLACK_DMS)]
        self.background += [SlackConv(self, "C1", "UA", thread=True, tag="SCA"),
                            SlackConv(self, "C1", "UB", thread=True, mention_all=False,
                                      tag="SCB")]
        self.killers: list[Conv] = [TgConv(self, c) for c in TG_KILLERS]
        self.killers += [SlackConv(self, c, f"U{c}") for c in SLACK_KILLERS]
        self.schedulers: list[Conv] = [TgConv(self, TG_SCHEDULE),
                                       SlackConv(self, "DS1", "UDS1")]
        self.cancellers: list[Conv] = [TgConv(self, TG_CANCEL),
                                       SlackConv(self, "DC1", "UDC1"),
                                       TgConv(self, TG_CANCEL_RESTART)]
        self.convs = [*self.background, *self.killers, *self.schedulers, *self.cancellers]
        self.tg_users = [c.chat for c in self.convs if isinstance(c, TgConv)]
        self.rig: Rig
        self.lb: SlackBalancer
        self.db: psycopg.AsyncConnection[Any] | None = None
        """The test's own connection, for looking at the queue."""
        self.db_lock = asyncio.Lock()
        self.lost: dict[str, list[str]] = {}
        self.unexplained: dict[str, list[str]] = {}

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- start and stop -----------------------------------------------------------------

    async def start(self) -> None:
        config = write_config(self.tmp, self.url, self.model, self.tg, self.slack,
                              tg_users=self.tg_users, slack_users=["*"],
                              public_url="http://127.0.0.1:8443/telegram")
        self.rig = Rig(self.tmp, config, WORKERS)
        self.lb = SlackBalancer(self.slack, self.rig, random.Random(SEED + 1))
        self.tg.webhook_targets = [w.tg_url for w in self.rig.workers]
        self.tg.add_chat(TG_QUIET)  # a chat Tandem could write to, where nobody speaks
        await self.rig.start_all()
        await until(lambda: len(self.tg.calls_to("setWebhook")) >= WORKERS, 30)

    async def restart_later(self, w: Worker) -> None:
        await asyncio.sleep(self.restart_rng.uniform(0.3, 1.5))
        try:
            await w.start()
            await w.wait_ready()
        except AssertionError as exc:
            self.problem(f"{w} did not start again: {exc}")

    async def others_ready(self, victim: Worker | None = None) -> None:
        """Kill only while every other worker runs: the cluster keeps two."""
        others = [w for w in self.rig.workers if w is not victim]
        if not await until(lambda: all(w.ready for w in others), 60):
            self.problem(f"before a kill: {others} not all up within 60 s")

    async def reap(self, w: Worker, kind: str, at: float) -> Kill:
        start = w.start_no
        assert w.proc is not None
        await w.proc.wait()
        kill = Kill(kind, w.index, start, at, time.time() - (time.monotonic() - at))
        self.kills.append(kill)
        self.spawn(self.restart_later(w))
        return kill

    async def kill(self, w: Worker, kind: str) -> Kill:
        return await self.reap(w, kind, w.kill_now())

    # -- what ran where -------------------------------------------------------------------

    def running(self, match: Callable[[Job], bool]) -> Job | None:
        """A job that runs now (its worker's current start, not ended) and matches."""
        for job in self.rig.jobs():
            w = self.rig.workers[job.worker]
            if job.ended is None and w.alive and job.start == w.start_no and match(job):
                return job
        return None

    def asker(self, tok: str) -> tuple[int, int] | None:
        """The worker (and start) whose job ran the turn of `tok` that asked."""
        jobs = [j for j in self.rig.jobs() if j.kind == "message" and tok in j.text]
        return (jobs[-1].worker, jobs[-1].start) if jobs else None

    def cut_jobs(self, kill: Kill, jobs: list[Job]) -> list[Job]:
        """What `kill` cut: jobs its process started and did not end, and jobs it logged
        as ended but died before the queue heard (another worker ran them again)."""
        again = {j.id for j in jobs if j.at > kill.wall}
        return [j for j in jobs if j.worker == kill.worker and j.start == kill.start
                and (j.ended is None or j.id in again)]

    def cut_tokens(self) -> set[str]:
        by_approval = {p.approval_id: p.tok for p in self.presses}
        cut: set[str] = set()
        jobs = self.rig.jobs()
        for kill in self.kills:
            for job in self.cut_jobs(kill, jobs):
                if job.kind == "message":
                    cut.update(TOKEN.findall(job.text))
                elif job.kind == "decision":
                    cut.add(by_approval.get(str(job.item.get("approval_id")), "?"))
                elif job.kind == "trigger":
                    cut.update(t + "!" for t in TOKEN.findall(job.text))
        return cut

    # -- a conversation's user --------------------------------------------------------------

    async def press(self, conv: Conv, card: Card) -> None:
        conv.pressed[card.approval_id] = time.monotonic()
        conv.presses[card.approval_id] = conv.presses.get(card.approval_id, 0) + 1
        self.presses.append(await conv.press(card))

    async def settle(self, conv: Conv, timeout: float = SETTLE_S) -> bool:
        """Until every message of `conv` is answered (or a notice stands for it), or it
        is quiet: nothing of it queued or running and nothing new shown for QUIET_S (what
        is missing then never comes; the checks at the end say what). Its cards are
        approved as they come, and pressed again when a press was lost."""
        began = deadline = time.monotonic()
        deadline += timeout
        seen, since = -1, time.monotonic()
        try:
            return await self._settle(conv, deadline, seen, since)
        finally:
            if time.monotonic() - began > 15:
                self.figures.slow.append(f"{conv!r} {time.monotonic() - began:.0f} s from "
                                         f"+{began - self.figures.phases[0][1]:.0f} s")

    async def _settle(self, conv: Conv, deadline: float, seen: int, since: float) -> bool:
        while not conv.settled():
            now = time.monotonic()
            shown = sum(len(s.text) + s.live for s in conv.shown())
            if shown != seen:
                seen, since = shown, now
            elif now - max(since, conv.said_at) > QUIET_S and not await self.queued(conv.key) \
                    and all(conv.presses.get(c.approval_id, 0) > 1 for c in conv.cards()):
                return False  # quiet, and every card left was pressed again in vain
            if now > deadline:
                o = conv.outcome()
                self.problem(f"{conv!r} did not settle within {SETTLE_S:g} s: unanswered "
                             f"{[t for t, f in o.answered.items() if not f]}, notices "
                             f"{len(o.interrupted)}; shows {o.finished[-8:]}")
                return False
            for card in conv.cards():
                first = conv.seen.setdefault(card.approval_id, now)
                pressed = conv.pressed.get(card.approval_id)
                if pressed is not None and now - pressed > REPRESS_S:
                    self.figures.represses.append(f"{conv!r} {card.tok}")
                if (pressed is None and now - first > PRESS_AFTER_S) or \
                        (pressed is not None and now - pressed > REPRESS_S):
                    await self.press(conv, card)
            await asyncio.sleep(LOOK_S)
        return True

    async def converse(self, conv: Conv, rng: random.Random,
                       more: Callable[[], bool]) -> None:
        """Bursts of 2-3 messages back to back, and approvals, until `more()` is false
        (at least one of each)."""
        kinds = ["burst", "approve"]
        rng.shuffle(kinds)
        if isinstance(conv, SlackConv) and conv.threaded:
            kinds = ["approve", "burst"]  # a mention, then replies typed right after it
        while kinds or more():
            kind = kinds.pop() if kinds else rng.choice(["burst", "burst", "approve"])
            if kind == "approve":  # settle() presses the card
                notices = len(conv.outcome().interrupted)
                tok, _ = await conv.say("approve")
                # its card first (or its end): a conversation a kill round also used may
                # count as settled by an older notice before the card is out
                await until(functools.partial(asked, conv, tok, notices), SETTLE_S)
            else:
                for _ in range(3 if not LONG else rng.choice((2, 3))):
                    await conv.say(rng.choice(("echo", "echo", "stream")))
            await self.settle(conv)
            await asyncio.sleep(rng.uniform(*PAUSE))

    # -- kill rounds ------------------------------------------------------------------------

    async def free(self, pool: list[Conv]) -> Conv:
        found = await until(lambda: [c for c in pool if not c.busy], SETTLE_S)
        assert found, f"no free conversation in {pool}"
        conv: Conv = self.rng.choice(found)
        conv.busy = True
        return conv

    def release(self, conv: Conv) -> None:
        async def run() -> None:
            try:
                await self.settle(conv)
            finally:
                conv.busy = False

        self.spawn(run())

    async def job_of(self, what: str, match: Callable[[Job], bool]) -> Job | None:
        job = await until(lambda: self.running(match), 30)
        if job is None:
            self.problem(f"kill round: no job {what} started within 30 s")
        return job

    async def round_stream(self, conv: Conv) -> None:
        tok, _ = await conv.say("stream")
        job = await self.job_of(f"streaming {tok}", lambda j: tok in j.text)
        if job is not None:
            await asyncio.sleep(self.rng.uniform(0.3, 2.0))
            w = self.rig.workers[job.worker]
            await self.others_ready(w)
            if w.alive and w.start_no == job.start:
                await self.kill(w, "stream")

    async def card(self, conv: Conv, tok: str) -> Card | None:
        card = await until(lambda: next((c for c in conv.cards() if c.tok == tok), None),
                           SETTLE_S)
        if card is None:
            self.problem(f"{conv!r}: no approval card for {tok} within {SETTLE_S:g} s")
        return card

    async def round_tool(self, conv: Conv) -> None:
        tok, _ = await conv.say("tool")
        if (card := await self.card(conv, tok)) is None:
            return
        await self.press(conv, card)
        job = await self.job_of(f"deciding {tok}", lambda j: j.kind == "decision"
                                and j.item.get("approval_id") == card.approval_id)
        if job is None or not await until(lambda: pgrep(TOOL_SLEEP), 20):
            self.problem(f"{conv!r}: the approved tool of {tok} did not start")
            return
        await asyncio.sleep(self.rng.uniform(0.1, 1.0))
        w = self.rig.workers[job.worker]
        await self.others_ready(w)
        await self.kill(w, "tool")
        if await until(lambda: not tool_alive(), 3.0) is None:
            self.problem(f"{conv!r}: `{TOOL_SLEEP}` outlived its worker {w} by 3 s: "
                         f"pids {pgrep(TOOL_SLEEP)}")

    async def round_approval(self, conv: Conv) -> None:
        tok, _ = await conv.say("approve")
        if (card := await self.card(conv, tok)) is None:
            return
        asker = self.asker(tok)
        if asker is not None and self.rig.workers[asker[0]].start_no == asker[1]:
            w = self.rig.workers[asker[0]]
            await self.others_ready(w)
            if w.alive:
                await self.kill(w, "approval")
        await asyncio.sleep(self.rng.uniform(0.2, 1.0))
        await self.press(conv, card)

    async def round_press(self, conv: Conv) -> None:
        tok, _ = await conv.say("approve")
        if (card := await self.card(conv, tok)) is None:
            return
        await self.others_ready()  # nobody down: any worker may take it
        if isinstance(conv, TgConv):
            await self.kill_on_ack(lambda: self.press(conv, card), "press")
        else:
            await self.press(conv, card)
            receiver = self.presses[-1].receiver
            assert receiver is not None
            await self.kill(self.rig.workers[receiver[0]], "press")

    async def kill_on_ack(self, deliver: Callable[[], Any], kind: str) -> None:
        """Telegram: the worker that answers the next update 200 dies right then."""
        acked: asyncio.Future[tuple[Worker, float]] = \
            asyncio.get_running_loop().create_future()

        def hook(url: str) -> None:
            w = self.rig.by_url(url)
            if w is not None and w.alive and not acked.done():
                acked.set_result((w, w.kill_now()))

        await deliver()
        self.tg.on_ack[self.tg.pending_updates[-1]] = hook
        w, at = await asyncio.wait_for(acked, 30)
        await self.reap(w, kind, at)

    async def round_ack(self, conv: Conv) -> None:
        await self.others_ready()
        if isinstance(conv, TgConv):
            await self.kill_on_ack(lambda: conv.say("echo"), "ack")
        else:
            _, took = await conv.say("echo")
            assert took is not None
            await self.kill(took, "ack")

    async def round_leader(self, conv: Conv) -> None:
        tok, _ = await conv.say("schedule")

        def scheduled() -> bool:
            return any(without_note(r["messages"])[-1]["role"] == "tool"
                       and tok in (said(r["messages"]) or [""])[-1]
                       for r in self.model.requests)

        if not await until(scheduled, SETTLE_S):
            self.problem(f"{conv!r}: {tok} was never scheduled")
            return
        due = time.monotonic() + 3.0
        await asyncio.sleep(max(0.0, due - time.monotonic() + self.rng.uniform(-1.5, 0.3)))
        leader = await until(self.rig.leader, 30)
        if leader is None:
            self.problem("no worker leads")
            return
        await self.others_ready(leader)
        await self.kill(leader, "leader")

    async def kill_rounds(self) -> None:
        """Rounds until KILLS kills happened (a round whose moment passed kills nobody)."""
        for n in range(KILLS * 3):
            if len(self.kills) >= KILLS:
                break
            kind = SHORT_KINDS[n % len(SHORT_KINDS)] if not LONG else self.rng.choices(
                list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
            pool = self.schedulers if kind == "leader" else self.killers
            conv = await self.free(pool)
            try:
                await getattr(self, f"round_{kind}")(conv)
            finally:
                self.release(conv)
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))

    # -- cancels ------------------------------------------------------------------------

    async def cancel_round(self, conv: Conv, restart_target: bool) -> None:
        """Cancel a streaming turn from another worker (restarted after the turn began,
        with `restart_target`)."""
        tok, _ = await conv.say("slow")
        live = await until(lambda: conv.live_slow(tok), 30)
        job = self.running(lambda j: tok in j.text)
        where = f"{conv!r} cancel{' via a restarted worker' if restart_target else ''}"
        if live is None or job is None:
            self.problem(f"{where}: the slow turn of {tok} is not streaming")
            self.figures.cancels.append((where, None))
            return
        target = next(w for w in self.rig.workers if w.index != job.worker and w.ready)
        if restart_target:
            assert await target.terminate() == 0
            await target.start()
            await target.wait_ready()
        sent, answer = await conv.press_cancel(live, target)
        self.figures.notes.append(f"{where}: press answered {answer!r}")
        stopped = await until(conv.cancelled_at, 5)
        took = stopped - sent if stopped is not None else None
        self.figures.cancels.append((f"{where}, w{job.worker} -> w{target.index}", took))
        if stopped is None:
            self.problem(f"{where}: Cancel taken by {target} (answered {answer!r}) did not "
                         f"stop the turn streaming on w{job.worker} within 5 s; shows "
                         f"{[t[:60] for t in conv.outcome().finished[-3:]]}")
            runner = self.rig.workers[job.worker]  # stop it where it runs, to go on
            if (live := conv.live_slow(tok)) is not None and runner.alive:
                await conv.press_cancel(live, runner)

    # -- the end ----------------------------------------------------------------------------

    async def queued(self, lock: str | None = None) -> int:
        """Jobs waiting (due within 10 s) or running: cluster-wide, or of one conversation
        (`lock`); a dead worker's job counts until another takes it."""
        async with self.db_lock:  # one connection, opened once even when asked at once
            if self.db is None or self.db.closed:
                self.db = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        row = await (await self.db.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE (status = 'doing' OR"
            " (status = 'todo' AND (scheduled_at IS NULL OR"
            " scheduled_at < now() + interval '10 seconds')))"
            " AND (%(lock)s::text IS NULL OR lock = %(lock)s)", {"lock": lock})).fetchone()
        return int(row[0]) if row else 0

    async def quiesce(self) -> None:
        """Until every conversation settled, or the queue is empty and nothing was posted
        for QUIET_S (nothing more will come)."""
        deadline = time.monotonic() + SETTLE_S * 2
        last, seen = time.monotonic(), -1
        while time.monotonic() < deadline:
            if all(c.settled() for c in self.convs if c.spoke) and not await self.queued():
                return
            posted = len(self.tg.calls) + len(self.slack.calls)
            if posted != seen or await self.queued():
                last, seen = time.monotonic(), posted
            elif time.monotonic() - last > QUIET_S:
                return
            await asyncio.sleep(LOOK_S)

    def check_conversations(self) -> None:
        cut = self.cut_tokens()
        for conv in self.convs:
            o = conv.outcome()
            for tok, found in o.answered.items():
                if len(found) > 1:
                    self.problem(f"{conv!r}: {tok} answered {len(found)} times")
            missing = [t for t in conv.expect if not o.answered[t]]
            if len(missing) != len(o.interrupted):
                self.unexplained[conv.key] = missing
                self.problem(f"{conv!r}: {len(missing)} messages unanswered {missing} but "
                             f"{len(o.interrupted)} interruption notices (what the store has "
                             f"of them: below); shows {o.finished}")
            if lost := [t for t in missing if t not in cut]:
                self.lost[conv.key] = lost
                self.problem(f"{conv!r}: {lost} never answered, and no kill cut their job"
                             " (lost; what the store has of them: below)")
            sent = [t for t in conv.expect if not t.endswith("!") and o.answered[t]]
            order = sorted(sent, key=lambda t: o.answered[t][0])
            if order != sent:
                self.problem(f"{conv!r}: answered out of order: sent {sent}, answered "
                             f"{order}")
            if strays := conv.tokens_shown() - {t.removesuffix("!") for t in conv.expect}:
                self.problem(f"{conv!r} shows other conversations' tokens {sorted(strays)}")

    async def check_scheduled(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Each task fired once (one claim in the store, one "fires" line in all the
        workers' logs) and its run reached the model once, or not at all if a kill cut
        it (then the notice stands for its answer)."""
        cut = self.cut_tokens()
        logs = "\n".join(w.log_text(n) for w in self.rig.workers for n in range(len(w.logs)))
        for conv in self.convs:
            for tok in [t for t, s in conv.expect.items() if s == "schedule"]:
                rows = await (await conn.execute(
                    "SELECT j.id, j.active, (SELECT count(*) FROM inbound i WHERE i.ref LIKE"
                    " 'job:' || j.id || ':%%') FROM jobs j WHERE j.prompt = %s",
                    (f"report {tok}",))).fetchall()
                runs = [r for r in self.model.requests
                        if without_note(r["messages"])[-1]["role"] == "user"
                        and f"report {tok}" in (said(r["messages"]) or [""])[-1]
                        and "[Scheduled task" in (said(r["messages"]) or [""])[-1]]
                if len(rows) != 1:
                    self.problem(f"{conv!r}: {tok} made {len(rows)} scheduled tasks")
                    continue
                job_id, active, claims = rows[0]
                fired = logs.count(f"job {job_id} fires for slot")
                if active or claims != 1 or fired != 1:
                    self.problem(f"{conv!r}: task {job_id} of {tok}: still active {active}, "
                                 f"{claims} claimed runs, fired {fired} times (worker logs)")
                if len(runs) > 1 or (not runs and tok + "!" not in cut):
                    self.problem(f"{conv!r}: the run of task {job_id} of {tok} reached the "
                                 f"model {len(runs)} times")

    def check_unprompted(self) -> None:
        spoken_chats = {str(c.chat) for c in self.convs if isinstance(c, TgConv) and c.spoke}
        sent_to = {str(c.params.get("chat_id")) for c in self.tg.calls_to("sendMessage")}
        if extra := sent_to - spoken_chats:
            self.problem(f"Telegram: messages to chats that never spoke: {sorted(extra)}")
        places = {(c.channel, c.root if c.threaded else None)
                  for c in self.convs if isinstance(c, SlackConv) and c.spoke}
        posted = {(str(c.params.get("channel")), c.params.get("thread_ts") or None)
                  for c in self.slack.calls_to("chat.postMessage")}
        if extra := posted - places:
            self.problem(f"Slack: messages where nobody spoke: {sorted(extra, key=str)}")

    async def check_database(self) -> None:
        store = PostgresStore(self.url, max_size=2)
        await store.open()
        try:
            if (found := await store.integrity_check()) != "ok":
                self.problem(f"integrity_check: {found}")
            if unprocessed := await store.unprocessed_inbound():
                self.problem(f"recorded inbound never processed: {unprocessed}")
            if open_turns := await store.open_turns():
                self.problem(f"turns left open: {open_turns}")
            tracked = await store.tracked_processes()
        finally:
            await store.close()
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            rows = await (await conn.execute(
                "SELECT id, task_name, status, args::text FROM procrastinate_jobs WHERE"
                " status IN ('doing', 'failed', 'aborted', 'cancelled') OR (status = 'todo'"
                " AND (scheduled_at IS NULL OR scheduled_at < now() + interval '1 minute'))"
                " ORDER BY id")).fetchall()
            if rows:
                self.problem(f"jobs left in the queue: {rows}")
            await self.check_scheduled(conn)
            told = set()
            for key, toks in [*self.unexplained.items(), *self.lost.items()]:
                for tok in toks:
                    stored = await self.stored(conn, tok)
                    if (key, tok) not in told and "'done', 'interrupted'" not in stored:
                        told.add((key, tok))  # (an interrupted turn has its notice)
                        self.problem(f"  store, {key} {tok}: {stored}{self.pressed(tok)}")
        self.figures.notes.append(f"tool processes still tracked: {tracked}")

    @staticmethod
    async def stored(conn: psycopg.AsyncConnection[Any], tok: str) -> str:
        """What the store has of `tok`: its inbound record, and its turn."""
        like = f"%{tok.removesuffix('!')}%"
        inbound = await (await conn.execute(
            "SELECT ref, kind, done FROM inbound WHERE payload LIKE %s", (like,))).fetchall()
        turn = await (await conn.execute(
            "SELECT t.turn, t.status, t.reason, (SELECT string_agg(m2.role || ': ' ||"
            " left(m2.content, 50), ' | ' ORDER BY m2.id) FROM messages m2 WHERE"
            " m2.conv_id = m.conv_id AND m2.session = m.session AND m2.turn = m.turn)"
            " FROM messages m JOIN turns t ON t.conv_id = m.conv_id AND t.session ="
            " m.session AND t.turn = m.turn WHERE m.role = 'user' AND m.content LIKE %s",
            (like,))).fetchall()
        approvals = await (await conn.execute(
            "SELECT status FROM approvals WHERE summary LIKE %s", (like,))).fetchall()
        return (f"inbound {inbound}; turn (number, status, reason, messages) {turn}; "
                f"approvals {approvals}")

    def pressed(self, tok: str) -> str:
        """How the presses of `tok`'s card went: (at, taken by, what the presser saw)."""
        start = self.figures.phases[0][1]
        went = [(f"+{p.at - start:.1f} s", p.receiver,
                 self.tg.callback_answers.get(p.query, {}).get("text") if p.query else "-")
                for p in self.presses if p.tok == tok]
        return f"; presses (at, taken by (worker, start), answer) {went}" if went else ""

    def failover(self) -> None:
        jobs = self.rig.jobs()
        for kill in self.kills:
            for job in self.cut_jobs(kill, jobs):
                again = [j.at for j in jobs if j.id == job.id and j.at > kill.wall]
                if again:
                    self.figures.handoff.append(min(again) - kill.wall)
                conv = self.conv_of(job)
                after = [t for t in conv.posts() if t > kill.at] if conv else []
                if after:
                    self.figures.failover.append(
                        (min(after) - kill.at, f"{kill.kind} kill of w{kill.worker}: "
                                               f"{job.kind} in {conv!r}"))

    def conv_of(self, job: Job) -> Conv | None:
        platform, chat, thread = job.conv
        for conv in self.convs:
            if isinstance(conv, TgConv) and platform == "telegram" and str(conv.chat) == chat:
                return conv
            if isinstance(conv, SlackConv) and platform == "slack" and conv.channel == chat \
                    and (conv.root if conv.threaded else None) == thread:
                return conv
        return None

    def check_presses(self) -> None:
        for press in self.presses:
            if press.update_id is None:
                continue
            got = next((d for d in self.tg.deliveries if d.update_id == press.update_id
                        and d.ok), None)
            w = self.rig.by_url(got.url) if got is not None else None
            if got is not None and w is not None and (n := w.start_at(got.time)) is not None:
                press.receiver = (w.index, n)
        known = [p for p in self.presses if p.asker and p.receiver]
        elsewhere = [p for p in known if p.asker != p.receiver]
        if not elsewhere:
            self.problem(f"no press reached another worker than the one that asked: "
                         f"{[(p.tok, p.asker, p.receiver) for p in self.presses]}")
        self.figures.notes.append(
            f"presses: {len(self.presses)}, {len(known)} traced, {len(elsewhere)} taken by "
            "another worker (or start) than the one that asked")

    def report(self, seconds: float) -> None:
        kinds: dict[str, int] = {}
        for kill in self.kills:
            kinds[kill.kind] = kinds.get(kill.kind, 0) + 1
        turns = sum(len(c.expect) for c in self.convs)
        lines = [f"\n[cluster] {WORKERS} workers, {len([c for c in self.convs if c.spoke])} "
                 f"conversations, {turns} messages and runs, {len(self.kills)} kills {kinds}, "
                 f"{seconds:.1f} s, seed {SEED}"]
        fo = sorted(t for t, _ in self.figures.failover)
        if fo:
            lines.append(f"[cluster] failover, kill -9 to the next message in a conversation "
                         f"it cut: n={len(fo)} p50 {fo[len(fo) // 2] * 1000:.0f} ms, max "
                         f"{fo[-1] * 1000:.0f} ms")
        lines += [f"[cluster]   {t * 1000:.0f} ms: {what}" for t, what in self.figures.failover]
        if ho := sorted(self.figures.handoff):
            lines.append(f"[cluster] handoff, kill -9 to another worker starting the cut job: "
                         f"n={len(ho)} p50 {ho[len(ho) // 2] * 1000:.0f} ms, max "
                         f"{ho[-1] * 1000:.0f} ms")
        for what, took in self.figures.cancels:
            shown = f"{took * 1000:.0f} ms" if took is not None else "never"
            lines.append(f"[cluster] cancel latency {what}: {shown}")
        lines += [f"[cluster] {line}" for line in self.figures.notes]
        phases = self.figures.phases
        lines.append("[cluster] phases: " + ", ".join(
            f"{name} +{at - phases[0][1]:.1f} s" for name, at in phases))
        tg_failed = [d for d in self.tg.deliveries if not d.ok]
        lines.append(f"[cluster] Telegram deliveries {len(self.tg.deliveries)} "
                     f"({len(tg_failed)} failed, retried); Slack requests taken "
                     f"{len(self.lb.took)} ({len(self.lb.failed_attempts)} failed attempts)")
        if self.figures.slow:
            lines.append(f"[cluster] slow to settle ({len(self.figures.slow)}): "
                         f"{', '.join(self.figures.slow[:12])}")
        if self.figures.represses:
            lines.append(f"[cluster] presses lost and pressed again: {self.figures.represses}")
        print("\n".join(lines))


async def test_three_workers_answer_every_message_once_through_kill_9(
        tmp_path: Path) -> None:
    started = time.monotonic()
    with database() as url:
        async with BalancerTelegram(flood=False) as tg, \
                FakeSlackServer(rate_limit=False) as slack, FakeModelServer() as model:
            model.responder = respond
            suite = Suite(tmp_path, url, tg, slack, model)
            try:
                async with asyncio.timeout(BUDGET_S):
                    await run(suite)
            except BaseException:
                print(suite.rig.dump_logs() if hasattr(suite, "rig") else "(no workers)")
                raise
            finally:
                for task in list(suite.tasks):
                    task.cancel()
                await asyncio.gather(*suite.tasks, return_exceptions=True)
                if suite.db is not None:
                    await suite.db.close()
                if hasattr(suite, "rig"):
                    suite.rig.kill_all_now()
                    for w in suite.rig.workers:
                        if w.proc is not None:
                            await w.proc.wait()
            suite.report(time.monotonic() - started)
            if suite.problems:
                print(suite.rig.dump_logs())
            assert not suite.problems, "\n".join(["Tandem misbehaved:", *suite.problems])


async def run(suite: Suite) -> None:
    suite.figures.phase("start")
    await suite.start()
    suite.figures.phase("ready")
    killing = suite.spawn(suite.kill_rounds())
    users = [suite.spawn(suite.converse(conv, random.Random(suite.rng.random()),
                                        lambda: LONG and not killing.done()))
             for conv in suite.background]
    await killing
    suite.figures.phase("kills done")
    await asyncio.gather(*users)
    suite.figures.phase("users done")
    for conv, restart in zip(suite.cancellers, (False, False, True), strict=True):
        await suite.others_ready()
        await suite.cancel_round(conv, restart_target=restart)
    suite.figures.phase("cancels done")
    await until(lambda: not any(c.busy for c in suite.convs), SETTLE_S)
    await until(lambda: all(w.ready for w in suite.rig.workers), 60)
    suite.figures.phase("kill rounds settled")
    await suite.quiesce()
    suite.figures.phase("quiet")
    codes = await suite.rig.stop_all()
    suite.figures.phase("stopped")
    if codes != [0] * WORKERS:
        suite.problem(f"exit statuses after SIGTERM: {codes}")
    # the tools' supervisors are told of their workers' deaths and kill their groups
    await within(lambda: not (tool_alive() or pgrep(APPROVE_SLEEP)), 0.5)
    if tool_alive() or pgrep(APPROVE_SLEEP):
        suite.problem(f"tool processes outlived the workers: {pgrep('sleep ')}")
    suite.check_conversations()
    suite.check_unprompted()
    suite.check_presses()
    suite.failover()
    await suite.check_database()
    if suite.model.violations:
        suite.problem(f"the model saw invalid histories: {suite.model.violations}")
