"""Configuration of the context: how a full window is trimmed, and the summary of what
the trim drops. `bot.core.config` assembles this into `Config`."""

from __future__ import annotations

from pydantic import Field

from bot.core.sections import Section


class ContextConfig(Section):
    summary: bool = False
    """When the trim drops turns, have the model summarize them (stored, reused)."""
    summary_max_tokens: int = Field(default=800, ge=50)
    low_water: float = Field(default=0.65, gt=0, le=1)
    """A full window is trimmed down to this share of the history's room, so the turns
    after a trim share one prefix (the provider's prompt cache keeps hitting) until the
    window is full again. 1 trims just enough, every turn."""
    cache_breakpoints: bool = True
    """Mark prompt-cache breakpoints for the models that cache only up to one (Claude,
    Gemini: `bot.llm.caching`); false for an endpoint that refuses `cache_control`."""
