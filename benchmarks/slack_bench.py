"""Slack adapter throughput and latency, through the fake Slack in Socket Mode.

The fake Slack runs in a child process (as Slack does not share Tandem's CPU) and drives
the load; Tandem (bolt, the adapter, the hub, SQLite) runs in this process with a model
that answers instantly (an in-process ModelClient), so what is measured is Tandem's own
cost. Each conversation is a thread: a mention in its own channel (delivered twice, as
`app_mention` and as `message`, like Slack does), then replies in the thread without one.

Two runs:
* capacity: `--workers` threads each send their next message as soon as the answer is in;
  turns/s is what Tandem sustains at full load;
* latency: messages arrive at `--rate` per second (spread over `--threads` threads, each
  message to a thread whose previous answer is in); added latency is measured from pushing
  the event to the fake receiving the final `chat.update` (or `chat.postMessage`) of the
  answer, and ack latency from push to ack.

    python benchmarks/slack_bench.py [--workers 50] [--turns 40] [--rate 200] [--seconds 10]
                                     [--profile tandem.prof]

Targets: >= 200 turns/s, p99 added latency < 50 ms, every ack < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.slack import create  # noqa: E402
from benchmarks.running import running  # noqa: E402
from bot.core.config import Config  # noqa: E402
from bot.llm import Completion, Delta, StreamItem  # noqa: E402
from tests.fakes.slack_server import FakeSlackServer  # noqa: E402

JSON = dict[str, Any]


class InstantModel:
    """A ModelClient that answers at once: one Delta, then the Completion."""

    model = "bench/instant"

    async def window(self) -> int:
        return 32_000

    async def stream(self, messages: Sequence[dict[str, Any]],
                     tools: Sequence[dict[str, Any]]) -> AsyncIterator[StreamItem]:
        # the user's words: the last user message that is not the state note
        last = next((str(m.get("content") or "") for m in reversed(messages)
                     if m.get("role") == "user"
                     and not str(m.get("content") or "").startswith("[Current state")), "")
        text = "answer to " + last.split("] ", 1)[-1].split("\n", 1)[0]
        yield Delta(text)
        yield Completion(text, prompt_tokens=100, completion_tokens=5)


# ---- the Slack side (child process) ----------------------------------------------------


class BenchSlack(FakeSlackServer):
    """The fake, plus a signal when an answer's final text arrives (no polling)."""

    def __init__(self) -> None:
        super().__init__(rate_limit=False)
        self.finals: dict[str, asyncio.Future[float]] = {}
        self.turns = 0

    def expect(self, text: str) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.finals[text] = future
        return future

    def _final(self, params: JSON) -> None:
        if any(b.get("type") == "actions" for b in params.get("blocks") or []):
            return  # still live (the Cancel button is there)
        future = self.finals.pop(str(params.get("text") or ""), None)
        if future is not None and not future.done():
            future.set_result(time.monotonic())

    def _chat_update(self, params: JSON) -> JSON:
        out = super()._chat_update(params)
        self._final(params)
        return out

    def _chat_post_message(self, params: JSON) -> JSON:
        out = super()._chat_post_message(params)
        self._final(params)
        return out


@dataclass
class Thread:
    fake: BenchSlack
    n: int
    root: str | None = None
    sent: int = 0
    latencies: list[float] = field(default_factory=list)

    async def turn(self) -> None:
        channel, user = f"C{self.n:05d}", f"U{self.n:05d}"
        words = f"question {self.n} {self.sent}"
        self.sent += 1
        self.fake.turns += 1
        expected = self.fake.expect(f"answer to {words}")
        if self.root is None:
            event = self.fake.message_event(channel, user, words, channel_type="channel",
                                            mention=True)
            self.root = str(event["ts"])
            start = time.monotonic()
            await self.fake.push_event(event)
            await self.fake.push_event(dict(event, type="message", channel_type="channel"))
        else:
            event = self.fake.message_event(channel, user, words, channel_type="channel",
                                            thread_ts=self.root)
            start = time.monotonic()
            await self.fake.push_event(event)
        self.latencies.append(await asyncio.wait_for(expected, 30) - start)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


