"""The prompt cache over a long team conversation at the window's limit, and what it costs.

    python benchmarks/cache_bench.py [--turns 200] [--window 12000] [--low-water 0.65]
                                     [--per-turn] [--json out.json]

A scripted conversation of three people (`--turns` turns, every fourth one with a tool
call: `read_file` of a team file, then the answer) runs through Tandem's core on a real
SQLite store, with the real litellm client, against the fake OpenAI-compatible model,
which reports cached input tokens as providers do (`tests.fakes.prompt_cache`): once as
OpenAI does (automatic, `openai/…`) and once as Anthropic does (breakpoints only, Claude
behind the endpoint). The window is `--window` tokens (`llm.context_window`), so after
the first turns every request is at the window's limit.

Printed for each: the input tokens per turn (by 20 turns; with `--per-turn`, each), the share of
input tokens read from the cache after the first 10 turns, the cost with and without
caching on that provider's prices (OpenAI: gpt-4o; Anthropic: claude-sonnet-4-5, from
litellm's price list), the number of trims, and the first request's fixed tokens (the
system prompt and the tool schemas). `--low-water 1` trims just enough every turn, as
Tandem did before `context.low_water`.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import asyncio
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import litellm  # noqa: E402

from bot import llm  # noqa: E402
from bot.core import watch as w  # noqa: E402
from bot.core.config import Config  # noqa: E402
from bot.core.events import ConvKey, Event, TurnEnded, User, UserMessage  # noqa: E402
from bot.run.app import build  # noqa: E402
from tests.fakes.model_server import (  # noqa: E402
    FakeModelServer,
    Reply,
    ToolCallSpec,
    estimate_prompt_tokens,
)

PEOPLE = (User("u1", "Ann"), User("u2", "Bob"), User("u3", "Chen"))
TOPICS = ("the release checklist", "the flaky integration test", "the database migration",
          "the on-call rota", "the customer escalation", "the cost report")
SKIP_TURNS = 10
BLOCK = 20
"""Turns per line of the printed input tokens."""
"""The cache-read share is reported after these first turns (the window fills)."""
PRICES = {"openai": "openai/gpt-4o", "anthropic": "anthropic/claude-sonnet-4-5"}
MODELS = {"openai": "openai/fake", "anthropic": "openai/claude-bench"}
"""What Tandem is told it calls: a Claude name gets breakpoints (`bot.llm.caching`)."""


def line(n: int) -> str:
    who = PEOPLE[n % 3].name
    topic = TOPICS[n % len(TOPICS)]
    return (f"{who} here, message {n}: about {topic}, I checked the dashboards again and "
            f"wrote down what changed since yesterday; what should we do next, and who "
            f"takes it? Please keep the earlier decisions in mind. " * 2).strip()


def reply(messages: list[dict[str, Any]]) -> Reply:
    """Every fourth turn reads a file first; answers are a few sentences."""
    said = [m for m in messages if m["role"] in ("user", "tool")
            and not str(m.get("content")).startswith("[Current state")]
    found = re.search(r"message (\d+):", str(said[-1].get("content")))
    if said[-1]["role"] == "user" and found and int(found.group(1)) % 4 == 3:
        return Reply(tool_calls=[ToolCallSpec("read_file", {"path": "team.md"})])
    return Reply(text="Here is the plan: we split the work, Ann checks the numbers, Bob "
                      "writes the summary and Chen reviews it by tomorrow. " * 2)


@dataclass
class Calls:
    """Every model call's usage, as Tandem counted it (`ModelCalled`)."""

    seen: list[w.ModelCalled] = field(default_factory=list)

    async def see(self, fact: w.Fact) -> None:
        if isinstance(fact, w.ModelCalled) and fact.ok:
            self.seen.append(fact)


class Ended:
    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()

    async def emit(self, event: Event) -> None:
        if isinstance(event, TurnEnded):
            self.count += 1
            self.changed.set()

    async def wait(self, count: int) -> None:
        while self.count < count:
            self.changed.clear()
            await self.changed.wait()


def trims(requests: list[dict[str, Any]]) -> int:
    """Requests whose history starts elsewhere than the previous one's (a trim)."""
    return sum(1 for a, b in zip(requests, requests[1:], strict=False)
               if a["messages"][1:2] != b["messages"][1:2]
               or a["messages"][0] != b["messages"][0])


def cost(model: str, calls: list[w.ModelCalled], cached: bool) -> float:
    total = 0.0
    for c in calls:
        read, written = (c.cache_read, c.cache_write) if cached else (0, 0)
        total += sum(litellm.cost_per_token(
            model=model, prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
            cache_read_input_tokens=read, cache_creation_input_tokens=written))
    return total


