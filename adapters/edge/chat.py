"""What a platform offers the edge: the `Chat` primitives and the `Live` surface of a turn.

A platform file implements `Chat` with its API's calls and nothing else: post a notice,
delete a message, show an approval card and its outcome, answer someone privately, react,
show that Tandem is typing, and make the live surface of a turn (a placeholder edited with
⏹ Cancel, a Telegram draft, a Slack stream). What to show for each core event, and when,
is decided once, in `adapters.edge.Edge`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from bot.core.events import ApprovalRequested, Button, ConvKey, Progress, User

Ref = TypeVar("Ref")
Where = dict[str, Any]
"""Where a message is, as the store keeps it (JSON): a card's or a live message's place."""


class Live(Protocol[Ref]):
    """A turn's live surface: a placeholder edited as the answer streams, a draft, or a
    stream. The edge calls these in order: `open`, any of `update`/`answer`/`show`, then
    `finish` or `pause`, then `close`."""

    @property
    def refs(self) -> list[Ref]:
        """The messages on screen, in order (none for a draft or a status line)."""
        ...

    @property
    def cancellable(self) -> bool:
        """It shows (or is about to show) a ⏹ Cancel of its own."""
        ...

    async def open(self, text: str, *, delay: float = 0.0) -> None: ...

    def adopt(self, ref: Ref) -> None: ...

    def update(self, text: str) -> None:
        """A status line ("⚙️ Running `shell`…")."""

    def answer(self, text: str) -> None:
        """The answer so far."""

    async def show(self) -> None:
        """On screen now (above an approval card)."""

    async def finish(self, text: str) -> None:
        """The final text, split if long; no button left."""

    async def pause(self, said: str) -> bool:
        """The turn waits for an approval, having said `said`: True when this surface now
        says so on screen (the edge parks it until the turn goes on); False when nothing
        of it is left (what was said was delivered as it is)."""
        ...

    async def close(self) -> None: ...


class Chat(Protocol[Ref]):
    """One platform's primitives. Every method may raise one of `failures`."""

    platform: str
    failures: tuple[type[BaseException], ...]
    """Errors that mean "the platform did not take it": the edge logs them, the turn goes on."""

    def new_live(self, conv: ConvKey, turn: int,
                 lost_cancel: Callable[[], None]) -> Live[Ref]:
        """The live surface for a new turn (the platform picks the mode); it calls
        `lost_cancel` when it stops showing a ⏹ of its own (a stream replacing its
        placeholder), so that the edge offers one."""
        ...

    def adopt_live(self, conv: ConvKey, turn: int, where: Where) -> Live[Ref] | None:
        """A live message another process posted for `turn` (kept in the store), or None."""
        ...

    def status(self, event: Progress, running_for: float | None) -> str:
        """A status line for `event`; `running_for` counts a running tool's seconds."""
        ...

    async def typing(self, conv: ConvKey) -> None:
        """Show that Tandem is at work (repeated every few seconds; may do nothing)."""

    async def post(self, conv: ConvKey, text: str,
                   buttons: Sequence[Button] = ()) -> list[Ref]:
        """A message (Markdown), split if long; the buttons go on its last part."""
        ...

    async def post_line(self, conv: ConvKey, line: str) -> None:
        """A line already in the platform's markup (an approval's outcome)."""

    async def delete(self, conv: ConvKey, ref: Ref) -> None: ...

    async def tell(self, conv: ConvKey, user: User, text: str) -> bool:
        """Show `text` to `user` alone; False when the platform cannot."""
        ...

    async def react(self, conv: ConvKey, ref: str | None) -> bool:
        """Mark the message of inbound `ref` as seen-but-queued (👀); False when it could
        not (the edge says so in words instead)."""
        ...

    async def show_card(self, event: ApprovalRequested) -> Where:
        """Post the approval card with its buttons; where it is."""
        ...

    def outcome_line(self, outcome: str, by: User | None) -> str: ...

    async def decide_card(self, approval_id: str, where: Where, line: str) -> bool:
        """The card with its outcome line and no buttons; False when it is gone."""
        ...
