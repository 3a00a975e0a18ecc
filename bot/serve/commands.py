"""Chat commands: `/new`, `/status`, `/help`, `/approvals`, `/jobs`.

A command gets a small context and returns what to show (events), plus `Reset` when
the conversation should start afresh; the hub carries that out.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from bot.core.buttons import ItemButton, pack
from bot.core.config import Config
from bot.core.events import Button, Command, Event, Notice
from bot.core.watch import BudgetLifted, RuleChanged, Watch
from bot.serve import model_command
from bot.serve.access import Access
from bot.serve.permissions import Action, may, refusal
from bot.store import RuleRow, Store
from bot.turn.budget import Budget
from bot.turn.conversation import Conversation
from bot.turn.prompt import Prompt

HELP = """Tandem answers here and can use tools; risky ones wait for your approval.
/new: start a fresh conversation (the old one is kept, but no longer in view)
/stop: cancel what is running
/status: the model, context used, tokens and cost of this conversation
/model: the models this conversation may use, with buttons to switch
/rules: standing rules in this chat (who made each, until when); /revoke N removes one
/jobs: scheduled tasks of this chat, with buttons to cancel them
/audit: the latest entries of this chat's audit log (approvers)
/help: this text"""
AUDIT_LINES = 15
APPROVERS_ONLY = "Only an approver can do that."


class Jobs(Protocol):
    async def cancel(self, conv_id: int, job_id: str) -> str: ...


@dataclass(frozen=True, slots=True)
class CommandContext:
    config: Config
    store: Store
    prompt: Prompt
    window: Callable[[], Awaitable[int]]
    """The context window (only `/status` asks: it may wait for the model library)."""
    running: bool
    """A turn of this conversation is running right now."""
    jobs: Jobs | None = None
    servers: Callable[[], list[str]] = list
    """One status line per MCP server."""
    backend: Callable[[], Awaitable[str]] | None = None
    """The store and, with several workers, the workers alive and the queue's depth."""
    approver: bool = False
    """Who gave the command is an approver on this platform."""
    budget: Budget | None = None
    watch: Watch | None = None
    access: Access | None = None
    """Who is an approver (`bot.serve.permissions.may` asks it)."""


@dataclass(frozen=True, slots=True)
class Reset:
    """Start a fresh session (what waits for a human is not run)."""


Result = list[Event | Reset]


async def run(ctx: CommandContext, conv: Conversation, cmd: Command) -> Result:
    key = conv.row.key
    match cmd.name:
        case "new":
            return new(ctx, cmd)
        case "status":
            return [Notice(key, await status(ctx, conv, cmd.user.id))]
        case "rules" | "approvals":
            return [await approvals(ctx, conv)]
        case "jobs":
            return [await jobs(ctx, conv)]
        case "model":
            refused = None if allowed(ctx, cmd, Action.MODEL) else refusal(Action.MODEL)
            return [await model_command.model(ctx.config, ctx.store, ctx.watch, conv, cmd,
                                              refused)]
        case "revoke":
            return [await revoke(ctx, conv, cmd)]
        case "audit":
            return [await audit(ctx, conv)]
        case "liftbudget":
            return [await lift_budget(ctx, conv, cmd)]
        case "canceljob" if ctx.jobs is not None:
            return [await cancel_job(ctx, conv, cmd, ctx.jobs)]
        case "help" | "start":
            return [Notice(key, HELP)]
        case _:
            return [Notice(key, f"Unknown command /{cmd.name}.\n\n{HELP}")]


def new(ctx: CommandContext, cmd: Command) -> Result:
    """`/new`: a fresh session; standing rules stay, "this conversation" ones end."""
    if not allowed(ctx, cmd, Action.NEW):
        return [Notice(cmd.conv, refusal(Action.NEW), ephemeral_to=cmd.user)]
    return [Reset(), Notice(cmd.conv, "Started a new conversation. Earlier messages are no "
                            "longer in view; standing rules stay (/rules).")]


async def cancel_job(ctx: CommandContext, conv: Conversation, cmd: Command,
                     jobs: Jobs) -> Notice:
    """`/canceljob ID` (or its button): one's own task, or anyone's for approvers."""
    job = await ctx.store.job(cmd.args.strip())
    if job is not None and not allowed(ctx, cmd, Action.CANCEL_JOB, job.created_by):
        return Notice(conv.row.key, refusal(Action.CANCEL_JOB), ephemeral_to=cmd.user)
    return Notice(conv.row.key, await jobs.cancel(conv.row.id, cmd.args.strip()))


def allowed(ctx: CommandContext, cmd: Command, action: Action, owner: str | None = None) -> bool:
    """`bot.serve.permissions.may` for the person who gave `cmd`."""
    return ctx.approver or may(ctx.access or Access(), cmd.user, action, cmd.conv, owner)


async def status(ctx: CommandContext, conv: Conversation, user: str) -> str:
    row = await ctx.store.conversation(conv.row.key)
    used, window = ctx.prompt.used(conv), await ctx.window()
    state = conv.turn
    running = "a turn is running" if ctx.running else "idle"
    if state is not None and not ctx.running:
        running = "waiting for approval"
    lines = [
        *await model_command.status_lines(ctx.config, ctx.store, conv),
        f"Context: ~{used:,} of {window:,} tokens ({100 * used // window}%)"
        f", {len(conv.history) - conv.cut} messages in view, {conv.dropped_turns} older "
        "turns trimmed" + (" (summarized)" if conv.summary else ""),
        f"This conversation: {row.prompt_tokens:,} prompt + {row.completion_tokens:,} "
        f"completion tokens, ${row.cost:.4f}",
        *([cache] if (cache := conv.usage.status()) else []),
        f"Turn: {running}" + (f", {state.steps} steps" if state else ""),
        f"Persona: {ctx.prompt.persona.fingerprint or 'not loaded yet'}",
    ]
    people = await ctx.store.talk_authors(str(conv.row.key))
    if len(people) > 1:
        lines.append("Taking part: " + ", ".join(people))
    if ctx.budget is not None:
        lines += await ctx.budget.status(row, user)
    if ctx.backend is not None:
        lines.append(f"Store: {await ctx.backend()}")
    servers = ctx.servers()
    if servers:
        lines.append("MCP servers:\n" + "\n".join(f"  {line}" for line in servers))
    return "\n".join(lines)


