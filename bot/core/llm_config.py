"""Configuration of the model: the primary, its fallbacks, the models a chat may switch
to (`/model`), and when a failing model is skipped. `bot.core.config` assembles this
into `Config`.

A fallback or a switchable model is a name (`anthropic/claude-sonnet-4-5`) or a full entry
with its own `api_base`, `api_key` (a `${VAR}` reference) and options. A name alone never
borrows the primary's `api_base` or key: litellm reaches that provider with its own
environment variables (`ANTHROPIC_API_KEY`, …).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from bot.core.sections import Section


class ModelEntry(Section):
    """One model Tandem may call, and how to reach it."""

    model: str
    api_base: str | None = None
    api_key: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    """Unset: `llm.timeout_s`."""
    max_output_tokens: int | None = Field(default=None, gt=0)
    """Unset: `llm.max_output_tokens`."""
    temperature: float | None = None
    """Unset: `llm.temperature`."""


def _entry(value: Any) -> Any:
    """A bare name is an entry with nothing but its name."""
    return {"model": value.strip()} if isinstance(value, str) else value


def _entries(value: Any) -> Any:
    if isinstance(value, str):  # an environment override: names separated by commas
        value = [part for part in value.split(",") if part.strip()]
    return value


Entry = Annotated[ModelEntry, BeforeValidator(_entry)]
Entries = Annotated[list[Entry], BeforeValidator(_entries)]


class FailoverConfig(Section):
    failures: int = Field(default=3, ge=1)
    """A model that failed this many times in a row is skipped by every conversation…"""
    cooldown_s: float = Field(default=60.0, gt=0)
    """…for this long; then one call tries it again."""
    after_cut: bool = False
    """Once an answer's text is on screen and its stream is cut, the next model answers
    afresh (the answer says so) instead of the turn ending with the cut."""


class LLMConfig(Section):
    model: str = "openai/gpt-4o-mini"
    api_base: str | None = None
    api_key: str | None = None
    context_window: int | None = Field(default=None, gt=0)
    """Tokens; when unset, from litellm's model info, else 32000."""
    max_output_tokens: int = Field(default=4096, gt=0)
    timeout_s: float = Field(default=120.0, gt=0)
    retries: int = Field(default=2, ge=0)
    fallbacks: Entries = Field(default_factory=list)
    """Tried in order when the model in use fails (a chat's `/model` choice included)."""
    models: Entries = Field(default_factory=list)
    """What `/model` offers besides `model`."""
    failover: FailoverConfig = Field(default_factory=FailoverConfig)
    temperature: float | None = None

    def primary(self) -> ModelEntry:
        return ModelEntry(model=self.model, api_base=self.api_base, api_key=self.api_key)

    def choices(self) -> list[ModelEntry]:
        """The models a chat may switch to: the primary first, then `models`."""
        out = [self.primary()]
        out += [m for m in self.models if m.model != self.model]
        return out

    def keys(self) -> list[str | None]:
        """Every configured API key (for redaction)."""
        return [self.api_key, *(m.api_key for m in (*self.fallbacks, *self.models))]
