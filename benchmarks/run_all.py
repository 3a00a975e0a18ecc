"""Run every benchmark several times and write BENCHMARKS.md with the medians.

    python benchmarks/run_all.py [--runs 3] [--out BENCHMARKS.md]

Figures: core time per turn vs history size; turns/s and added latency through Telegram
and through Slack; one long answer streamed on each platform path (first text, calls);
cold start of `tandem run` to ready; `tandem --help`; idle RSS; SQLite round trips and
rows written per turn. Each is the median of `--runs` runs.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import asyncio
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.running import run_config  # noqa: E402
from tests.fakes.model_server import FakeModelServer, Reply  # noqa: E402
from tests.fakes.telegram_server import FakeTelegram  # noqa: E402

LONG_MODES = "## Long modes"
STREAM_PATHS = ("telegram-draft", "telegram-group", "slack-stream", "slack-update")


def bench(script: str, *args: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args,
                        "--json", out.name], check=False, cwd=REPO, capture_output=True)
        return json.loads(Path(out.name).read_text() or "{}")


def median(runs: list[dict[str, Any]], *path: str) -> float:
    values = []
    for run in runs:
        node: Any = run
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, (int, float)):
            values.append(float(node))
    return statistics.median(values) if values else float("nan")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def startup_once() -> dict[str, float]:
    """`tandem run` with Telegram enabled, against the fakes: time to ready, RSS."""
    async with FakeTelegram(flood=False) as tg, FakeModelServer() as model:
        model.responder = lambda _m: Reply(text="pong")
        with tempfile.TemporaryDirectory() as tmp:
            config = run_config(tmp, tg, model)
            env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
            env["PYTHONPATH"] = str(REPO)
            began = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "--config", str(config), "run", env=env, cwd=tmp,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                await tg.wait_for(lambda: bool(tg.calls_to("getUpdates")), timeout=60)
                ready = time.perf_counter() - began
                idle_before_turn = rss_kib(proc.pid)
                tg.push_message(42, 42, "ping")
                await tg.wait_for(lambda: "pong" in tg.bot_texts(42), timeout=60)
                await asyncio.sleep(2)
                idle_after_turn = rss_kib(proc.pid)
            finally:
                proc.terminate()
                await proc.wait()
    return {"ready_s": ready, "rss_idle_mib": idle_before_turn / 1024,
            "rss_after_turn_mib": idle_after_turn / 1024}


async def store_per_turn(turns: int = 200) -> dict[str, float]:
    """Round trips to SQLite and rows written per plain turn (no tools)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from core_bench import Done, InstantModel

    from bot.core.config import Config
    from bot.core.events import ConvKey, User, UserMessage
    from bot.run.app import build
    from bot.store.sqlite import SQLiteStore

    class Counting(SQLiteStore):
        calls = 0

        async def _run(self, fn: Any) -> Any:
            Counting.calls += 1
            return await super()._run(fn)

    with tempfile.TemporaryDirectory() as tmp:
        config = Config.model_validate({
            "llm": {"model": "openai/instant", "context_window": 32000},
            "persona": {"dir": str(REPO / "persona")}, "workspace": {"dir": f"{tmp}/ws"}})
        store = Counting(f"{tmp}/t.db")
        hub, dispatch = build(config, model=InstantModel(), store=store)
        done = Done()
        dispatch.sinks["console"] = done
        await store.open()
        try:
            key, user = ConvKey("console", "1"), User("u", "Ann")
            await hub.submit(UserMessage(key, user, "warm up", ref="w"))
            await done.event.wait()
            await hub.idle()
            calls = Counting.calls
            assert store._db is not None
            changes = store._db.total_changes
            for i in range(turns):
                done.event.clear()
                await hub.submit(UserMessage(key, user, f"q{i}", ref=f"r{i}"))
                await done.event.wait()
                await hub.idle()
            return {"round_trips": (Counting.calls - calls) / turns,
                    "rows": (store._db.total_changes - changes) / turns}
        finally:
            await hub.close()
            await store.close()


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return (f"{model}, {os.cpu_count()} cores, {int(mem) // 1024 // 1024} GiB, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "BENCHMARKS.md"))
    args = parser.parse_args()
    n = args.runs
    print(f"core ({n} runs)…", flush=True)
    core = [bench("core_bench.py", "--turns", "300") for _ in range(n)]
    print(f"telegram ({n} runs)…", flush=True)
    tg = [bench("telegram_bench.py") for _ in range(n)]
    print(f"slack ({n} runs)…", flush=True)
    slack = [bench("slack_bench.py") for _ in range(n)]
    print(f"stream ({n} runs)…", flush=True)
    stream = [bench("stream_bench.py") for _ in range(n)]
    print(f"startup ({n} runs)…", flush=True)
    start = [asyncio.run(startup_once()) for _ in range(n)]
    store = [asyncio.run(store_per_turn()) for _ in range(n)]
    redact = [bench("redact_bench.py") for _ in range(n)]
    print(f"mcp ({n} runs)…", flush=True)
    mcp = [bench("mcp_bench.py") for _ in range(n)]
    rows = [
        ("Core time per turn, 10-message history (p50 / p99)",
         f"{median(core, '10', 'p50_ms'):.2f} / {median(core, '10', 'p99_ms'):.2f} ms",
         "python benchmarks/core_bench.py"),
        ("Core time per turn, 1,000-message history (p50 / p99)",
         f"{median(core, '1000', 'p50_ms'):.2f} / {median(core, '1000', 'p99_ms'):.2f} ms",
         "python benchmarks/core_bench.py"),
        ("Core time per turn, 10,000-message history (p50 / p99)",
         f"{median(core, '10000', 'p50_ms'):.2f} / {median(core, '10000', 'p99_ms'):.2f} ms",
         "python benchmarks/core_bench.py"),
        ("Telegram: turns/s, 50 chats, no think time",
         f"{median(tg, 'throughput', 'turns_per_s'):.0f}", "python benchmarks/telegram_bench.py"),
        (f"Telegram: added latency, 50 chats at ~{median(tg, 'latency', 'turns_per_s'):.0f} "
         "turns/s (p50 / p99)",
         f"{median(tg, 'latency', 'p50_ms'):.1f} / {median(tg, 'latency', 'p99_ms'):.1f} ms",
         "python benchmarks/telegram_bench.py"),
        ("Telegram: added latency, 300 chats at "
         f"~{median(tg, 'latency_loaded', 'turns_per_s'):.0f} turns/s (p50 / p99)",
         f"{median(tg, 'latency_loaded', 'p50_ms'):.1f} / "
         f"{median(tg, 'latency_loaded', 'p99_ms'):.1f} ms",
         "python benchmarks/telegram_bench.py"),
        ("Telegram: highest edit rate in any chat", f"{median(tg, 'max_edits_per_s'):.0f}/s",
         "python benchmarks/telegram_bench.py"),
        ("Slack: turns/s, 50 threads, full load",
         f"{median(slack, 'capacity', 'turns_per_s'):.0f}", "python benchmarks/slack_bench.py"),
        ("Slack: added latency at 200 turns/s offered (p50 / p99)",
         f"{median(slack, 'paced', 'p50_ms'):.1f} / {median(slack, 'paced', 'p99_ms'):.1f} ms",
         "python benchmarks/slack_bench.py"),
        ("Slack: ack latency (p99 / max)",
         f"{median(slack, 'paced', 'ack_p99_ms'):.1f} / "
         f"{median(slack, 'paced', 'ack_max_ms'):.1f} ms", "python benchmarks/slack_bench.py"),
        ("Streaming one 2,000-token answer at 50 tokens/s: first text on screen, Telegram "
         "draft / group / Slack stream / Slack updates",
         " / ".join(f"{median(stream, p, 'first_text_s'):.2f}" for p in STREAM_PATHS) + " s",
         "python benchmarks/stream_bench.py"),
        ("Streaming the same answer: calls to the chat (same order) / 429s",
         " / ".join(f"{median(stream, p, 'chat_calls'):.0f}" for p in STREAM_PATHS)
         + f" / {sum(median(stream, p, 'rate_limited') for p in STREAM_PATHS):.0f}",
         "python benchmarks/stream_bench.py"),
        ("Cold start of `tandem run` (Telegram) to polling",
         f"{median(start, 'ready_s'):.2f} s", "python benchmarks/run_all.py"),
        ("`tandem --help`", f"{median(core, 'help_ms'):.0f} ms",
         "python benchmarks/core_bench.py"),
        ("RSS when ready / idle after the first turn (litellm loaded)",
         f"{median(start, 'rss_idle_mib'):.0f} / {median(start, 'rss_after_turn_mib'):.0f} MiB",
         "python benchmarks/run_all.py"),
        ("SQLite round trips / rows written per plain turn",
         f"{median(store, 'round_trips'):.1f} / {median(store, 'rows'):.1f}",
         "python benchmarks/run_all.py"),
        ("Redaction of a 16 kB tool output, 8 known secrets (clean / 3 secrets inside / "
         "emoji text, p50)",
         f"{median(redact, 'clean shell output', 'p50_ms'):.3f} / "
         f"{median(redact, 'three secrets inside', 'p50_ms'):.3f} / "
         f"{median(redact, 'emoji, variation sel.', 'p50_ms'):.3f} ms",
         "python benchmarks/redact_bench.py"),
        ("MCP: Tandem's overhead per call above the bare SDK, stdio / HTTP (p50)",
         f"{median(mcp, 'stdio', 'overhead_p50_ms'):.2f} / "
         f"{median(mcp, 'http', 'overhead_p50_ms'):.2f} ms", "python benchmarks/mcp_bench.py"),
        ("MCP: connect + list + build 212 tools (stdio, spawn included) / listing alone",
         f"{median(mcp, 'tools_200', 'connect_list_build_ms'):.0f} / "
         f"{median(mcp, 'tools_200', 'list_ms'):.1f} ms", "python benchmarks/mcp_bench.py"),
        ("MCP: cold start to polling with three stdio servers (none: "
         f"{median(mcp, 'startup', 'none_ready_s'):.2f} s) / all three connected",
         f"{median(mcp, 'startup', 'three_ready_s'):.2f} / "
         f"{median(mcp, 'startup', 'three_all_connected_s'):.2f} s",
         "python benchmarks/mcp_bench.py"),
    ]
    lines = [
        "# Benchmarks", "",
        f"Written by `python benchmarks/run_all.py` on {dt.datetime.now(dt.UTC):%Y-%m-%d}.",
        f"Machine: {machine()}.",
        f"Every figure is the median of {n} runs. The model is instant (in-process, or the "
        "fake OpenAI-compatible server for the cold start), so the figures are Tandem's own "
        "cost; Telegram and Slack are the project's loopback fakes, driven by the real "
        "python-telegram-bot and slack-bolt code.", "",
        "| figure | value | reproduce |", "|---|---|---|",
        *[f"| {name} | {value} | `{cmd}` |" for name, value, cmd in rows], "",
    ]
    out = Path(args.out)
    kept = out.read_text().partition(LONG_MODES)[2] if out.exists() else ""
    if kept:  # the long modes' results are written by hand after their (long) runs
        lines += [LONG_MODES + kept.rstrip("\n"), ""]
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
