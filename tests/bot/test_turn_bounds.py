"""A turn's first and last moments in the core: an error right after it is stored, a
decision that a kill cuts off from the turn going on, and a turn resumed after a reload.
The real hub, SQLite and litellm against the strict fake model."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bot.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    Attachment,
    Cancel,
    Command,
    Decision,
    Event,
    Notice,
    Progress,
    Trigger,
    TurnEnded,
    TurnStarted,
    UserMessage,
    Verdict,
)
from tests.bot.test_media import wav
from tests.conftest import Core, Recorder
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.waiting import eventually


def turns(tmp_path: Path) -> list[tuple[int, str, str | None]]:
    with sqlite3.connect(tmp_path / "tandem.db") as conn:
        return conn.execute("SELECT turn, status, reason FROM turns ORDER BY turn").fetchall()


async def test_an_error_as_the_turn_begins_ends_it_in_the_store(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    """The system prompt outgrew the window: the turn is stored, then cannot go on. It
    ends as an error where the user sees it, and the next message is not told of an
    interrupted answer."""
    model.script(Reply(text="Fine again."))
    config = config_factory(persona__max_file_chars=400_000)
    agent = tmp_path / "persona" / "AGENT.md"
    normal = agent.read_text()
    agent.write_text(normal + "\n" + "word " * 40_000)  # ~50k tokens: over the window
    async with Core(config) as core:
        await core.say("hello")
        [failed] = await core.sink.ended()
        agent.write_text(normal)
        await core.say("and now?")
        ended = await core.sink.ended(2)
        await core.hub.idle()
    assert failed.reason == "error" and "context" in failed.text.lower()
    assert ended[1].text == "Fine again."
    assert not any("interrupted" in n.text for n in core.sink.of(Notice))
    assert turns(tmp_path) == [(1, "done", "error"), (2, "done", "completed")]
    assert len(model.requests) == 1


class Killed(Exception):
    pass


class DiesShowingTheDecision(Recorder):
    """Tandem is killed right after it stored a decision, before the turn goes on."""

    async def emit(self, event: Event) -> None:
        await super().emit(event)
        if isinstance(event, ApprovalResolved):
            raise Killed  # the lane stops here, as at a kill; the store is left as it was


async def test_deny_then_a_kill_before_the_turn_goes_on(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    """After an Approve in that window the turn goes on at the next start; after a Deny it
    must too: the model reads the denial and answers."""
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "touch x"})]),
                 Reply(text="Understood, I did not touch it."))
    config = config_factory()
    async with Core(config) as core:
        await core.say("touch x")
        [asked] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        dying = DiesShowingTheDecision()
        core.dispatch.sinks["console"] = dying
        await core.hub.submit(Decision(core.key, core.user, asked.approval_id, Verdict.DENY))
        await dying.wait(lambda: dying.of(ApprovalResolved))
        await core.hub.idle()
    assert turns(tmp_path) == [(1, "suspended", None)]
    async with Core(config) as again:
        [ended] = await again.sink.ended()
        await again.hub.idle()
    assert ended.text == "Understood, I did not touch it."
    assert len(model.requests) == 2
    results = [m["content"] for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert "did not approve" in results[0]
    assert turns(tmp_path) == [(1, "done", "completed")]
    assert not (tmp_path / "workspace" / "x").exists()


class FailsOnce(Recorder):
    """Showing the turn's progress fails once (a chat that refused the update)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    async def emit(self, event: Event) -> None:
        if isinstance(event, Progress) and not self.failed:
            self.failed = True
            raise RuntimeError("the chat refused it")
        await super().emit(event)


async def test_a_turn_that_fails_while_it_runs_ends_in_the_store(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(Reply(text="Fine again."))
    config = config_factory()
    async with Core(config) as core:
        failing = FailsOnce()
        core.dispatch.sinks["console"] = failing
        await core.say("hello")
        [failed] = await failing.ended()
        await core.say("and now?")
        ended = await failing.ended(2)
        await core.hub.idle()
    assert failed.reason == "error"
    assert ended[1].text == "Fine again."
    assert not any("interrupted" in n.text for n in failing.of(Notice))
    assert turns(tmp_path) == [(1, "done", "error"), (2, "done", "completed")]


async def test_a_turn_resumed_after_a_restart_is_trimmed_like_before_its_pause(
        model: FakeModelServer, config_factory: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """A long conversation pauses for an approval and Tandem restarts: the turn goes on
    with the history it had, not after an emergency trim (half the budget, no summary)."""
    model.responder = lambda _m: Reply(text=" ".join(f"w{i}" for i in range(500)))
    config = config_factory(llm__context_window=6000, llm__max_output_tokens=500)
    async with Core(config) as core:
        for i in range(6):
            await core.say(f"question {i} " + "x" * 2000)
            await core.sink.ended(i + 1)
        model.responder = None
        model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "echo hi"})]),
                     Reply(text="Done."))
        await core.say("run it")
        await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
    paused = model.requests[-1]["messages"]
    async with Core(config) as again:
        [asked] = await again.sink.wait(lambda: again.sink.of(ApprovalRequested))
        await again.hub.submit(Decision(again.key, again.user, asked.approval_id,
                                        Verdict.APPROVE))
        [ended] = await again.sink.ended()
    assert ended.text == "Done."
    assert "emergency trim" not in caplog.text
    resumed = str(model.requests[-1]["messages"])
    assert "question 5" in str(paused) and "question 5" in resumed  # the last turns stay
    assert "question 4" in str(paused) and "question 4" in resumed


