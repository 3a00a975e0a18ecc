"""Tandem's multi-worker mode side by side: one process on SQLite, then one, two and three
workers on one PostgreSQL database; round trips per turn; failover after `kill -9`;
Cancel across workers.

Every configuration is real `tandem run` processes (`tests.suites.cluster_rig.Worker`)
with Telegram in webhook mode, so SQLite and PostgreSQL are measured the same way. The
fake Bot API, in this process, is the load balancer: it posts each update to the next
worker (`webhook_targets`), up to 40 at once as Telegram does (the test fake posts one
at a time, which would cap turns/s), and stamps each answer's final text as it arrives
(`TimedTelegram`). The fake model, also here, answers at once, so latencies are Tandem's
own. Each run makes a throwaway database (`tests.pg.database`) and drops it; every wait
has a timeout, and every worker is killed (by pid) on the way out, SIGTERM included.
What other processes took of the machine shows in the "other" CPU column, and each
configuration also gets the turns/s its own CPU per turn allows on idle cores.

1. Load, per configuration, after every worker has run a turn (litellm loaded):
   * throughput: `--chats` chats each send their next message the moment the previous
     answer shows; turns/s over the phase;
   * latency: `--lat-chats` chats at a fixed offered rate (`--rate` turns/s: each chat
     thinks lat-chats/rate s, uniform 0.5-1.5x, between turns), the same for every
     configuration; added latency from the fake's first POST of the update to a worker to
     the answer's final text (p50/p99): what Tandem adds above an instant model;
   * during the throughput phase, CPU seconds per turn (/proc): the workers'; the
     PostgreSQL backends serving this database (pids from pg_stat_activity; one that
     exits within the phase is missed); all postgres processes (other databases' too,
     and backends that exited, as the postmaster's reaped children); this process (the
     fakes and the chats); everything else on the machine (/proc/stat); and how many of
     the machine's cores were busy;
   * transactions and rows written per turn on this database over both phases
     (pg_stat_database, the idle rate subtracted). A backend that goes idle may report its
     counts up to 10 s late, so the counters are read `--settle` s (11) after the
     warm-up and after the phases; in quick mode 1.5 s, which makes them approximate.
2. Round trips per plain turn (one message, one answer, no tool), counted exactly: a hub
   and a cluster worker (the code `tandem run` runs, with an instant in-process model) in
   this process, on a database of their own. Every request-response exchange psycopg
   makes (`AsyncConnection.wait`; LISTEN's waits for notifications excluded) is counted
   and attributed by its call stack: the store (`bot/store`, by method), the task queue
   (procrastinate, by query) or the cluster's signals and leader (`bot/serve/cluster`). What
   the idle worker does meanwhile (heartbeats, polls, the leader's sweeps), measured over
   an idle window, is subtracted.
3. Cancel across workers (`--cancels` rounds on three workers): a slow answer streams on
   one worker, the press of its Cancel button is delivered to another; time from the
   press to the edit showing "⏹ Cancelled." (target p99 <= 1 s).
4. Failover (`--kills` rounds on three workers): a chat's answer streams (~9 s); 0.2-1 s
   after it shows, `kill -9` of the worker whose job runs it (from the workers' logs);
   time from the kill to Tandem's next message in that chat (target p99 <= 10 s; a turn
   cut mid-stream is not run again: that message is the interruption notice), and to
   another worker starting the cut job. The killed worker starts again 0.5 s later, and
   the next round waits until all three are ready.

Percentiles are nearest-rank (p99 of 20 samples is their maximum). A measurement that
fails (a turn never answered, no message after a kill, a Cancel that stops nothing) is
counted and reported rather than waited for.

    python benchmarks/cluster_bench.py [--quick] [--json out.json]

`--quick` (or `TANDEM_CLUSTER_BENCH_QUICK=1`): a smoke run, few turns, 3 cancels and
3 kills, about two minutes. The full run (20 cancels, 20 kills) takes about ten minutes
on 2 cores. `--help` lists the knobs (chats, turns, offered rate, rounds).
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import asyncio
import atexit
import contextlib
import json
import math
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import psycopg

from benchmarks.core_bench import Done, InstantModel
from benchmarks.run_all import machine
from benchmarks.telegram_bench import QUESTION, TimedTelegram
from tests.conftest import said
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.slack_server import FakeSlackServer
from tests.pg import ADMIN_URL, database
from tests.suites.cluster_rig import (
    BalancerTelegram,
    Job,
    Rig,
    Worker,
    free_port,
    write_config,
)
from tests.suites.test_cluster import INTERRUPTED, TgConv, until
from tests.suites.test_cluster import respond as scenario_respond

REPO = Path(__file__).resolve().parent.parent
JSON = dict[str, Any]
TICKS = os.sysconf("SC_CLK_TCK")
CHAT_BASE, MAX_CHATS = 10_000, 3_000
"""Every chat the benchmark opens is one of these (all allowed users)."""
TURN_S = 60.0
"""How long one answer may take before it counts as failed."""
READY_S = 120.0
FAILOVER_S = 60.0
"""After a kill: no message in the chat within this long counts as a failed failover."""
CANCEL_S = 5.0
LIVE: list[Rig] = []
"""Every rig started, for the exit hook."""


# -- the fakes --------------------------------------------------------------------------


def respond(messages: list[dict[str, Any]]) -> Reply:
    """`q<tag>` (the load phases) gets `a<tag>` at once; the cluster suite's scenarios
    ("slow <token>": about 9 s of streaming) get its answers."""
    users = said(messages)
    found = QUESTION.findall(users[-1]) if users else []
    return Reply(text=f"Sure: a{found[-1]}") if found else scenario_respond(messages)


class ClusterTelegram(TimedTelegram, BalancerTelegram):
    """The balancing fake Bot API, stamping each update's first POST to a worker (where
    added latency starts) and how long the workers took to answer deliveries. It delivers
    as Telegram does, up to the webhook's `max_connections` updates at once (40 unless
    set; Tandem does not set it), where the test fake posts one at a time (which caps
    turns/s at one over the time a worker takes to answer a delivery)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.acks: list[tuple[float, float]] = []
        """(began, seconds) of every delivery attempt."""
        self._flying: dict[int, asyncio.Task[None]] = {}

    async def _deliver(self) -> None:
        assert self._webhook is not None
        slots = asyncio.Semaphore(int(self._webhook.get("max_connections") or 40))
        timeout = aiohttp.ClientTimeout(total=self.webhook_timeout)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while self._webhook is not None and not self._closing:
                    await slots.acquire()  # then the update and its target, as of now
                    event = self._signal.current()
                    update = next((u for u in self._updates
                                   if u["update_id"] not in self._flying), None)
                    target = self._next_target() if update is not None else None
                    if update is None or target is None:
                        slots.release()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(event.wait(), 1.0)
                        continue
                    self._flying[update["update_id"]] = asyncio.get_running_loop() \
                        .create_task(self._deliver_one(session, target, update, slots))
        finally:
            for task in self._flying.values():
                task.cancel()

    async def _deliver_one(self, session: aiohttp.ClientSession, target: str, update: JSON,
                           slots: asyncio.Semaphore) -> None:
        """One attempt; the update leaves the queue on a 2xx, else waits to be retried."""
        try:
            if await self._post_update(session, target, update):
                with contextlib.suppress(ValueError):
                    self._updates.remove(update)
            else:
                await asyncio.sleep(self.webhook_retry[0])
        finally:
            self._flying.pop(update["update_id"], None)
            slots.release()
            self._signal.fire()

    async def _post_update(self, session: Any, url: str, update: JSON) -> bool:
        began = time.monotonic()
        self.served.setdefault(update["update_id"], began)
        try:
            return await super()._post_update(session, url, update)
        finally:
            self.acks.append((began, time.monotonic() - began))


