"""A running turn's cancel signal: a person's ⏹ or `/stop`, or Tandem shutting down.

The runner looks at it at fixed checkpoints. A person's cancel ends the turn as
cancelled; a shutdown only stops the work under way, and a turn that is pausing for an
approval stays paused (it is shown again at the next start).
"""

from __future__ import annotations

import asyncio


class CancelSignal(asyncio.Event):
    def __init__(self) -> None:
        super().__init__()
        self.shutdown = False
        """Set by a shutdown rather than by a person."""

    def stop_for_shutdown(self) -> None:
        self.shutdown = True
        self.set()

    @property
    def by_person(self) -> bool:
        return self.is_set() and not self.shutdown
