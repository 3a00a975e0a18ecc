"""Load suite: many conversations at once through the Telegram adapter and its fake.

The model is in process and takes 200 ms per answer; every answer echoes a token unique
to its chat and turn. Telegram flood control is on with realistic settings (edits at
most one a second per chat, bursts of 3) and the adapter runs with its own defaults.

* N conversations x M turns at once, with a short human pause between turns: every chat
  gets exactly its own answers in order, no 429 in steady state, memory bounded.
* Back to back: each chat sends its next message within 50 ms of seeing the previous
  answer; every message is answered.
* A model stuck calling `list_dir` never floods the chat: progress edits one message,
  and the breaker (identical calls) or the step limit (200 distinct calls) ends the turn.

CI runs 50 x 4; `TANDEM_LOAD_LONG=1` runs 500 x 20. The figures (turns/s, RSS, 429s)
are printed: run with `-s` to see them.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.core.history import ToolCall
from bot.llm import Completion, Delta, StreamItem
from tests.conftest import said
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec, validate_messages
from tests.fakes.telegram_server import FakeTelegram
from tests.suites.harness import FaultyTelegram, rss_kb, tg_rig

LONG = os.environ.get("TANDEM_LOAD_LONG") == "1"
CHATS, TURNS = (500, 20) if LONG else (50, 4)
LATENCY = 0.2
RSS_GROWTH_MB = 600 if LONG else 150
DEFAULTS = {"min_edit_interval": 1.0, "placeholder_delay": 0.5, "typing_delay": 0.2,
            "typing_interval": 4.0}
"""The adapter's own settings (the other suites speed them up)."""
TOKEN = re.compile(r"tok-\d+-\d+")
FIRST_CHAT = 10_000


@dataclass
class EchoModel:
    """A `ModelClient` that answers after `latency` with the token of the last message."""

    latency: float = LATENCY
    model: str = "test/echo"
    calls: int = 0

    async def window(self) -> int:
        return 32_000

    async def stream(self, messages: Sequence[dict[str, Any]],
                     tools: Sequence[dict[str, Any]]) -> AsyncIterator[StreamItem]:
        self.calls += 1
        await asyncio.sleep(self.latency)
        tokens = TOKEN.findall(said(list(messages))[-1])
        text = "echo " + " ".join(tokens) if tokens else "no token"
        yield Delta(text)
        yield Completion(text, (), 100, 10)


@dataclass
class Figures:
    turns: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def line(self, name: str, fake: FakeTelegram, rss: tuple[int, int]) -> str:
        lat = sorted(self.latencies) or [0.0]
        p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        return (f"\n[load] {name}: {CHATS} chats x {TURNS} turns = {self.turns} turns in "
                f"{self.seconds:.1f} s = {self.turns / self.seconds:.1f} turns/s; answer "
                f"latency p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; RSS start "
                f"{rss[0] / 1024:.0f} MB, end {rss[1] / 1024:.0f} MB "
                f"(+{(rss[1] - rss[0]) / 1024:.0f} MB); 429s: {len(fake.rate_limited)}; "
                f"sendMessage {len(fake.calls_to('sendMessage'))}, editMessageText "
                f"{len(fake.calls_to('editMessageText'))}")


def answered(fake: FakeTelegram, chat: int, expected: str) -> bool:
    return any(m.from_bot and m.text == expected and not m.reply_markup
               for m in fake.chat(chat))


async def converse(fake: FaultyTelegram, chat: int, pause: tuple[float, float],
                   figures: Figures, rng: random.Random) -> None:
    """One user: a message, wait for its answer, pause, the next message."""
    for turn in range(TURNS):
        expected = f"echo tok-{chat}-{turn}"
        sent = time.monotonic()
        fake.push_message(chat, chat, f"please repeat tok-{chat}-{turn}", first_name=f"U{chat}")
        await fake.wait_chat(chat, lambda e=expected: answered(fake, chat, e), timeout=60)
        figures.latencies.append(time.monotonic() - sent)
        figures.turns += 1
        await asyncio.sleep(rng.uniform(*pause))


def check_answers(fake: FakeTelegram) -> None:
    """Every chat shows exactly its own answers, once each, in order: no cross-talk."""
    for chat in range(FIRST_CHAT, FIRST_CHAT + CHATS):
        shown = [t for t in fake.bot_texts(chat) if not t.startswith("👀")]
        assert shown == [f"echo tok-{chat}-{turn}" for turn in range(TURNS)], (chat, shown)


async def run_load(tmp_path: Path, model: FakeModelServer, pause: tuple[float, float],
                   name: str) -> tuple[FaultyTelegram, Figures]:
    echo = EchoModel()
    users = list(range(FIRST_CHAT, FIRST_CHAT + CHATS))
    figures = Figures()
    async with FaultyTelegram(edit_interval=1.0, burst=3, retry_after=1) as fake, \
            tg_rig(tmp_path, model, fake, adapter_args=DEFAULTS, allowed_users=users,
                   build_args={"model": echo}) as r:
        rss_start = rss_kb()
        rng = random.Random(7)
        started = time.monotonic()
        await asyncio.gather(*(converse(fake, chat, pause, figures, rng) for chat in users))
        figures.seconds = time.monotonic() - started
        await r.hub.idle()
        rss_end = rss_kb()
        assert fake.internal_errors == []
    print(figures.line(name, fake, (rss_start, rss_end)))
    assert echo.calls == CHATS * TURNS, "a turn was answered without its own model call"
    assert (rss_end - rss_start) / 1024 < RSS_GROWTH_MB
    return fake, figures


