"""The Telegram adapter under load: N private chats × M turns through FakeTelegram.

Everything real except the model: python-telegram-bot polls the fake Bot API over HTTP,
the hub runs on SQLite on disk, and an instant in-process model answers every call. The
fake and the chats that drive it run in a child process (Telegram does not share
Tandem's CPU); Tandem runs in this one, started afresh, on a fresh database, per phase:

* throughput: every chat sends its next message the moment the previous answer shows;
  latency here is mostly queueing (Little's law: chats / throughput);
* latency: every chat waits a think time (uniform 0.5-1.5 x `--think` s) between turns,
  so the bot is loaded but not saturated: 50 chats (~35 turns/s, more than Telegram
  delivers to one bot) and `--rate-chats` chats (300: ~200 turns/s, the throughput target);
* streaming: the model takes `--stream` s per answer (a chunk every 0.1 s), so turns
  stream as message drafts (these are private chats), then the answer is sent; here
  latency excludes the model's time.

Telegram's flood control is strict by default (`--strict`): the fake counts every call to
a chat (sends, edits, drafts, reactions) and answers 429 to any that comes less than a
second after the previous accepted one, with no burst allowed (`chat_interval=1.0,
burst=0`), so the printed 429s are meaningful: Tandem's per-chat pacer must keep them at
0. The pacer spaces every call to a chat by `min_edit_interval` (1 s) whatever the fake
does, so a chat gets at most about one answer a second: with no think time, turns/s is
bounded by ~`--chats` per second, and latency there includes the wait for the chat's
pace. `--no-strict` runs the fake without flood control (`--flood`: the older edit-only
rule, 1 edit/s per chat with a burst of 3).

Measured: turns per second; the bot's added latency per turn, from the fake handing out
the update in getUpdates to the answer's final text on screen (p50/p99); the highest
edit rate and call rate seen in any chat and the shortest gap between two calls to one
chat; 429s; Tandem's CPU time per turn. Run: `python benchmarks/telegram_bench.py
[--chats 50] [--turns 10] [--think 1.0] [--stream 3.0] [--no-strict [--flood]]
[--profile out.prof]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import asyncio
import cProfile
import json
import logging
import multiprocessing
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.telegram import create
from benchmarks.running import running
from bot.core.config import Config
from bot.llm import Completion, Delta, StreamItem
from tests.fakes.telegram_server import FakeTelegram, JSONDict

REPO = Path(__file__).resolve().parent.parent
QUESTION = re.compile(r"q(\d+\.\d+-\d+)")
ANSWER = re.compile(r"a\d+\.\d+-\d+")
FIRST_USER = 10_000
PHASES = 4
PHASE_STRIDE = 100_000
"""Each phase talks in chats of its own: a phase's fresh Tandem (its pacer new) would
otherwise call a chat the previous phase's Tandem called less than a second before,
which the strict fake rightly refuses."""
CHAT_CALLS = frozenset({"sendMessage", "editMessageText", "editMessageReplyMarkup",
                        "sendDocument", "sendPhoto", "setMessageReaction", "sendMessageDraft"})
"""The calls the strict fake counts against a chat (not sendChatAction)."""


def user_id(phase: int, chat: int) -> int:
    """The user (and private chat) id of chat number `chat` in phase `phase`."""
    return FIRST_USER + phase * PHASE_STRIDE + chat


class InstantModel:
    """An in-process model that answers `q<tag>` with `a<tag>`: at once, or streamed over
    `stream_s` seconds (a chunk every 0.1 s)."""

    model = "instant"

    def __init__(self, stream_s: float = 0.0) -> None:
        self.stream_s = stream_s

    async def window(self) -> int:
        return 32_000

    async def stream(self, messages: Sequence[dict[str, Any]],
                     tools: Sequence[dict[str, Any]]) -> AsyncIterator[StreamItem]:
        found: list[str] = []
        for message in reversed(messages):  # the question, before any note that follows it
            found = QUESTION.findall(str(message.get("content", "")))
            if found:
                break
        tag = f"a{found[-1]}" if found else "a?"
        pieces = ["Sure", ", here", " it is: "] + ["more "] * int(self.stream_s * 10)
        for piece in pieces:
            if self.stream_s:
                await asyncio.sleep(0.1)
            yield Delta(piece)
        yield Completion("".join(pieces) + tag, (), 100, 8)


# ---- the Telegram side (child process) -------------------------------------------------


class TimedTelegram(FakeTelegram):
    """The fake, stamping when each update is handed out and each answer is final."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.served: dict[int, float] = {}
        self.shown: dict[str, float] = {}
        self.waiters: dict[str, asyncio.Event] = {}

    async def _get_updates(self, params: JSONDict) -> list[JSONDict]:
        result = await super()._get_updates(params)
        now = time.monotonic()
        for update in result:
            self.served.setdefault(update["update_id"], now)
        return result

    def _final(self, result: JSONDict) -> JSONDict:
        match = ANSWER.search(result.get("text", ""))
        if match and "reply_markup" not in result:
            self.shown.setdefault(match.group(0), time.monotonic())
            waiter = self.waiters.get(match.group(0))
            if waiter is not None:
                waiter.set()
        return result

    async def _send_message(self, params: JSONDict) -> JSONDict:
        return self._final(await super()._send_message(params))

    async def _edit_message_text(self, params: JSONDict) -> JSONDict:
        return self._final(await super()._edit_message_text(params))


