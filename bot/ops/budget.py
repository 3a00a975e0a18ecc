"""Budgets: what one person and one conversation may spend in a day.

Each model call's tokens and cost are added to the day's spending of the person the turn
is for and of the conversation (only while a budget is configured); before each model
call the turn checks both. A day runs from midnight to midnight in `scheduler.timezone`.
An approver may lift a scope's budget for the rest of the day. A model litellm has no
price for spends tokens only: its cost counts as 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from bot.core.config import Config
from bot.core.ops_config import Allowance
from bot.store import ConvRow, Spent, Store
from bot.turn.budget import Reached


class Budget:
    """The daily budgets of `limits.budget` (satisfies `bot.turn.budget.Budget`)."""

    def __init__(self, config: Config, store: Store,
                 clock: Callable[[], float] = time.time) -> None:
        self.limits = config.limits.budget
        self.store = store
        self.clock = clock
        self.tz = ZoneInfo(config.scheduler.timezone)
        self.on = any(_set(a) for a in (self.limits.per_user_day,
                                        self.limits.per_conversation_day))

    def day(self) -> str:
        return datetime.fromtimestamp(self.clock(), self.tz).strftime("%Y%m%d")

    def resets(self) -> str:
        """When today's budgets reset, in words ("at 00:00 UTC, in 3 h 12 min")."""
        now = datetime.fromtimestamp(self.clock(), self.tz)
        midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        left = int((midnight - now).total_seconds()) // 60
        return f"at 00:00 {self.tz.key} (in {left // 60} h {left % 60} min)"

    @staticmethod
    def scopes(row: ConvRow, user: str) -> tuple[str, str]:
        return f"user:{row.key.platform}:{user}", f"conv:{row.id}"

    async def spend(self, row: ConvRow, user: str, tokens: int, cost: float) -> None:
        if self.on:
            await self.store.add_spend(self.day(), self.scopes(row, user), tokens, cost)

    async def reached(self, row: ConvRow, user: str) -> Reached | None:
        """The first budget of this person or conversation that today's spending reached
        (and no approver lifted), else None."""
        if not self.on:
            return None
        day = self.day()
        mine, ours = self.scopes(row, user)
        spent = await self.store.spent(day, (mine, ours))
        for scope, key, allowance, whose in (
                ("user", mine, self.limits.per_user_day, "your"),
                ("conversation", ours, self.limits.per_conversation_day, "this conversation's")):
            used = spent.get(key, Spent())
            if used.lifted or not _over(used, allowance):
                continue
            text = (f"This stops here: {whose} daily budget is used up "
                    f"({_usage(used, allowance)}). It resets {self.resets()}; "
                    "an approver can lift it for today.")
            lift = f"u{day}{user}" if scope == "user" else f"c{day}"
            return Reached(scope, text, lift)
        return None

    async def lift(self, row: ConvRow, data: str) -> str | None:
        """Lift the budget a lift button names (its day must be today): the scope lifted,
        or None when the button is stale or malformed."""
        day = self.day()
        if len(data) < 9 or data[1:9] != day:
            return None
        if data[0] == "c" and len(data) == 9:
            await self.store.lift_budget(day, f"conv:{row.id}")
            return "this conversation"
        if data[0] == "u" and len(data) > 9:
            await self.store.lift_budget(day, f"user:{row.key.platform}:{data[9:]}")
            return f"user {data[9:]}"
        return None

    async def status(self, row: ConvRow, user: str) -> list[str]:
        """`/status` lines: today's spending against each budget set."""
        if not self.on:
            return []
        mine, ours = self.scopes(row, user)
        spent = await self.store.spent(self.day(), (mine, ours))
        lines = []
        for label, key, allowance in (("you", mine, self.limits.per_user_day),
                                      ("this conversation", ours,
                                       self.limits.per_conversation_day)):
            if _set(allowance):
                used = spent.get(key, Spent())
                lifted = " (lifted for today)" if used.lifted else ""
                lines.append(f"Budget today, {label}: {_usage(used, allowance)}{lifted}")
        return [*lines, f"Budgets reset {self.resets()}"]


def _set(allowance: Allowance) -> bool:
    return allowance.tokens is not None or allowance.cost is not None


def _over(used: Spent, allowance: Allowance) -> bool:
    return (allowance.tokens is not None and used.tokens >= allowance.tokens) or \
        (allowance.cost is not None and used.cost >= allowance.cost)


def _usage(used: Spent, allowance: Allowance) -> str:
    parts = []
    if allowance.tokens is not None:
        parts.append(f"{used.tokens:,} of {allowance.tokens:,} tokens")
    if allowance.cost is not None:
        parts.append(f"${used.cost:.4f} of ${allowance.cost:.2f}")
    return ", ".join(parts)
