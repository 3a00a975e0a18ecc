"""The terminal channel: the same core in a terminal.

Interactive on a TTY (Ctrl-C cancels the running turn, Ctrl-D quits); scriptable when
stdin is not a TTY: each line is a user message, processed one at a time, and an
approval prompt takes the next line (`y` approve, `n` deny, `a` always in this chat).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections import deque
from typing import TextIO

from bot.buttons import ItemButton, unpack
from bot.events import (
    ApprovalRequested,
    ApprovalResolved,
    Button,
    Cancel,
    Command,
    ConvKey,
    Decision,
    Event,
    Notice,
    Phase,
    Progress,
    Queued,
    Suspended,
    TurnEnded,
    TurnStarted,
    User,
    UserMessage,
    Verdict,
)
from bot.hub import Hub

PLATFORM = "console"
TYPED = {"rule": "/revoke", "job": "/canceljob"}


def typed(buttons: tuple[Button, ...]) -> str:
    """A notice's buttons as the commands a terminal types instead (one per line)."""
    lines = []
    for button in buttons:
        data = unpack(button.data)
        if isinstance(data, ItemButton):
            lines.append(f"  {button.label}: {TYPED[data.kind]} {data.item_id}\n")
    return "".join(lines)
ANSWERS = {"y": Verdict.APPROVE, "yes": Verdict.APPROVE, "n": Verdict.DENY, "no": Verdict.DENY,
           "a": Verdict.ALWAYS, "always": Verdict.ALWAYS}


class Console:
    def __init__(self, hub: Hub, *, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout,
                 stderr: TextIO = sys.stderr, interactive: bool | None = None,
                 user: str = "you") -> None:
        self.hub = hub
        self.stdin, self.out, self.err = stdin, stdout, stderr
        self.interactive = stdin.isatty() if interactive is None else interactive
        self.user = User(user, user)
        self.conv = ConvKey(PLATFORM, user)
        self.pending: deque[str] = deque()
        self.restored: set[str] = set()
        """Cards shown again after a restart: a new message may supersede them."""
        self._streamed = 0
        self._shown = ""
        self._tool_shown: str | None = None
        self._lines = 0
        self._cancels: set[asyncio.Task[object]] = set()

    # -- rendering --------------------------------------------------------------------

    async def emit(self, event: Event) -> None:
        match event:
            case TurnStarted():
                self._streamed, self._shown, self._tool_shown = 0, "", None
            case Progress(phase=Phase.TOOL, tool=tool) if tool != self._tool_shown:
                self._tool_shown = tool
                self._status(f"[running {tool}…]")
            case Progress(text=text) if self.interactive and len(text) > self._streamed:
                if not text.startswith(self._shown):  # the model restarted its answer
                    self._write("\n")
                    self._streamed = 0
                self._write(text[self._streamed :])
                self._streamed, self._shown = len(text), text
            case TurnEnded(text=text):
                self._finish(text, False)
            case Suspended():
                self._finish("", True)
            case ApprovalRequested():
                self._card(event)
            case ApprovalResolved(approval_id=aid, outcome=outcome):
                with contextlib.suppress(ValueError):
                    self.pending.remove(aid)
                self._status(f"[{outcome}]")
            case Notice(text=text, buttons=buttons):
                self._write(f"{text}\n{typed(buttons)}")
            case Queued():
                self._status("[received; I will answer it after the current reply]")

    def _card(self, event: ApprovalRequested) -> None:
        """A reminder too: a terminal keeps no card on screen."""
        if event.approval_id not in self.pending:
            self.pending.append(event.approval_id)
        if event.reminder:
            self.restored.add(event.approval_id)
        body = "\n".join(f"    {line}" for line in event.summary.splitlines())
        still = "still waits to" if event.reminder else "wants to"
        why = f"{event.reason}\n" if event.reason else ""
        self._write(f"\nTandem {still} run `{event.tool}`:\n{body}\n{why}"
                    "Approve? [y]es / [n]o / [a]lways in this chat\n")

    def _finish(self, text: str, suspended: bool) -> None:
        if suspended:
            if self._streamed:
                self._write("\n")
            return
        if self._streamed and text.startswith(self._shown):
            self._write(text[self._streamed :] + "\n")
        else:
            self._write(("\n" if self._streamed else "") + text + "\n")
        self._streamed, self._shown = 0, ""

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _status(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()

    # -- input ------------------------------------------------------------------------

    def parse(self, line: str) -> UserMessage | Decision | Cancel | Command | None:
        """Turn one input line into an inbound (None: nothing to do)."""
        self._lines += 1
        stripped = line.strip()
        if self.pending and stripped.lower() in ANSWERS:
            return Decision(self.conv, self.user, self.pending[0], ANSWERS[stripped.lower()])
        if self.pending and not stripped.startswith("/") and self.pending[0] not in self.restored:
            self._write("Please answer y, n or a (or /stop).\n")
            return None  # a card shown again after a restart may be passed over instead
        if stripped in ("/stop", "/cancel"):
            return Cancel(self.conv, self.user)
        if stripped.startswith("/") and len(stripped) > 1:
            name, _, args = stripped[1:].partition(" ")
            return Command(self.conv, self.user, name.lower(), args.strip())
        return UserMessage(self.conv, self.user, line.rstrip("\n"))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self._on_interrupt)
        try:
            if self.interactive:
                self._write("Tandem is ready. /help for commands, Ctrl-C cancels, "
                            "Ctrl-D quits.\n")
            while True:
                line = await asyncio.to_thread(self.stdin.readline)
                if not line:
                    break
                item = self.parse(line)
                if item is None:
                    continue
                receipt = await self.hub.submit(item)
                if receipt.note and not receipt.accepted:
                    self._write(receipt.note + "\n")
                if not self.interactive:
                    await self.hub.idle()
            await self.hub.idle()
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)

    def _on_interrupt(self) -> None:
        if self.hub.running(self.conv):
            self._status("[cancelling…]")
            task = asyncio.get_running_loop().create_task(
                self.hub.cancel(Cancel(self.conv, self.user)))
            self._cancels.add(task)
            task.add_done_callback(self._cancels.discard)
        else:
            self._status("(nothing is running; Ctrl-D quits)")


def create(config: object, hub: Hub, dispatch: object) -> Console:
    console = Console(hub)
    dispatch.sinks[PLATFORM] = console  # type: ignore[attr-defined]
    return console
