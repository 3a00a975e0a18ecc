"""The one trim of a turn's history: once the window is full, whole turns are dropped down
to the low-water mark (`context.low_water`), so that many turns share one prefix before the
next trim; with `context.summary` the model summarizes what was dropped."""

from __future__ import annotations

from bot.turn import compaction, taint
from bot.turn.budget import spender
from bot.turn.cancel import CancelSignal, unless_cancelled
from bot.turn.conversation import Conversation
from bot.turn.deps import Deps


async def trim_history(d: Deps, conv: Conversation, window: int,
                       cancel: CancelSignal | None = None) -> None:
    """Trim `conv` for a model with `window` tokens; a `cancel` set during the summary call
    leaves the plain trim standing."""
    if not to_low_water(d, conv, window) or not d.config.context.summary:
        return
    dropped = [m for m in conv.history[:conv.cut] if (m.id or 0) > conv.summary_through]
    if not dropped:
        return
    text = await unless_cancelled(compaction.summarize(
        d.model, taint.without_untrusted(dropped, d.tools), conv.summary,
        d.config.context.summary_max_tokens, spend=spender(
            d.budget, conv.row, conv.turn.requester if conv.turn else "")),
        cancel)  # a /stop meanwhile counts
    if text is None:
        return  # the plain trim stands
    through = max(m.id or 0 for m in dropped)
    await d.store.set_summary(conv.row.id, conv.row.session, through, text)
    conv.summary, conv.summary_through = text, through
    to_low_water(d, conv, window)  # the summary takes room


def to_low_water(d: Deps, conv: Conversation, window: int) -> bool:
    """Drop whole turns down to the low-water mark once the history outgrows its budget."""
    budget = d.prompt.history_budget(conv, window)
    return conv.trim_to(budget, int(budget * d.config.context.low_water))
