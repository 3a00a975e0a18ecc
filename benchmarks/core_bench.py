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

from bot.core.config import Config
from bot.core.events import ConvKey, Event, TurnEnded, User, UserMessage
from bot.core.history import Msg, ToolCall
from bot.llm import Completion, Delta, StreamItem, warm
from bot.run.app import build

REPO = Path(__file__).resolve().parent.parent


class InstantModel:
    """A zero-latency model: a few streamed chunks, then the answer."""

    model = "instant"

    def __init__(self, window: int = 32_000) -> None:
        self.context_window = window

    async def window(self) -> int:
        return self.context_window

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
        await store.end_turn(row.id, row.session, batch[start].turn, "done", "completed")


async def measure(history: int, turns: int, window: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.model_validate({
            "llm": {"model": "openai/instant", "context_window": window},
            "store": {"path": f"{tmp}/bench.db"}, "persona": {"dir": str(REPO / "persona")},
            "workspace": {"dir": f"{tmp}/ws"}})
        hub, dispatch = build(config, model=InstantModel(window))
        done = Done()
        dispatch.sinks["console"] = done
        key = ConvKey("console", "c1")
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


class ToolModel(InstantModel):
    """Each turn: one allowed tool call (`list_dir`), then the answer: a turn that the
    audit log records (the tool run) and the metrics count (two model calls, a run)."""

    def __init__(self, window: int = 32_000) -> None:
        super().__init__(window)
        self.calls = 0

    async def stream(self, messages: Sequence[dict[str, Any]],
                     tools: Sequence[dict[str, Any]]) -> AsyncIterator[StreamItem]:
        self.calls += 1
        asked = max(i for i, m in enumerate(messages)
                    if str(m.get("content") or "").startswith("[Ann]"))
        if any(m.get("role") == "tool" for m in messages[asked:]):
            yield Completion("Listed.", (), 120, 3, 0.0001)
        else:
            yield Completion("", (ToolCall(f"c{self.calls}", "list_dir", "{}"),), 100, 5, 0.0001)


class Timed:
    """A watcher with a stopwatch: the time its calls take on the event loop."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seconds = inner, 0.0

    async def see(self, fact: Any) -> None:
        started = time.perf_counter()
        await self.inner.see(fact)
        self.seconds += time.perf_counter() - started

    async def flush(self) -> None:
        if hasattr(self.inner, "flush"):
            await self.inner.flush()

    async def close(self) -> None:
        await self.inner.close()


async def ops_overhead(turns: int, block: int = 20) -> dict[str, float]:
    """What the audit log and the metrics add to a tool turn (one allowed tool call, two
    model calls): their calls' own time, and the turn time with and without them (blocks
    of `block` turns alternate, on a conversation trimmed to a fixed size, so that drift
    hits both alike; two cores make that figure the noisier one)."""
    from bot.ops.audit import Audit
    from bot.ops.metrics import Metrics

    with tempfile.TemporaryDirectory() as tmp:
        config = Config.model_validate({
            "llm": {"model": "openai/instant", "context_window": 16_000},
            "store": {"path": f"{tmp}/bench.db"}, "persona": {"dir": str(REPO / "persona")},
            "workspace": {"dir": f"{tmp}/ws"}})
        Path(f"{tmp}/ws").mkdir()
        hub, dispatch = build(config, model=ToolModel(16_000))
        audit = next(w for w in hub.d.watch.watchers if isinstance(w, Audit))
        watching = [Timed(audit), Timed(Metrics())]
        done = Done()
        dispatch.sinks["console"] = done
        key, user = ConvKey("console", "c1"), User("u", "Ann")
        await hub.d.store.open()
        figures: dict[str, list[float]] = {"with": [], "without": []}
        try:
            for n in range(2 * (turns // block) + 2):
                label = "with" if n % 2 else "without"
                hub.d.watch.watchers = list(watching) if label == "with" else []
                if n == 2:  # the first two blocks warm up
                    for watcher in watching:
                        watcher.seconds = 0.0
                for i in range(block):
                    done.event.clear()
                    started = time.perf_counter()
                    await hub.submit(UserMessage(key, user, f"list it {i}"))
                    await done.event.wait()
                    await hub.idle()
                    if n >= 2:
                        figures[label].append(time.perf_counter() - started)
            hub.d.watch.watchers = list(watching)
            await hub.d.watch.flush()
            audited = len(await hub.d.store.audit(limit=1_000_000))
            write_ms = await audit_write_ms(audit, key)
        finally:
            await hub.close()
            await hub.d.store.close()
    measured = len(figures["with"])
    with_ms = statistics.median(figures["with"]) * 1000
    without_ms = statistics.median(figures["without"]) * 1000
    entries_per_turn = audited / (measured + block)
    return {"audit_ms_per_turn": watching[0].seconds * 1000 / measured,
            "audit_write_ms_per_turn": write_ms * entries_per_turn,
            "metrics_ms_per_turn": watching[1].seconds * 1000 / measured,
            "with_p50_ms": with_ms, "without_p50_ms": without_ms,
            "turns": measured, "audit_entries": audited}


async def audit_write_ms(audit: Any, key: ConvKey, batches: int = 50,
                         batch: int = 40) -> float:
    """The audit log's writing, per entry: batches as `Audit` writes them (a batch every
    `bot.ops.audit.FLUSH_S`), on an idle store (off the turn's path, in the store's thread)."""
    from bot.core.watch import ToolRan

    started = time.perf_counter()
    for _ in range(batches):
        for i in range(batch):
            await audit.see(ToolRan(key, "list_dir", f"list_dir {i}", "ok", 0.001, "u"))
        await audit.flush()
    return (time.perf_counter() - started) * 1000 / (batches * batch)


def help_time(runs: int = 7) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bot", "--help"], check=True, cwd=REPO,
                       capture_output=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


# A fresh Tandem in a child process (litellm not imported yet, preload started where
# `tandem run` starts it): the first message starts the first model turn at once, and
# meanwhile a second chat sends /help every 50 ms. argv: the fake model's api_base, the
# context window or "".
FIRST_TURN_CHILD = """
import asyncio, json, os, shutil, statistics, sys, tempfile, time
from pathlib import Path
from bot import llm
from bot.run.app import build
from bot.core.config import Config
from bot.core.events import Command, ConvKey, Notice, TurnEnded, User, UserMessage


