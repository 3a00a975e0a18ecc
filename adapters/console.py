"""The terminal channel: the same core in a terminal.

Two ways in, one rendering:

* On a terminal (stdin and stdout both a TTY) input is read by a line editor
  (`adapters.console_prompt`): history, a paste of several lines as one message, output
  above the input line, the answer streamed as it comes and "thinking…" until it does.
  Ctrl-C cancels the running turn, Ctrl-D quits.
* Otherwise it is scriptable: each line of stdin is a user message, processed one at a
  time; answers go to stdout whole, status lines to stderr, and an approval prompt takes
  the next line (`y` approve, `n` deny, `a` always in this chat).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from bot.core.buttons import ItemButton, unpack
from bot.core.config import Config
from bot.core.events import (
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
from bot.run.app import Dispatch
from bot.serve.hub import Hub
from bot.store.backends import POSTGRES_SCHEMES, SQLITE_SCHEME

PLATFORM = "console"
THINKING = "thinking…"
HISTORY_FILE = "chat_history"
WELCOME = "Tandem is ready. /help for commands, Ctrl-C cancels, Ctrl-D quits.\n"


def typed(buttons: tuple[Button, ...]) -> str:
    """A notice's buttons as the commands a terminal types instead (one per line)."""
    lines = []
    for button in buttons:
        data = unpack(button.data)
        if isinstance(data, ItemButton):
            lines.append(f"  {button.label}: /{data.command} {data.item_id}\n")
    return "".join(lines)
ANSWERS = {"y": Verdict.APPROVE, "yes": Verdict.APPROVE, "n": Verdict.DENY, "no": Verdict.DENY,
           "a": Verdict.ALWAYS, "always": Verdict.ALWAYS, "s": Verdict.SESSION,
           "session": Verdict.SESSION}


def history_path(store_target: str) -> Path | None:
    """Where typed lines are remembered: `chat_history` beside the SQLite database (None
    with PostgreSQL or an in-memory database: the history then lasts one session)."""
    if store_target.lower().startswith(POSTGRES_SCHEMES):
        return None
    if store_target.lower().startswith(SQLITE_SCHEME):
        store_target = store_target[len(SQLITE_SCHEME):]
    if store_target in ("", ":memory:"):
        return None
    return Path(store_target).parent / HISTORY_FILE


class Screen(Protocol):
    """Where the terminal channel's output goes."""

    streams: bool
    """Whether the answer is shown while it is written (else once, whole, at the end)."""

    def show(self, text: str) -> None:
        """Print `text` (whole lines) for good."""

    def status(self, line: str) -> None:
        """Print a status line, kept apart from the answers."""

    def live(self, text: str) -> None:
        """Show what the turn is doing now until the next call ("" shows nothing)."""


