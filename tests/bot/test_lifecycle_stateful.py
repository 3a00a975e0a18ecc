"""The turn's lifecycle as a Hypothesis state machine, against the real core.

Each example drives the real hub (real SQLite store in a temp dir, the real litellm
client) against the strict fake model over HTTP, with random sequences of messages,
model steps (shell calls that ask, list_dir calls that are allowed, unknown tools,
reused call ids), presses (approve / deny / always, again on a decided card, by a
stranger), expiries, cancels (also while a card is being posted), `/new`, scheduled
runs, restarts, edits of earlier messages (and of messages never seen), and two messages
at once (with `busy: steer`, `SteerMachine`, the second joins the running turn). After
every rule the store and the events must agree:

1. a call outside the one unfinished turn is finished with exactly one result message;
   the calls of a suspended turn are pending / asking / allowed, never submitted;
2. every approval is resolved exactly once, and a pending one waits in an unfinished turn;
3. no live button for a finished turn, and at most one unfinished turn per conversation;
4. the fake model saw no violation, and the next request would be accepted too;
5. every TurnEnded / Suspended event is about a turn the store has.

`RuleBasedStateMachine` is synchronous: each machine has its own event loop, and every
rule runs its coroutine on it. TANDEM_STATEFUL_EXAMPLES raises the number of examples.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import tempfile
import threading
from collections import Counter, deque
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bot import llm
from bot.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    Cancel,
    Command,
    Decision,
    Edit,
    Notice,
    Progress,
    Suspended,
    Trigger,
    TurnEnded,
    User,
    UserMessage,
    Verdict,
)
from tests.conftest import Core, HoldCards, Recorder, make_config
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec, validate_messages

T = TypeVar("T")

EXAMPLES = int(os.environ.get("TANDEM_STATEFUL_EXAMPLES", "25"))
RULE_TIMEOUT_S = 30.0
"""A rule that takes longer has hung: fail instead of waiting forever."""
EVE = User("u9", "Eve")
FIXED_ID = "call_0"
OPEN_CALL_STATES = frozenset({"pending", "asking", "allowed"})
BAD_NOTICES = ("database is unavailable", "Something went wrong")

TOOL_KINDS = ("shell", "shell", "list_dir", "no_such_tool")
"""shell twice: its cards are what most rules act on."""
one_call = st.tuples(st.sampled_from(TOOL_KINDS), st.integers(0, 3), st.booleans())
"""(tool, which `echo n`, use the fixed id "call_0")"""
texts = st.sampled_from(["hello", "do it", "never mind", "what now?"])
verdicts = st.sampled_from([Verdict.APPROVE, Verdict.DENY, Verdict.ALWAYS])
picks = st.integers(0, 7)
"""Which live (or decided) approval a press goes to: index modulo how many there are."""


def spec(kind: str, n: int, fixed: bool) -> ToolCallSpec:
    call_id = FIXED_ID if fixed else None  # None: the fake's own unique "call_<n>"
    match kind:
        case "shell":
            return ToolCallSpec("shell", {"command": f"echo {n}"}, call_id)
        case "list_dir":
            return ToolCallSpec("list_dir", {"path": "."}, call_id)
        case _:
            return ToolCallSpec("no_such_tool", {"n": n}, call_id)


class DiesAfterTheDecision:
    """Stands in for a kill right after a decision is stored: the process freezes as it
    shows it (`dead`), and once its lanes are closed (nothing of it may go on, like a
    message that waited for the card) showing it fails (`release`)."""

    def __init__(self, sink: Recorder) -> None:
        self.sink = sink
        self.killed = False
        self.dead = asyncio.Event()
        self.release = asyncio.Event()

    async def emit(self, event: Any) -> None:
        if self.killed:  # a dead process shows nothing more
            return
        await self.sink.emit(event)
        if isinstance(event, ApprovalResolved):
            self.killed = True
            self.dead.set()
            await self.release.wait()
            raise RuntimeError("killed")


class LifecycleMachine(RuleBasedStateMachine):
    busy = "queue"

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="tandem-stateful-"))
        self.loop = asyncio.new_event_loop()
        self.server = FakeModelServer()
        self.queue: deque[Reply] = deque()
        self.recorders: list[Recorder] = []
        self.core: Core | None = None
        self.cards = 0
        self.threads = set(threading.enumerate())
        self.run(self.server.start())
        self.server.responder = self._respond
        self.config = make_config(self.tmp, self.server, busy=self.busy)
        self.sent: list[str] = []
        """The ids of the messages sent, for edits to name."""
        self.db_path = self.tmp / "tandem.db"
        self.run(self._open())

    # -- plumbing ---------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, RULE_TIMEOUT_S))

    def _respond(self, _messages: list[dict[str, Any]]) -> Reply:
        return self.queue.popleft() if self.queue else Reply(text="ok")

    async def _open(self) -> None:
        core = Core(self.config)
        self.core = core
        self.recorders.append(core.sink)
        await core.__aenter__()
        await core.hub.idle()

    @property
    def c(self) -> Core:
        assert self.core is not None
        return self.core

    def events(self, kind: type[T]) -> list[T]:
        return [e for r in self.recorders for e in r.of(kind)]

    def resolved(self) -> Counter[str]:
        return Counter(e.approval_id for e in self.events(ApprovalResolved))

    def live(self) -> list[str]:
        """Cards shown (first or as reminders) and not resolved, oldest first."""
        done = self.resolved()
        ids = dict.fromkeys(e.approval_id for e in self.events(ApprovalRequested))
        return [i for i in ids if i not in done]

    def decided(self) -> list[str]:
        return list(self.resolved())

    def has_live(self) -> bool:
        return bool(self.live())

    def has_decided(self) -> bool:
        return bool(self.decided())

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(f"file:{self.db_path}?mode=ro",
                                                uri=True)) as conn:
            return conn.execute(sql).fetchall()

    def snapshot(self) -> tuple[Any, ...]:
        """What a refused press must leave alone: the store, the events, the model."""
        return (self.query("SELECT conv_id, session, turn, status, reason FROM turns"
                           " ORDER BY 1, 2, 3"),
                self.query("SELECT conv_id, session, call_id, state, outcome FROM tool_calls"
                           " ORDER BY 1, 2, 3"),
                self.query("SELECT id, status, decided_by FROM approvals ORDER BY 1"),
                self.query("SELECT COUNT(*) FROM messages"),
                [len(r.events) for r in self.recorders], len(self.server.requests))

    async def _settled(self, coro: Coroutine[Any, Any, T]) -> T:
        result = await coro
        await self.c.hub.idle()
        return result

    def press(self, user: User, approval_id: str, verdict: Verdict) -> Any:
        core = self.c
        return self.run(self._settled(core.hub.submit(
            Decision(core.key, user, approval_id, verdict))))

    # -- the model --------------------------------------------------------------------

    @rule(calls=st.lists(one_call, max_size=3), text=texts)
    def step(self, calls: list[tuple[str, int, bool]], text: str) -> None:
        """Queue one model step (0-3 tool calls), then a plain answer so the turn can end."""
        self._queue_step(calls, text)

    @rule(calls=st.lists(one_call, min_size=1, max_size=3), text=texts)
    def step_then_say(self, calls: list[tuple[str, int, bool]], text: str) -> None:
        """`step` and `say` at once: with rules drawn uniformly, cards are otherwise rare
        (about one example in a hundred pressed a card)."""
        self._queue_step(calls, text)
        self.say(text)

    def _queue_step(self, calls: list[tuple[str, int, bool]], text: str) -> None:
        if calls:  # a fixed id may repeat within a step too, as some providers send them
            self.queue.append(Reply(tool_calls=[spec(kind, n, fixed)
                                                for kind, n, fixed in calls]))
        self.queue.append(Reply(text=f"answer: {text}"))

    # -- people -----------------------------------------------------------------------

    @rule(text=texts)
    def say(self, text: str) -> None:
        self.run(self._settled(self._say(text)))

    async def _say(self, text: str) -> None:
        core = self.c
        self.sent.append(f"m{len(self.sent)}")
        await core.hub.submit(UserMessage(core.key, core.user, text, message_id=self.sent[-1]))

    @rule(text=texts, second=texts)
    def say_twice(self, text: str, second: str) -> None:
        """A second message while the first one's turn runs (or waits)."""
        async def both() -> None:
            await self._say(text)
            await self._say(second)

        self.run(self._settled(both()))

    @precondition(lambda self: bool(self.sent))
    @rule(pick=picks, text=texts)
    def edit(self, pick: int, text: str) -> None:
        """An edit of an earlier message: a note for the next turn, never an answer."""
        core = self.c
        turns, requests = self.query("SELECT COUNT(*) FROM turns"), len(self.server.requests)
        edit = Edit(core.key, core.user, self.sent[pick % len(self.sent)], f"{text} (edited)")
        self.run(self._settled(core.hub.submit(edit)))
        assert self.query("SELECT COUNT(*) FROM turns") == turns
        assert len(self.server.requests) == requests

    @rule(text=texts)
    def edit_of_a_message_never_seen(self, text: str) -> None:
        core = self.c
        before = self.snapshot()
        self.run(self._settled(core.hub.submit(Edit(core.key, core.user, "elsewhere", text))))
        assert self.snapshot() == before

    @precondition(has_live)
    @rule(pick=picks)
    def approve(self, pick: int) -> None:
        self._decide(pick, Verdict.APPROVE, "approved")

    @precondition(has_live)
    @rule(pick=picks)
    def deny(self, pick: int) -> None:
        self._decide(pick, Verdict.DENY, "denied")

    @precondition(has_live)
    @rule(pick=picks)
    def always(self, pick: int) -> None:
        self._decide(pick, Verdict.ALWAYS, "always")

    def _decide(self, pick: int, verdict: Verdict, outcome: str) -> None:
        live = self.live()
        approval_id = live[pick % len(live)]
        if any(e.reminder for e in self.events(ApprovalRequested)
               if e.approval_id == approval_id):
            event("a card shown again after a restart was decided")
        receipt = self.press(self.c.user, approval_id, verdict)
        assert receipt.accepted, receipt
        outcomes = [e.outcome for e in self.events(ApprovalResolved)
                    if e.approval_id == approval_id]
        assert outcomes == [outcome], (approval_id, outcomes)

    @precondition(has_decided)
    @rule(pick=picks, verdict=verdicts)
    def double_press(self, pick: int, verdict: Verdict) -> None:
        decided = self.decided()
        approval_id = decided[pick % len(decided)]
        before = self.snapshot()
        receipt = self.press(self.c.user, approval_id, verdict)
        assert not receipt.accepted and receipt.note and "Already decided" in receipt.note, \
            receipt
        assert self.snapshot() == before

    @precondition(has_live)
    @rule(pick=picks, verdict=verdicts)
    def stranger_presses(self, pick: int, verdict: Verdict) -> None:
        live = self.live()
        approval_id = live[pick % len(live)]
        before = self.snapshot()
        receipt = self.press(EVE, approval_id, verdict)
        assert not receipt.accepted and receipt.note and "not yours" in receipt.note, receipt
        assert self.snapshot() == before

    @precondition(has_live)
    @rule(pick=picks)
    def expire(self, pick: int) -> None:
        live = self.live()
        approval_id = live[pick % len(live)]
        core = self.c

        async def fire() -> None:
            # What a card's timer calls (`Approvals.arm` schedules it with call_later).
            core.hub.worker.due(core.key, approval_id)

        self.run(self._settled(fire()))
        outcomes = [e.outcome for e in self.events(ApprovalResolved)
                    if e.approval_id == approval_id]
        assert outcomes == ["expired"], (approval_id, outcomes)

    @rule()
    def cancel(self) -> None:
        core = self.c

        async def cancel() -> None:
            receipt = await core.hub.cancel(Cancel(core.key, core.user))
            assert receipt.accepted, receipt

        live = self.live()
        event(f"cancel: {'a waiting turn' if live else 'nothing waits'}")
        self.run(self._settled(cancel()))
        if live:  # the waiting turn is over: its cards are closed
            assert self.live() == [], self.live()

    @rule()
    def cancel_while_card_posted(self) -> None:
        self.cards += 1  # a command of its own: no "always" rule covers it
        self.queue.appendleft(Reply(tool_calls=[ToolCallSpec(
            "shell", {"command": f"echo card {self.cards}"})]))
        self.run(self._cancel_while_posted())

    async def _cancel_while_posted(self) -> None:
        core = self.c
        hold = HoldCards(core.sink)
        core.dispatch.sinks["console"] = hold
        waits: set[asyncio.Future[Any]] = set()
        try:
            asked = len(core.sink.of(ApprovalRequested))
            ended = len(core.sink.of(TurnEnded))
            await core.say("run the card command")
            waits = {asyncio.ensure_future(hold.posting.wait()),
                     asyncio.ensure_future(core.hub.idle())}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            posted = hold.posting.is_set()
            event(f"cancel_while_card_posted: card {'posted' if posted else 'never posted'}")
            receipt = await core.hub.cancel(Cancel(core.key, core.user))
            hold.release.set()
            await core.hub.idle()
            if posted:  # the turn ran (blocked in the emit): the cancel reached it
                assert receipt.note == "Cancelling…", receipt
                card = core.sink.of(ApprovalRequested)[asked]
                assert [e.outcome for e in self.events(ApprovalResolved)
                        if e.approval_id == card.approval_id] == ["cancelled"]
                # the turn that posted it ends cancelled (a parked scheduled run may follow)
                assert [e.reason for e in core.sink.of(TurnEnded)[ended:]][:1] == ["cancelled"]
        finally:
            hold.release.set()
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            core.dispatch.sinks["console"] = core.sink

    @precondition(has_live)
    @rule(pick=picks, verdict=verdicts)
    def decide_then_killed(self, pick: int, verdict: Verdict) -> None:
        """A press is stored, then Tandem dies before the turn goes on: the next start
        lets the turn go on whatever the decision (a Deny used to end it silently)."""
        live = self.live()
        approval_id = live[pick % len(live)]
        self.run(self._decide_then_killed(approval_id, verdict))

    async def _decide_then_killed(self, approval_id: str, verdict: Verdict) -> None:
        core = self.c
        dying = DiesAfterTheDecision(core.sink)
        core.dispatch.sinks["console"] = dying
        try:
            await core.hub.submit(Decision(core.key, core.user, approval_id, verdict))
            idle = asyncio.ensure_future(core.hub.idle())
            dead = asyncio.ensure_future(dying.dead.wait())
            await asyncio.wait({idle, dead}, return_when=asyncio.FIRST_COMPLETED)
            for waiting in (idle, dead):
                waiting.cancel()
            if dying.killed:  # the dead process's work ends with it
                closed = asyncio.ensure_future(core.hub.lanes.close())
                await asyncio.sleep(0)  # its lanes drop what waits, then wait for the turn
                dying.release.set()
                await closed
        finally:
            dying.release.set()
            core.dispatch.sinks["console"] = core.sink
        event(f"decide_then_killed: {verdict.value}, {'killed' if dying.killed else 'lived'}")
        ended = len(self.events(TurnEnded))
        await self._restart()
        await self.c.hub.idle()
        if dying.killed and not self.live():  # decided: the turn went on, and ended
            assert len(self.events(TurnEnded)) > ended, "the turn ended silently"

    @rule(calls=st.lists(one_call, min_size=1, max_size=2), text=texts)
    def say_while_thinking(self, calls: list[tuple[str, int, bool]], text: str) -> None:
        """A message sent while the model is still streaming the step that shows a card:
        it never supersedes that card (nobody could have decided it yet)."""
        self.queue.appendleft(Reply(text="thinking " + " ".join(str(i) for i in range(40)),
                                    chunk_size=4, chunk_delay=0.005,
                                    tool_calls=[spec(k, n, f) for k, n, f in calls]))
        self.queue.append(Reply(text=f"answer: {text}"))
        self.run(self._say_while_thinking(text))

    async def _say_while_thinking(self, text: str) -> None:
        core = self.c
        shown = len(core.sink.of(Progress))
        await core.say("look into it")  # (supersedes a card that waits: sent after it)
        await core.sink.wait(lambda: any(p.text.startswith("thinking")
                                          for p in core.sink.of(Progress)[shown:]))
        superseded = sum(e.outcome == "superseded" for e in self.events(ApprovalResolved))
        await core.say(text)
        await core.hub.idle()
        assert sum(e.outcome == "superseded" for e in self.events(ApprovalResolved)) \
            == superseded

    @rule(turn=st.integers(1, 3))
    def cancel_from_an_old_session(self, turn: int) -> None:
        """A ⏹ of an earlier session's turn (numbers start again after `/new`) changes
        nothing."""
        core = self.c
        conv = core.hub.convs.cached(core.key)
        session = conv.row.session if conv is not None else 1
        before = self.snapshot()
        receipt = self.run(self._settled(core.hub.cancel(
            Cancel(core.key, core.user, turn=turn, session=session - 1))))
        assert receipt.note != "Cancelling…", receipt
        assert self.snapshot()[:4] == before[:4]

    @rule()
    def new_session(self) -> None:
        """`/new` ends the waiting turn and closes its cards. A message that waited for
        one of them is answered then, in the new session (its own card may be live)."""
        core = self.c
        before = self.live()
        self.run(self._settled(core.hub.submit(Command(core.key, core.user, "new"))))
        assert not set(before) & set(self.live()), (before, self.live())
        sessions = {s for (s,) in self.query("SELECT session FROM conversations")}
        stale = self.query("SELECT a.id FROM approvals a JOIN conversations c ON c.id ="
                           " a.conv_id WHERE a.status = 'pending' AND a.session < c.session")
        assert stale == [], (stale, sessions)

    @rule()
    def scheduled_run(self) -> None:
        core = self.c

        async def deliver() -> None:
            core.hub.deliver(Trigger(core.key, "job1", "scheduled prompt", requester="u1"))

        self.run(self._settled(deliver()))

    @rule()
    def restart(self) -> None:
        self.run(self._restart())

    async def _restart(self) -> None:
        event(f"restart: {'with live cards' if self.live() else 'idle'}")
        core, self.core = self.c, None
        await core.__aexit__(None, None, None)
        await self._open()

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def calls_are_answered_once(self) -> None:
        turns = self.query("SELECT conv_id, session, turn, status FROM turns")
        unfinished = {(c, s, n) for c, s, n, status in turns if status != "done"}
        running = [t for t in turns if t[3] not in ("done", "suspended")]
        assert running == [], running  # settled: nothing runs, a turn waits for a human
        results = Counter((c, s, i) for c, s, i in self.query(
            "SELECT conv_id, session, tool_call_id FROM messages WHERE role='tool'"))
        calls = self.query("SELECT conv_id, session, call_id, turn, state FROM tool_calls")
        for c, s, call_id, n, state in calls:
            if (c, s, n) in unfinished and state != "finished":  # waits: never submitted
                assert state in OPEN_CALL_STATES, (c, s, call_id, n, state)
                assert results[(c, s, call_id)] == 0, (c, s, call_id, n, state)
            else:  # a finished call of the waiting turn (it ran before the card) is too
                assert state == "finished", (c, s, call_id, n, state)
                assert results[(c, s, call_id)] == 1, (c, s, call_id, results[(c, s, call_id)])
        known = {(c, s, i) for c, s, i, _n, _st in calls}
        assert set(results) <= known, set(results) - known  # no result without its call

    @invariant()
    def approvals_are_resolved_once(self) -> None:
        resolved = self.resolved()
        assert all(n == 1 for n in resolved.values()), resolved
        unfinished = {(c, s, n) for c, s, n in self.query(
            "SELECT conv_id, session, turn FROM turns WHERE status <> 'done'")}
        calls = {(c, s, i): (n, state) for c, s, i, n, state in self.query(
            "SELECT conv_id, session, call_id, turn, state FROM tool_calls")}
        requested = {e.approval_id for e in self.events(ApprovalRequested)}
        outcomes = {e.approval_id: e.outcome for e in self.events(ApprovalResolved)}
        for approval_id, c, s, call_id, status in self.query(
                "SELECT id, conv_id, session, call_id, status FROM approvals"):
            assert approval_id in requested, (approval_id, status)  # its card was shown
            if status == "pending":
                n, state = calls[(c, s, call_id)]
                assert state == "asking" and (c, s, n) in unfinished, \
                    (approval_id, call_id, n, state)
                assert approval_id not in resolved, approval_id
            else:  # its one ApprovalResolved says what the store says
                assert resolved[approval_id] == 1, (approval_id, status)
                assert outcomes[approval_id] == status, (approval_id, status, outcomes)

    @invariant()
    def one_unfinished_turn_per_conversation(self) -> None:
        per_conv = Counter(c for (c,) in self.query(
            "SELECT conv_id FROM turns WHERE status <> 'done'"))
        assert all(n <= 1 for n in per_conv.values()), per_conv
        for approval_id, c, s in self.query(
                "SELECT a.id, a.conv_id, a.session FROM approvals a WHERE status='pending'"
                " AND NOT EXISTS (SELECT 1 FROM tool_calls k JOIN turns t ON t.conv_id ="
                " k.conv_id AND t.session = k.session AND t.turn = k.turn WHERE k.conv_id ="
                " a.conv_id AND k.session = a.session AND k.call_id = a.call_id AND"
                " t.status <> 'done')"):
            raise AssertionError(f"live card {approval_id} of a finished turn ({c}, {s})")

    @invariant()
    def the_model_accepts_every_history(self) -> None:
        assert self.server.violations == [], self.server.violations
        core = self.c
        conv = core.hub.convs.cached(core.key)
        if conv is None:
            return

        async def build() -> list[dict[str, Any]]:
            window = await core.hub.runner.window()
            return core.hub.d.prompt.build(conv, window).messages

        problem = validate_messages(self.run(build()))
        assert problem is None, problem.message

    @invariant()
    def events_are_about_stored_turns(self) -> None:
        core = self.c
        rows = self.query(
            "SELECT t.turn, t.status FROM turns t JOIN conversations c ON c.id = t.conv_id"
            f" WHERE c.platform = '{core.key.platform}' AND c.chat_id = '{core.key.chat_id}'")
        stored = {n for n, _status in rows}
        done = {n for n, status in rows if status == "done"}
        for e in self.events(Suspended):
            assert e.turn in stored, (e, sorted(stored))
        for e in self.events(TurnEnded):  # shown as over: the store says so too
            assert e.turn in done, (e, rows)

    # -- the end ----------------------------------------------------------------------

    def teardown(self) -> None:
        errors: list[BaseException] = []

        async def close() -> None:
            if self.core is not None:
                try:
                    await self.core.__aexit__(None, None, None)
                except BaseException as exc:  # keep closing the rest
                    errors.append(exc)
                self.core = None
            await llm.close()  # litellm's HTTP clients, while this loop still runs
            await self.server.close()

        try:
            self.loop.run_until_complete(close())
            leftover = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            if leftover:
                errors.append(AssertionError(f"tasks left running: {leftover}"))
                for task in leftover:
                    task.cancel()
                self.loop.run_until_complete(
                    asyncio.gather(*leftover, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
        if errors:
            raise errors[0]
        started = [t for t in threading.enumerate() if t not in self.threads]
        for thread in started:
            thread.join(timeout=2)
        assert not [t for t in started if t.is_alive()], started
        bad = [e.text for r in self.recorders for e in r.events
               if isinstance(e, Notice | TurnEnded) and any(b in e.text for b in BAD_NOTICES)]
        assert bad == [], bad


LifecycleMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=15, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestLifecycle = LifecycleMachine.TestCase


class SteerMachine(LifecycleMachine):
    """The same rules and invariants with `busy: steer`: a message sent while a turn runs
    joins it before its next model call (the history stays valid for the model)."""

    busy = "steer"


SteerMachine.TestCase.settings = settings(
    max_examples=max(EXAMPLES // 2, 5), stateful_step_count=15, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestSteer = SteerMachine.TestCase


async def test_two_calls_with_one_id_in_one_step(model: FakeModelServer,
                                                 config_factory: Any) -> None:
    """Found by the machine (its shortest failing example, before the fix):

        state = LifecycleMachine()
        state.step_then_say(calls=[('shell', 0, True), ('shell', 0, True)], text='hello')
        state.calls_are_answered_once()   # AssertionError: [(1, 1, 1, 'running')]
        state.teardown()   # AssertionError: ["Tandem's database is unavailable. ..."]

    The model answers one step with two calls that share the id "call_0".

    Both calls kept "call_0" (ids were made unique against earlier steps only), the
    store's primary key refused the step and the user read "Tandem's database is
    unavailable". Each call now gets a session-unique id as it is read.
    """
    twice = Reply(tool_calls=[ToolCallSpec("list_dir", {"path": "."}, FIXED_ID),
                              ToolCallSpec("list_dir", {"path": "."}, FIXED_ID)])
    model.script(twice, Reply(text="Listed twice."))
    async with Core(config_factory()) as core:
        await core.say("look twice")
        [ended] = await core.sink.ended()
        await core.hub.idle()
    assert (ended.reason, ended.text) == ("completed", "Listed twice.")
