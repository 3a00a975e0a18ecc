"""Group talk as context on a busy Telegram group: `telegram.groups.context: 50` against 0.

A supergroup (privacy mode off, so the bot receives every message) where five people,
two of them allowed users, talk at `--rate` unaddressed messages a minute (default 1,000,
sent on a fixed schedule for `--seconds`, default 60), while an allowed user addresses
Tandem (`@tandem_bot ...`) `--turns` times (default 12) spread evenly through the run, the
last after the last unaddressed message. Each setting runs its own Tandem, started afresh
on a fresh SQLite database: real python-telegram-bot polling the fake Bot API, the real
hub, real litellm against the fake OpenAI-compatible model, whose reply is instant. The
fakes and the people run in a child process, so Tandem's process holds only Tandem
(its event loop, the SQLite thread, litellm's threads). A warm-up turn comes first (it
loads litellm) and is not counted.

Measured per setting:
* Tandem's CPU time per unaddressed message: `time.process_time()` of Tandem's process
  (all its threads, user + system) from the first unaddressed message to the last turn's
  answer, divided by the unaddressed messages; the addressed turns fall inside it, so
  context 0 is the baseline (python-telegram-bot receiving and parsing each update) and
  the difference is the cost of keeping the talk;
* the `talk` table's rows for the group at the end, by kind, and the database's size
  (the file after Tandem closed it, and the file + WAL just before);
* the addressed turn's latency, from the fake queueing the update to the answer on
  screen (median and max over the counted turns), and how many rows of talk the model got
  with each;
* the machine's load: the 1-minute load average at the end, and how busy all CPUs were
  over the run (/proc/stat), with Tandem's share and the fakes' share of it.

    python benchmarks/group_context_bench.py [--quick] [--seconds 60] [--rate 1000]
                                             [--turns 8] [--contexts 0,50] [--json FILE]

`--quick` runs 10 s per setting (the same rate, 4 addressed turns) for a smoke run.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import asyncio
import json
import logging
import multiprocessing
import platform
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.telegram import create
from benchmarks.running import running
from bot.core.config import Config
from bot.serve.talk import TALK_HEADER
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.telegram_server import FakeTelegram, JSONDict

REPO = Path(__file__).resolve().parent.parent
GROUP = -100_777
ANN, BOB = 42, 43
PEOPLE = [(ANN, "Ann"), (BOB, "Bob"), (51, "Chen"), (52, "Dana"), (53, "Eve")]
"""Who talks in the group; Ann and Bob are allowed users (the others' talk is kept as
outside content)."""
QUESTION = re.compile(r"\bq(\d+-q?\d+)\b")
ANSWER = re.compile(r"\ba(\d+-q?\d+)\b")
QUIET = 4
PACE = 1.2
"""Seconds between quiet turns: Tandem spaces its calls to a chat by a second."""
"""Addressed turns with no talk around them, before the busy run: their CPU time is the
turns' own, subtracted from the run's."""
WORDS = ("the build is red again", "who has the release notes", "lunch at one?",
         "I pushed a fix for the login page", "can someone review #4121",
         "the staging database is slow today", "ok", "thanks!", "see the doc I shared",
         "meeting moved to 3 pm", "did the deploy go out", "I'll take that one")


def chatter(n: int, rng: random.Random) -> str:
    """An ordinary group message, 2 to 160 characters."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))) + f" (#{n})"


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


# ---- the fakes and the people (child process) ------------------------------------------


class TimedTelegram(FakeTelegram):
    """The fake, stamping when each answer's final text first shows."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shown: dict[str, float] = {}
        self.waiters: dict[str, asyncio.Event] = {}

    def _final(self, result: JSONDict) -> JSONDict:
        match = ANSWER.search(result.get("text", ""))
        if match and "reply_markup" not in result:
            self.shown.setdefault(match.group(1), time.monotonic())
            if (waiter := self.waiters.get(match.group(1))) is not None:
                waiter.set()
        return result

    async def _send_message(self, params: JSONDict) -> JSONDict:
        return self._final(await super()._send_message(params))

    async def _edit_message_text(self, params: JSONDict) -> JSONDict:
        return self._final(await super()._edit_message_text(params))


class Model:
    """The fake model's responder: `q<tag>` is answered `a<tag>` at once; counts the rows
    of group talk each addressed turn's request carried."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}

    def __call__(self, messages: list[dict[str, Any]]) -> Reply:
        for message in reversed(messages):
            text = str(message.get("content") or "")
            if message.get("role") == "user" and (found := QUESTION.findall(text)):
                talk = text.split(TALK_HEADER, 1)[1].split("\n\n", 1)[0] \
                    if TALK_HEADER in text else ""
                self.rows[found[-1]] = sum(1 for line in talk.splitlines()
                                           if line.startswith("["))
                return Reply(text=f"Noted: a{found[-1]}")
        return Reply(text="ok")


async def turn(fake: TimedTelegram, tag: str) -> tuple[float, float]:
    """Ann addresses Tandem; (when it was queued, when the answer showed)."""
    fake.waiters[tag] = done = asyncio.Event()
    pushed = time.monotonic()
    fake.push_message(GROUP, ANN, f"@tandem_bot q{tag} what did I miss?", first_name="Ann",
                      chat_type="supergroup")
    await asyncio.wait_for(done.wait(), 120)
    return pushed, fake.shown[tag]


async def busy_group(fake: TimedTelegram, conn: Connection, phase: int,
                     args: argparse.Namespace) -> dict[str, Any]:
    """One setting's run: the chatter on its schedule, the addressed turns among it."""
    rng = random.Random(phase)
    await turn(fake, f"{phase}-0")  # warm-up: litellm loads on the first turn
    quiet: list[float] = []
    await mark(conn, "quiet")
    for k in range(QUIET):  # addressed turns with nothing else going on
        await asyncio.sleep(PACE)
        pushed, shown = await turn(fake, f"{phase}-q{k}")
        quiet.append(1000 * (shown - pushed))
    calls = len(fake.calls)
    await asyncio.sleep(PACE)
    await mark(conn, "busy")
    total = round(args.rate * args.seconds / 60)
    gap = 60 / args.rate
    at = [round(total * (k + 1) / args.turns) for k in range(args.turns)]
    latencies: list[float] = []
    started, cpu, ticks = time.monotonic(), time.process_time(), cpu_ticks()
    late = sent = 0.0
    for n in range(total):
        delay = started + n * gap - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            late = max(late, -delay)
        who, name = PEOPLE[rng.randrange(len(PEOPLE))]
        fake.push_message(GROUP, who, chatter(n, rng), first_name=name, chat_type="supergroup")
        sent = time.monotonic() - started
        for k in (k for k, point in enumerate(at) if point == n + 1):
            task = turn(fake, f"{phase}-{k + 1}")
            if k + 1 == args.turns:
                pushed, shown = await task
                latencies.append(shown - pushed)
            else:
                asyncio.get_running_loop().create_task(_record(task, latencies))
    while len(latencies) < args.turns:  # the earlier turns' answers, if any still wait
        await asyncio.sleep(0.01)
    elapsed = time.monotonic() - started
    busy, all_ticks = (a - b for a, b in zip(cpu_ticks(), ticks, strict=True))
    methods: dict[str, int] = {}
    for call in fake.calls[calls:]:
        if call.params.get("chat_id") == GROUP:
            methods[call.method] = methods.get(call.method, 0) + 1
    return {"messages": total, "seconds": elapsed, "sending_s": sent, "late_s": late,
            "quiet_ms": quiet,
            "group_calls": methods, "fake_errors": len(fake.internal_errors),
            "load_1m": os.getloadavg()[0],
            "latencies_ms": [1000 * x for x in latencies],
            "fake_cpu_s": time.process_time() - cpu,
            "machine_busy": busy / all_ticks if all_ticks else float("nan"),
            "machine_cpu_s": busy / os.sysconf("SC_CLK_TCK")}


async def mark(conn: Connection, name: str) -> None:
    """Tandem's process reads its CPU clock at this point of the run."""
    conn.send(("mark", name))
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)


