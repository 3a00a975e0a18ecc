"""The turn's lifecycle under approvals, cancels, schedules and restarts, end to end.

Each test reproduces one defect seen from outside; they run the real hub on a real
SQLite store, the real litellm client and the strict fake model.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from bot.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    Cancel,
    Command,
    Decision,
    Event,
    Notice,
    Progress,
    Suspended,
    Trigger,
    TurnEnded,
    TurnStarted,
    Verdict,
)
from bot.core.history import CallState
from tests.conftest import Core, HoldCards, Recorder
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec


def shell(*commands: str, ids: tuple[str, ...] = ()) -> Reply:
    return Reply(tool_calls=[ToolCallSpec("shell", {"command": c}, ids[i] if ids else None)
                             for i, c in enumerate(commands)])


async def press(core: Core, verdict: Verdict, n: int = 1) -> Any:
    await core.sink.wait(lambda: len(core.sink.of(ApprovalRequested)) >= n)
    asked = core.sink.of(ApprovalRequested)[n - 1]
    return await core.hub.submit(Decision(core.key, core.user, asked.approval_id, verdict))


def db(tmp_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(tmp_path / "tandem.db")


async def test_a_restart_keeps_the_other_calls_of_a_suspended_turn(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    config = config_factory()
    model.script(shell("echo one > one.txt", "echo two > two.txt"), Reply(text="Both ran."))
    async with Core(config) as core:
        await core.say("write both")
        await core.sink.wait(lambda: core.sink.of(Suspended))
    async with Core(config) as fresh:
        [again] = await fresh.sink.wait(lambda: fresh.sink.of(ApprovalRequested))
        assert again.reminder
        await fresh.hub.submit(Decision(fresh.key, fresh.user, again.approval_id,
                                        Verdict.APPROVE))
        await press(fresh, Verdict.APPROVE, 2)  # the second call is asked, not interrupted
        [ended] = await fresh.sink.ended()
    assert ended.text == "Both ran."
    workspace = tmp_path / "workspace"
    assert (workspace / "one.txt").exists() and (workspace / "two.txt").exists()
    results = [m["content"] for m in model.last_messages() if m["role"] == "tool"]
    assert not any("interrupted" in r for r in results)


async def test_cancel_while_the_card_is_posted_closes_the_card(
        model: FakeModelServer, config_factory: Any) -> None:
    config = config_factory()
    model.script(shell("touch never"))
    async with Core(config) as core:
        slow = HoldCards(core.sink)
        core.dispatch.sinks["console"] = slow
        await core.say("touch it")
        await slow.posting.wait()
        assert (await core.hub.cancel(Cancel(core.key, core.user))).accepted
        slow.release.set()
        [ended] = await core.sink.ended()
        assert ended.reason == "cancelled"
        [asked] = core.sink.of(ApprovalRequested)
        resolved = core.sink.of(ApprovalResolved)
        assert [(r.approval_id, r.outcome) for r in resolved] == [(asked.approval_id,
                                                                    "cancelled")]
        row = await core.hub.d.store.approval(asked.approval_id)
        assert row is not None and row.status == "cancelled"
    async with Core(config) as fresh:
        await fresh.hub.idle()
        assert not any("expired" in n.text for n in fresh.sink.of(Notice))
        assert fresh.sink.of(ApprovalRequested) == []


async def test_a_stale_cancel_button_does_not_cancel_a_later_turn(
        model: FakeModelServer, config_factory: Any) -> None:
    model.script(Reply(text="first"), Reply(text="slow " * 60, chunk_size=5, chunk_delay=0.01))
    async with Core(config_factory()) as core:
        await core.say("one")
        [first] = await core.sink.ended()
        await core.say("two")
        await core.sink.wait(lambda: any(p.turn != first.turn for p in core.sink.of(Progress)))
        stale = await core.hub.cancel(Cancel(core.key, core.user, turn=first.turn))
        assert stale.note != "Cancelling…"
        ended = await core.sink.ended(2)
    assert ended[-1].reason == "completed"


async def test_a_scheduled_run_does_not_deny_a_pending_approval(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(shell("echo human > human.txt"), Reply(text="Ran it for you."),
                 Reply(text="Scheduled answer."))
    async with Core(config_factory()) as core:
        await core.say("please write")
        [asked] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        core.hub.deliver(Trigger(core.key, "job1", "post the report", requester="u1"))
        await core.sink.wait(lambda: any("Scheduled task job1" in n.text
                                         for n in core.sink.of(Notice)))
        row = await core.hub.d.store.approval(asked.approval_id)
        assert row is not None and row.status == "pending"
        await press(core, Verdict.APPROVE)
        ended = await core.sink.ended(2)
    assert [e.text for e in ended] == ["Ran it for you.", "Scheduled answer."]
    assert (tmp_path / "workspace" / "human.txt").read_text() == "human\n"


async def test_a_decision_is_stored_before_it_is_emitted(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(shell("touch no"), Reply(text="Not run."))
    seen: list[tuple[str, str | None]] = []

    class Checking:
        def __init__(self, core: Core) -> None:
            self.core = core

        async def emit(self, event: Event) -> None:
            if isinstance(event, ApprovalResolved):
                with db(tmp_path) as conn:
                    row = conn.execute("SELECT state, outcome FROM tool_calls").fetchone()
                    seen.append(row)
            await self.core.sink.emit(event)

    async with Core(config_factory()) as core:
        core.dispatch.sinks["console"] = Checking(core)
        await core.say("touch")
        await press(core, Verdict.DENY)
        await core.sink.ended()
    assert seen == [(CallState.FINISHED.value, "denied")]


async def test_a_success_loop_ends_after_ignored_skips(model: FakeModelServer,
                                                       config_factory: Any) -> None:
    model.responder = lambda _m: Reply(tool_calls=[ToolCallSpec("list_dir", {"path": "."})])
    async with Core(config_factory()) as core:
        await core.say("list forever")
        [ended] = await core.sink.ended()
    assert ended.reason == "breaker" and "kept repeating `list_dir`" in ended.text
    results = [m["content"] for m in model.last_messages() if m["role"] == "tool"]
    assert sum(1 for r in results if not r.startswith("skipped")) == 5
    assert len(model.requests) <= 8 and not any("failed" in r for r in results)


async def test_the_fatal_tier_ends_right_after_the_eighth_failure(
        model: FakeModelServer, config_factory: Any) -> None:
    count = iter(range(100))
    model.responder = lambda _m: shell(f"exit 1 # {next(count)}")
    async with Core(config_factory(approvals__tools={"shell": "allow"})) as core:
        await core.say("loop")
        [ended] = await core.sink.ended(timeout=30)
    assert ended.reason == "breaker" and "failed 8 times" in ended.text
    results = [m["content"] for m in model.last_messages() if m["role"] == "tool"]
    assert sum(1 for c in results if c.startswith("error: exit status 1")) == 7
    assert sum(1 for c in results if "failed 6 times" in c) == 1  # the warning, once
    assert len(model.requests) == 9  # 8 failures + the warned call; none after the 8th


async def test_sessions_do_not_collide_on_reused_call_ids(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    read = Reply(tool_calls=[ToolCallSpec("list_dir", {"path": "."}, "call_0")])
    model.script(read, Reply(text="one"), read, Reply(text="two"))
    async with Core(config_factory()) as core:
        await core.say("first")
        await core.sink.ended()
        await core.hub.submit(Command(core.key, core.user, "new"))
        await core.say("second")
        ended = await core.sink.ended(2)
    assert [e.text for e in ended] == ["one", "two"]
    with db(tmp_path) as conn:
        turns = conn.execute("SELECT session, turn, status FROM turns ORDER BY session").fetchall()
        calls = conn.execute("SELECT session, call_id FROM tool_calls ORDER BY session").fetchall()
    assert turns == [(1, 1, "done"), (2, 1, "done")]
    assert calls == [(1, "call_0"), (2, "call_0")]


async def test_the_requests_of_one_turn_are_prefixes_of_the_next(
        model: FakeModelServer, config_factory: Any) -> None:
    model.script(Reply(tool_calls=[ToolCallSpec("list_dir", {"path": "."})]),
                 Reply(tool_calls=[ToolCallSpec("list_dir", {"path": "."})]),
                 Reply(text="done"), Reply(text="again"))
    async with Core(config_factory()) as core:
        await core.say("look twice")
        await core.sink.ended()
        await core.say("and once more")
        await core.sink.ended(2)
    bodies = [r["messages"] for r in model.requests]
    for before, after in zip(bodies, bodies[1:], strict=False):
        head = before[:-1]  # without its state note
        assert json.dumps(after[:len(head)]) == json.dumps(head)
    for body in bodies:
        assert body[-1]["role"] == "user" and body[-1]["content"].startswith("[Current state")
        assert not any("Current state" in str(m.get("content")) for m in body[:-1])


async def test_calibration_covers_the_whole_request(model: FakeModelServer,
                                                    config_factory: Any,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A provider counting twice the estimate: the trim leaves room, no emergency trim."""
    def doubled(messages: list[dict[str, Any]]) -> Reply:
        from tests.fakes.model_server import estimate_prompt_tokens

        counted = 2 * estimate_prompt_tokens(messages, None) + 4000
        return Reply(text=" ".join(f"w{i}" for i in range(300)), usage=(counted, 300))
    model.responder = doubled
    model.context_limit = 9000
    config = config_factory(llm__context_window=9000, llm__max_output_tokens=500)
    with caplog.at_level(logging.WARNING):
        async with Core(config) as core:
            for i in range(10):
                await core.say(f"question {i} " + "x" * 1500)
                await core.sink.ended(i + 1)
            ended = core.sink.of(TurnEnded)
    assert all(e.reason == "completed" for e in ended)
    assert not any("emergency trim" in r.getMessage() for r in caplog.records)


