"""Core time per turn, model time excluded, at several history sizes; and `tandem --help`.

An instant in-process model answers every call, so what is measured is Tandem's own
work per turn: the hub, the store (real SQLite on disk), trimming, sanitizing, the
system prompt and the events. Run: `python benchmarks/core_bench.py`.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bot.app import build
from bot.config import Config
from bot.events import ConvKey, Event, TurnEnded, User, UserMessage
from bot.history import Msg
from bot.llm import Completion, Delta, StreamItem, warm

REPO = Path(__file__).resolve().parent.parent


class InstantModel:
    """A zero-latency model: a few streamed chunks, then the answer."""

    model = "instant"

    async def stream(self, messages: Sequence[dict[str, Any]],
                     tools: Sequence[dict[str, Any]]) -> AsyncIterator[StreamItem]:
        for piece in ("Sure", ", here", " it is."):
            yield Delta(piece)
        yield Completion("Sure, here it is.", (), 100, 5)


class Done:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def emit(self, event: Event) -> None:
        if isinstance(event, TurnEnded):
            self.event.set()


async def seed(hub: Any, key: ConvKey, messages: int) -> None:
    """Fill a conversation with `messages` stored messages in whole turns."""
    store = hub.d.store
    row = await store.conversation(key)
    turn = 0
    batch: list[Msg] = []
    for i in range(messages // 2):
        turn = i + 1
        batch += [Msg("user", f"[Ann] question {i} about the deployment", turn),
                  Msg("assistant", f"Answer {i}: it is done and verified.", turn)]
    for start in range(0, len(batch), 2):
        await store.begin_turn(row.id, row.session, batch[start:start + 2], "u", False, [])
    await store.end_turn(row.id, turn, "done", "completed")


async def measure(history: int, turns: int, window: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.model_validate({
            "llm": {"model": "openai/instant", "context_window": window},
            "store": {"path": f"{tmp}/bench.db"}, "persona": {"dir": str(REPO / "persona")},
            "workspace": {"dir": f"{tmp}/ws"}})
        hub, dispatch = build(config, model=InstantModel())
        done = Done()
        dispatch.sinks["bench"] = done
        key = ConvKey("bench", "c1")
        await hub.d.store.open()
        try:
            await seed(hub, key, history)
            warm()  # as `tandem run` does once it is ready
            user = User("u", "Ann")
            times = []
            for i in range(turns + 5):
                done.event.clear()
                started = time.perf_counter()
                await hub.submit(UserMessage(key, user, f"next question {i}"))
                await done.event.wait()
                await hub.idle()
                if i >= 5:  # the first turns load the conversation
                    times.append(time.perf_counter() - started)
            return times
        finally:
            await hub.close()
            await hub.d.store.close()


def help_time(runs: int = 7) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bot", "--help"], check=True, cwd=REPO,
                       capture_output=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--window", type=int, default=1_000_000,
                        help="context window in tokens (large: the whole history is in view)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}")
    print(f"{'history':>8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for history in (10, 1_000, 10_000):
        times = asyncio.run(measure(history, args.turns, args.window))
        ms = sorted(t * 1000 for t in times)
        p50, p99 = statistics.median(ms), ms[int(len(ms) * 0.99) - 1]
        figures[str(history)] = {"p50_ms": p50, "p99_ms": p99, "mean_ms": statistics.mean(ms)}
        print(f"{history:>8} {p50:>8.3f} {p99:>8.3f} {statistics.mean(ms):>8.3f}")
    figures["help_ms"] = help_time() * 1000
    print(f"tandem --help: {figures['help_ms']:.0f} ms (median of 7)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