# -- figures ----------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (so p99 of 20 samples is their maximum); nan if none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def cpu_of(pid: int) -> float:
    """CPU seconds of a live process and its reaped children (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return sum(int(f) for f in fields[11:15]) / TICKS


def postgres_cpu() -> float:
    """CPU seconds of every postgres process, exited backends included (the
    postmaster's reaped children)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "postgres":
                total += cpu_of(int(entry.name))
    return total


def machine_busy() -> float:
    """CPU seconds the whole machine spent not idle since boot."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS


@dataclass
class Snapshot:
    at: float
    workers: dict[int, float]
    backends: dict[int, float]
    postgres: float
    machine: float
    me: float


class Meter:
    """CPU of the workers, of PostgreSQL and of the rest; the database's own counters."""

    def __init__(self, admin: psycopg.AsyncConnection[Any], db: str | None) -> None:
        self.admin, self.db = admin, db
        self.idle = (0.0, 0.0)
        """Transactions and rows written per second while the workers wait for work."""

    async def snap(self, workers: list[Worker]) -> Snapshot:
        pids: list[int] = []
        if self.db is not None:
            rows = await (await self.admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.db,))).fetchall()
            pids = [int(r[0]) for r in rows]
        return Snapshot(time.monotonic(), {w.pid: cpu_of(w.pid) for w in workers if w.pid},
                        {pid: cpu_of(pid) for pid in pids}, postgres_cpu(), machine_busy(),
                        time.process_time())

    async def counts(self) -> tuple[float, int, int]:
        """(when, transactions, rows written) of this database so far."""
        if self.db is None:
            return time.monotonic(), 0, 0
        row = await (await self.admin.execute(
            "SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted"
            " FROM pg_stat_database WHERE datname = %s", (self.db,))).fetchone()
        return time.monotonic(), int(row[0]) if row else 0, int(row[1]) if row else 0

    async def measure_idle(self, settle: float, seconds: float) -> None:
        """The counters' rate while the workers wait for work, after `settle` s."""
        await asyncio.sleep(settle)
        a = await self.counts()
        await asyncio.sleep(seconds)
        b = await self.counts()
        self.idle = ((b[1] - a[1]) / (b[0] - a[0]), (b[2] - a[2]) / (b[0] - a[0]))

    def per_turn(self, a: tuple[float, int, int], b: tuple[float, int, int],
                 turns: int) -> JSON:
        """Transactions and rows written per turn between two `counts`, idle subtracted."""
        window = b[0] - a[0]
        return {"xacts_per_turn": (b[1] - a[1] - self.idle[0] * window) / max(turns, 1),
                "rows_per_turn": (b[2] - a[2] - self.idle[1] * window) / max(turns, 1),
                "idle_xacts_per_s": self.idle[0]}

    @staticmethod
    def cpu(a: Snapshot, b: Snapshot, turns: int) -> JSON:
        """CPU milliseconds per turn between two snapshots, by whose."""
        def grown(before: dict[int, float], after: dict[int, float]) -> float:
            return sum(v - before.get(pid, 0.0) for pid, v in after.items())

        parts = {"workers": grown(a.workers, b.workers), "pg_db": grown(a.backends, b.backends),
                 "pg_all": b.postgres - a.postgres, "bench": b.me - a.me}
        machine = b.machine - a.machine
        parts["other"] = machine - parts["workers"] - parts["pg_all"] - parts["bench"]
        out = {f"{k}_ms_per_turn": 1000 * v / max(turns, 1) for k, v in parts.items()}
        out["cores_busy"] = machine / (b.at - a.at)
        return out


