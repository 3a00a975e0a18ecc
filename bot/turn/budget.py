"""What a turn asks of the daily budgets: the `Budget` protocol and what a reached budget
says (`Reached`).

The budgets themselves are operations' (`bot.ops.budget.Budget`, which satisfies this
protocol); `bot.run.app` injects them into the runner (`Deps.budget`), and `/status` and
the lift button (`bot.serve.commands`) reach them through the same protocol. The turn and
the serving layer never import `bot.ops`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from bot.core.buttons import ItemButton, pack
from bot.core.events import Button, ConvKey, Notice
from bot.llm import Completion
from bot.store import ConvRow


@dataclass(frozen=True, slots=True)
class Reached:
    scope: str
    """user | conversation"""
    text: str
    """What the person is told: which limit, how much was spent, when it resets."""
    lift: str
    """The lift button's data: what `/liftbudget` takes."""

    def notice(self, key: ConvKey) -> Notice:
        """Said besides the turn's end: the scope, and a button for approvers."""
        lift = Button("Lift for today (approvers)", pack(ItemButton("budget", self.lift)))
        return Notice(key, f"The {self.scope} budget for today is used up.", buttons=(lift,))


class Budget(Protocol):
    """Daily budgets of a person and of a conversation."""

    async def reached(self, row: ConvRow, user: str) -> Reached | None:
        """The first budget of this person or conversation that today's spending reached
        (and no approver lifted), else None: checked before each model call."""

    async def spend(self, row: ConvRow, user: str, tokens: int, cost: float) -> None:
        """Add a model call's tokens and cost to today's spending."""

    async def lift(self, row: ConvRow, data: str) -> str | None:
        """Lift the budget a lift button names: the scope lifted, or None when the button
        is stale or malformed."""

    async def status(self, row: ConvRow, user: str) -> list[str]:
        """`/status` lines: today's spending against each budget set."""


def spender(budget: Budget | None, row: ConvRow,
            user: str) -> Callable[[Completion], Awaitable[None]] | None:
    """What counts a model call made besides the turn's own steps (a summary of trimmed
    turns) against `user`'s and the conversation's budgets; None without budgets."""
    if budget is None:
        return None

    async def spend(completion: Completion) -> None:
        if completion.prompt_tokens is not None:
            await budget.spend(row, user, completion.prompt_tokens
                               + (completion.completion_tokens or 0), completion.cost)
    return spend
