"""What Tandem did, told to whoever watches: the audit log and the metrics.

The core says each fact once (`Watch.see`) where it happens; a `Watcher` takes the ones
it cares about. The audit log (`bot.ops.audit`) appends them to the store; the metrics
(`bot.ops.metrics`) count them. With nobody watching, saying a fact costs one call.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from bot.core.events import ConvKey

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Asked:
    """An approval card was posted."""

    conv: ConvKey
    approval_id: str
    tool: str
    call: str
    """The exact call as the card shows it (redacted)."""
    requester: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class Decided:
    """An approval was decided: approved, denied, always, expired, cancelled, superseded."""

    conv: ConvKey
    approval_id: str
    tool: str
    call: str
    status: str
    by: str | None
    """Who pressed (None: nobody; it expired or the turn moved on)."""
    waited_s: float


@dataclass(frozen=True, slots=True)
class RuleChanged:
    """A standing rule ("always in this chat") was added or revoked."""

    conv: ConvKey
    tool: str
    key: str
    change: str
    """added | revoked"""
    by: str | None


@dataclass(frozen=True, slots=True)
class ToolRan:
    conv: ConvKey
    tool: str
    call: str
    """The call's rendered arguments (redacted)."""
    outcome: str
    seconds: float
    requester: str


@dataclass(frozen=True, slots=True)
class Refused:
    """Someone was turned away: a stranger's message (`access`) or a press that could
    not count (`press`)."""

    platform: str
    user: str
    what: str
    """access | press"""
    why: str
    conv: ConvKey | None = None


@dataclass(frozen=True, slots=True)
class ModelCalled:
    model: str
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    cost: float
    ok: bool
    cache_read: int = 0
    """Of `prompt_tokens`: read from the provider's prompt cache."""
    cache_write: int = 0
    """Of `prompt_tokens`: written to the provider's prompt cache."""


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """What a turn's model calls used (told as the turn ends, when it called the model)."""

    conv: ConvKey
    requester: str
    model: str
    """The model that answered last."""
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cache_read: int
    cache_write: int
    cost: float


@dataclass(frozen=True, slots=True)
class TurnDone:
    conv: ConvKey
    reason: str
    """The exit reason (answered, cancelled, max_steps, …)."""
    seconds: float


@dataclass(frozen=True, slots=True)
class PlatformCall:
    """A platform API call that failed (`status` its HTTP status; 429: rate limited)."""

    platform: str
    method: str
    status: int


@dataclass(frozen=True, slots=True)
class BudgetReached:
    """A turn stopped before a model call: a daily budget was used up."""

    conv: ConvKey
    user: str
    scope: str
    """user | conversation"""


@dataclass(frozen=True, slots=True)
class BudgetLifted:
    conv: ConvKey
    scope: str
    """What was lifted for today: "this conversation" or "user <id>"."""
    by: str


@dataclass(frozen=True, slots=True)
class FailedOver:
    """Another model answered while the chat's own was unavailable (told once per outage
    and chat)."""

    conv: ConvKey
    model: str
    """The model that answered."""
    unavailable: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ModelChosen:
    """A conversation was switched to another model (`/model`)."""

    conv: ConvKey
    model: str
    by: str


Fact = (Asked | Decided | RuleChanged | ToolRan | Refused | ModelCalled | TurnDone
        | TurnUsage | PlatformCall | BudgetReached | BudgetLifted | FailedOver | ModelChosen)


class Watcher(Protocol):
    async def see(self, fact: Fact) -> None: ...


class Watch:
    """Hands each fact to every watcher; a watcher that fails is logged, never the
    caller's problem (a turn does not fail because a counter did)."""

    def __init__(self, watchers: list[Watcher] | None = None) -> None:
        self.watchers: list[Watcher] = list(watchers or [])

    def add(self, watcher: Watcher) -> None:
        self.watchers.append(watcher)

    async def see(self, fact: Fact) -> None:
        for watcher in self.watchers:
            try:
                await watcher.see(fact)
            except Exception:
                log.warning("could not record %s", type(fact).__name__, exc_info=True)

    async def flush(self) -> None:
        """Whatever a watcher keeps back is written now (before reading the audit log)."""
        for flush in self._hooks("flush"):
            await flush()

    async def close(self) -> None:
        """Before the store closes: each watcher writes what it kept back (and the
        metrics endpoint stops)."""
        for close in self._hooks("close"):
            try:
                await close()
            except Exception:
                log.warning("could not close a watcher", exc_info=True)

    def _hooks(self, name: str) -> list[Callable[[], Awaitable[None]]]:
        """The watchers' `name` methods, where they have one."""
        return [hook for watcher in self.watchers
                if (hook := getattr(watcher, name, None)) is not None]
