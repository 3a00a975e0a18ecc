"""⏹ Cancel on every Slack path, end to end: real slack-bolt/slack-sdk against the fake
Slack, the real hub and SQLite, the real litellm client against the fake model.

A turn still running after `cancel_delay` whose live surface has no ⏹ of its own (a chat
stream once it started, an assistant thread's status line) gets a "⏳ Working on it…"
status message with ⏹ Cancel in its thread; it is deleted once the answer is delivered,
when the turn pauses for an approval, or is cancelled. An updated placeholder (streams
refused or off, a DM's top level) carries ⏹ itself, and a quick answer costs no extra
call.

Timings are measured from the press (before the fake pushes the `block_actions`
payload, so its delivery and ack are included) to the turn's end as the core emits it,
to the `chat.stopStream` that closes the streamed answer, to the cut of the model's
stream at the fake model server, and to the death of a tool's processes.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import litellm  # noqa: F401 - loaded up front, not inside the first test's event loop
import pytest

from adapters.edge.turns import WORKING
from adapters.live import THINKING
from bot.core.buttons import CancelButton, pack
from tests.adapters.cancel_watch import Watch, slow_reply
from tests.adapters.test_slack import Rig, buttons
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.fakes.slack_server import Call, FakeSlackMessage, FakeSlackServer

CANCEL_DELAY = 0.5
"""The adapter's cancel_delay in these tests (the default, 1.5 s, only slows them)."""
STOP_WITHIN = 1.0
"""A press stops the turn, the model's stream and a tool's process within this."""
OFFER_ACTION = "tandem_button_0"
"""The action id of the status message's ⏹ (a notice's first button)."""
CANCEL_ACTION = "tandem_cancel"
"""The action id of a placeholder's own ⏹."""
ROOT = "How can I help?"
"""The text of the message of Tandem's that the tests' threads are under."""
CHAT_METHODS = {"chat.postMessage", "chat.update", "chat.delete", "chat.startStream",
                "chat.appendStream", "chat.stopStream"}
STREAM_METHODS = {"chat.startStream", "chat.appendStream", "chat.stopStream"}


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlackServer]:
    """Rate limits off (they only make these tests slow); the app may set a thread's
    status (`assistant:write`), which it does only with `slack.assistant.enabled`."""
    async with FakeSlackServer(rate_limit=False, assistant=True) as server:
        yield server
        assert server.unexpected_socket_messages == []


def cancel_rig(fake: FakeSlackServer, model: FakeModelServer, tmp: Path, mode: str = "socket",
               *, cancel_delay: float | None = CANCEL_DELAY, **overrides: Any) -> Rig:
    """test_slack's Rig (acks within 3 s, none twice, no invalid model request) with the
    adapter's `cancel_delay` (None: the default)."""
    rig = Rig(fake, model, tmp, mode, **overrides)
    if cancel_delay is not None:
        rig.options["cancel_delay"] = cancel_delay
    return rig


# -- what the fake saw -------------------------------------------------------------------


def in_thread(m: FakeSlackMessage, thread: str | None) -> bool:
    return thread is None or m.thread_ts == thread


def working_posts(fake: FakeSlackServer, channel: str = "D1") -> list[Call]:
    """Every accepted chat.postMessage of the "Working on it" status message."""
    return [c for c in fake.calls_to("chat.postMessage")
            if c.error is None and c.params.get("channel") == channel
            and c.params.get("text") == WORKING]


def working_messages(fake: FakeSlackServer, channel: str = "D1",
                     thread: str | None = None) -> list[FakeSlackMessage]:
    """The status messages posted, in order: those still shown and those deleted."""
    every = [*fake.messages.get(channel, []), *fake.deleted]
    return sorted((m for m in every if m.bot and m.channel == channel and m.text == WORKING
                   and in_thread(m, thread)), key=lambda m: float(m.ts))


def shown(fake: FakeSlackServer, channel: str, ts: str) -> bool:
    return fake.message(channel, ts) is not None


