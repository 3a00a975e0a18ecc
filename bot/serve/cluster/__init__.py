"""Several workers on one PostgreSQL database.

Every conversation's work (a message, a press, a scheduled run, an expiry) is a job of
procrastinate's task queue, locked on its conversation: one conversation's items run one
at a time and in order across all workers, different conversations on different ones.
A worker that dies mid-job stops its heartbeat; the leader hands its stalled jobs to
the others, which load the conversation fresh from the store and repair it exactly as a
restart does. Cancels and which turns run where travel by LISTEN/NOTIFY, so a Cancel
pressed anywhere stops the turn on the worker that runs it. One worker is the leader
(a PostgreSQL advisory lock, taken over when its holder dies): it computes the schedule
and sweeps stalled jobs.

A process outside the queue on the same database (`tandem chat`) keeps its own lanes and
`hold`s a conversation, with an advisory lock of its own, while it handles an item of
it: two terminals in one conversation take turns, and one that dies lets go.

Part of `bot.serve`: it may import the rest of `bot.serve` and the layers below it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from bot.core.events import ConvKey, Decision, Trigger, UserMessage
from bot.serve.cluster.codec import decode, encode

log = logging.getLogger(__name__)

TASK = "tandem.work"
LATER = "tandem.later"
"""Work for later waits unlocked, then queues itself locked: a future job holding its
conversation's lock would hold up every job after it (the queue goes by job order)."""
QUEUE = "tandem"
CHANNEL = "tandem_cluster"
LEADER_LOCK = 0x7A4D_0001
"""The advisory lock the leader holds for its life."""
CONV_LOCKS = 0x7A4D
"""The advisory locks `hold` takes: the key pair (this, a hash of the conversation), a
key space apart from the leader's single key."""
HEARTBEAT_S = 1.0
LOST_SWEEP_S = 5.0
STALLED_S = 4.0
"""A worker silent this long is dead: its jobs are handed to the others."""

Handle = Callable[[Any], Awaitable[None]]
"""Runs one work item (the worker's lane handler, for one item)."""