async def approvals(ctx: CommandContext, conv: Conversation) -> Notice:
    """`/rules`: the standing rules in force here, numbered as `/revoke N` takes them."""
    rules = await ctx.store.rules(conv.row.id, session=conv.row.session)
    if not rules:
        return Notice(conv.row.key, "No standing rules in this chat.")
    lines = ["Standing rules in this chat (/revoke N removes one):"]
    buttons = []
    for n, rule in enumerate(rules, 1):
        lines.append(f"{n}. {rule.tool}: {rule.key} — {rule_terms(rule)}")
        buttons.append(Button(f"Revoke {n}", pack(ItemButton("rule", rule.id))))
    return Notice(conv.row.key, "\n".join(lines), buttons=tuple(buttons))


def rule_terms(rule: RuleRow, now: float | None = None) -> str:
    """Who made a rule, when, for whom and until when, in a few words."""
    made = time.strftime("%Y-%m-%d", time.gmtime(rule.created_at))
    who = rule.author_name or rule.author or "someone (before authors were kept)"
    parts = [f"by {who} on {made}"]
    if rule.user:
        parts.append(f"for {rule.user} only")
    if rule.session is not None:
        parts.append("until /new")
    elif rule.expires_at is None:
        parts.append("until revoked")
    else:
        left = rule.expires_at - (time.time() if now is None else now)
        parts.append(f"expires {time.strftime('%Y-%m-%d %H:%M', time.gmtime(rule.expires_at))}"
                     f" UTC (in {max(0, round(left / 86400))} d)" if left >= 86400 else
                     f"expires in {max(1, round(left / 3600))} h")
    return ", ".join(parts)


async def jobs(ctx: CommandContext, conv: Conversation) -> Notice:
    rows = await ctx.store.jobs(conv.row.id)
    if not rows:
        return Notice(conv.row.key, "No scheduled tasks in this chat.")
    lines = ["Scheduled tasks in this chat:"]
    buttons = []
    for n, job in enumerate(rows, 1):
        lines.append(f"{n}. [{job.id}] {job.spec}: {job.prompt}")
        buttons.append(Button(f"Cancel {n}", pack(ItemButton("job", job.id))))
    return Notice(conv.row.key, "\n".join(lines), buttons=tuple(buttons))


async def revoke(ctx: CommandContext, conv: Conversation, cmd: Command) -> Notice:
    """`/revoke N` (the number `/approvals` lists) or the rule's id (a button's)."""
    rules = await ctx.store.rules(conv.row.id, session=conv.row.session)
    wanted = cmd.args.strip()
    if wanted.isdigit() and 1 <= int(wanted) <= len(rules):
        wanted = rules[int(wanted) - 1].id
    rule = next((r for r in rules if r.id == wanted), None)
    if rule is not None and not allowed(ctx, cmd, Action.REVOKE, rule.author):
        return Notice(conv.row.key, refusal(Action.REVOKE), ephemeral_to=cmd.user)
    if rule is None or not await ctx.store.delete_rule(conv.row.id, rule.id):
        return Notice(conv.row.key, "That rule no longer exists.")
    if ctx.watch is not None:
        await ctx.watch.see(RuleChanged(conv.row.key, rule.tool, rule.key, "revoked",
                                        cmd.user.id))
    return Notice(conv.row.key, "Rule revoked: that call will ask again.")


async def audit(ctx: CommandContext, conv: Conversation) -> Notice:
    """`/audit`: the latest entries of this conversation's audit log, for approvers."""
    if not ctx.approver:
        return Notice(conv.row.key, APPROVERS_ONLY)
    if ctx.watch is not None:
        await ctx.watch.flush()
    rows = [r for r in await ctx.store.audit(conv=str(conv.row.key), limit=4 * AUDIT_LINES)
            if r.kind != "usage"][-AUDIT_LINES:]  # a turn's usage: `tandem audit`, `/status`
    if not rows:
        return Notice(conv.row.key, "The audit log has no entries for this chat.")
    head = f"The latest {len(rows)} audit entries of this chat (all: `tandem audit`):"
    return Notice(conv.row.key, "\n".join([head, *(r.line() for r in rows)]))


async def lift_budget(ctx: CommandContext, conv: Conversation, cmd: Command) -> Notice:
    """The "Lift for today" button of a used-up budget: approvers only."""
    if not ctx.approver:
        return Notice(conv.row.key, APPROVERS_ONLY, ephemeral_to=cmd.user)
    lifted = await ctx.budget.lift(conv.row, cmd.args.strip()) if ctx.budget else None
    if lifted is None:
        return Notice(conv.row.key, "That button is from another day; nothing was lifted.")
    if ctx.watch is not None:
        await ctx.watch.see(BudgetLifted(conv.row.key, lifted, cmd.user.id))
    return Notice(conv.row.key, f"The daily budget of {lifted} is lifted for today by "
                                f"{cmd.user.name or cmd.user.id}. Send the message again.")
