"""Configuration for running Tandem for a team: the audit log, budgets, metrics and the
log format. `bot.core.config` assembles these into `Config`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from bot.core.sections import Section


class Allowance(Section):
    """A day's allowance; either or both may be set, unset means no limit."""

    tokens: int | None = Field(default=None, gt=0)
    """Prompt plus completion tokens."""
    cost: float | None = Field(default=None, gt=0)
    """In US dollars, from litellm's price data (a model it has no price for counts
    tokens only)."""


class BudgetConfig(Section):
    per_user_day: Allowance = Field(default_factory=Allowance)
    """What one person's messages may spend in a day, across conversations."""
    per_conversation_day: Allowance = Field(default_factory=Allowance)
    """What one conversation may spend in a day, whoever asks."""


class AuditConfig(Section):
    keep_days: int = Field(default=90, ge=1)
    """Entries older than this are pruned (at start and once a day)."""


class MetricsConfig(Section):
    listen: str | None = None
    """`host:port` for a Prometheus `/metrics` endpoint; unset: no endpoint."""


class LoggingConfig(Section):
    format: Literal["text", "json"] = "text"
    """`json`: one JSON object per line (time, level, logger, message, exception)."""
