"""Scheduled tasks: firing, catching up once after downtime, never twice per slot."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bot.core.errors import ToolError
from bot.core.events import ApprovalRequested, TurnEnded
from bot.serve.schedule_spec import parse
from bot.store import JobRow
from tests.conftest import Core
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec


def scheduled_turns(model: FakeModelServer) -> list[str]:
    out = []
    for request in model.requests:
        last_user = [m for m in request["messages"] if m["role"] == "user"][-2]  # before the note
        if "[Scheduled task" in last_user["content"]:
            out.append(last_user["content"])
    return out


async def add_job(core: Core, kind: str, spec: str, anchor: float,
                  last_slot: float | None, prompt: str = "Post the report") -> JobRow:
    row = await core.hub.d.store.conversation(core.key)
    job = JobRow(f"j{int(anchor) % 100000}", row.id, core.key, spec, kind, prompt, "u1",
                 last_slot, True, anchor)
    await core.hub.d.store.add_job(job)
    return job


def test_schedules_are_read_as_times_intervals_or_cron() -> None:
    tz = ZoneInfo("Europe/Berlin")
    now = datetime(2026, 11, 30, 10, 0, tzinfo=tz)
    assert parse("in 20 minutes", tz, now).trigger.run_date == datetime(2026, 11, 30, 10, 20,
                                                                          tzinfo=tz)
    assert parse("every 2 hours", tz, now).kind == "interval"
    weekday = parse("every weekday at 9", tz, now).trigger
    assert weekday.get_next_fire_time(None, now) == datetime(2026, 12, 1, 9, 0, tzinfo=tz)
    assert parse("0 9 * * mon-fri", tz, now).kind == "cron"
    for bad in ("yesterday", "every 5 seconds", "whenever", "2020-01-01 09:00"):
        with pytest.raises(ToolError):
            parse(bad, tz, now)


async def test_a_task_scheduled_by_the_model_fires_and_posts(model: FakeModelServer,
                                                             config_factory: Any) -> None:
    model.script(
        Reply(tool_calls=[ToolCallSpec("schedule_task", {"when": "in 2 seconds",
                                                         "prompt": "Remind the user to stretch"})]),
        Reply(text="I will remind you."),
        Reply(text="Time to stretch!"))
    async with Core(config_factory()) as core:
        await core.say("remind me in 2 seconds to stretch")
        ended = await core.sink.ended(2, timeout=15)
    assert [e.text for e in ended] == ["I will remind you.", "Time to stretch!"]
    [trigger] = scheduled_turns(model)
    assert "Remind the user to stretch" in trigger and "late" not in trigger


async def test_a_run_missed_while_stopped_runs_once_at_start_marked_late(
        model: FakeModelServer, config_factory: Any) -> None:
    model.responder = lambda _m: Reply(text="Here is the late report.")
    config = config_factory()
    async with Core(config) as core:
        await add_job(core, "date", "2026-11-30 09:00", time.time() - 120, None)
    async with Core(config) as core:
        [ended] = await core.sink.ended()
        await core.hub.idle()
        assert ended.text == "Here is the late report."
    async with Core(config) as core:  # a second restart does not run it again
        await core.hub.idle()
        assert core.sink.of(TurnEnded) == []
    [trigger] = scheduled_turns(model)
    assert "running late" in trigger


async def test_a_recurring_job_catches_up_once_and_never_runs_a_slot_twice(
        model: FakeModelServer, config_factory: Any) -> None:
    model.responder = lambda _m: Reply(text="hourly")
    config = config_factory()
    now = time.time()
    async with Core(config) as core:
        job = await add_job(core, "interval", "every 1 hour", now - 3 * 3600 - 60,
                            now - 3 * 3600 - 60)
    for _ in range(2):
        async with Core(config) as core:
            await core.hub.idle()
    assert len(scheduled_turns(model)) == 1  # three missed slots coalesce into one run
    async with Core(config) as core:
        stored = await core.hub.d.store.job(job.id)
        assert stored is not None and stored.last_slot is not None
        assert not await core.hub.scheduler.fire(job.id, stored.last_slot, late=True)


async def test_unattended_runs_deny_risky_tools_by_default(model: FakeModelServer,
                                                           config_factory: Any,
                                                           tmp_path: Any) -> None:
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "touch x"})]),
                 Reply(text="I could not run it unattended."))
    config = config_factory()
    async with Core(config) as core:
        await add_job(core, "date", "soon", time.time() - 5, None)
    async with Core(config) as core:
        [ended] = await core.sink.ended()
        assert core.sink.of(ApprovalRequested) == []
    assert ended.text == "I could not run it unattended."
    assert not (tmp_path / "workspace" / "x").exists()
    tool = [m for m in model.last_messages() if m["role"] == "tool"]
    assert tool[0]["content"].startswith("denied: this is a scheduled run")


async def test_jobs_are_listed_and_cancelled_per_conversation(model: FakeModelServer,
                                                              config_factory: Any) -> None:
    async with Core(config_factory()) as core:
        row = await core.hub.d.store.conversation(core.key)
        job = await core.hub.scheduler.add(row, "every day at 9", "Standup reminder", "u1")
        other = await core.hub.d.store.conversation(core.key.__class__("console", "other"))
        assert "no active task" in (await core.hub.scheduler.cancel(other.id, job.id)).lower()
        assert core.hub.scheduler.next_run(job.id) is not None
        assert "Cancelled" in await core.hub.scheduler.cancel(row.id, job.id)
        assert core.hub.scheduler.next_run(job.id) is None
        assert await core.hub.d.store.jobs(row.id) == []