async def chat_loop(fake: TimedTelegram, phase: int, chat: int, turns: int,
                    update_ids: dict[str, int], think: float) -> None:
    await asyncio.sleep(random.uniform(0, 2 * think))
    user = user_id(phase, chat)
    for turn in range(turns):
        tag = f"{phase}.{chat}-{turn}"
        fake.waiters[f"a{tag}"] = done = asyncio.Event()
        update_ids[f"a{tag}"] = fake.push_message(user, user, f"q{tag}",
                                                  first_name=f"User{chat}")
        await asyncio.wait_for(done.wait(), 60)
        await asyncio.sleep(random.uniform(0.5, 1.5) * think)


def chat_pace(calls: list[Any]) -> tuple[float, float]:
    """The most calls to one chat within any second, and the shortest gap (ms) between
    two calls to one chat (arrivals, whatever their outcome)."""
    times: dict[int, list[float]] = {}
    for call in calls:
        if call.method in CHAT_CALLS and isinstance(call.params.get("chat_id"), int):
            times.setdefault(call.params["chat_id"], []).append(call.time)
    most, gap = 0, float("inf")
    for stamps in times.values():
        stamps.sort()
        left = 0
        for right, moment in enumerate(stamps):
            while moment - stamps[left] >= 1.0:
                left += 1
            most = max(most, right - left + 1)
            if right:
                gap = min(gap, moment - stamps[right - 1])
    return float(most), gap * 1000 if gap < float("inf") else float("nan")


async def drive(fake: TimedTelegram, phase: int, chats: int, turns: int, think: float,
                stream_s: float) -> dict[str, float]:
    """One phase's chats, start to finish; its figures."""
    calls, limited = len(fake.calls), len(fake.rate_limited)
    edits = len(fake.calls_to("editMessageText"))
    drafts = len(fake.calls_to("sendMessageDraft"))
    update_ids: dict[str, int] = {}
    started, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(chat_loop(fake, phase, c, turns, update_ids, think)
                           for c in range(chats)))
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    latencies = sorted(1000 * (fake.shown[tag] - fake.served[uid] - stream_s)
                       for tag, uid in update_ids.items())
    cuts = statistics.quantiles(latencies, n=100)
    most, gap = chat_pace(fake.calls[calls:])
    return {
        "turns": float(chats * turns), "seconds": elapsed,
        "turns_per_s": chats * turns / elapsed, "p50_ms": cuts[49], "p99_ms": cuts[98],
        "max_ms": latencies[-1],
        "max_edits_per_s": float(max(fake.max_edit_rate(user_id(phase, c))
                                     for c in range(chats))),
        "api_calls": float(len(fake.calls) - calls),
        "rate_limited": float(len(fake.rate_limited) - limited),
        "edits": float(len(fake.calls_to("editMessageText")) - edits),
        "drafts": float(len(fake.calls_to("sendMessageDraft")) - drafts),
        "max_calls_per_s": most, "min_gap_ms": gap,
        "fake_cpu_ms": cpu * 1000,
    }