async def test_a_new_message_tells_in_words_what_was_not_run(
        model: FakeModelServer, config_factory: Any) -> None:
    model.script(shell("rm -rf build"), Reply(text="ok, other thing"))
    config = config_factory()
    async with Core(config) as core:
        await core.say("clean up")
        await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
    async with Core(config) as fresh:  # as after a crash during the approval
        await fresh.sink.wait(lambda: fresh.sink.of(ApprovalRequested))
        await fresh.say("never mind, do the other thing")
        await fresh.sink.ended()
    notices = [n.text for n in fresh.sink.of(Notice)]
    assert any("Not run" in n and "`shell`" in n for n in notices)
    assert [r.outcome for r in fresh.sink.of(ApprovalResolved)] == ["superseded"]


async def test_one_repair_after_a_crash_even_with_a_message_waiting(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    config = config_factory(approvals__tools={"shell": "allow"})
    model.script(shell("sleep 30"))
    async with Core(config) as core:
        await core.say("long job")
        await core.sink.wait(lambda: any(p.tool == "shell" for p in core.sink.of(Progress)))
        core.hub.lanes.closing = True  # as if killed: nothing more is recorded
    with db(tmp_path) as conn:  # what a kill -9 leaves: the turn running, the call submitted
        conn.execute("UPDATE turns SET status='running', reason=NULL")
        conn.execute("UPDATE tool_calls SET state='submitted', outcome=NULL")
        conn.execute("DELETE FROM messages WHERE role='tool'")
        conn.execute("INSERT INTO inbound (ref, conv, kind, payload, done, received_at) "
                     "VALUES ('tg:9', 'console:c1', 'message', ?, 0, ?)",
                     (json.dumps({"conv": {"platform": "console", "chat_id": "c1",
                                           "thread_id": None},
                                  "user": {"id": "u1", "name": "Ann", "team": None},
                                  "text": "are you there?", "context": None}), time.time()))
    model.script(Reply(text="Yes."))
    async with Core(config) as fresh:
        [ended] = await fresh.sink.ended()
        await fresh.hub.idle()
    assert ended.text == "Yes."
    told = [n.text for n in fresh.sink.of(Notice) if "interrupted" in n.text]
    assert len(told) == 1
    results = [m["content"] for m in model.last_messages() if m["role"] == "tool"]
    assert len(results) == 1 and "Tandem stopped while this call was running" in results[0]


def _summarizing(fail: bool) -> Any:
    """A model that answers questions at length and summarizes when asked to."""
    from bot.turn.compaction import SUMMARY_PROMPT

    marker = SUMMARY_PROMPT.split(".")[0]

    def respond(messages: list[dict[str, Any]]) -> Reply:
        if marker in str(messages[0]["content"]):
            if fail:
                return Reply(fault="500")
            seen = str(messages[-1]["content"])  # the previous summary and the dropped turns
            covered = [f"q{q}" for q in range(20) if f"question {q} " in seen or f"q{q} " in seen]
            return Reply(text=f"Ann asked {' '.join(covered)} .")
        return Reply(text=" ".join(f"w{i}" for i in range(300)))
    return respond


@pytest.mark.parametrize("fail", [False, True], ids=["summary", "failed-summary"])
async def test_summary_compaction_keeps_what_the_trim_dropped(
        model: FakeModelServer, config_factory: Any, tmp_path: Path, fail: bool) -> None:
    from bot.turn.compaction import SUMMARY_HEADER

    model.responder = _summarizing(fail)
    config = config_factory(llm__context_window=6000, llm__max_output_tokens=500,
                            llm__retries=0, context__summary=True)
    async with Core(config) as core:
        for i in range(8):
            await core.say(f"question {i} " + "x" * 2000)
            await core.sink.ended(i + 1)
        ended = core.sink.of(TurnEnded)
    assert [e.reason for e in ended] == ["completed"] * 8  # a failed summary changes nothing
    answers = [r["messages"] for r in model.requests if "tools" in r]
    last = answers[-1]
    assert not any("question 0 " in str(m["content"]) for m in last[1:])  # trimmed
    with db(tmp_path) as conn:
        stored = conn.execute("SELECT text FROM summaries").fetchall()
    if fail:
        assert stored == [] and SUMMARY_HEADER not in last[0]["content"]
        return
    [(summary,)] = stored
    assert last[0]["content"].endswith(f"{SUMMARY_HEADER}\n{summary}")
    assert "q0 " in summary and "q1 " in summary  # the first questions are not lost
    summaries = [r for r in model.requests if "tools" not in r]
    assert all({m["role"] for m in r["messages"]} <= {"system", "user"} for r in summaries)
    # between two drops every request carries the same summary, byte for byte
    systems = {m[0]["content"] for m in answers if SUMMARY_HEADER in m[0]["content"]}
    assert len(systems) <= len(summaries)


async def test_an_answer_stored_but_never_shown_is_shown_after_a_restart(
        model: FakeModelServer, config_factory: Any) -> None:
    """A process that dies between storing a turn's answer and showing it: the next start
    shows it once, in the placeholder the first one posted when it had one, and a start
    after that shows nothing more."""
    model.script(Reply(text="The answer."), Reply(text="Quick."))
    config = config_factory()

    class DiesBeforeShowing(Recorder):
        def __init__(self, hub: Any, placeholder: bool) -> None:
            super().__init__()
            self.hub, self.placeholder = hub, placeholder

        async def emit(self, event: Event) -> None:
            if isinstance(event, TurnStarted) and self.placeholder:  # as an adapter does
                await self.hub.remember_live(event.conv, event.turn, {"message_id": 7})
            if isinstance(event, TurnEnded):  # the process is gone before the chat has it
                raise ConnectionError("killed")
            await super().emit(event)

    for placeholder, text in ((True, "The answer."), (False, "Quick.")):
        async with Core(config) as core:
            core.dispatch.sinks["console"] = dying = DiesBeforeShowing(core.hub, placeholder)
            await core.say("question")
            await core.hub.idle()
            assert dying.of(TurnEnded) == []
        async with Core(config) as fresh:  # its start shows what was never shown
            await fresh.hub.idle()
        [shown] = fresh.sink.of(TurnEnded)
        assert (shown.text, shown.reason) == (text, "completed")
        assert shown.live == ({"message_id": 7} if placeholder else None)
    async with Core(config) as again:  # its start found nothing more to show
        await again.hub.idle()
    assert again.sink.of(TurnEnded) == []
    assert len(model.requests) == 2
