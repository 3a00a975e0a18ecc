"""Scheduled tasks: APScheduler fires them, the store is the source of truth.

At start every active job is registered again; a run missed while Tandem was down runs
once (marked late). Each run first claims its slot in the store (with the inbound it
produces, in one commit), so a slot never runs twice, also after a crash mid-run.
A firing job enters its conversation as a `Trigger`: an ordinary turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bot.core.errors import ToolError
from bot.core.events import Inbound, Trigger
from bot.serve.intake import encode_inbound
from bot.serve.schedule_spec import parse, previous_fire
from bot.store import ConvRow, JobRow, Store, new_id

log = logging.getLogger(__name__)
MAX_JOBS_PER_CONVERSATION = 50


def _undelivered(item: Inbound) -> None:
    log.error("a scheduled run fired before the core was attached: %s", item)


class Scheduler:
    def __init__(self, store: Store, timezone: str, misfire_grace_s: int) -> None:
        self.store = store
        self.deliver: Callable[[Inbound], None] = _undelivered
        """Hands a claimed run to the core (the hub sets it)."""
        self.tz = ZoneInfo(timezone)
        self.grace = misfire_grace_s
        self._aps: AsyncIOScheduler | None = None
        self.active: dict[int, set[str]] = {}
        """Active job ids per conversation (for the per-request state note)."""

    async def start(self) -> None:
        """Register every stored job; run once what was missed while stopped."""
        self._aps = AsyncIOScheduler(timezone=self.tz)
        self._aps.start()
        now = datetime.now(self.tz)
        for job in await self.store.jobs():
            await self._take(job, now)

    async def _take(self, job: JobRow, now: datetime) -> None:
        """Run a slot missed until `now` (late), and register what is still to come."""
        self.active.setdefault(job.conv_id, set()).add(job.id)
        trigger = self.trigger(job)
        since = datetime.fromtimestamp(job.last_slot or job.anchor, self.tz)
        if job.kind == "date" and job.last_slot is None:
            since = datetime.fromtimestamp(job.anchor - 1, self.tz)
        missed = previous_fire(trigger, since, now)
        if missed is not None:
            await self.fire(job.id, missed.timestamp(), late=True)
        if job.kind != "date" or missed is None:
            self._register(job, trigger)

    async def sync(self) -> None:
        """Take up what other workers changed in the store: their new tasks are
        registered (a missed slot runs once, late), cancelled ones removed."""
        if self._aps is None:
            return
        stored = {job.id: job for job in await self.store.jobs()}
        for job in self._aps.get_jobs():
            if job.id not in stored:
                job.remove()
        now = datetime.now(self.tz)
        for job in stored.values():
            if self._aps.get_job(job.id) is None:
                await self._take(job, now)

    def shutdown(self) -> None:
        if self._aps is not None and self._aps.running:
            self._aps.shutdown(wait=False)
        self._aps = None

    def trigger(self, job: JobRow) -> Any:
        if job.kind == "date":
            return DateTrigger(datetime.fromtimestamp(job.anchor, self.tz), timezone=self.tz)
        spec = parse(job.spec, self.tz)
        if job.kind == "interval":
            interval: IntervalTrigger = spec.trigger
            return IntervalTrigger(seconds=int(interval.interval.total_seconds()),
                                   start_date=datetime.fromtimestamp(job.anchor, self.tz),
                                   timezone=self.tz)
        return spec.trigger

    def _register(self, job: JobRow, trigger: Any) -> None:
        if self._aps is None:  # not this worker's to run: the leader's `sync` takes it up
            return
        self._aps.add_job(self._on_time, trigger, args=[job.id], id=job.id,
                          replace_existing=True, misfire_grace_time=self.grace, coalesce=True,
                          max_instances=1)

    async def _on_time(self, job_id: str) -> None:
        job = await self.store.job(job_id)
        if job is None or not job.active:
            return
        now = datetime.now(self.tz)
        since = datetime.fromtimestamp(job.last_slot or (job.anchor - 1), self.tz)
        slot = previous_fire(self.trigger(job), since, now)
        if slot is not None:
            await self.fire(job_id, slot.timestamp(), late=False)

    async def fire(self, job_id: str, slot: float, *, late: bool) -> bool:
        """Claim `slot` and hand the run to the hub; False if it already ran."""
        job = await self.store.job(job_id)
        if job is None or not job.active:
            return False
        ref = f"job:{job_id}:{slot:.0f}"
        trigger = Trigger(job.key, job.id, job.prompt, late=late, ref=ref,
                          requester=job.created_by)
        _, payload = encode_inbound(trigger)
        if not await self.store.claim_slot(job_id, slot, ref, job.key, payload,
                                           last=job.kind == "date"):
            log.info("job %s slot %.0f already ran", job_id, slot)
            return False
        if job.kind == "date":
            self.active.get(job.conv_id, set()).discard(job_id)
        log.info("job %s fires for slot %.0f%s", job_id, slot, " (late)" if late else "")
        self.deliver(trigger)
        return True

    # -- what the tools and /jobs use -------------------------------------------------

    async def add(self, conv: ConvRow, when: str, prompt: str, created_by: str) -> JobRow:
        if not prompt.strip():
            raise ToolError("`prompt` is empty: say what should happen when the task runs")
        if len(await self.store.jobs(conv.id)) >= MAX_JOBS_PER_CONVERSATION:
            raise ToolError("this conversation has too many scheduled tasks; cancel some first")
        spec = parse(when, self.tz)
        now = time.time()
        anchor = now
        if spec.kind == "date":
            anchor = spec.trigger.run_date.timestamp()
        job = JobRow(new_id(), conv.id, conv.key, spec.text, spec.kind, prompt.strip(),
                     created_by, None if spec.kind == "date" else now, True, anchor)
        await self.store.add_job(job)
        self._register(job, self.trigger(job))
        self.active.setdefault(conv.id, set()).add(job.id)
        return job

    def next_run(self, job_id: str) -> datetime | None:
        if self._aps is None:
            return None
        job = self._aps.get_job(job_id)
        return None if job is None else job.next_run_time

    async def cancel(self, conv_id: int, job_id: str) -> str:
        job = await self.store.job(job_id)
        if job is None or job.conv_id != conv_id or not job.active:
            return f"There is no active task {job_id} in this conversation."
        await self.store.deactivate_job(job_id)
        self.active.get(conv_id, set()).discard(job_id)
        if self._aps is not None and self._aps.get_job(job_id) is not None:
            self._aps.remove_job(job_id)
        return f"Cancelled the task {job_id} ({job.spec}: {job.prompt})."

    def count(self, conv_id: int) -> int:
        """Active tasks of a conversation (for the per-request state note)."""
        return len(self.active.get(conv_id, ()))