async def capacity(fake: BenchSlack, workers: int, turns: int, base: int) -> JSON:
    threads = [Thread(fake, base + i) for i in range(workers)]

    async def run(thread: Thread) -> None:
        for _ in range(turns):
            await thread.turn()

    began = time.monotonic()
    await asyncio.gather(*(run(t) for t in threads))
    elapsed = time.monotonic() - began
    latencies = [x for t in threads for x in t.latencies]
    return {"turns": len(latencies), "turns_per_s": len(latencies) / elapsed,
            "p50_ms": pct(latencies, 0.5), "p99_ms": pct(latencies, 0.99)}


async def paced(fake: BenchSlack, rate: float, seconds: float, count: int, base: int) -> JSON:
    """Open loop: one message every 1/rate s, each to an idle thread. The threads are
    started (mention, first answer) beforehand, so this measures replies in threads."""
    threads = [Thread(fake, base + i) for i in range(count)]
    for i in range(0, count, 10):
        await asyncio.gather(*(t.turn() for t in threads[i:i + 10]))
    for thread in threads:
        thread.latencies.clear()
    idle = deque(threads)
    busy: set[asyncio.Task[None]] = set()
    first_ack = len(fake.acks)
    skipped = 0

    async def one(thread: Thread) -> None:
        await thread.turn()
        idle.append(thread)

    began = time.monotonic()
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, began + i / rate - time.monotonic()))
        if not idle:
            skipped += 1
            continue
        task = asyncio.get_running_loop().create_task(one(idle.popleft()))
        busy.add(task)
        task.add_done_callback(busy.discard)
    await asyncio.gather(*busy)
    elapsed = time.monotonic() - began
    latencies = [x for t in threads for x in t.latencies]
    acks = list(fake.acks.values())[first_ack:]
    return {"turns": len(latencies), "turns_per_s": len(latencies) / elapsed,
            "skipped": skipped, "p50_ms": pct(latencies, 0.5), "p99_ms": pct(latencies, 0.99),
            "max_ms": max(latencies) * 1000, "ack_p50_ms": pct(acks, 0.5),
            "ack_p99_ms": pct(acks, 0.99), "ack_max_ms": max(acks) * 1000, "acks": len(acks)}


