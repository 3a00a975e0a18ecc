"""Several workers on one PostgreSQL database, in one process: each is a hub with its own
cluster runtime (task queue worker, LISTEN connection, leader election) on a fresh
database of the machine's PostgreSQL. A conversation's items run one at a time and in
order whichever worker takes them, a Cancel given to one worker stops the turn another
runs, and a press given to one resumes a turn another suspended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from bot.core.config import Config
from bot.core.events import (
    ApprovalRequested,
    Cancel,
    ConvKey,
    Decision,
    Event,
    TurnEnded,
    TurnStarted,
    User,
    UserMessage,
    Verdict,
)
from bot.run.app import Dispatch, build
from bot.serve.cluster import Cluster
from bot.serve.hub import Hub
from tests.conftest import said
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.pg import database
from tests.waiting import eventually

ANN = User("u1", "Ann")


@dataclass
class Worker:
    hub: Hub
    cluster: Cluster
    dispatch: Dispatch


class Shared:
    """Every worker's events in the order they were sent (what the chats would show),
    each with the number of the worker that sent it."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []
        self.log: list[tuple[int, Event]] = []

    def sink(self, worker: int) -> Any:
        shared = self

        class Sink:
            async def emit(self, event: Event) -> None:
                shared.log.append((worker, event))

        return Sink()

    def events(self) -> list[tuple[int, Event]]:
        return list(self.log)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for _, e in self.events() if isinstance(e, kind)]

    async def wait(self, predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (found := predicate()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; events: {self.events()[-12:]}")
            await asyncio.sleep(0.02)
        return found

    async def _due(self) -> int:
        """Jobs running, or waiting and due now, cluster-wide."""
        conn = await psycopg.AsyncConnection.connect(self.workers[0].cluster.url,
                                                     autocommit=True)
        try:
            row = await (await conn.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status = 'doing' OR"
                " (status = 'todo' AND (scheduled_at IS NULL OR scheduled_at <= now()))"
            )).fetchone()
        finally:
            await conn.close()
        return int(row[0]) if row else 0

    async def _still(self) -> bool:
        for w in self.workers:
            await w.hub.idle()  # its jobs ran, and what they queued is in the queue
        return await self._due() == 0

    async def quiet(self, timeout: float = 20.0) -> None:
        """Until nothing more can come: no job due or running in the queue, and no worker
        with work under way. Looked at twice in a row, so that a job queued by work that
        ended just before the first look is seen by the second."""
        async def twice() -> bool:
            return await self._still() and await self._still()

        await eventually(twice, timeout, what="the cluster quiet", step=0.05)

    async def all_alive(self) -> bool:
        """Every worker's heartbeat is recent, as the store sees them."""
        workers, _ = await self.workers[0].cluster.stats()
        return workers == len(self.workers)

    async def sweep(self) -> None:
        """The leader's look for inbound recorded but never queued (its `on_sweep`, run
        every few seconds), run once now."""
        [leader] = await self.wait(lambda: [w for w in self.workers if w.cluster.leader])
        assert leader.cluster.on_sweep is not None
        await leader.cluster.on_sweep()


async def join(shared: Shared, config: Config) -> Worker:
    """One more worker on the cluster's database."""
    assert config.store.url is not None
    cluster = Cluster(config.store.url, concurrency=4)
    hub, dispatch = build(config, cluster=cluster)
    dispatch.sinks["console"] = shared.sink(len(shared.workers))
    await hub.d.store.open()
    await cluster.start()
    shared.workers.append(Worker(hub, cluster, dispatch))
    return shared.workers[-1]


@asynccontextmanager
async def cluster_of(n: int, config: Config) -> AsyncIterator[Shared]:
    shared = Shared()
    try:
        for _ in range(n):
            await join(shared, config)
        yield shared
    finally:
        for w in shared.workers:
            await w.hub.close()
            await w.cluster.close()
            await w.hub.d.store.close()


@pytest.fixture
def pg_url() -> Any:
    with database() as url:
        yield url


def echo(messages: list[dict[str, Any]]) -> Reply:
    return Reply(text="echo " + said(messages)[-1].split("] ", 1)[-1])


async def test_each_conversation_in_order_once_across_workers(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    model.responder = echo
    config = config_factory(store__url=pg_url)
    convs = [ConvKey("console", f"c{i}") for i in range(8)]
    async with cluster_of(2, config) as shared:
        for n in range(3):
            for i, key in enumerate(convs):
                hub = shared.workers[(i + n) % 2].hub  # messages arrive at either worker
                await hub.submit(UserMessage(key, ANN, f"{key.chat_id} #{n}",
                                             ref=f"console:{key.chat_id}:{n}"))
        await shared.wait(lambda: len(shared.of(TurnEnded)) >= 24)
        await shared.quiet()  # nothing more may come
        ended = shared.of(TurnEnded)
        ran_on = {i for i, e in shared.events() if isinstance(e, TurnStarted)}
    assert len(ended) == 24
    for key in convs:
        texts = [e.text for e in ended if e.conv == key]
        assert texts == [f"echo {key.chat_id} #{n}" for n in range(3)], texts
    assert ran_on == {0, 1}  # the work was shared


async def test_a_redelivered_message_is_answered_once_whichever_worker_gets_it(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    model.responder = echo
    config = config_factory(store__url=pg_url)
    key = ConvKey("console", "dup")
    async with cluster_of(2, config) as shared:
        for w in shared.workers:
            await w.hub.submit(UserMessage(key, ANN, "once", ref="console:dup:1"))
        await shared.wait(lambda: shared.of(TurnEnded))
        await shared.quiet()
        assert [e.text for e in shared.of(TurnEnded)] == ["echo once"]


async def test_cancel_given_to_another_worker_stops_the_turn_within_a_second(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    model.script(Reply(text="slow " * 400, chunk_size=2, chunk_delay=0.02))
    config = config_factory(store__url=pg_url)
    key = ConvKey("console", "cancel")
    async with cluster_of(2, config) as shared:
        await shared.workers[0].hub.submit(UserMessage(key, ANN, "talk", ref="console:c:1"))
        [(where, started)] = await shared.wait(
            lambda: [(i, e) for i, e in shared.events() if isinstance(e, TurnStarted)])
        other = shared.workers[1 - where].hub
        await shared.wait(lambda: other.running(key), timeout=5)  # it heard "running"
        await stops_within_a_second(shared, other, Cancel(key, ANN, ref="console:c:2",
                                                          turn=started.turn))


async def stops_within_a_second(shared: Shared, hub: Hub, cancel: Cancel) -> None:
    """`cancel`, given to `hub`, ends the running turn (wherever it runs) within 1 s."""
    pressed = time.monotonic()
    receipt = await hub.cancel(cancel)
    assert receipt.accepted and receipt.note == "Cancelling…"
    [ended] = await shared.wait(lambda: shared.of(TurnEnded))
    took = time.monotonic() - pressed
    assert ended.reason == "cancelled" and took < 1.0, (ended, took)


async def test_a_press_on_another_worker_resumes_the_turn(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "echo hi"})]),
                 Reply(text="It printed hi."))
    config = config_factory(store__url=pg_url)
    key = ConvKey("console", "press")
    async with cluster_of(2, config) as shared:
        await shared.workers[0].hub.submit(UserMessage(key, ANN, "run it", ref="console:p:1"))
        [(where, card)] = await shared.wait(
            lambda: [(i, e) for i, e in shared.events() if isinstance(e, ApprovalRequested)])
        other = shared.workers[1 - where].hub
        receipt = await other.submit(Decision(key, ANN, card.approval_id, Verdict.APPROVE,
                                              ref="console:p:2"))
        assert receipt.accepted, receipt
        [ended] = await shared.wait(lambda: shared.of(TurnEnded))
    assert ended.text == "It printed hi."
    results = [m["content"] for m in model.last_messages() if m["role"] == "tool"]
    assert results and "hi" in results[0]