class SlowPort:
    """A platform whose download does not finish until released."""

    platform_name = "Console"
    download_limit = upload_limit = 20 * 1024 * 1024

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def download(self, attachment: Attachment, dest: Path, limit: int) -> int:
        self.started.set()
        await self.release.wait()
        data = wav()
        dest.write_bytes(data)
        return len(data)


async def test_a_stop_while_a_voice_note_is_fetched_stops_it(
        model: FakeModelServer, config_factory: Any) -> None:
    """`/stop` while the message's file is still being fetched (or transcribed): it used to
    wait behind the turn, which then went on and answered."""
    model.script(Reply(text="Answered the next one."))
    config = config_factory()
    async with Core(config) as core:
        port = SlowPort()
        core.dispatch.ports["console"] = port
        await core.hub.submit(UserMessage(core.key, core.user, "", ref="m1", attachments=(
            Attachment("voice.ogg", "audio/ogg", 0, "voice", "v1"),)))
        await asyncio.wait_for(port.started.wait(), 10)
        receipt = await core.hub.submit(Cancel(core.key, core.user))
        told = await core.sink.wait(lambda: [n for n in core.sink.of(Notice)
                                             if "Cancelled" in n.text])
        await core.hub.idle()
        assert model.transcriptions == [] and model.requests == []
        await core.say("something else", ref="m2")
        [ended] = await core.sink.ended()
    assert receipt.note == "Cancelling…"
    assert told[0].text == "⏹ Cancelled."
    assert ended.text == "Answered the next one."
    assert len(model.requests) == 1 and "voice" not in str(model.requests[0]["messages"])
    async with Core(config) as again:  # the stopped message is not taken up again
        await again.hub.idle()
    assert again.sink.events == [] and len(model.requests) == 1


async def test_a_stop_during_the_summary_call_ends_the_turn_at_once(
        model: FakeModelServer, config_factory: Any) -> None:
    from bot.turn.compaction import SUMMARY_PROMPT

    marker = SUMMARY_PROMPT.split(".")[0]

    def respond(messages: list[dict[str, Any]]) -> Reply:
        if marker in str(messages[0]["content"]):
            return Reply(fault="hang")  # the summary call takes its time
        return Reply(text=" ".join(f"w{i}" for i in range(300)))

    model.responder = respond
    config = config_factory(llm__context_window=6000, llm__max_output_tokens=500,
                            llm__timeout_s=30, context__summary=True)
    def summarizing() -> bool:
        return any(marker in str(r["messages"][0]["content"]) for r in model.requests)

    async with Core(config) as core:
        n = 0
        while not summarizing():
            await core.say(f"question {n} " + "x" * 2000)
            n += 1
            await eventually(lambda n=n: len(core.sink.of(TurnEnded)) >= n
                             or summarizing())
        answered = len(model.requests)
        receipt = await core.hub.submit(Cancel(core.key, core.user))
        ended = await core.sink.ended(n, timeout=5)
    assert receipt.note == "Cancelling…"
    assert ended[-1].reason == "cancelled" and ended[-1].turn == n
    assert len(model.requests) == answered  # the turn's own model call never went out


async def test_a_message_sent_while_the_model_thinks_waits_for_the_card_it_shows(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    """The message came before the card existed: nobody could have decided it, so it
    does not supersede it. It waits for the decision, then is answered."""
    model.script(Reply(text="Let me look first. " * 20, chunk_size=5, chunk_delay=0.01,
                       tool_calls=[ToolCallSpec("shell", {"command": "touch ran"})]),
                 Reply(text="Touched it."), Reply(text="Here is the other thing."))
    async with Core(config_factory()) as core:
        await core.say("touch it")
        await core.sink.wait(lambda: any(p.text for p in core.sink.of(Progress)))
        await core.say("and tell me the other thing too")
        [asked] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        await core.sink.wait(lambda: any("once the approval" in n.text
                                         for n in core.sink.of(Notice)))
        assert core.sink.of(ApprovalResolved) == []  # the card is still live
        await core.hub.submit(Decision(core.key, core.user, asked.approval_id,
                                       Verdict.APPROVE))
        ended = await core.sink.ended(2)
    assert [e.text for e in ended] == ["Touched it.", "Here is the other thing."]
    assert [r.outcome for r in core.sink.of(ApprovalResolved)] == ["approved"]
    assert (tmp_path / "workspace" / "ran").exists()
    assert not any("instead of deciding" in n.text for n in core.sink.of(Notice))
    assert "the other thing" in str(model.requests[2]["messages"][-2:])


async def test_a_message_sent_while_the_card_waits_supersedes_it(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "touch ran"})]),
                 Reply(text="Something else, then."))
    async with Core(config_factory()) as core:
        await core.say("touch it")
        await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        await core.hub.idle()
        await core.say("no, something else")
        [ended] = await core.sink.ended()
    assert ended.text == "Something else, then."
    assert [r.outcome for r in core.sink.of(ApprovalResolved)] == ["superseded"]
    assert not (tmp_path / "workspace" / "ran").exists()