class Sink:
    def __init__(self):
        self.changed = asyncio.Event()
        self.events = []

    async def emit(self, event):
        self.events.append(event)
        self.changed.set()

    async def wait(self, test, after=0):
        while not any(test(e) for e in self.events[after:]):
            self.changed.clear()
            await self.changed.wait()


async def main(api_base, window):
    tmp = tempfile.mkdtemp()
    llm_config = {"model": "openai/fake", "api_base": api_base, "api_key": "sk-bench",
                  "timeout_s": 60}
    if window:
        llm_config["context_window"] = int(window)
    config = Config.model_validate({
        "llm": llm_config, "store": {"path": f"{tmp}/t.db"},
        "persona": {"dir": str(Path.cwd() / "persona")}, "workspace": {"dir": f"{tmp}/ws"}})
    hub, dispatch = build(config)
    sink = dispatch.sinks["console"] = Sink()
    await hub.d.store.open()
    assert "litellm" not in sys.modules
    llm.preload()  # where bot/run/main.py starts it: before the platforms connect
    await hub.recover()
    user = User("u", "Ann")
    first, second = ConvKey("console", "first"), ConvKey("console", "second")
    started = time.perf_counter()
    await hub.submit(UserMessage(first, user, "hello", ref="m1"))
    waits, slot = [], 0
    while not any(isinstance(e, TurnEnded) and e.conv == first for e in sink.events):
        # /help is due every 50 ms, as if sent from outside: a loop that was blocked
        # answers late, and the wait counts from when it was due.
        due = started + slot * 0.05
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        seen = len(sink.events)
        await hub.submit(Command(second, user, "help"))
        await sink.wait(lambda e: isinstance(e, Notice) and e.conv == second, seen)
        done = time.perf_counter()
        waits.append(done - due)
        slot = int((done - started) / 0.05) + 1
    answered = time.perf_counter() - started
    await hub.close()
    await hub.d.store.close()
    await llm.close()
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"max_ms": max(waits) * 1000, "median_ms": statistics.median(waits) * 1000,
                      "samples": len(waits), "first_answer_s": answered}))


asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def first_turn_help(window: int | None) -> dict[str, float]:
    """How long /help in a second chat waits while the first model turn after a fresh
    start runs (litellm loading, then the answer streaming), in a child process."""
    from tests.fakes.model_server import FakeModelServer, Reply

    async def run() -> dict[str, float]:
        async with FakeModelServer() as model:
            model.responder = lambda _m: Reply(text="pong " * 25, chunk_delay=0.02)
            env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
            env["PYTHONPATH"] = str(REPO)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", FIRST_TURN_CHILD, model.api_base, str(window or ""),
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 180)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            if proc.returncode:
                raise RuntimeError(f"first-turn child failed:\n{err.decode()[-3000:]}")
            result: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
            return result

    return asyncio.run(run())


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
    ops = figures["audit_metrics"] = asyncio.run(ops_overhead(args.turns))
    print(f"a tool turn's audit log and metrics: {ops['audit_ms_per_turn']:.4f} + "
          f"{ops['metrics_ms_per_turn']:.4f} ms on the turn's path, and "
          f"{ops['audit_write_ms_per_turn']:.4f} ms of batched audit writing off it, per "
          f"turn; the turn p50 with / "
          f"without them {ops['with_p50_ms']:.3f} / {ops['without_p50_ms']:.3f} ms "
          f"({ops['turns']:.0f} turns each, {ops['audit_entries']:.0f} audit entries)")
    figures["help_ms"] = help_time() * 1000
    print(f"tandem --help: {figures['help_ms']:.0f} ms (median of 7)")
    for name, window in (("first_turn_help", 32_000), ("first_turn_help_no_window", None)):
        got = figures[name] = first_turn_help(window)
        print(f"/help in a 2nd chat during the first model turn after a start "
              f"(llm.context_window {'set' if window else 'unset'}): max {got['max_ms']:.0f} "
              f"ms, median {got['median_ms']:.1f} ms over {got['samples']:.0f}; the first "
              f"answer after {got['first_answer_s']:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