def with_buttons(fake: FakeSlackServer, channel: str = "D1") -> list[FakeSlackMessage]:
    """Every bot message in the channel (threads included) that still has buttons."""
    return [m for m in fake.bot_messages(channel) if buttons(m)]


def button_elements(message: FakeSlackMessage) -> list[dict[str, Any]]:
    return [e for b in message.blocks or [] if b["type"] == "actions" for e in b["elements"]]


def deletes(fake: FakeSlackServer, channel: str = "D1") -> list[Call]:
    return [c for c in fake.calls_to("chat.delete") if c.params.get("channel") == channel]


def chat_calls(fake: FakeSlackServer, channel: str = "D1") -> list[Call]:
    return [c for c in fake.calls if c.method in CHAT_METHODS
            and c.params.get("channel") == channel and c.params.get("text") != ROOT]


# -- waiting and pressing ------------------------------------------------------------------


async def within(predicate: Callable[[], Awaitable[bool]], seconds: float) -> float:
    """Poll `predicate` (something no API call signals) until it holds; the seconds it
    took. Fails after `seconds`."""
    began = time.monotonic()
    while not await predicate():
        if time.monotonic() - began > seconds:
            raise AssertionError(f"not within {seconds} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - began


def sleeper(pattern: str) -> Callable[[], Awaitable[bool]]:
    """Whether a process whose command line matches `pattern` runs (`pgrep -f`)."""
    async def running() -> bool:
        proc = await asyncio.create_subprocess_exec(
            "pgrep", "-f", pattern, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        return await proc.wait() == 0

    return running


def negate(predicate: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[bool]]:
    async def negated() -> bool:
        return not await predicate()

    return negated


async def offered(r: Rig, watch: Watch, thread: str, *, late: float = 1.0,
                  timeout: float = 5.0) -> FakeSlackMessage:
    """Wait for the turn's status message with ⏹ in `thread`; check what it carries and
    when it came: not before cancel_delay from the turn's start, and at most `late`
    seconds after the later of that and the moment the surface lost a ⏹ of its own (the
    pre-stream placeholder deleted: a loaded machine may start the stream late)."""
    await r.fake.wait_for(lambda: any(buttons(m)
                                      for m in working_messages(r.fake, "D1", thread)),
                          timeout)
    [post] = working_posts(r.fake)
    [status] = working_messages(r.fake, "D1", thread)
    began, start = [(t, e) for t, e in watch.started() if e.conv.thread_id == thread][-1]
    [button] = button_elements(status)
    assert button["action_id"] == OFFER_ACTION and button["text"]["text"] == "⏹ Cancel"
    assert button["value"] == pack(CancelButton(start.turn, start.session))
    delay = r.adapter.cancel_delay
    lost = [c.time for c in deletes(r.fake) if c.time > began and c.time < post.time]
    due = max([began + delay, *lost])
    assert began + delay - 0.05 <= post.time <= due + late, (post.time - began, delay, lost)
    return status


async def timed_press(r: Rig, message: FakeSlackMessage, action_id: str) -> float:
    """U1 presses `action_id` on `message`; when the press began."""
    pressed = time.monotonic()
    await r.press(message.channel, "U1", message.ts, action_id)
    return pressed


async def cancelled_end(r: Rig, watch: Watch, pressed: float) -> float:
    """Wait for the turn's end; it is cancelled, and within STOP_WITHIN of the press."""
    await r.fake.wait_for(lambda: watch.ended())
    [(ended, event)] = watch.ended()
    assert event.reason == "cancelled", event
    took = ended - pressed
    assert 0 < took <= STOP_WITHIN, took
    return took


def stopped_stream_at(fake: FakeSlackServer, ts: str) -> float:
    """When the one chat.stopStream of the stream `ts` was answered."""
    [stop] = [c for c in fake.calls_to("chat.stopStream") if c.params.get("ts") == ts]
    assert stop.error is None, stop
    return stop.time


def nothing_stale(fake: FakeSlackServer, channel: str = "D1") -> None:
    """No bot message with a button, every status message gone, no stream left open."""
    assert with_buttons(fake, channel) == [], fake.dump()
    assert all(not shown(fake, channel, m.ts) for m in working_messages(fake, channel))
    assert all(not m.stream.streaming for m in fake.streams(channel) if m.stream), fake.dump()
    assert fake.duplicate_acks == []


async def thread_root(r: Rig) -> str:
    """A DM thread under a message of Tandem's own (its replies are a conversation of
    their own). Tandem is in it already: nothing earlier is read, so nothing makes the
    conversation ask before running a tool."""
    sent = await r.adapter.client.chat_postMessage(channel="D1", text=ROOT)
    return str(sent["ts"])


def bot(fake: FakeSlackServer, thread: str | None = None) -> list[FakeSlackMessage]:
    """Tandem's messages in D1 (or in one thread of it), but for the threads' roots."""
    return [m for m in fake.bot_messages("D1", thread) if m.text != ROOT]


def report(capsys: pytest.CaptureFixture[str], label: str, **timings: float) -> None:
    with capsys.disabled():
        print(f"\n[slack {label}] " + ", ".join(f"press → {what.replace('_', ' ')} "
                                                 f"{took * 1000:.0f} ms"
                                                 for what, took in timings.items()))


# -- streams: ⏹ beside the stream ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["socket", "http"])
async def test_a_slow_stream_in_a_thread_gets_a_cancel_that_stops_it(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path, mode: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    model.script(slow_reply())
    async with cancel_rig(fake, model, tmp_path, mode) as r:
        watch = Watch(r.adapter, model)
        thread = await thread_root(r)
        await r.say("D1", "U1", "talk a lot", thread_ts=thread)
        status = await offered(r, watch, thread)
        # the pre-stream placeholder (with its own ⏹) went when the stream started: the
        # status message's ⏹ is the only one, beside an answer still streaming
        await fake.wait_for(lambda: with_buttons(fake) == [status])
        [answer] = fake.streams("D1", thread)
        assert answer.stream is not None and answer.stream.streaming
        assert answer.text.startswith("word") and status.thread_ts == thread
        pressed = await timed_press(r, status, OFFER_ACTION)
        took = await cancelled_end(r, watch, pressed)
        await fake.wait_for(lambda: not shown(fake, "D1", status.ts))
        await r.settle()
    [cut] = watch.stream_ends
    stopped = stopped_stream_at(fake, answer.ts)
    assert 0 < cut - pressed <= STOP_WITHIN, cut - pressed
    assert 0 < stopped - pressed <= STOP_WITHIN, stopped - pressed
    [final] = bot(fake, thread)  # the answer is one message
    assert final is answer and final.stream is not None and final.stream.state == "stopped"
    assert final.visible_text.startswith("word") and final.visible_text.endswith("⏹ Cancelled.")
    assert final.visible_text.count("word") < 400  # cut, not finished
    [placeholder] = [m for m in fake.deleted if m.text != WORKING]
    assert buttons(placeholder) == [CANCEL_ACTION] and placeholder.thread_ts == thread
    assert [c.params["ts"] for c in deletes(fake)] == [placeholder.ts, status.ts]
    assert [c for c in fake.calls_to("chat.update") if c.params["ts"] == status.ts] == []
    assert len(working_posts(fake)) == 1 and fake.statuses == []
    assert fake.ephemerals == []  # the press took effect: nothing to tell the presser
    nothing_stale(fake)
    report(capsys, f"stream {mode}", turn_ended=took, stopStream=stopped - pressed,
           model_stream_cut=cut - pressed)


async def test_a_stream_that_starts_after_the_delay_takes_over_the_placeholders_cancel(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The first words come 0.7 s in, the next every 0.7 s: at cancel_delay the
    # placeholder still carries ⏹; once the stream replaced it, a status message does.
    model.script(Reply(text="word " * 20, chunk_size=5, chunk_delay=0.7))
    async with cancel_rig(fake, model, tmp_path) as r:
        watch = Watch(r.adapter, model)
        thread = await thread_root(r)
        await r.say("D1", "U1", "take a breath first", thread_ts=thread)
        status = await offered(r, watch, thread, late=2.0)
        [(began, _)] = watch.started()
        [start] = fake.calls_to("chat.startStream")
        [placeholder] = [m for m in fake.deleted if m.text != WORKING]
        assert buttons(placeholder) == [CANCEL_ACTION] and placeholder.thread_ts == thread
        [drop] = [c for c in deletes(fake) if c.params["ts"] == placeholder.ts]
        [post] = working_posts(fake)  # one offer, after the stream took the placeholder's place
        assert began + CANCEL_DELAY < start.time < drop.time < post.time
        assert post.time - drop.time <= 0.7 + 1.0  # ⏹ again by the next words
        assert with_buttons(fake) == [status]
        pressed = await timed_press(r, status, OFFER_ACTION)
        took = await cancelled_end(r, watch, pressed)
        await fake.wait_for(lambda: not shown(fake, "D1", status.ts))
        await r.settle()
    [cut] = watch.stream_ends
    assert 0 < cut - pressed <= STOP_WITHIN, cut - pressed
    [answer] = bot(fake, thread)
    assert answer.stream is not None and answer.stream.state == "stopped"
    assert answer.visible_text.startswith("word") and answer.visible_text.endswith("⏹ Cancelled.")
    assert [c.params["ts"] for c in deletes(fake)] == [placeholder.ts, status.ts]
    nothing_stale(fake)
    report(capsys, "late stream", turn_ended=took, model_stream_cut=cut - pressed)


async def test_a_stream_that_starts_after_the_delay_then_writes_a_long_tool_call_offers_cancel(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    # "Let me check." 0.7 s in (after cancel_delay), then a tool call whose arguments
    # stream for about 20 s (a long command, a file being written) with no more text.
    call = ToolCallSpec("shell", {"command": "echo " + "x" * 300})
    model.script(Reply(text="Let me check.", tool_calls=[call], chunk_size=13,
                       chunk_delay=0.7))
    async with cancel_rig(fake, model, tmp_path) as r:
        watch = Watch(r.adapter, model)
        thread = await thread_root(r)
        await r.say("D1", "U1", "check it", thread_ts=thread)
        await fake.wait_for(lambda: fake.deleted)  # the stream took the placeholder's place
        [start] = fake.calls_to("chat.startStream")
        [(began, _)] = watch.started()
        assert start.time > began + CANCEL_DELAY
        assert with_buttons(fake) == []  # the placeholder's ⏹ went with it
        status = await offered(r, watch, thread, late=2.0, timeout=1.5)  # ⏹ again, soon
        pressed = await timed_press(r, status, OFFER_ACTION)
        await cancelled_end(r, watch, pressed)
        await fake.wait_for(lambda: not shown(fake, "D1", status.ts))
        await r.settle()
    nothing_stale(fake)


async def test_a_running_tool_beside_a_stream_is_killed_by_the_cancel(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    seconds = f"30.{uuid.uuid4().int % 10**9:09d}"  # this test's own sleep, for pgrep
    running = sleeper(re.escape(f"sleep {seconds}"))
    model.script(Reply(text="Sleeping on it.",
                       tool_calls=[ToolCallSpec("shell", {"command": f"sleep {seconds}"})]))
    async with cancel_rig(fake, model, tmp_path, approvals__tools={"shell": "allow"}) as r:
        thread = await thread_root(r)
        # Joining the thread reads its earlier messages, which make a tool call ask
        # whatever its policy (Tandem's own root counts as such today: the adapter never
        # gives `Threads` the bot's ids); `/new` starts the conversation afresh.
        await r.say("D1", "U1", "/new", thread_ts=thread)
        await r.wait_text("D1", "Started a new conversation", thread=thread)
        await r.settle()
        fresh = {m.ts for m in bot(fake, thread)}
        watch = Watch(r.adapter, model)
        await r.say("D1", "U1", "sleep a while", thread_ts=thread)
        status = await offered(r, watch, thread)
        await within(running, 5.0)
        [answer] = fake.streams("D1", thread)
        assert answer.stream is not None and answer.stream.streaming
        assert with_buttons(fake) == [status]
        pressed = await timed_press(r, status, OFFER_ACTION)
        gone = await within(negate(running), STOP_WITHIN)
        took = await cancelled_end(r, watch, pressed)
        await fake.wait_for(lambda: not shown(fake, "D1", status.ts))
        await r.settle()
    assert not await running()
    stopped = stopped_stream_at(fake, answer.ts)
    assert 0 < stopped - pressed <= STOP_WITHIN, stopped - pressed
    # One message: the stream, stopped, then edited to the turn's end (the text of a step
    # that called a tool is not the answer: the message starts over, as after any tool)
    [final] = [m for m in bot(fake, thread) if m.ts not in fresh]
    assert final is answer and final.stream is not None and final.stream.state == "stopped"
    [start] = fake.calls_to("chat.startStream")
    assert start.params["markdown_text"] == "Sleeping on it."
    assert final.visible_text == "⏹ Cancelled." and not buttons(final)
    assert len(model.requests) == 1  # no model call after the cancel
    assert [c.params["ts"] for c in deletes(fake)][-1] == status.ts
    assert len(working_posts(fake)) == 1
    nothing_stale(fake)
    report(capsys, "stream+tool", process_gone=gone, turn_ended=took,
           stopStream=stopped - pressed)


async def test_a_slow_stream_removes_its_status_message_after_the_answer(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    answer_text = " ".join(f"w{i}" for i in range(120))  # 75 chunks 25 ms apart: ~1.9 s
    model.script(Reply(text=answer_text, chunk_size=8, chunk_delay=0.025))
    async with cancel_rig(fake, model, tmp_path) as r:
        watch = Watch(r.adapter, model)
        thread = await thread_root(r)
        await r.say("D1", "U1", "a longer answer", thread_ts=thread)
        status = await offered(r, watch, thread)
        await fake.wait_for(lambda: not shown(fake, "D1", status.ts))
        await r.settle()
    [(_, end)] = watch.ended()
    assert end.reason == "completed"
    [final] = bot(fake, thread)
    assert final.stream is not None and final.stream.state == "stopped"
    assert final.visible_text == answer_text and final.edits == []
    # exactly two calls for the offer: its post and its delete, after the answer's stop
    [post] = working_posts(fake)
    naming = [c for c in fake.calls if c.params.get("ts") == status.ts]
    assert [c.method for c in naming] == ["chat.delete"] and naming[0].error is None
    [delete] = naming
    assert delete.time >= stopped_stream_at(fake, final.ts)
    [placeholder] = [m for m in fake.deleted if m.ts != status.ts]
    calls = [c for c in chat_calls(fake) if c.method not in STREAM_METHODS]
    assert [(c.method, c.params.get("ts") or c.params.get("text")) for c in calls] == [
        ("chat.postMessage", THINKING),  # the pre-stream placeholder, with its own ⏹
        ("chat.delete", placeholder.ts),  # gone when the stream started
        ("chat.postMessage", WORKING),  # the status message, with ⏹
        ("chat.delete", status.ts),  # gone after the answer
    ], calls
    assert calls[2] is post
    nothing_stale(fake)


async def test_a_quick_answer_on_the_stream_path_costs_no_status_message(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    # The default cancel_delay (1.5 s), after a first model call elsewhere (it alone may
    # take half a second). A later, slow turn in another thread is the clock: its status
    # message is due cancel_delay after a start that follows the quick turn's end, so any
    # offer the quick turn left behind would have been posted by then. A placeholder is
    # due only after 1 s, so a quick answer is one message.
    model.script(Reply(text="Warm."), Reply(text="Quick."),
                 Reply(text="slow " * 100, chunk_size=5, chunk_delay=0.03))
    async with cancel_rig(fake, model, tmp_path, cancel_delay=None,
                          placeholder_delay=1.0) as r:
        assert r.adapter.cancel_delay == 1.5
        await r.say("D2", "U2", "warm up")  # another chat: the process's first model call
        await r.wait_text("D2", "Warm.")
        await r.settle()
        watch = Watch(r.adapter, model)
        quick = await thread_root(r)
        await r.say("D1", "U1", "quick?", thread_ts=quick)
        await r.wait_text("D1", "Quick.", thread=quick)
        await r.settle()
        [(began, _)], [(ended, _)] = watch.started(), watch.ended()
        assert ended - began < 0.8, "not a quick answer"
        clock = await thread_root(r)
        await r.say("D1", "U1", "take your time", thread_ts=clock)
        status = await offered(r, watch, clock)
        assert working_messages(fake, "D1", quick) == []
        await fake.wait_for(lambda: not shown(fake, "D1", status.ts))
        await r.settle()
    assert [e.reason for _, e in watch.ended()] == ["completed", "completed"]
    [answer] = bot(fake, quick)
    assert answer.visible_text == "Quick." and not buttons(answer)
    assert working_messages(fake, "D1", quick) == [] and len(working_posts(fake)) == 1
    # every delete was the clock turn's (its status message, and its placeholder if one
    # landed before its stream); none in the quick thread
    gone = {m.ts: m for m in fake.deleted}
    assert all(gone[c.params["ts"]].thread_ts == clock for c in deletes(fake)), fake.dump()
    assert status.ts in [c.params["ts"] for c in deletes(fake)]
    in_quick = [c for c in chat_calls(fake) if c.params.get("thread_ts") == quick
                or c.params.get("ts") == answer.ts]
    assert [c.method for c in in_quick] in (["chat.postMessage"],
                                            ["chat.startStream", "chat.stopStream"]), in_quick
    nothing_stale(fake)


# -- an assistant thread: ⏹ beside its status line ----------------------------------------


async def test_an_assistant_thread_gets_a_cancel_beside_its_status_line(
        model: FakeModelServer, tmp_path: Path, fake: FakeSlackServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The model "thinks" for about 4 s: a tool call whose arguments stream slowly, and no
    # text, so the thread shows only its status line.
    call = ToolCallSpec("shell", {"command": "echo " + "x" * 400})
    model.script(Reply(tool_calls=[call], chunk_size=2, chunk_delay=0.02))
    async with cancel_rig(fake, model, tmp_path, slack__assistant__enabled=True) as r:
        watch = Watch(r.adapter, model)
        thread = await thread_root(r)
        await r.say("D1", "U1", "think hard", thread_ts=thread)
        status = await offered(r, watch, thread)
        set_status = [c for c in fake.calls_to("assistant.threads.setStatus")
                      if c.error is None and c.params.get("thread_ts") == thread]
        assert set_status and set_status[0].params["status"] == "is thinking…"
        assert set_status[0].time < working_posts(fake)[0].time  # the status line first
        assert bot(fake, thread) == [status]  # no placeholder: the status line
        assert fake.calls_to("chat.startStream") == []
        pressed = await timed_press(r, status, OFFER_ACTION)
        took = await cancelled_end(r, watch, pressed)
        await fake.wait_for(lambda: not shown(fake, "D1", status.ts))
        await r.settle()
    [cut] = watch.stream_ends
    assert 0 < cut - pressed <= STOP_WITHIN, cut - pressed
    assert len(model.requests) == 1
    assert [m.visible_text for m in bot(fake, thread)] == ["⏹ Cancelled."]
    assert [c.params["ts"] for c in deletes(fake)] == [status.ts]
    assert fake.status_of("D1", thread) is None  # no status left claiming it still thinks
    nothing_stale(fake)
    report(capsys, "assistant", turn_ended=took, model_stream_cut=cut - pressed)


# -- updates: the placeholder carries ⏹ ------------------------------------------------------


@pytest.mark.parametrize("where", ["refused", "off", "top"],
                         ids=["thread-streams-refused", "thread-streaming-off", "dm-top-level"])
async def test_an_updated_placeholder_carries_its_own_cancel(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path, where: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    model.script(slow_reply())
    fake.refuse_streams = where == "refused"
    settings = {"slack__streaming": False} if where == "off" else {}
    async with cancel_rig(fake, model, tmp_path, **settings) as r:
        watch = Watch(r.adapter, model)
        thread = None if where == "top" else await thread_root(r)
        await r.say("D1", "U1", "talk a lot", thread_ts=thread)
        await fake.wait_for(lambda: any(m.visible_text.startswith("word") and buttons(m)
                                        for m in bot(fake)))
        [(began, start)] = watch.started()
        [placeholder] = bot(fake)

        def updates_past_the_delay() -> int:
            return len([c for c in fake.calls_to("chat.update") if c.error is None
                        and c.params.get("ts") == placeholder.ts
                        and c.time > began + CANCEL_DELAY])

        # the turn is well past cancel_delay and still streaming into the placeholder
        await fake.wait_for(lambda: updates_past_the_delay() >= 3)
        assert working_posts(fake) == []
        [button] = button_elements(placeholder)
        assert button["action_id"] == CANCEL_ACTION
        assert button["value"] == pack(CancelButton(start.turn, start.session))
        pressed = await timed_press(r, placeholder, CANCEL_ACTION)
        took = await cancelled_end(r, watch, pressed)
        await fake.wait_for(lambda: placeholder.visible_text.endswith("⏹ Cancelled.")
                            and not buttons(placeholder))
        await r.settle()
    [cut] = watch.stream_ends
    assert 0 < cut - pressed <= STOP_WITHIN, cut - pressed
    assert bot(fake) == [placeholder]  # the answer is the placeholder
    assert placeholder.thread_ts == thread and placeholder.stream is None
    assert placeholder.visible_text.startswith("word")
    assert placeholder.visible_text.count("word") < 400
    assert working_posts(fake) == [] and deletes(fake) == []
    assert len(fake.calls_to("chat.startStream")) == (1 if where == "refused" else 0)
    nothing_stale(fake)
    report(capsys, f"updates {where}", turn_ended=took, model_stream_cut=cut - pressed)


# -- approvals: the card's buttons, and no other ---------------------------------------


async def test_a_stream_paused_for_approval_drops_its_status_message(
        fake: FakeSlackServer, model: FakeModelServer, tmp_path: Path) -> None:
    # The text and the tool call stream for about 2 s, so the status message is up
    # before the card.
    echo = ToolCallSpec("shell", {"command": "echo hi > out.txt"})
    model.script(Reply(text="I will write it.", tool_calls=[echo], chunk_size=1,
                       chunk_delay=0.04),
                 Reply(text="Wrote it."))
    async with cancel_rig(fake, model, tmp_path, approvals__tools={"shell": "ask"}) as r:
        watch = Watch(r.adapter, model)
        thread = await thread_root(r)
        await r.say("D1", "U1", "write hi to out.txt", thread_ts=thread)
        status = await offered(r, watch, thread)
        [answer] = fake.streams("D1", thread)
        card = await r.card("D1")
        assert card.thread_ts == thread and float(card.ts) > float(status.ts)
        await fake.wait_for(lambda: not shown(fake, "D1", status.ts))
        assert with_buttons(fake) == [card]  # the card's buttons are the only ones
        assert buttons(card) == ["tandem_approve", "tandem_deny", "tandem_session", "tandem_always"]
        assert answer.stream is not None and answer.stream.state == "stopped"
        assert "I will write it." in answer.visible_text  # what the model said stays
        assert "Waiting for approval" in answer.visible_text
        assert watch.ended() == []  # paused, not over
        await r.press("D1", "U1", card.ts, "tandem_approve")
        await r.wait_text("D1", "Wrote it.", thread=thread)
        await fake.wait_for(lambda: not buttons(card) and watch.ended())
        await r.settle()
    assert (r.workspace / "out.txt").read_text() == "hi\n"
    assert [e.reason for _, e in watch.ended()] == ["completed"]
    assert [c.params["ts"] for c in deletes(fake)].count(status.ts) == 1
    nothing_stale(fake)
