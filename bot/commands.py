"""Chat commands: `/new`, `/status`, `/help`, `/approvals`, `/jobs`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.buttons import ItemButton, pack
from bot.events import Button, Command, Notice

if TYPE_CHECKING:
    from bot.conversation import Conversation
    from bot.hub import Hub

HELP = """Tandem answers here and can use tools; risky ones wait for your approval.
/new: start a fresh conversation (the old one is kept, but no longer in view)
/stop: cancel what is running
/status: the model, context used, tokens and cost of this conversation
/approvals: standing "always" rules in this chat, with buttons to revoke them
/jobs: scheduled tasks of this chat, with buttons to cancel them
/help: this text"""


async def run(hub: Hub, conv: Conversation, cmd: Command) -> None:
    key = conv.row.key
    match cmd.name:
        case "new":
            await hub.reset(conv)
            text = "Started a new conversation. Earlier messages are no longer in view."
            await hub.d.emit(Notice(key, text))
        case "status":
            await hub.d.emit(Notice(key, await status(hub, conv)))
        case "approvals":
            await hub.d.emit(await approvals(hub, conv))
        case "jobs":
            await hub.d.emit(await jobs(hub, conv))
        case "revoke":
            await revoke(hub, conv, cmd.args)
        case "canceljob" if hub.scheduler is not None:
            await hub.d.emit(Notice(key, await hub.scheduler.cancel(conv.row.id, cmd.args)))
        case "help" | "start":
            await hub.d.emit(Notice(key, HELP))
        case _:
            await hub.d.emit(Notice(key, f"Unknown command /{cmd.name}.\n\n{HELP}"))


async def status(hub: Hub, conv: Conversation) -> str:
    row = await hub.d.store.conversation(conv.row.key)
    budget_used = int(conv.kept * conv.calibration) + hub.runner.budget_fixed()
    window = hub.d.window
    state = conv.turn
    running = "a turn is running" if hub.running(conv.row.key) else "idle"
    if state is not None and not hub.running(conv.row.key):
        running = "waiting for approval"
    lines = [
        f"Model: {hub.config.llm.model}",
        f"Context: ~{budget_used:,} of {window:,} tokens ({100 * budget_used // window}%)"
        f", {len(conv.history) - conv.cut} messages in view, {conv.dropped_turns} older "
        "turns trimmed",
        f"This conversation: {row.prompt_tokens:,} prompt + {row.completion_tokens:,} "
        f"completion tokens, ${row.cost:.4f}",
        f"Turn: {running}" + (f", {state.steps} steps" if state else ""),
        f"Persona: {hub.d.persona.fingerprint or 'not loaded yet'}",
    ]
    return "\n".join(lines)


async def approvals(hub: Hub, conv: Conversation) -> Notice:
    rules = await hub.d.store.rules(conv.row.id)
    if not rules:
        return Notice(conv.row.key, "No standing \"always\" rules in this chat.")
    lines = ["Standing \"always\" rules in this chat:"]
    buttons = []
    for n, rule in enumerate(rules, 1):
        lines.append(f"{n}. {rule.tool}: {rule.key}")
        buttons.append(Button(f"Revoke {n}", pack(ItemButton("rule", rule.id))))
    return Notice(conv.row.key, "\n".join(lines), buttons=tuple(buttons))


async def jobs(hub: Hub, conv: Conversation) -> Notice:
    rows = await hub.d.store.jobs(conv.row.id)
    if not rows:
        return Notice(conv.row.key, "No scheduled tasks in this chat.")
    lines = ["Scheduled tasks in this chat:"]
    buttons = []
    for n, job in enumerate(rows, 1):
        lines.append(f"{n}. [{job.id}] {job.spec}: {job.prompt}")
        buttons.append(Button(f"Cancel {n}", pack(ItemButton("job", job.id))))
    return Notice(conv.row.key, "\n".join(lines), buttons=tuple(buttons))


async def revoke(hub: Hub, conv: Conversation, rule_id: str) -> None:
    removed = await hub.d.store.delete_rule(conv.row.id, rule_id)
    text = "Rule revoked: that call will ask again." if removed else "That rule no longer exists."
    await hub.d.emit(Notice(conv.row.key, text))
