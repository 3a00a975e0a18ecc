"""Which model a conversation uses, and what its answer says when another stood in.

The choice (`/model`) is kept in the store, so every worker and every restart sees it;
it is read as each turn begins. When a fallback answered because the conversation's own
model was unavailable, the answer's footer says so once per outage and chat
("answered by X: Y is unavailable"), and the audit log and metrics are told.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from bot.core.llm_config import LLMConfig
from bot.core.watch import FailedOver, Watch
from bot.llm.failover import Unavailable, choosing, find
from bot.store import Store
from bot.turn.conversation import Conversation
from bot.turn.streaming import Scratch


async def refresh(store: Store, config: LLMConfig, conv: Conversation) -> None:
    """Take the conversation's stored choice (another worker may have made it). A model
    no longer configured is no choice: the configured one answers. Without `llm.models`
    there is nothing to choose, and nothing is read."""
    stored = await store.chat_model(conv.row.id) if config.models else None
    found = find(config, stored) if stored else None
    choice = found.model if found is not None and found.model != config.model else None
    if choice != conv.model:
        conv.switch(choice)


def using(conv: Conversation) -> AbstractContextManager[None]:
    """Model calls made inside go to the conversation's model first."""
    return choosing(conv.model)


def in_use(config: LLMConfig, conv: Conversation) -> str:
    return conv.model or config.model


def footer(model: str, unavailable: list[Unavailable]) -> str:
    names = list(dict.fromkeys(u.model for u in unavailable))
    cut = [u.model for u in unavailable if u.cut]
    if cut:
        return f"↪ answered by {model}: {', '.join(cut)} was cut off mid-answer"
    verb = "is" if len(names) == 1 else "are"
    return f"↪ answered by {model}: {', '.join(names)} {verb} unavailable"


async def answered(watch: Watch, conv: Conversation, scratch: Scratch, text: str) -> str:
    """The turn's final text, with the footer when a fallback answered in an outage this
    chat was not told of yet."""
    if not scratch.model:
        return text
    conv.answered_by = scratch.model
    fresh: list[Unavailable] = []
    for gone in scratch.unavailable:
        told = (gone.model, gone.outage)
        if gone.model != scratch.model and told not in conv.told:
            conv.told.add(told)
            fresh.append(gone)
    if not fresh:
        return text
    await watch.see(FailedOver(conv.row.key, scratch.model,
                               tuple(dict.fromkeys(u.model for u in fresh))))
    return f"{text}\n\n{footer(scratch.model, fresh)}" if text else footer(scratch.model, fresh)