def phases(args: argparse.Namespace) -> list[tuple[str, int, int, float, float]]:
    """(name, chats, turns, think, stream_s) for each phase (`PHASES` of them)."""
    return [("throughput", args.chats, args.turns, 0.0, 0.0),
            ("latency", args.chats, args.turns, args.think, 0.0),
            ("latency_loaded", args.rate_chats, args.turns, args.think, 0.0),
            ("streaming", args.chats, max(1, args.turns // 3), args.think, args.stream)]


async def telegram_side(conn: Connection, args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    options: dict[str, Any] = {"chat_interval": 1.0, "burst": 0} if args.strict \
        else {"flood": args.flood}
    async with TimedTelegram(**options) as fake:
        conn.send((fake.url, fake.token))
        results: dict[str, Any] = {}
        for phase, (name, chats, turns, think, stream_s) in enumerate(phases(args)):
            conn.send(("start", stream_s))
            await loop.run_in_executor(None, conn.recv)  # Tandem is polling
            results[name] = await drive(fake, phase, chats, turns, think, stream_s)
            conn.send(("stop", None))
            results[name]["tandem_cpu_ms"] = await loop.run_in_executor(None, conn.recv)
        conn.send(("done", results))


def telegram_process(conn: Connection, args: argparse.Namespace) -> None:
    asyncio.run(telegram_side(conn, args))


# ---- Tandem (this process) -------------------------------------------------------------


async def tandem_phase(conn: Connection, url: str, token: str, chats: int,
                       stream_s: float) -> float:
    """Tandem from start to stop for one phase; its CPU milliseconds in between."""
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.model_validate({
            "llm": {"model": "openai/instant", "context_window": 32000},
            "store": {"path": f"{tmp}/bench.db"},
            "persona": {"dir": str(REPO / "persona")}, "workspace": {"dir": f"{tmp}/ws"},
            "telegram": {"enabled": True, "token": token, "base_url": f"{url}/bot",
                         "allowed_users": [user_id(p, c) for p in range(PHASES)
                                           for c in range(chats)]}})
        async with running(config, InstantModel(stream_s), create):
            cpu = time.process_time()
            conn.send("ready")
            await loop.run_in_executor(None, conn.recv)  # the phase is over
            cpu = time.process_time() - cpu
    return cpu * 1000


async def tandem_side(conn: Connection, chats: int,
                      profiler: cProfile.Profile | None) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    url, token = await loop.run_in_executor(None, conn.recv)
    while True:
        command, value = await loop.run_in_executor(None, conn.recv)
        if command == "done":
            return dict(value)
        if profiler is not None:
            profiler.enable()
        cpu_ms = await tandem_phase(conn, url, token, chats, value)
        if profiler is not None:
            profiler.disable()
        conn.send(cpu_ms)


def report(name: str, result: dict[str, float]) -> None:
    print(f"{name}: {result['turns']:.0f} turns in {result['seconds']:.2f} s")
    print(f"  turns/s            {result['turns_per_s']:8.1f}")
    print(f"  added latency p50  {result['p50_ms']:8.1f} ms")
    print(f"  added latency p99  {result['p99_ms']:8.1f} ms   (max {result['max_ms']:.1f} ms)")
    print(f"  max edits/s/chat   {result['max_edits_per_s']:8.0f}")
    print(f"  max calls/s/chat   {result['max_calls_per_s']:8.0f}   (shortest gap between "
          f"two calls to a chat {result['min_gap_ms']:.0f} ms)")
    print(f"  CPU per turn       {result['tandem_cpu_ms'] / result['turns']:8.2f} ms Tandem's, "
          f"{result['fake_cpu_ms'] / result['turns']:.2f} ms the fake's and its chats'")
    print(f"  API calls {result['api_calls']:.0f}, edits {result['edits']:.0f}, "
          f"drafts {result['drafts']:.0f}, 429s {result['rate_limited']:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--think", type=float, default=1.0,
                        help="mean seconds between a chat's turns in the latency phases")
    parser.add_argument("--rate-chats", type=int, default=300,
                        help="chats in the second latency phase (~chats / think turns/s)")
    parser.add_argument("--stream", type=float, default=3.0,
                        help="seconds the model streams each answer in the streaming phase")
    parser.add_argument("--strict", action=argparse.BooleanOptionalAction, default=True,
                        help="the strictest flood control: every call to a chat counts, "
                             "at most 1/s, no burst (default); --no-strict: see --flood")
    parser.add_argument("--flood", action="store_true",
                        help="with --no-strict: the fake's edit flood control on (1 edit/s "
                             "per chat, burst 3); without it, no flood control at all")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of Tandem's side")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    flood = "strict (every call to a chat, 1/s, no burst)" if args.strict \
        else "edits, 1/s per chat, burst 3" if args.flood else "off"
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs; {args.chats} chats x "
          f"{args.turns} turns, flood control {flood}")
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=telegram_process, args=(theirs, args), daemon=True)
    child.start()
    profiler = cProfile.Profile() if args.profile else None
    try:
        results = asyncio.run(tandem_side(ours, max(args.chats, args.rate_chats), profiler))
    finally:
        child.join(timeout=30)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    busy, paced, loaded = results["throughput"], results["latency"], results["latency_loaded"]
    report("throughput (no think time)", busy)
    report(f"latency ({args.chats} chats, think time ~{args.think:g} s)", paced)
    report(f"latency ({args.rate_chats} chats, think time ~{args.think:g} s)", loaded)
    report(f"streaming ({args.stream:g} s answers, model time not counted)",
           results["streaming"])
    edits = max(r["max_edits_per_s"] for r in results.values())
    most = max(r["max_calls_per_s"] for r in results.values())
    limited = sum(r["rate_limited"] for r in results.values())
    print(f"targets: >= 200 turns/s: {busy['turns_per_s']:.0f} with {args.chats} chats (bound "
          f"by the pace: ~1 answer/s per chat after its first), "
          f"{loaded['turns_per_s']:.0f} with {args.rate_chats}; p99 < 50 ms: "
          f"{paced['p99_ms']:.1f} ms at {paced['turns_per_s']:.0f} turns/s, "
          f"{loaded['p99_ms']:.1f} ms at {loaded['turns_per_s']:.0f} turns/s; "
          f"<= 1 edit/s/chat: {edits:.0f}; <= 1 call/s/chat: {most:.0f}; 429s: {limited:.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {**results, "max_edits_per_s": edits, "max_calls_per_s": most,
             "rate_limited": limited, "strict": args.strict}, indent=1, default=str))


if __name__ == "__main__":
    main()