# -- the bench --------------------------------------------------------------------------


@dataclass
class Bench:
    """The fakes, the workers of the configuration measured now, and the figures."""

    args: argparse.Namespace
    tg: ClusterTelegram
    slack: FakeSlackServer
    model: FakeModelServer
    tmp: Path
    admin: psycopg.AsyncConnection[Any]
    rig: Rig | None = None
    meter: Meter | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    phase: int = 0
    chats: int = 0
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def take_chats(self, n: int) -> int:
        """The first of `n` chats nobody used yet."""
        first = CHAT_BASE + self.chats
        self.chats += n
        assert self.chats <= MAX_CHATS, "raise MAX_CHATS"
        return first

    def conv(self) -> TgConv:
        """A fresh chat driven as the cluster suite drives one (TgConv needs only `.tg`)."""
        return TgConv(self, self.take_chats(1))  # type: ignore[arg-type]

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def start_rig(self, name: str, store_url: str, count: int) -> Rig:
        """Workers in `tmp/<name>`, their working directory."""
        folder = self.tmp / name
        folder.mkdir()
        config = write_config(folder, store_url, self.model, self.tg, self.slack,
                              tg_users=list(range(CHAT_BASE, CHAT_BASE + MAX_CHATS)),
                              slack_users=["*"], public_url="http://127.0.0.1:8443/telegram")
        self.rig = Rig(folder, config, count)
        LIVE.append(self.rig)
        return self.rig