async def _record(task: Any, latencies: list[float]) -> None:
    pushed, shown = await task
    latencies.append(shown - pushed)


async def fakes_side(conn: Connection, args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    model = FakeModelServer()
    responder = Model()
    model.responder = responder
    await model.start()
    try:
        fake = TimedTelegram()
        async with fake:
            fake.me["can_read_all_group_messages"] = True  # privacy mode off in BotFather
            conn.send((fake.url, fake.token, model.api_base))
            results: dict[str, Any] = {}
            for phase, context in enumerate(args.contexts):
                conn.send(("start", context))
                await loop.run_in_executor(None, conn.recv)  # Tandem is polling
                result = await busy_group(fake, conn, phase, args)
                result["talk_given"] = [responder.rows.get(f"{phase}-{k + 1}", 0)
                                        for k in range(args.turns)]
                conn.send(("stop", None))
                result.update(await loop.run_in_executor(None, conn.recv))
                results[str(context)] = result
            conn.send(("done", results))
    finally:
        await model.close()


def fakes_process(conn: Connection, args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(fakes_side(conn, args))


# ---- Tandem (this process) -------------------------------------------------------------


def store_figures(path: Path) -> dict[str, Any]:
    with sqlite3.connect(path) as db:
        kinds = dict(db.execute("SELECT kind, COUNT(*) FROM talk WHERE place LIKE ?"
                                " GROUP BY kind", (f"%{GROUP}%",)).fetchall())
        unread = db.execute("SELECT COUNT(*) FROM talk WHERE place LIKE ? AND taken=0"
                            " AND kind <> 'said'",
                            (f"%{GROUP}%",)).fetchone()[0]
        tables = [str(r[0]) for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
        counts = {t: db.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables}
        history = db.execute("SELECT COALESCE(SUM(LENGTH(content)), 0) FROM messages"
                             " WHERE role='user'").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.close()
    return {"free_pages": free, "pages": pages, "history_chars": history, "talk_rows": kinds,
            "talk_unread": unread, "db_bytes": path.stat().st_size,
            "table_rows": {t: n for t, n in counts.items() if n}}


async def tandem_run(conn: Connection, url: str, token: str, api_base: str,
                     context: int) -> dict[str, Any]:
    """Tandem from start to stop for one setting; its figures."""
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        config = Config.model_validate({
            "llm": {"model": "openai/fake", "api_base": api_base, "api_key": "x",
                    "context_window": 32000},
            "store": {"path": str(db)},
            "persona": {"dir": str(REPO / "persona")}, "workspace": {"dir": f"{tmp}/ws"},
            "telegram": {"enabled": True, "token": token, "base_url": f"{url}/bot",
                         "allowed_users": [ANN, BOB], "groups": {"context": context}}})
        async with running(config, None, create):  # type: ignore[arg-type]
            conn.send("ready")
            marks: dict[str, float] = {}
            while (said := await loop.run_in_executor(None, conn.recv))[0] == "mark":
                marks[said[1]] = time.process_time()
                conn.send("ok")
            end = time.process_time()  # "stop": the run is over
            wal = Path(f"{db}-wal")
            live = db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        return {"tandem_cpu_s": end - marks["busy"], "db_live_bytes": live,
                "quiet_cpu_s": (marks["busy"] - marks["quiet"]) / QUIET, **store_figures(db)}


async def tandem_side(conn: Connection) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    url, token, api_base = await loop.run_in_executor(None, conn.recv)
    while True:
        command, value = await loop.run_in_executor(None, conn.recv)
        if command == "done":
            return dict(value)
        figures = await tandem_run(conn, url, token, api_base, value)
        conn.send(figures)


def per_message(r: dict[str, Any]) -> tuple[float, float]:
    """Tandem's CPU ms per unaddressed message: (all of the run's, less the addressed
    turns' own as the quiet turns measured it)."""
    turns = len(r["latencies_ms"]) * r["quiet_cpu_s"]
    return (1000 * r["tandem_cpu_s"] / r["messages"],
            1000 * (r["tandem_cpu_s"] - turns) / r["messages"])


def against(value: float, base: float | None, unit: str, digits: int) -> str:
    return "" if base is None else f" ({value - base:+.{digits}f} {unit} against the first)"


def report(context: int, r: dict[str, Any], base: dict[str, Any] | None) -> None:
    lat, quiet = r["latencies_ms"], r["quiet_ms"]
    gross, net = per_message(r)
    median = statistics.median(lat)
    was = (None, None, None) if base is None else (
        per_message(base)[1], base["db_bytes"] / 1024, statistics.median(base["latencies_ms"]))
    print(f"groups.context: {context}: {r['messages']} unaddressed messages sent in "
          f"{r['sending_s']:.1f} s ({60 * (r['messages'] - 1) / r['sending_s']:.0f}/min; the "
          f"schedule slipped at most {1000 * r['late_s']:.0f} ms), {len(lat)} addressed "
          f"turns; {r['seconds']:.1f} s to the last answer")
    print(f"  Tandem's CPU per unaddressed message  {net:.3f} ms"
          f"{against(net, was[0], 'ms', 3)}; {gross:.3f} ms with the "
          f"addressed turns' own ({1000 * r['quiet_cpu_s']:.1f} ms a quiet turn)")
    rows = ", ".join(f"{k} {v}" for k, v in sorted(r["talk_rows"].items())) or "none"
    print(f"  talk rows kept for the group          {sum(r['talk_rows'].values())} "
          f"({rows}; not yet read {r['talk_unread']})")
    print(f"  database                              {r['db_bytes'] / 1024:.0f} KiB closed"
          f"{against(r['db_bytes'] / 1024, was[1], 'KiB', 0)}, "
          f"{r['db_live_bytes'] / 1024:.0f} KiB with its WAL while running; "
          f"{r['pages']} pages, {r['free_pages']} free")
    print(f"  addressed turn, queued to answer      median {median:.1f} ms"
          f"{against(median, was[2], 'ms', 1)}, "
          f"max {max(lat):.1f} ms; quiet (no talk around) median "
          f"{statistics.median(quiet):.1f} ms")
    print(f"  talk rows the model got per turn      {r['talk_given']}")
    calls = ", ".join(f"{k} {v}" for k, v in sorted(r["group_calls"].items()))
    print(f"  Tandem's calls to the group           {calls}; the fake's own errors "
          f"{r['fake_errors']}")
    tables = ", ".join(f"{k} {v}" for k, v in sorted(r["table_rows"].items()))
    print(f"  rows in the database                  {tables}")
    more = ""
    if base is not None:
        added = (r["history_chars"] - base["history_chars"]) / len(lat)
        more = f" ({added:+,.0f} a turn of the run against the first: the talk a turn " \
            "read stays in its message)"
    print(f"  the history's user messages           {r['history_chars']:,} characters{more}")
    print(f"  machine                               load {r['load_1m']:.2f} (1 min) at the "
          f"end; all CPUs {100 * r['machine_busy']:.0f} % busy: Tandem "
          f"{r['tandem_cpu_s']:.1f} s, the fakes {r['fake_cpu_s']:.1f} s, everything "
          f"{r['machine_cpu_s']:.1f} s of CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="unaddressed messages a minute")
    parser.add_argument("--turns", type=int, default=12,
                        help="addressed turns per setting, spread through the run")
    parser.add_argument("--contexts", default="0,50", help="the settings, comma-separated")
    parser.add_argument("--quick", action="store_true", help="10 s per setting")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.turns = 10.0, min(args.turns, 4)
    args.contexts = [int(c) for c in args.contexts.split(",")]
    logging.basicConfig(level=logging.ERROR)
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"{args.rate:g} unaddressed messages/min for {args.seconds:g} s per setting, "
          f"{args.turns} addressed turns; load before {os.getloadavg()[0]:.2f}")
    print("CPU: Tandem's process alone (process_time, all threads); the fake Telegram, "
          "the fake model and the people run in a child process")
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=fakes_process, args=(theirs, args), daemon=True)
    child.start()

    try:
        results = asyncio.run(tandem_side(ours))
    finally:
        child.join(timeout=30)
    base = None
    for context, result in results.items():
        report(int(context), result, base)
        base = base or result
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