async def test_a_cancel_button_from_before_new_stops_nothing(
        model: FakeModelServer, config_factory: Any) -> None:
    """Turn numbers start at 1 again after `/new`: an old ⏹ of turn 1 must not stop the new
    session's turn 1."""
    model.script(Reply(text="first"), Reply(text="slow " * 60, chunk_size=5, chunk_delay=0.01))
    async with Core(config_factory()) as core:
        await core.say("one")
        [first] = await core.sink.ended()
        conv = core.hub.convs.cached(core.key)
        assert conv is not None
        old = conv.row.session
        await core.hub.submit(Command(core.key, core.user, "new"))
        await core.say("two")
        await core.sink.wait(lambda: any(p.text.startswith("slow")
                                         for p in core.sink.of(Progress)))
        started = core.sink.of(TurnStarted)[-1]
        stale = await core.hub.cancel(Cancel(core.key, core.user, turn=first.turn, session=old))
        ended = await core.sink.ended(2)
    assert started.turn == first.turn and started.session != old
    assert stale.note == "That turn is already over."
    assert ended[-1].reason == "completed"


async def test_the_cancel_button_of_the_running_turn_stops_it(
        model: FakeModelServer, config_factory: Any) -> None:
    model.script(Reply(text="slow " * 200, chunk_size=5, chunk_delay=0.01))
    async with Core(config_factory()) as core:
        await core.say("one")
        [started] = await core.sink.wait(lambda: core.sink.of(TurnStarted))
        await core.sink.wait(lambda: any(p.text for p in core.sink.of(Progress)))
        receipt = await core.hub.cancel(Cancel(core.key, core.user, turn=started.turn,
                                               session=started.session))
        [ended] = await core.sink.ended()
    assert receipt.note == "Cancelling…" and ended.reason == "cancelled"


@pytest.mark.parametrize("summary", [False, True], ids=["plain", "summary"])
async def test_memory_holds_the_window_not_the_whole_session(
        model: FakeModelServer, config_factory: Any, tmp_path: Path, summary: bool) -> None:
    """A long conversation keeps in memory what its turns need (the window, and what the
    summary does not cover yet); the rest stays in the store."""
    model.responder = lambda m: Reply(text="Ann asked things ." if "compacting" in str(
        m[0]["content"]) else " ".join(f"w{i}" for i in range(300)))
    config = config_factory(llm__context_window=6000, llm__max_output_tokens=500,
                            context__summary=summary)
    async with Core(config) as core:
        for i in range(20):
            await core.say(f"question {i} " + "x" * 2000)
            await core.sink.ended(i + 1)
        await core.hub.idle()
        conv = core.hub.convs.cached(core.key)
        assert conv is not None
        in_memory, cut, dropped = len(conv.history), conv.cut, conv.dropped_turns
        last = model.requests[-1]["messages"]
    with sqlite3.connect(tmp_path / "tandem.db") as db:
        (stored,) = db.execute("SELECT COUNT(*) FROM messages").fetchone()
    assert stored == 40
    in_view = sum(1 for m in last if m["role"] == "user" and "question" in str(m["content"]))
    assert in_memory - cut == 2 * in_view  # the window: each turn a question and an answer
    assert in_memory <= 2 * in_view + 2  # at most one turn beyond it, not the session
    assert dropped == 20 - in_view
    assert "question 19" in str(last) and "question 0 " not in str(last)


async def test_a_message_after_the_card_supersedes_it_while_the_lane_is_busy(
        model: FakeModelServer, config_factory: Any) -> None:
    """The card was shown first; the message comes while the conversation's lane handles
    something else (a scheduled run that waits for the card): the message was sent after
    the card, so it supersedes it and is answered."""
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "touch ran"})]),
                 Reply(text="Something else, then."), Reply(text="The report."))
    async with Core(config_factory()) as core:
        await core.say("touch it")
        await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        await core.hub.idle()
        core.hub.deliver(Trigger(core.key, "job1", "post the report", requester="u1"))
        await core.say("no, something else")
        ended = await core.sink.ended(2)
    assert ended[0].text == "Something else, then."
    assert [r.outcome for r in core.sink.of(ApprovalResolved)] == ["superseded"]