def worker_name() -> str:
    """Unique per worker (two in one process too): host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def owner_id(cluster: bool) -> str:
    """Whose tool processes these are: "" for a lone process; with several workers the
    supervisor's slot (`TANDEM_WORKER`, so a restarted worker finds what it left), else
    this process."""
    if not cluster:
        return ""
    slot = os.environ.get("TANDEM_WORKER")
    return f"{socket.gethostname()}/{slot}" if slot else worker_name()


class Cluster:
    def __init__(self, url: str, *, concurrency: int = 8) -> None:
        self.url = url
        self.name = worker_name()
        self.concurrency = concurrency
        self.handle: Handle | None = None
        """Set by the core before `start`."""
        self.on_signal: Callable[[dict[str, Any]], None] = lambda _m: None
        """Called with each cluster message (cancel, running, ended)."""
        self.leader = False
        self.on_leader: Callable[[], Awaitable[None]] | None = None
        """Called once when this worker becomes the leader."""
        self.on_sweep: Callable[[], Awaitable[None]] | None = None
        """Called by the leader every `LOST_SWEEP_S` (inbound a dead worker never queued)."""
        self._app: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._listen: Any = None
        self._lock_conn: Any = None
        self._notify: Any = None

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        import procrastinate

        connector = procrastinate.PsycopgConnector(conninfo=self.url, min_size=1, max_size=4,
                                                   configure=_autocommit)
        self._app = procrastinate.App(connector=connector)
        self._app.task(name=TASK, queue=QUEUE, pass_context=False)(self._run)
        self._app.task(name=LATER, queue=QUEUE, pass_context=False)(self._due)
        await self._app.open_async()
        await ensure_queue_schema(self.url)
        self._notify = await self._connect()
        self._listen = await self._connect()
        await self._listen.execute(f"LISTEN {CHANNEL}")
        self._tasks = [asyncio.create_task(self._worker(), name="cluster:worker"),
                       asyncio.create_task(self._signals(), name="cluster:signals"),
                       asyncio.create_task(self._elect(), name="cluster:leader")]
        log.info("cluster: worker %s started", self.name)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for conn in (self._listen, self._notify, self._lock_conn):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        self._listen = self._notify = self._lock_conn = None
        if self._app is not None:
            await self._app.close_async()
            self._app = None

    async def _connect(self) -> Any:
        import psycopg

        return await psycopg.AsyncConnection.connect(self.url, autocommit=True)

    async def _worker(self) -> None:
        await self._app.run_worker_async(
            queues=[QUEUE], concurrency=self.concurrency, name=self.name, wait=True,
            install_signal_handlers=False, update_heartbeat_interval=HEARTBEAT_S,
            stalled_worker_timeout=STALLED_S, listen_notify=True, delete_jobs="successful",
            fetch_job_polling_interval=1.0)

    # -- work ---------------------------------------------------------------------------

    async def defer(self, item: Any, *, at: float | None = None) -> None:
        """Queue `item` behind its conversation's other work (at time `at`, if given)."""
        if at is None:
            import procrastinate.exceptions

            ref = getattr(item, "ref", None) \
                if isinstance(item, UserMessage | Trigger | Decision) else None
            try:  # an inbound's id is its queueing lock: it waits in the queue once
                await self._app.configure_task(TASK, lock=str(item.conv), queueing_lock=ref) \
                    .defer_async(item=encode(item))
            except procrastinate.exceptions.AlreadyEnqueued:
                log.info("cluster: %s is queued already", ref)
            return
        await self._app.configure_task(LATER, schedule_at=datetime.fromtimestamp(at, UTC)) \
            .defer_async(item=encode(item))

    async def _run(self, item: str) -> None:
        assert self.handle is not None
        await self.handle(decode(item))

    async def _due(self, item: str) -> None:
        await self.defer(decode(item))

    async def stats(self) -> tuple[int, int]:
        return await stats(self.url)

    # -- signals ------------------------------------------------------------------------

    def signal(self, message: dict[str, Any]) -> None:
        """Tell every other worker `message`; fire and forget."""
        self._tasks.append(asyncio.create_task(self._send({**message, "from": self.name})))
        self._tasks = [t for t in self._tasks if not t.done()]

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self._notify.execute("SELECT pg_notify(%s, %s)",
                                       (CHANNEL, json.dumps(message)))
        except Exception:
            log.warning("cluster: could not send %s", message.get("kind"), exc_info=True)

    async def _signals(self) -> None:
        async for note in self._listen.notifies():
            try:
                message = json.loads(note.payload)
            except ValueError:
                continue
            if message.get("from") == self.name:
                continue
            self.on_signal(message)

    # -- the leader ---------------------------------------------------------------------

    async def _elect(self) -> None:
        self._lock_conn = await self._connect()
        while not self.leader:
            row = await (await self._lock_conn.execute(
                "SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,))).fetchone()
            if row and row[0]:
                self.leader = True
                log.info("cluster: %s leads (schedules, stalled jobs)", self.name)
                if self.on_leader is not None:
                    await self.on_leader()
                break
            await asyncio.sleep(1.0)
        rounds = 0
        while True:
            await self._sweep()
            rounds += 1
            if self.on_sweep is not None and rounds % int(LOST_SWEEP_S / HEARTBEAT_S) == 0:
                try:
                    await self.on_sweep()
                except Exception:
                    log.warning("cluster: could not look for lost inbound", exc_info=True)
            await asyncio.sleep(HEARTBEAT_S)

    async def queued(self, ref: str) -> bool:
        """A job for the inbound `ref` waits or runs."""
        conn = await self._connect()
        try:
            # a job for now carries the ref as its queueing lock; one for later, in its item
            row = await (await conn.execute(
                "SELECT 1 FROM procrastinate_jobs WHERE queueing_lock = %s OR (task_name = %s"
                " AND strpos(args->>'item', %s) > 0) LIMIT 1",
                (ref, LATER, f'"ref": {json.dumps(ref)}'))).fetchone()
            return row is not None
        finally:
            await conn.close()

    async def _sweep(self) -> None:
        """Jobs of dead workers go back to the queue (another worker takes them); one
        whose inbound was queued again meanwhile (a redelivery) is dropped instead."""
        import procrastinate

        manager = self._app.job_manager
        try:
            stalled = await manager.get_stalled_jobs(queue=QUEUE,
                                                     seconds_since_heartbeat=STALLED_S)
        except Exception:
            log.warning("cluster: could not look for stalled jobs", exc_info=True)
            return
        for job in stalled:
            try:
                try:
                    await manager.retry_job(job)
                    log.warning("cluster: job %s of a dead worker is retried", job.id)
                except procrastinate.exceptions.UniqueViolation:
                    await manager.finish_job(job, procrastinate.jobs.Status.ABORTED,
                                             delete_job=True)
                    log.warning("cluster: job %s of a dead worker is queued again already",
                                job.id)
            except Exception:
                log.warning("cluster: could not retry job %s", job.id, exc_info=True)


@contextlib.asynccontextmanager
async def hold(url: str, key: ConvKey, waiting: Callable[[], Awaitable[None]]
               ) -> AsyncIterator[None]:
    """Hold the conversation `key` against every other process that holds it this way,
    until leaving: a session advisory lock on a connection of its own, so that the
    process's death lets go too. While another holds it, `waiting` is called, then this
    waits its turn (PostgreSQL grants a lock's waiters in the order they came)."""
    import psycopg

    from bot.store.postgres_base import fail, redact

    try:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    except psycopg.Error as exc:
        fail(f"cannot open the database {redact(url)}", exc, url)
    try:
        args = (CONV_LOCKS, str(key))
        try:
            row = await (await conn.execute(
                "SELECT pg_try_advisory_lock(%s::int4, hashtext(%s))", args)).fetchone()
            if not (row and row[0]):
                await waiting()
                await conn.execute("SELECT pg_advisory_lock(%s::int4, hashtext(%s))", args)
        except psycopg.Error as exc:
            fail("database error", exc, url)
        yield
    finally:  # closing lets go of the lock, also when letting go by statement would fail
        with contextlib.suppress(Exception):
            await conn.close()


async def _autocommit(conn: Any) -> None:
    """The queue's pooled connections commit each statement: its queries are one
    statement each, so a transaction around one would cost a COMMIT round trip more."""
    await conn.set_autocommit(True)


async def ensure_queue_schema(url: str) -> None:
    """procrastinate's tables, created once (under a lock: workers start together)."""
    import procrastinate
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (LEADER_LOCK + 1,))
            found = await (await conn.execute(
                "SELECT to_regclass('procrastinate_jobs') IS NOT NULL")).fetchone()
            if not found or not found[0]:
                await conn.execute(procrastinate.schema.SchemaManager.get_schema())
    finally:
        await conn.close()


async def stats(url: str) -> tuple[int, int]:
    """(workers whose heartbeat is recent, jobs waiting or running), cluster-wide; zeros
    before any worker ever started."""
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        found = await (await conn.execute(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL")).fetchone()
        if not found or not found[0]:
            return 0, 0
        workers = await (await conn.execute(
            "SELECT count(*) FROM procrastinate_workers WHERE last_heartbeat > "
            "now() - make_interval(secs => %s)", (STALLED_S,))).fetchone()
        depth = await (await conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND "
            "status IN ('todo', 'doing')", (QUEUE,))).fetchone()
        return int(workers[0]) if workers else 0, int(depth[0]) if depth else 0
    finally:
        await conn.close()


def conv_of(message: dict[str, Any]) -> ConvKey | None:
    try:
        return ConvKey(**message["conv"])
    except (KeyError, TypeError):
        return None