async def slack_side(conn: Connection, args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    fake = BenchSlack()
    await fake.start()
    try:
        conn.send(fake.api_url)
        await fake.wait_connections(1, timeout=60)
        await capacity(fake, 2, 5, 90_000)  # warm up
        cpu, warm = time.process_time(), fake.turns
        results = {"capacity": await capacity(fake, args.workers, args.turns, 0),
                   "paced": await paced(fake, args.rate, args.seconds, args.threads, 10_000)}
        cpu_ms = (time.process_time() - cpu) * 1000
        conn.send({**results, "slack_cpu_ms_per_turn": cpu_ms / (fake.turns - warm),
                   "all_turns": fake.turns, "calls": _calls_per_turn(fake),
                   "unacked": len([e for e in fake.pushed if e not in fake.acks])})
        await loop.run_in_executor(None, conn.recv)  # Tandem has stopped
    finally:
        await fake.close()


def _calls_per_turn(fake: BenchSlack) -> str:
    methods: dict[str, int] = {}
    for call in fake.calls:
        methods[call.method] = methods.get(call.method, 0) + 1
    return ", ".join(f"{m} {n / fake.turns:.2f}" for m, n in sorted(methods.items()))


def slack_process(conn: Connection, args: argparse.Namespace) -> None:
    asyncio.run(slack_side(conn, args))


# ---- Tandem (this process) -------------------------------------------------------------


def make_config(tmp: Path, api_url: str) -> Config:
    return Config.model_validate({
        "llm": {"model": "bench/instant", "context_window": 32000},
        "store": {"path": str(tmp / "bench.db")},
        "persona": {"dir": str(ROOT / "persona")},
        "workspace": {"dir": str(tmp)},
        "slack": {"enabled": True, "mode": "socket", "bot_token": "xoxb-test",
                  "app_token": "xapp-test", "base_url": api_url, "allowed_users": ["*"]},
    })


async def tandem_side(conn: Connection, profiler: cProfile.Profile | None) -> JSON:
    loop = asyncio.get_running_loop()
    api_url = await loop.run_in_executor(None, conn.recv)
    with tempfile.TemporaryDirectory() as tmp:
        config = make_config(Path(tmp), api_url)
        try:
            async with running(config, InstantModel(), create):
                if profiler:
                    profiler.enable()
                cpu = time.process_time()
                results: JSON = await loop.run_in_executor(None, conn.recv)
                cpu = time.process_time() - cpu
                if profiler:
                    profiler.disable()
                results["cpu_ms_per_turn"] = cpu * 1000 / results["all_turns"]
        finally:
            conn.send("stopped")
    return results


def reference_loop_us() -> float:
    """A fixed pure-Python loop, to compare this machine's speed with another's."""
    best = float("inf")
    for _ in range(20):
        began = time.perf_counter()
        sum(range(10_000))
        best = min(best, time.perf_counter() - began)
    return best * 1e6


def report(r: JSON) -> bool:
    c, p = r["capacity"], r["paced"]
    print(f"capacity: {c['turns']} turns, {c['turns_per_s']:.0f} turns/s at full load "
          f"(latency there p50 {c['p50_ms']:.1f} ms, p99 {c['p99_ms']:.1f} ms: queueing)")
    print(f"paced:    {p['turns']} turns at {p['turns_per_s']:.0f} turns/s offered "
          f"({p['skipped']} skipped: no idle thread)")
    print(f"  added latency p50 {p['p50_ms']:.1f} ms, p99 {p['p99_ms']:.1f} ms, "
          f"max {p['max_ms']:.1f} ms")
    print(f"  acks ({p['acks']}, {r['unacked']} never acked in all runs): "
          f"p50 {p['ack_p50_ms']:.1f} ms, p99 {p['ack_p99_ms']:.1f} ms, "
          f"max {p['ack_max_ms']:.1f} ms")
    print(f"Web API calls per turn: {r['calls']}")
    print(f"machine: sum(range(10_000)) takes {reference_loop_us():.0f} µs here")
    print(f"Tandem's CPU: {r['cpu_ms_per_turn']:.2f} ms per turn "
          f"(one core: at most {1000 / r['cpu_ms_per_turn']:.0f} turns/s); the fake Slack's: "
          f"{r['slack_cpu_ms_per_turn']:.2f} ms per turn")
    ok = c["turns_per_s"] >= 200 and p["p99_ms"] < 50 and p["ack_max_ms"] < 100 \
        and not r["unacked"] and not p["skipped"]
    print("targets (>= 200 turns/s, p99 < 50 ms, every ack < 100 ms):",
          "met" if ok else "MISSED")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=50, help="capacity run: threads")
    parser.add_argument("--turns", type=int, default=40, help="capacity run: turns each")
    parser.add_argument("--rate", type=float, default=200.0, help="paced run: turns/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="paced run: duration")
    parser.add_argument("--threads", type=int, default=100, help="paced run: threads")
    parser.add_argument("--profile", help="write a cProfile of Tandem's side to this file")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    slack = ctx.Process(target=slack_process, args=(theirs, args), daemon=True)
    slack.start()
    profiler = cProfile.Profile() if args.profile else None
    try:
        result = asyncio.run(tandem_side(ours, profiler))
    finally:
        slack.join(timeout=30)
    if profiler and args.profile:
        profiler.dump_stats(args.profile)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0 if report(result) else 1


if __name__ == "__main__":
    sys.exit(main())