async def test_many_conversations_each_get_their_own_answers(tmp_path: Path,
                                                             model: FakeModelServer) -> None:
    fake, _ = await run_load(tmp_path, model, (0.8, 1.5), "steady")
    check_answers(fake)
    assert fake.rate_limited == [], fake.rate_limited[:10]


async def test_back_to_back_messages_are_all_answered(tmp_path: Path,
                                                      model: FakeModelServer) -> None:
    fake, figures = await run_load(tmp_path, model, (0.0, 0.05), "back-to-back")
    check_answers(fake)
    assert figures.turns == CHATS * TURNS


# ---- a model stuck in a loop -------------------------------------------------------------

CHAT = FIRST_CHAT


def loop_rig(tmp_path: Path, model: FakeModelServer, fake: FakeTelegram,
             **overrides: Any) -> Any:
    return tg_rig(tmp_path, model, fake, adapter_args=DEFAULTS, allowed_users=[CHAT],
                  overrides=overrides)


async def stuck_turn(fake: FakeTelegram, ending: str, timeout: float) -> tuple[int, int, str]:
    fake.push_message(CHAT, CHAT, "look around")
    await fake.wait_for(lambda: any(m.from_bot and ending in m.text and not m.reply_markup
                                    for m in fake.chat(CHAT)), timeout)
    sends = [c for c in fake.calls_to("sendMessage") if c.params.get("chat_id") == CHAT]
    edits = [c for c in fake.calls_to("editMessageText") if c.params.get("chat_id") == CHAT]
    return len(sends), len(edits), fake.bot_texts(CHAT)[-1]


async def test_identical_tool_calls_in_a_loop_are_stopped_by_the_breaker(
        tmp_path: Path, model: FakeModelServer) -> None:
    model.responder = lambda messages: Reply(
        tool_calls=[ToolCallSpec("list_dir", {"path": "."})])
    async with FakeTelegram(edit_interval=1.0, burst=3, retry_after=1) as fake, \
            loop_rig(tmp_path, model, fake) as r:
        started = time.monotonic()
        sends, edits, final = await stuck_turn(fake, "kept repeating", 60)
        took = time.monotonic() - started
        await r.hub.idle()
        assert fake.internal_errors == []
    calls = sum(m["role"] == "tool" for m in model.requests[-1]["messages"])
    print(f"\n[load] identical list_dir loop: {len(model.requests)} model calls, {calls} tool "
          f"results, {took:.1f} s, sendMessage {sends}, edits {edits}, 429s "
          f"{len(fake.rate_limited)}; final: {final!r}")
    assert sends <= 2 and fake.rate_limited == []
    assert "list_dir" in final and len(model.requests) <= 8  # 5 runs, 2 skips, the loop ends
    assert calls == 7


@dataclass
class LoopModel:
    """A `ModelClient` that always calls `list_dir` again, each time with other arguments.
    Every request it gets is checked with the strict fake's history rules."""

    model: str = "test/loop"
    requests: list[list[dict[str, Any]]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    async def window(self) -> int:
        return 32_000

    async def stream(self, messages: Sequence[dict[str, Any]],
                     tools: Sequence[dict[str, Any]]) -> AsyncIterator[StreamItem]:
        self.requests.append(list(messages))
        problem = validate_messages(list(messages))
        if problem is not None:
            self.violations.append(problem.message)
        n = len(self.requests)
        await asyncio.sleep(0.02)
        yield Delta("")
        path = json.dumps({"path": "./" * n})
        yield Completion("", (ToolCall(f"call_{n}", "list_dir", path),), 100, 10)


async def test_two_hundred_tool_calls_edit_one_message_and_the_step_limit_ends_it(
        tmp_path: Path, model: FakeModelServer) -> None:
    looping = LoopModel()
    async with FakeTelegram(edit_interval=1.0, burst=3, retry_after=1) as fake, \
            tg_rig(tmp_path, model, fake, adapter_args=DEFAULTS, allowed_users=[CHAT],
                   overrides={"limits": {"max_steps": 200}},
                   build_args={"model": looping}) as r:
        started = time.monotonic()
        sends, edits, final = await stuck_turn(fake, "I stopped after 200 steps", 120)
        took = time.monotonic() - started
        await r.hub.idle()
        assert fake.internal_errors == []
    results = [m for m in looping.requests[-1] if m["role"] == "tool"]
    print(f"\n[load] 200 distinct list_dir calls: {len(looping.requests)} model calls, "
          f"{len(results)} tool results in the last request, {took:.1f} s, sendMessage "
          f"{sends}, edits {edits} (max {fake.max_edit_rate(CHAT)}/s), 429s "
          f"{len(fake.rate_limited)}")
    assert looping.violations == []
    assert len(looping.requests) == 200 and sends <= 2
    assert fake.rate_limited == [] and fake.max_edit_rate(CHAT) <= 3
    assert edits <= took + 3  # about one a second
    assert all(not r["content"].startswith(("skipped", "error")) for r in results)
    [shown] = [m for m in fake.chat(CHAT) if m.from_bot]
    assert any("Running `list_dir`" in h or "Running list_dir" in h for h in shown.history)