class Lines:
    """Plain streams: answers to stdout, status lines to stderr, nothing live."""

    streams = False

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err

    def show(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def status(self, line: str) -> None:
        self.err.write(line + "\n")
        self.err.flush()

    def live(self, text: str) -> None:
        pass


@dataclass(slots=True)
class Answer:
    """The answer being streamed: whole lines are printed for good as they arrive; the
    unfinished line stays live until it ends (so nothing is printed twice)."""

    text: str = ""
    """This step's answer so far."""
    printed: int = 0
    """How much of `text` is printed."""

    @property
    def partial(self) -> str:
        return self.text[self.printed :]

    def advance(self, text: str) -> str:
        """The stream now reads `text`: the whole lines to print."""
        out = "" if text.startswith(self.text) else self.cut()  # a new step, or a restart
        self.text = text
        end = text.rfind("\n") + 1
        if end > self.printed:
            out += text[self.printed : end]
            self.printed = end
        return out

    def cut(self) -> str:
        """End the unfinished line (a tool runs, the turn waits): what to print."""
        rest = self.partial
        self.text, self.printed = "", 0
        return rest + "\n" if rest else ""

    def finish(self, text: str) -> str:
        """The turn's final text: what is left to print."""
        out = text[self.printed :] if self.text and text.startswith(self.text) \
            else self.cut() + text
        self.text, self.printed = "", 0
        return out + "\n"


class Console:
    def __init__(self, hub: Hub, *, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout,
                 stderr: TextIO = sys.stderr, history: Path | None = None,
                 user: str = "you") -> None:
        self.hub = hub
        self.stdin = stdin
        self.interactive = stdin.isatty()
        self.editing = self.interactive and stdout.isatty()
        """A person at a terminal: the line editor reads input."""
        self.screen: Screen = Lines(stdout, stderr)
        self.history = history
        self.user = User(user, user)
        self.conv = ConvKey(PLATFORM, user)
        self.pending: deque[str] = deque()
        self.restored: set[str] = set()
        """Cards shown again after a restart: a new message may supersede them."""
        self._answer = Answer()
        self._tool_shown: str | None = None
        self._cancels: set[asyncio.Task[object]] = set()

    # -- rendering --------------------------------------------------------------------

    async def emit(self, event: Event) -> None:
        match event:
            case TurnStarted():
                self._answer, self._tool_shown = Answer(), None
                self.screen.live(THINKING)
            case Progress(phase=Phase.TOOL, tool=tool):
                if tool != self._tool_shown:
                    self._tool_shown = tool
                    self._show(self._answer.cut())
                    self.screen.status(f"[running {tool}…]")
                    self.screen.live(f"running {tool}…")
            case Progress(text=text) if self.screen.streams:
                self._show(self._answer.advance(text))
                self.screen.live(self._answer.partial or ("" if text else THINKING))
            case TurnEnded(text=text):
                self._show(self._answer.finish(text))
                self.screen.live("")
            case Suspended():
                self._show(self._answer.cut())
                self.screen.live("")
            case ApprovalRequested():
                self._card(event)
            case ApprovalResolved(approval_id=aid, outcome=outcome):
                with contextlib.suppress(ValueError):
                    self.pending.remove(aid)
                self.screen.status(f"[{outcome}]")
            case Notice(text=text, buttons=buttons):
                self._show(f"{text}\n{typed(buttons)}")
            case Queued():
                self.screen.status("[received; I will answer it after the current reply]")

    def _card(self, event: ApprovalRequested) -> None:
        """A reminder too: a terminal keeps no card on screen."""
        if event.approval_id not in self.pending:
            self.pending.append(event.approval_id)
        if event.reminder:
            self.restored.add(event.approval_id)
        body = "\n".join(f"    {line}" for line in event.summary.splitlines())
        still = "still waits to" if event.reminder else "wants to"
        why = f"{event.reason}\n" if event.reason else ""
        self._show(self._answer.cut())  # what the model said before it asked
        self._show(f"\nTandem {still} run `{event.tool}`:\n{body}\n{why}"
                   "Approve? [y]es / [n]o / [a]lways in this chat\n")

    def _show(self, text: str) -> None:
        if text:
            self.screen.show(text)

    def prompt(self) -> str:
        """The input line's prompt: it says when an approval waits for the answer."""
        return "y/n/s/a› " if self.pending else "› "

    # -- input ------------------------------------------------------------------------

    def parse(self, line: str) -> UserMessage | Decision | Cancel | Command | None:
        """Turn one input (a line, or a pasted block) into an inbound (None: nothing to
        do)."""
        stripped = line.strip()
        if self.pending and stripped.lower() in ANSWERS:
            return Decision(self.conv, self.user, self.pending[0], ANSWERS[stripped.lower()])
        if self.pending and not stripped.startswith("/") and self.pending[0] not in self.restored:
            self._show("Please answer y, n or a (or /stop).\n")
            return None  # a card shown again after a restart may be passed over instead
        if stripped in ("/stop", "/cancel"):
            return Cancel(self.conv, self.user)
        if stripped.startswith("/") and len(stripped) > 1 and "\n" not in stripped:
            name, _, args = stripped[1:].partition(" ")
            return Command(self.conv, self.user, name.lower(), args.strip())
        return UserMessage(self.conv, self.user, line.rstrip("\n"))

    async def take(self, line: str) -> None:
        """Hand one input to the core."""
        item = self.parse(line)
        if item is None:
            return
        receipt = await self.hub.submit(item)
        if receipt.note and not receipt.accepted:
            self._show(receipt.note + "\n")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self.interrupt)
        try:
            if self.editing:
                await self._edit()
            else:
                await self._script()
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)

    async def _script(self) -> None:
        """Lines from stdin (a pipe, a file, or a terminal that is not ours to draw on)."""
        if self.interactive:
            self._show(WELCOME)
        while True:
            line = await asyncio.to_thread(self.stdin.readline)  # no length limit
            if not line:
                break
            await self.take(line)
            if not self.interactive:
                await self.hub.idle()
        await self.hub.idle()

    async def _edit(self) -> None:
        from adapters.console_prompt import Editor  # prompt_toolkit: only on a terminal

        async with Editor(self.history, prompt=self.prompt, running=self.running,
                          interrupt=self.interrupt) as editor:
            self.screen = editor
            editor.show(WELCOME)
            while (line := await editor.read()) is not None:
                if line.strip():
                    await self.take(line)
            await self.hub.idle()  # Ctrl-D while a turn runs: its answer still shows

    def running(self) -> bool:
        return self.hub.running(self.conv)

    def interrupt(self) -> None:
        """Ctrl-C: cancel the running turn, if there is one."""
        if self.running():
            self.screen.status("[cancelling…]")
            task = asyncio.get_running_loop().create_task(
                self.hub.cancel(Cancel(self.conv, self.user)))
            self._cancels.add(task)
            task.add_done_callback(self._cancels.discard)
        else:
            self.screen.status("(nothing is running; Ctrl-D quits)")


def create(config: Config, hub: Hub, dispatch: Dispatch) -> Console:
    console = Console(hub, history=history_path(config.store.target))
    dispatch.sinks[PLATFORM] = console
    return console
