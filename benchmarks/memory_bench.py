"""Memory over a long life, and core time per turn at a very long history.

1. RSS while 10 chats hold 10,000 turns between them (about 1 kB in and 1 kB out per
   turn): a conversation keeps in memory what its turns need (the window, and what the
   summary does not cover yet); the rest stays in the store.
2. Core time per turn (model time excluded) at 100,000 messages of history.

An instant in-process model answers (`benchmarks/core_bench.py`); the store is real SQLite
on disk. Run: `python benchmarks/memory_bench.py [--turns 10000] [--history 100000]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.core_bench import REPO, Done, InstantModel, measure
from bot.core.config import Config
from bot.core.events import ConvKey, User, UserMessage
from bot.llm import Completion, Delta, StreamItem, warm
from bot.run.app import build

ANSWER = " ".join(f"w{i}" for i in range(200))  # about 1 kB
CHATS = 10


class KilobyteModel(InstantModel):
    """Answers about 1 kB, in a few chunks."""

    async def stream(self, messages: Sequence[dict[str, Any]],
                     tools: Sequence[dict[str, Any]]) -> AsyncIterator[StreamItem]:
        for start in range(0, len(ANSWER), 256):
            yield Delta(ANSWER[start:start + 256])
        yield Completion(ANSWER, (), None, None)  # no usage: the estimate stands


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def long_life(turns: int, window: int) -> list[tuple[int, float]]:
    """(turns done, RSS in MiB) along the way."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.model_validate({
            "llm": {"model": "openai/instant", "context_window": window},
            "store": {"path": f"{tmp}/bench.db"}, "persona": {"dir": str(REPO / "persona")},
            "workspace": {"dir": f"{tmp}/ws"}})
        hub, dispatch = build(config, model=KilobyteModel(window))
        done = Done()
        dispatch.sinks["console"] = done
        await hub.d.store.open()
        warm()
        user = User("u", "Ann")
        question = "please look at this: " + "q" * 1000
        points: list[tuple[int, float]] = []
        try:
            for i in range(turns):
                done.event.clear()
                await hub.submit(UserMessage(ConvKey("console", f"c{i % CHATS}"), user,
                                             f"{i} {question}"))
                await done.event.wait()
                await hub.idle()
                if (i + 1) % (turns // 20) == 0:
                    gc.collect()
                    points.append((i + 1, rss_mib()))
        finally:
            await hub.close()
            await hub.d.store.close()
        return points


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=32_000)
    args = parser.parse_args()
    points = asyncio.run(long_life(args.turns, args.window))
    for done, rss in points:
        print(f"after {done:>6,} turns: RSS {rss:7.1f} MiB")
    settled = points[len(points) // 4][1]  # once the windows are full
    print(f"RSS growth from {points[len(points) // 4][0]:,} to {points[-1][0]:,} turns: "
          f"{points[-1][1] - settled:+.1f} MiB (peak {max(r for _, r in points):.1f} MiB)")
    times = asyncio.run(measure(args.history, 200, args.window))
    ms = sorted(t * 1000 for t in times)
    print(f"core time per turn at {args.history:,} messages of history: p50 "
          f"{statistics.median(ms):.2f} ms, p99 {ms[int(len(ms) * 0.99) - 1]:.2f} ms")


if __name__ == "__main__":
    main()