def commit() -> str:
    """The code measured: its commit, and whether it has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                              text=True, check=False).stdout.strip()

    changed = git("status", "--porcelain", "--", "bot", "adapters")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if changed else "")


def kill_workers(workers: list[Worker]) -> None:
    """SIGKILL every one of `workers` still running (by pid)."""
    for w in workers:
        if w.proc is not None and w.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.proc.pid, signal.SIGKILL)


async def stop_workers_of(workers: list[Worker]) -> None:
    kill_workers(workers)
    waits = [w.proc.wait() for w in workers if w.proc is not None]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*waits), 10)


async def stop_workers(rig: Rig) -> None:
    await stop_workers_of(rig.workers)


async def start_worker(w: Worker) -> None:
    """Start `w` on ports picked just now (a port picked earlier may have gone to some
    connection since: they come from the same range), once more if it fails to start."""
    for attempt in (1, 2):
        w.tg_port, w.slack_port = free_port(), free_port()
        await w.start()
        try:
            await w.wait_ready(READY_S)
            return
        except AssertionError:
            if w.alive:
                await stop_workers_of([w])
            if attempt == 2:
                raise AssertionError(f"w{w.index} did not start twice: {why(w)}") from None


def why(w: Worker) -> str:
    """What a worker that did not start left to say."""
    code = w.proc.returncode if w.proc is not None else None
    return f"exit status {code}, log:\n{w.log_text().strip()[-3000:]}"


async def start_workers(workers: list[Worker]) -> None:
    await asyncio.gather(*(start_worker(w) for w in workers))


def running_job(rig: Rig, match: Callable[[Job], bool]) -> Job | None:
    """A job running now (its worker's current start, not ended) that matches."""
    for job in rig.jobs():
        w = rig.workers[job.worker]
        if job.ended is None and w.alive and job.start == w.start_no and match(job):
            return job
    return None


# -- load -------------------------------------------------------------------------------


@dataclass
class Load:
    sent: list[tuple[float, int, str]] = field(default_factory=list)
    """(pushed, update id, answer tag) of every message answered."""
    failed: int = 0


async def chat_turns(bench: Bench, chat: int, turns: int, think: float, load: Load) -> None:
    """One chat: `turns` messages, each once the previous one's answer shows."""
    if think:
        await asyncio.sleep(bench.rng.uniform(0, think))
    for turn in range(turns):
        tag = f"{bench.phase}.{chat}-{turn}"
        bench.tg.waiters[f"a{tag}"] = done = asyncio.Event()
        pushed = time.monotonic()
        uid = bench.tg.push_message(chat, chat, f"q{tag}", first_name=f"User{chat}")
        try:
            await asyncio.wait_for(done.wait(), TURN_S)
        except TimeoutError:
            load.failed += turns - turn  # this chat's lane is stuck: the rest never goes
            return
        load.sent.append((pushed, uid, f"a{tag}"))
        if think and turn < turns - 1:
            await asyncio.sleep(bench.rng.uniform(0.5, 1.5) * think)


async def run_chats(bench: Bench, chats: int, turns: int, think: float) -> Load:
    bench.phase += 1
    first, load = bench.take_chats(chats), Load()
    await asyncio.gather(*(chat_turns(bench, first + c, turns, think, load)
                           for c in range(chats)))
    return load


async def load_phase(bench: Bench, workers: list[Worker], chats: int, turns: int,
                     think: float) -> JSON:
    """One phase's figures: turns/s, added latency, CPU."""
    assert bench.meter is not None
    before, acks0 = await bench.meter.snap(workers), len(bench.tg.acks)
    load = await run_chats(bench, chats, turns, think)
    after = await bench.meter.snap(workers)
    tg, n, seconds = bench.tg, len(load.sent), after.at - before.at
    latency = [1000 * (tg.shown[tag] - tg.served[uid]) for _, uid, tag in load.sent]
    queued = [1000 * (tg.served[uid] - pushed) for pushed, uid, _ in load.sent]
    acks = tg.acks[acks0:]
    out: JSON = {"turns": n, "failed": load.failed, "seconds": seconds,
                 "turns_per_s": n / seconds, "p50_ms": pct(latency, 50),
                 "p99_ms": pct(latency, 99), "max_ms": pct(latency, 100),
                 "queued_p50_ms": pct(queued, 50),
                 "ack_p50_ms": pct([1000 * s for _, s in acks], 50),
                 "deliveries_in_flight": sum(s for _, s in acks) / seconds,
                 **Meter.cpu(before, after, n)}
    return out


async def warm_up(bench: Bench, workers: list[Worker]) -> None:
    """Until every worker ran a turn (its first one waits for litellm's import)."""
    for _ in range(5):
        load = await run_chats(bench, 3 * len(workers), 1, 0.0)
        if load.failed:
            bench.notes.append(f"warm-up: {load.failed} turns unanswered")
        if len(workers) == 1 or all(any(j.ended for j in w.jobs()) for w in workers):
            break
    await asyncio.sleep(1.0)


async def measure_config(bench: Bench, workers: list[Worker]) -> JSON:
    """Throughput, then latency at the fixed offered rate, on `workers`; with PostgreSQL,
    the database's counters over both (a settle before and after: see `--settle`)."""
    args, meter = bench.args, bench.meter
    assert meter is not None
    bench.tg.webhook_targets = [w.tg_url for w in workers]
    await warm_up(bench, workers)
    if meter.db is not None:
        await meter.measure_idle(args.settle, args.idle)
    counts0 = await meter.counts()
    busy = await load_phase(bench, workers, args.chats, args.turns, 0.0)
    paced = await load_phase(bench, workers, args.lat_chats, args.lat_turns,
                             args.lat_chats / args.rate)
    out = {"workers": len(workers), "throughput": busy, "latency": paced}
    if meter.db is not None:
        await asyncio.sleep(args.settle)
        turns = busy["turns"] + paced["turns"]
        out["database"] = meter.per_turn(counts0, await meter.counts(), turns)
    return out


async def sqlite_configs(bench: Bench, out: JSON) -> None:
    rig = bench.start_rig("sqlite", f"sqlite:///{bench.tmp}/sqlite/tandem.db", 1)
    bench.meter = Meter(bench.admin, None)
    try:
        await start_workers(rig.workers)
        out["sqlite_1"] = await measure_config(bench, rig.workers)
    finally:
        await stop_workers(rig)


async def postgres_configs(bench: Bench, url: str, out: JSON) -> None:
    """One, two, then three workers on the same database (each phase with chats of its
    own); the three stay up for the cancel and failover rounds."""
    rig = bench.start_rig("pg", url, 3)
    bench.meter = Meter(bench.admin, url.rsplit("/", 1)[1])
    for n in (1, 2, 3):
        await start_workers(rig.workers[n - 1:n])
        print(f"PostgreSQL, {n} worker{'s' * (n > 1)}…", flush=True)
        out[f"postgres_{n}"] = await measure_config(bench, rig.workers[:n])


# -- round trips ------------------------------------------------------------------------


def _query_names() -> dict[str, str]:
    from procrastinate import sql

    return {text: name for name, text in sql.queries.items()}


LOCAL = frozenset({"notifies", "_set_autocommit_gen", "_set_read_only_gen",
                   "_set_isolation_level_gen", "_set_deferrable_gen"})
"""psycopg generators that send nothing (a setting kept here; waiting for NOTIFY)."""
STEPS = {"_commit_gen": "commit", "_exit_gen": "commit", "_enter_gen": "begin",
         "_rollback_gen": "rollback"}


class RoundTrips:
    """Counts the exchanges with the server psycopg makes in this process: every
    `AsyncConnection.wait` but those that send nothing (`LOCAL`, a commit or rollback
    with no transaction open). Each is labelled by who asked, and by what it was when
    not a statement: the pool's check of a connection it hands out, BEGIN, COMMIT."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.queries = _query_names()
        self._wait: Any = None

    def __enter__(self) -> RoundTrips:
        self._wait = original = psycopg.AsyncConnection.wait
        counts, who = self.counts, self.who

        async def wait(conn: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
            name = getattr(gen, "__name__", "")
            idle = conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
            if name not in LOCAL and not (idle and name in ("_commit_gen", "_rollback_gen")):
                counts[who(sys._getframe(1), STEPS.get(name, ""))] += 1
            return await original(conn, gen, *args, **kwargs)

        psycopg.AsyncConnection.wait = wait  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_exc: object) -> None:
        psycopg.AsyncConnection.wait = self._wait  # type: ignore[method-assign]

    def who(self, frame: FrameType | None, step: str) -> str:
        """"store: <method>" (the outermost store frame), "queue: <procrastinate query>",
        "cluster: <function>" or "other: <file>:<function>"; then "[step]"."""
        store, label = None, None
        for f in _frames(frame):
            path, name = f.f_code.co_filename, f.f_code.co_qualname
            if "/psycopg_pool/" in path and name.endswith(".check_connection"):
                step = "pool check"
            if path.endswith("/contextlib.py"):
                continue  # `async with` helpers between a store method and its connection
            if "/bot/store/" in path:
                store = name
                continue
            label = self.owner(f, path, name) if store is None else f"store: {store}"
            if label:
                break
        label = label or (f"store: {store}" if store else "other: ?")
        return f"{label} [{step}]" if step else label

    def owner(self, f: FrameType, path: str, name: str) -> str | None:
        query = f.f_locals.get("query") if "/procrastinate/" in path else None
        if isinstance(query, str) and query in self.queries:
            return f"queue: {self.queries[query]}"
        if "/bot/serve/cluster/" in path:
            return f"cluster: {name}"
        if "/bot/" in path or "/benchmarks/" in path:
            return f"other: {Path(path).name}:{name}"
        return None


def _frames(frame: FrameType | None) -> Iterator[FrameType]:
    while frame is not None:
        yield frame
        frame = frame.f_back


def per_turn(turns: Counter[str], idle: Counter[str], idle_s: float, window: float,
             n: int) -> JSON:
    """Round trips per turn by label and by kind, the idle rate subtracted."""
    labels = {k: (turns[k] - idle[k] * window / idle_s) / n for k in turns | idle}
    labels = {k: round(v, 2) for k, v in sorted(labels.items()) if abs(v) >= 0.05}
    kinds: dict[str, float] = {}
    for label, value in labels.items():
        kind = label.split(":")[0]
        kinds[kind] = kinds.get(kind, 0.0) + value
    return {"total": round(sum(kinds.values()), 1),
            **{k: round(v, 1) for k, v in sorted(kinds.items())}, "by_label": labels,
            "idle_per_s": {k: round(v / idle_s, 2) for k, v in sorted(idle.items())}}


async def round_trips(turns: int, idle_s: float) -> JSON:
    """Round trips per plain turn of one in-process worker (see the module docstring)."""
    from bot.core.config import Config
    from bot.core.events import ConvKey, User, UserMessage
    from bot.run.app import build
    from bot.serve.cluster import Cluster

    with database() as url, tempfile.TemporaryDirectory() as tmp:
        config = Config.model_validate({
            "llm": {"model": "openai/instant", "context_window": 32000},
            "store": {"url": url, "pool_size": 4}, "persona": {"dir": str(REPO / "persona")},
            "workspace": {"dir": f"{tmp}/ws"}})
        cluster = Cluster(url)
        hub, dispatch = build(config, model=InstantModel(), cluster=cluster)
        done = Done()
        dispatch.sinks["console"] = done
        key, user = ConvKey("console", "1"), User("u", "Ann")

        async def turn(text: str) -> None:
            done.event.clear()
            await hub.submit(UserMessage(key, user, text, ref=text))
            await asyncio.wait_for(done.event.wait(), TURN_S)

        with RoundTrips() as trips:
            await hub.d.store.open()
            await cluster.start()
            try:
                for i in range(3):
                    await turn(f"warm {i}")
                await asyncio.sleep(1.0)
                trips.counts.clear()
                await asyncio.sleep(idle_s)
                idle = Counter(trips.counts)
                trips.counts.clear()
                began = time.monotonic()
                for i in range(turns):
                    await turn(f"q{i}")
                await asyncio.sleep(0.5)  # the last job's end and the next poll
                window = time.monotonic() - began
                counted = Counter(trips.counts)
            finally:
                await hub.close()
                await cluster.close()
                await hub.d.store.close()
    return per_turn(counted, idle, idle_s, window, turns)


# -- cancel and failover ----------------------------------------------------------------


async def streaming(bench: Bench, conv: TgConv) -> tuple[str, Any, Job] | None:
    """A slow answer (about 9 s) streaming in `conv`: (token, its live message, its job)."""
    rig = bench.rig
    assert rig is not None
    if not await until(lambda: all(w.ready for w in rig.workers), READY_S):
        return None
    tok, _ = await conv.say("slow")
    live = await until(lambda: conv.live_slow(tok), TURN_S)
    job = await until(lambda: running_job(rig, lambda j: tok in j.text), 10)
    return (tok, live, job) if live is not None and job is not None else None


async def cancel_round(bench: Bench) -> JSON:
    """Cancel pressed on the live message, delivered to another worker than the one
    streaming it: time to the edit that shows "⏹ Cancelled."."""
    rig, conv = bench.rig, bench.conv()
    assert rig is not None
    found = await streaming(bench, conv)
    if found is None:
        return {"error": "the slow turn did not start streaming"}
    tok, live, job = found
    target = next((w for w in rig.workers if w.index != job.worker and w.ready), None)
    if target is None:
        return {"error": "no other worker is ready"}
    try:
        sent, _answer = await conv.press_cancel(live, target)
    except AssertionError:
        return {"error": f"the press was not delivered to w{target.index}"}
    stopped = await until(conv.cancelled_at, CANCEL_S)
    if stopped is None:
        runner = rig.workers[job.worker]  # stop it where it runs, to go on
        if (live := conv.live_slow(tok)) is not None and runner.alive:
            with contextlib.suppress(AssertionError):
                await conv.press_cancel(live, runner)
        return {"error": f"not stopped within {CANCEL_S:g} s (w{job.worker} -> "
                         f"w{target.index})"}
    return {"ms": 1000 * (stopped - sent), "from": job.worker, "to": target.index}


def post_after(bench: Bench, chat: int, at: float) -> Any:
    """Tandem's first new message in `chat` after `at`."""
    return next((c for c in bench.tg.calls_to("sendMessage") if c.ok and c.time > at
                 and str(c.params.get("chat_id")) == str(chat)), None)


async def restart(bench: Bench, w: Worker) -> None:
    """`w` again, 0.5 s after its kill, in the balancer's list on its new port."""
    await asyncio.sleep(0.5)
    try:
        await start_worker(w)
    except AssertionError as exc:
        bench.notes.append(f"w{w.index} did not start again: {str(exc)[-300:]}")
    assert bench.rig is not None
    bench.tg.webhook_targets = [x.tg_url for x in bench.rig.workers]


async def failover_round(bench: Bench) -> JSON:
    """`kill -9` of the worker streaming a turn: time to the next message in its chat."""
    rig, conv = bench.rig, bench.conv()
    assert rig is not None
    found = await streaming(bench, conv)
    if found is None:
        return {"error": "the slow turn did not start streaming"}
    _tok, _live, job = found
    await asyncio.sleep(bench.rng.uniform(0.2, 1.0))
    w = rig.workers[job.worker]
    leader = rig.leader() is w
    at, wall = w.kill_now(), time.time()
    assert w.proc is not None
    await asyncio.wait_for(w.proc.wait(), 10)
    bench.spawn(restart(bench, w))
    post = await until(lambda: post_after(bench, conv.chat, at), FAILOVER_S)
    again = [j.at for j in rig.jobs() if j.id == job.id and j.at > wall]
    out: JSON = {"worker": w.index, "leader": leader,
                 "handoff_ms": 1000 * (min(again) - wall) if again else None}
    if post is None:
        return {**out, "error": f"no message within {FAILOVER_S:g} s"}
    text = str(post.params.get("text"))
    shown = "notice" if text.startswith(INTERRUPTED) else text[:40]
    return {**out, "ms": 1000 * (post.time - at), "shown": shown}


async def rounds(bench: Bench, count: int, play: Callable[[Bench], Any], what: str) -> JSON:
    """`count` rounds of `play`; their times and failures."""
    results = []
    for n in range(count):
        try:
            result = await asyncio.wait_for(play(bench), READY_S + TURN_S)
        except TimeoutError:
            result = {"error": "round timed out"}
        except Exception as exc:  # counted as a failed round; the next one goes on
            result = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        shown = result.get("error") or f"{result['ms']:.0f} ms"
        print(f"  {what} {n + 1}/{count}: {shown}", flush=True)
        results.append(result)
    times = [r["ms"] for r in results if "ms" in r]
    return {"n": count, "ok": len(times), "failed": count - len(times),
            "p50_ms": pct(times, 50), "p99_ms": pct(times, 99), "max_ms": pct(times, 100),
            "rounds": results}


# -- the report -------------------------------------------------------------------------

NAMES = {"sqlite_1": "SQLite, 1 process", "postgres_1": "PostgreSQL, 1 worker",
         "postgres_2": "PostgreSQL, 2 workers", "postgres_3": "PostgreSQL, 3 workers"}


def num(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1f}"


def config_rows(configs: JSON) -> list[str]:
    head = (f"{'':23} {'turns/s':>7} {'p50':>6} {'p99':>6} {'at/s':>5} | {'workers':>7} "
            f"{'pg db':>6} {'pg all':>6} {'fakes':>6} {'other':>6} {'cores':>5} | "
            f"{'xacts':>5} {'rows':>5} {'failed':>6}")
    lines = [head, "-" * len(head)]
    for key, name in NAMES.items():
        got = configs.get(key)
        if not isinstance(got, dict) or "throughput" not in got:
            lines.append(f"{name:23} failed: {configs.get(key.split('_')[0] + '_error')}")
            continue
        busy, paced, db = got["throughput"], got["latency"], got.get("database", {})
        lines.append(
            f"{name:23} {busy['turns_per_s']:7.1f} {paced['p50_ms']:6.1f} {paced['p99_ms']:6.1f}"
            f" {paced['turns_per_s']:5.1f} | {busy['workers_ms_per_turn']:7.1f} "
            f"{busy['pg_db_ms_per_turn']:6.1f} {busy['pg_all_ms_per_turn']:6.1f} "
            f"{busy['bench_ms_per_turn']:6.1f} {busy['other_ms_per_turn']:6.1f} "
            f"{busy['cores_busy']:5.2f} | {num(db.get('xacts_per_turn')):>5} "
            f"{num(db.get('rows_per_turn')):>5} {busy['failed'] + paced['failed']:6d}")
    return lines


def cpu_bound(got: JSON) -> float:
    """Turns/s the CPU per turn allows on idle cores: the cores over the CPU of a turn
    (workers, PostgreSQL, fakes), and each worker process at most one core (the GIL)."""
    busy = got["throughput"]
    total = sum(busy[f"{k}_ms_per_turn"] for k in ("workers", "pg_all", "bench"))
    return 1000 * min((os.cpu_count() or 1) / total,
                      got["workers"] / busy["workers_ms_per_turn"])


def config_notes(configs: JSON) -> list[str]:
    lines = []
    for key, name in NAMES.items():
        got = configs.get(key)
        if isinstance(got, dict) and "throughput" in got:
            busy = got["throughput"]
            lines.append(
                f"  {name}: full load {busy['turns']} turns in {busy['seconds']:.1f} s, "
                f"latency there p50 {busy['p50_ms']:.0f} / p99 {busy['p99_ms']:.0f} ms "
                f"(queueing); a webhook delivery answered in {busy['ack_p50_ms']:.1f} ms "
                f"(p50), {busy['deliveries_in_flight']:.1f} in flight on average; an update "
                f"waited at the fake {busy['queued_p50_ms']:.1f} ms (p50); its CPU per turn "
                f"allows ~{cpu_bound(got):.0f} turns/s on {os.cpu_count()} idle cores")
    return lines


def trips_lines(trips: JSON) -> list[str]:
    if "total" not in trips:
        return [f"round trips: {trips.get('error')}"]
    kinds = " + ".join(f"{k} {trips[k]:.1f}" for k in ("store", "queue", "cluster", "other")
                       if k in trips)
    idle = sum(trips["idle_per_s"].values())
    lines = [f"PostgreSQL round trips per plain turn (one in-process worker): "
             f"{trips['total']:.1f} = {kinds}  (idle worker: {idle:.1f}/s, subtracted)",
             "  (turns one at a time, so each job's fetch_job is followed by one that finds "
             "nothing; [pool check]: procrastinate's pool tests each connection it lends)"]
    labels = sorted(trips["by_label"].items(), key=lambda kv: -kv[1])
    lines += [f"    {value:5.2f}  {label}" for label, value in labels]
    return lines


def rounds_line(name: str, got: JSON, target_ms: float) -> str:
    if "n" not in got:
        return f"{name}: {got.get('error')}"
    met = got["failed"] == 0 and got["p99_ms"] <= target_ms
    return (f"{name}: n={got['n']} ok={got['ok']} failed={got['failed']}  p50 "
            f"{got['p50_ms']:.0f} ms, p99 {got['p99_ms']:.0f} ms, max {got['max_ms']:.0f} ms"
            f"  (target p99 <= {target_ms / 1000:g} s: {'met' if met else 'NOT met'})")


def failover_lines(got: JSON) -> list[str]:
    lines = [rounds_line("failover, kill -9 -> next message in the chat", got, 10_000)]
    if "rounds" in got:
        done = [r for r in got["rounds"] if "worker" in r]
        hand = [r["handoff_ms"] for r in done if r.get("handoff_ms") is not None]
        shown = Counter(r.get("shown", "none") for r in done)
        lines.append(f"    handoff (kill -> another worker starts the job): p50 "
                     f"{pct(hand, 50):.0f} ms, max {pct(hand, 100):.0f} ms; "
                     f"{sum(r['leader'] for r in done)} kills hit the leader; "
                     f"shown after the kill: {dict(shown)}")
        lines += [f"    {r['error']}" for r in got["rounds"] if "error" in r]
    return lines


LEGEND = """
Every configuration: `tandem run` processes, Telegram in webhook mode behind the fake Bot
API (its deliveries balanced over the workers, up to 40 at once), an instant fake model.
turns/s: full load (each chat's next message as soon as its answer shows). p50/p99: added
latency in ms, at the fixed offered rate (at/s: achieved). CPU at full load, ms per turn:
workers = the `tandem run` processes; pg db = PostgreSQL backends of this database; pg all =
every postgres process; fakes = this process (fake Telegram, fake model, the chats); other
= the rest of the machine (other users' processes, interrupts); cores = cores busy.
xacts/rows: transactions and rows written per turn, both phases (pg_stat_database, idle
rate subtracted; read {settle:g} s after{approx}). failed: turns never answered in 60 s.
"""


def report(out: JSON) -> None:
    print(f"\n{out['machine']}; load average before: {out['load_before']}; code "
          f"{out.get('code')}")
    settle = out["settings"]["settle"]
    print(LEGEND.format(settle=settle, approx=": approximate" if settle < 10 else ""))
    print("\n".join(config_rows(out.get("configs", {}))))
    print("\n".join(config_notes(out.get("configs", {}))))
    print()
    print("\n".join(trips_lines(out.get("round_trips", {}))))
    print(rounds_line("cancel across workers, press -> '⏹ Cancelled.'", out.get("cancel", {}),
                      1_000))
    for r in out.get("cancel", {}).get("rounds", []):
        if "error" in r:
            print(f"    {r['error']}")
    print("\n".join(failover_lines(out.get("failover", {}))))
    for note in out.get("notes", []):
        print(f"note: {note}")


# -- main -------------------------------------------------------------------------------

QUICK = {"chats": 10, "turns": 4, "lat_chats": 10, "lat_turns": 3, "cancels": 3, "kills": 3,
         "trips": 20, "idle": 3.0, "settle": 1.5}
FULL = {"chats": 30, "turns": 20, "lat_chats": 20, "lat_turns": 15, "cancels": 20,
        "kills": 20, "trips": 100, "idle": 5.0, "settle": 11.0}


async def section(out: JSON, name: str, work: Any, bench: Bench | None = None) -> bool:
    """`out[name] = await work` (unless None); a failure is reported there instead (the
    run goes on), with the end of the workers' logs."""
    try:
        if (result := await work) is not None:
            out[name] = result
        return True
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(f"  {name} failed: {out[name]['error']}", flush=True)
        if bench is not None and bench.rig is not None:
            print(bench.rig.dump_logs(tail=30), flush=True)
        return False


async def measure_all(bench: Bench, url: str, out: JSON) -> None:
    print("SQLite, 1 process…", flush=True)
    configs = out["configs"] = {}
    await section(configs, "sqlite_error", sqlite_configs(bench, configs), bench)
    ok = await section(configs, "postgres_error", postgres_configs(bench, url, configs), bench)
    if not ok:
        out["cancel"] = out["failover"] = {"error": "not run: three workers did not run"}
        return
    print(f"cancels ({bench.args.cancels})…", flush=True)
    await section(out, "cancel", rounds(bench, bench.args.cancels, cancel_round, "cancel"),
                  bench)
    print(f"kills ({bench.args.kills})…", flush=True)
    await section(out, "failover", rounds(bench, bench.args.kills, failover_round, "kill"),
                  bench)


async def run(args: argparse.Namespace) -> JSON:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    out: JSON = {"mode": "quick" if args.quick else "full", "machine": machine(),
                 "load_before": os.getloadavg(), "settings": vars(args)}
    with tempfile.TemporaryDirectory() as tmp, database() as url:
        out["code"] = commit()
        print(f"code: {out['code']}", flush=True)
        print("round trips per plain turn (one in-process worker)…", flush=True)
        await section(out, "round_trips", round_trips(args.trips, args.idle))
        async with ClusterTelegram(flood=False) as tg, \
                FakeSlackServer(rate_limit=False) as slack, FakeModelServer() as model:
            model.responder = respond
            admin = await psycopg.AsyncConnection.connect(ADMIN_URL, autocommit=True)
            bench = Bench(args, tg, slack, model, Path(tmp), admin)
            try:
                await measure_all(bench, url, out)
            finally:
                for task in list(bench.tasks):
                    task.cancel()
                await asyncio.gather(*bench.tasks, return_exceptions=True)
                for rig in LIVE:
                    await stop_workers(rig)
                await admin.close()
    out["notes"] = bench.notes
    return out


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        default=bool(os.environ.get("TANDEM_CLUSTER_BENCH_QUICK")),
                        help="a smoke run: few turns, 3 cancels, 3 kills")
    parser.add_argument("--chats", type=int, help="chats in the throughput phase")
    parser.add_argument("--turns", type=int, help="turns per chat in the throughput phase")
    parser.add_argument("--lat-chats", type=int, help="chats in the latency phase")
    parser.add_argument("--lat-turns", type=int, help="turns per chat in the latency phase")
    parser.add_argument("--rate", type=float, default=10.0,
                        help="turns/s offered in the latency phase (every configuration)")
    parser.add_argument("--cancels", type=int)
    parser.add_argument("--kills", type=int)
    parser.add_argument("--trips", type=int, help="turns counted for the round trips")
    parser.add_argument("--idle", type=float,
                        help="seconds of idle workers measured (their rate is subtracted)")
    parser.add_argument("--settle", type=float,
                        help="seconds before reading pg_stat_database (a backend that went "
                        "idle reports its counts up to 10 s late; quick: 1.5, approximate)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def kill_all() -> None:
    """At exit, whatever happened: no worker outlives the benchmark."""
    for rig in LIVE:
        kill_workers(rig.workers)


def main() -> None:
    args = parse()
    atexit.register(kill_all)
    began = time.monotonic()
    out = asyncio.run(run(args))
    out["seconds"] = time.monotonic() - began
    report(out)
    print(f"\n{out['seconds']:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