async def test_status_names_the_backend_the_workers_and_the_queue(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    from bot.core.events import Command, Notice

    config = config_factory(store__url=pg_url)
    key = ConvKey("console", "status")
    async with cluster_of(2, config) as shared:
        await shared.wait(lambda: any(w.cluster.leader for w in shared.workers), timeout=10)
        await eventually(shared.all_alive, 10, step=0.1,  # both heartbeats are in
                         what="both workers alive")
        await shared.workers[1].hub.submit(Command(key, ANN, "status", ref="console:s:1"))
        [notice] = await shared.wait(lambda: shared.of(Notice))
    assert "Store: PostgreSQL, 2 workers alive, 1 jobs queued or running" in notice.text


async def test_inbound_a_dead_worker_recorded_but_never_queued_is_answered_once(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    model.responder = echo
    config = config_factory(store__url=pg_url)
    key = ConvKey("console", "lost")
    async with cluster_of(2, config) as shared:
        item = UserMessage(key, ANN, "lost and found", ref="console:lost:1")
        # recorded, and the worker "died" before it queued the job
        assert (await shared.workers[0].hub.intake.accept(item)).accepted
        [ended] = await shared.wait(lambda: shared.of(TurnEnded), timeout=15)
        await shared.sweep()  # another sweep finds nothing more to do
        await shared.quiet()
        assert [e.text for e in shared.of(TurnEnded)] == ["echo lost and found"]
    assert ended.conv == key


async def test_cancel_given_to_a_worker_that_started_after_the_turn_began(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    model.script(Reply(text="slow " * 400, chunk_size=2, chunk_delay=0.02))
    config = config_factory(store__url=pg_url)
    key = ConvKey("console", "late")
    async with cluster_of(1, config) as shared:
        await shared.workers[0].hub.submit(UserMessage(key, ANN, "talk", ref="console:l:1"))
        [started] = await shared.wait(lambda: shared.of(TurnStarted))
        late = await join(shared, config)  # it never heard the turn announced
        await stops_within_a_second(shared, late.hub, Cancel(key, ANN, ref="console:l:2",
                                                             turn=started.turn))


async def test_a_redelivered_copy_of_inbound_recorded_but_never_queued_is_queued_at_once(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    """Its worker died between recording and queueing it; the copy that comes again (to
    another worker) is queued there, not refused as a duplicate, and answered once in
    its place, long before the leader's sweep would find it."""
    model.responder = echo
    config = config_factory(store__url=pg_url)
    key = ConvKey("console", "again")
    async with cluster_of(2, config) as shared:
        first = UserMessage(key, ANN, "first", ref="console:a:1")
        assert (await shared.workers[0].hub.intake.accept(first)).accepted  # then it died
        sent = time.monotonic()
        assert (await shared.workers[1].hub.submit(first)).accepted
        await shared.workers[1].hub.submit(UserMessage(key, ANN, "second", ref="console:a:2"))
        await shared.wait(lambda: len(shared.of(TurnEnded)) >= 2)
        took = time.monotonic() - sent
        await shared.sweep()  # the sweep finds nothing more to do
        await shared.quiet()
        texts = [e.text for e in shared.of(TurnEnded)]
    assert texts == ["echo first", "echo second"] and took < 3.0, (texts, took)


async def _asked(shared: Shared, key: ConvKey) -> tuple[int, ApprovalRequested]:
    await shared.workers[0].hub.submit(UserMessage(key, ANN, "run it", ref=f"{key}:1"))
    [(where, card)] = await shared.wait(
        lambda: [(i, e) for i, e in shared.events() if isinstance(e, ApprovalRequested)])
    return where, card


@pytest.mark.parametrize("how", ["sweep", "redelivery"])
async def test_a_press_recorded_but_never_queued_is_not_lost(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str,
        how: str) -> None:
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "echo hi"})]),
                 Reply(text="It printed hi."))
    config = config_factory(store__url=pg_url)
    key = ConvKey("console", f"press-{how}")
    async with cluster_of(2, config) as shared:
        where, card = await _asked(shared, key)
        press = Decision(key, ANN, card.approval_id, Verdict.APPROVE, ref=f"{key}:2")
        assert (await shared.workers[where].hub.intake.accept(press)).accepted  # then died
        if how == "redelivery":
            assert (await shared.workers[1 - where].hub.submit(press)).accepted
        [ended] = await shared.wait(lambda: shared.of(TurnEnded), timeout=15)
    assert ended.text == "It printed hi."


