"""Scheduling tools: `schedule_task`, `list_tasks`, `cancel_task`."""

from __future__ import annotations

from typing import Any

from bot.core.errors import ToolError
from bot.tools import Tool, ToolContext, require_str


def _scheduler(ctx: ToolContext) -> Any:
    scheduler = ctx.extras.get("scheduler")
    if scheduler is None:
        raise ToolError("scheduling is not available in this Tandem")
    return scheduler


async def schedule_task(ctx: ToolContext, args: dict[str, Any]) -> str:
    scheduler = _scheduler(ctx)
    when, prompt = require_str(args, "when"), require_str(args, "prompt")
    job = await scheduler.add(ctx.extras["conv"], when, prompt, ctx.extras.get("requester", ""))
    nxt = scheduler.next_run(job.id)
    at = f"; next run {nxt:%Y-%m-%d %H:%M %Z}" if nxt else ""
    return f"scheduled task {job.id} ({job.kind}: {job.spec}){at}"


async def list_tasks(ctx: ToolContext, args: dict[str, Any]) -> str:
    scheduler = _scheduler(ctx)
    jobs = await scheduler.store.jobs(ctx.extras["conv"].id)
    if not jobs:
        return "no scheduled tasks in this conversation"
    lines = []
    for job in jobs:
        nxt = scheduler.next_run(job.id)
        at = f", next {nxt:%Y-%m-%d %H:%M %Z}" if nxt else ""
        lines.append(f"{job.id}: {job.spec}{at}: {job.prompt}")
    return "\n".join(lines)


async def cancel_task(ctx: ToolContext, args: dict[str, Any]) -> str:
    scheduler = _scheduler(ctx)
    text: str = await scheduler.cancel(ctx.extras["conv"].id, require_str(args, "job_id"))
    return text


TOOLS = [
    Tool("schedule_task",
         "Schedule a prompt to run later in this conversation. `when` is a time "
         "('2026-12-01 09:00', 'in 20 minutes', 'tomorrow at 9'), an interval ('every 2 hours') "
         "or a cron expression ('0 9 * * mon-fri'), in the user's timezone. `prompt` is what "
         "you will be asked to do then (e.g. 'Remind the user to stretch').",
         {"type": "object", "properties": {"when": {"type": "string"},
                                           "prompt": {"type": "string"}},
          "required": ["when", "prompt"]}, schedule_task, policy="allow", lasting=True),
    Tool("list_tasks", "List the scheduled tasks of this conversation.",
         {"type": "object", "properties": {}}, list_tasks, policy="allow"),
    Tool("cancel_task", "Cancel a scheduled task of this conversation by its id.",
         {"type": "object", "properties": {"job_id": {"type": "string"}},
          "required": ["job_id"]}, cancel_task, policy="allow", lasting=True),
]