async def converse(shape: str, turns: int, window: int, low_water: float) -> dict[str, Any]:
    server = FakeModelServer(cache=shape)
    server.responder = reply
    await server.start()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "ws").mkdir()
    (tmp / "ws" / "team.md").write_text("# Team notes\n\n" + "- a decision we made\n" * 40)
    config = Config.model_validate({
        "llm": {"model": MODELS[shape], "api_base": server.api_base, "api_key": "sk-bench",
                "context_window": window, "max_output_tokens": 1024, "timeout_s": 30},
        "context": {"low_water": low_water},
        "store": {"path": str(tmp / "bench.db")}, "persona": {"dir": str(REPO / "persona")},
        "workspace": {"dir": str(tmp / "ws")}})
    hub, dispatch = build(config)
    ended = Ended()
    dispatch.sinks["console"] = ended
    calls = Calls()
    hub.d.watch.add(calls)
    await hub.d.store.open()
    key = ConvKey("console", "team")
    per_turn: list[tuple[int, int, int]] = []
    try:
        for n in range(turns):
            before = len(calls.seen)
            await hub.submit(UserMessage(key, PEOPLE[n % 3], line(n)))
            await ended.wait(n + 1)
            await hub.idle()
            mine = calls.seen[before:]
            per_turn.append((sum(c.prompt_tokens for c in mine),
                             sum(c.cache_read for c in mine),
                             sum(c.cache_write for c in mine)))
    finally:
        await hub.close()
        await hub.d.store.close()
        await server.close()
    assert server.violations == [], server.violations
    first = server.requests[0]
    fixed = estimate_prompt_tokens(first["messages"][:1], first.get("tools"))
    later = per_turn[SKIP_TURNS:]
    read, prompt = sum(t[1] for t in later), sum(t[0] for t in later)
    price = PRICES[shape]
    return {
        "shape": shape, "turns": turns, "calls": len(calls.seen), "window": window,
        "low_water": low_water, "trims": trims(server.requests), "fixed_tokens": fixed,
        "tools": len(first.get("tools") or []),
        "read_share": read / prompt if prompt else 0.0,
        "input_per_turn": sum(t[0] for t in later) / max(1, len(later)),
        "cost_cached": cost(price, calls.seen, True),
        "cost_uncached": cost(price, calls.seen, False), "price_of": price,
        "per_turn": per_turn,
    }


def report(found: dict[str, Any], every_turn: bool) -> None:
    print(f"\n{found['shape']} caching ({MODELS[found['shape']]}), {found['turns']} turns, "
          f"{found['calls']} model calls, window {found['window']:,}, "
          f"low water {found['low_water']:.0%}")
    print(f"  first request's fixed tokens (system prompt + {found['tools']} tool schemas): "
          f"{found['fixed_tokens']:,}")
    print(f"  input tokens per turn after turn {SKIP_TURNS}: {found['input_per_turn']:,.0f}")
    print(f"  cache-read share of input tokens after turn {SKIP_TURNS}: "
          f"{found['read_share']:.1%}")
    print(f"  trims: {found['trims']}")
    saved = 1 - found["cost_cached"] / found["cost_uncached"] if found["cost_uncached"] else 0
    print(f"  cost on {found['price_of']}'s prices: ${found['cost_cached']:.4f} with caching, "
          f"${found['cost_uncached']:.4f} without ({saved:.0%} less)")
    if every_turn:
        print("  turn  input  cache read  written")
        for n, (prompt, read, written) in enumerate(found["per_turn"], 1):
            print(f"  {n:4}  {prompt:5,}  {read:10,}  {written:7,}")
        return
    print("  turns     input tokens per turn (min / mean / max)   read from the cache")
    per_turn = found["per_turn"]
    for start in range(0, len(per_turn), BLOCK):
        block = per_turn[start:start + BLOCK]
        inputs = [t[0] for t in block]
        share = sum(t[1] for t in block) / max(1, sum(inputs))
        print(f"  {start + 1:3}-{start + len(block):<3}   {min(inputs):6,} / "
              f"{sum(inputs) / len(inputs):6,.0f} / {max(inputs):6,}{'':20}{share:6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--window", type=int, default=12_000)
    parser.add_argument("--low-water", type=float, default=0.65)
    parser.add_argument("--per-turn", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    litellm.suppress_debug_info = True

    async def both() -> list[dict[str, Any]]:
        await llm.load()
        out = [await converse(shape, args.turns, args.window, args.low_water)
               for shape in ("openai", "anthropic")]
        await llm.close()
        return out

    results = asyncio.run(both())
    for found in results:
        report(found, args.per_turn)
    if args.json:
        Path(args.json).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