async def test_a_turn_whose_press_was_applied_when_its_worker_died_goes_on(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    """The press was applied (the call allowed) and the worker died before the turn went
    on: the job, run again by another worker, finds the turn ready and drives it."""
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "echo hi"})]),
                 Reply(text="It printed hi."))
    config = config_factory(store__url=pg_url)
    key = ConvKey("console", "applied")
    async with cluster_of(2, config) as shared:
        where, card = await _asked(shared, key)
        press = Decision(key, ANN, card.approval_id, Verdict.APPROVE, ref=f"{key}:2")
        dead = shared.workers[where].hub
        assert (await dead.intake.accept(press)).accepted
        conv = await dead.worker.convs.get(key)
        assert await dead.approvals.decide(conv, press)  # applied; never driven
        shared.workers[1 - where].hub.lanes.put(key, press)  # its job, run again
        [ended] = await shared.wait(lambda: shared.of(TurnEnded), timeout=15)
        await shared.quiet()
    assert ended.text == "It printed hi."
    assert len(shared.of(TurnEnded)) == 1
    results = [m["content"] for m in model.last_messages() if m["role"] == "tool"]
    assert results and "hi" in results[0]


async def test_a_card_whose_worker_died_before_posting_it_is_posted_by_the_next_job(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    """The approval was stored and the worker died before its card reached the chat: the
    job run again (on any worker) posts the card, once, and a press on it resumes the
    turn."""
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "echo hi"})]),
                 Reply(text="It printed hi."))
    config = config_factory(store__url=pg_url)
    key = ConvKey("console", "lost-card")
    async with cluster_of(2, config) as shared:
        posted: list[str] = []
        lost: list[str] = []

        class Cards:
            """As a platform does: a card it posts is remembered (the first one is lost:
            its worker died before posting it)."""

            def __init__(self, index: int) -> None:
                self.index, self.inner = index, shared.sink(index)

            async def emit(self, event: Event) -> None:
                if isinstance(event, ApprovalRequested):
                    if not lost:
                        lost.append(event.approval_id)
                        return
                    posted.append(event.approval_id)
                    await shared.workers[self.index].hub.remember_card(event.approval_id, {})
                await self.inner.emit(event)

        for i, w in enumerate(shared.workers):
            w.dispatch.sinks["console"] = Cards(i)
        message = UserMessage(key, ANN, "run it", ref="console:lc:1")
        await shared.workers[0].hub.submit(message)
        await shared.wait(lambda: lost)
        await shared.quiet()  # the turn is suspended, its card nowhere
        for w in shared.workers:  # its job, run again (twice: nothing more to post)
            w.hub.lanes.put(key, message)
        [card] = await shared.wait(lambda: shared.of(ApprovalRequested))
        await shared.quiet()
        assert posted == lost == [card.approval_id]
        receipt = await shared.workers[1].hub.submit(
            Decision(key, ANN, card.approval_id, Verdict.APPROVE, ref="console:lc:2"))
        assert receipt.accepted, receipt
        [ended] = await shared.wait(lambda: shared.of(TurnEnded))
    assert ended.text == "It printed hi."


async def test_inbound_a_dead_worker_recorded_goes_before_the_next_one(
        config_factory: Callable[..., Config], model: FakeModelServer, pg_url: str) -> None:
    """A message recorded by a worker that died before queueing it, then the next one of
    the conversation on another worker: both are answered, in the order they came, at
    once (not when the leader's sweep finds the first)."""
    model.responder = echo
    config = config_factory(store__url=pg_url)
    key = ConvKey("console", "order")
    async with cluster_of(2, config) as shared:
        first = UserMessage(key, ANN, "first", ref="console:o:1")
        assert (await shared.workers[0].hub.intake.accept(first)).accepted  # then it died
        sent = time.monotonic()
        await shared.workers[1].hub.submit(UserMessage(key, ANN, "second", ref="console:o:2"))
        await shared.wait(lambda: len(shared.of(TurnEnded)) >= 2)
        took = time.monotonic() - sent
        await shared.sweep()  # the sweep finds nothing more to do
        await shared.quiet()
        texts = [e.text for e in shared.of(TurnEnded)]
    assert texts == ["echo first", "echo second"] and took < 3.0, (texts, took)
