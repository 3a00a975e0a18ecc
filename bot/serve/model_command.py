"""`/model`: which model this conversation uses, and switching it.

`/model` lists `llm.model` and `llm.models` with a button each; `/model NAME` (or a
button) switches this conversation, with or without the provider prefix. The choice is
kept in the store (every worker, every restart); the next turn uses it, the history
sanitized again for it. Who may switch is `bot.serve.permissions`' to say (`MODEL`:
anyone in a DM; in a group, approvers); the command is told its answer.
"""

from __future__ import annotations

import hashlib

from bot.core.buttons import ItemButton, pack
from bot.core.config import Config
from bot.core.events import Button, Command, Notice
from bot.core.llm_config import ModelEntry
from bot.core.watch import ModelChosen, Watch
from bot.llm.failover import bare, find
from bot.store import Store
from bot.turn.conversation import Conversation
from bot.turn.model_choice import in_use, refresh


def button_id(model: str) -> str:
    """A short id of a model for its button (names hold `/`, `:` and `.`; an id stays
    valid when `llm.models` is reordered)."""
    return hashlib.sha256(model.encode()).hexdigest()[:12]


def _entry(config: Config, wanted: str) -> ModelEntry | None:
    by_button = {button_id(m.model): m for m in config.llm.choices()}
    return by_button.get(wanted) or find(config.llm, wanted)


def listing(config: Config, conv: Conversation) -> Notice:
    current = in_use(config.llm, conv)
    choices = config.llm.choices()
    lines = [f"This conversation uses {current}."]
    if len(choices) == 1:
        lines.append("No other model is configured (llm.models).")
        return Notice(conv.row.key, "\n".join(lines))
    lines.append("Switch with a button or /model NAME:")
    lines += [f"• {m.model}" + (" (in use)" if m.model == current else "") for m in choices]
    buttons = tuple(Button(("✓ " if m.model == current else "") + m.model,
                           pack(ItemButton("model", button_id(m.model)))) for m in choices)
    return Notice(conv.row.key, "\n".join(lines), buttons=buttons)


async def model(config: Config, store: Store, watch: Watch | None, conv: Conversation,
                cmd: Command, refused: str | None) -> Notice:
    """`/model` lists, `/model NAME` switches; `refused` is what a person who may not
    switch here is told (None: they may)."""
    key, wanted = conv.row.key, cmd.args.strip()
    await refresh(store, config.llm, conv)
    if not wanted:
        return listing(config, conv)
    if refused is not None:
        return Notice(key, refused, ephemeral_to=cmd.user)
    entry = _entry(config, wanted)
    if entry is None:
        same = [m.model for m in config.llm.choices() if bare(m.model) == bare(wanted)]
        if len(same) > 1:
            return Notice(key, f"{wanted} is {' and '.join(same)}: name it with its provider.")
        names = ", ".join(m.model for m in config.llm.choices())
        return Notice(key, f"No model called {wanted} here. The choices: {names}.")
    choice = None if entry.model == config.llm.model else entry.model
    await store.set_chat_model(conv.row.id, choice, cmd.user.id)
    conv.switch(choice)
    if watch is not None:
        await watch.see(ModelChosen(key, entry.model, cmd.user.id))
    who = cmd.user.name or cmd.user.id
    return Notice(key, f"This conversation now uses {entry.model} (switched by {who}).")


async def status_lines(config: Config, store: Store, conv: Conversation) -> list[str]:
    """What `/status` says of the model: the one in use, and who answered last when
    another model stood in."""
    await refresh(store, config.llm, conv)
    current = in_use(config.llm, conv)
    chosen = " (chosen with /model)" if conv.model else ""
    lines = [f"Model: {current}{chosen}"]
    if conv.answered_by and conv.answered_by != current:
        lines.append(f"Last answer by: {conv.answered_by} ({current} was unavailable)")
    return lines
