"""The terminal channel's line editor (prompt_toolkit), used when a person is at a terminal.

* Input is read in raw mode, so a line of any length arrives whole (a terminal's own
  line editing keeps 4,095 characters of a line). A paste of several lines (bracketed
  paste) is one message; Enter sends, Alt-Enter (or Esc, then Enter) starts a new line.
  Up and Down recall earlier input from a private history file.
* Output is printed above the input line, in order, by one printer task through
  `run_in_terminal`, so typing never mixes into an answer. The line the model is still
  writing, or "thinking…", is drawn just above the prompt and never left behind.
* While the prompt is on screen, log records and stray prints go above it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

from prompt_toolkit import PromptSession
from prompt_toolkit.application import run_in_terminal
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.patch_stdout import patch_stdout
from prompt_toolkit.styles import Style

from bot.core.file_modes import private_file

log = logging.getLogger(__name__)
STYLE = Style.from_dict({"live": "italic fg:ansibrightblack", "prompt": "bold"})


def open_history(path: Path | None) -> History:
    """Typed input remembered in `path` (created 0600), or in memory for this session
    when there is no such place or it cannot be used."""
    if path is None:
        return InMemoryHistory()
    try:
        private_file(path)
        usable = stat.S_ISREG(path.lstat().st_mode) and os.access(path, os.R_OK | os.W_OK)
    except OSError:
        usable = False
    if not usable:
        log.warning("the chat history cannot be kept in %s: it lasts this session only", path)
        return InMemoryHistory()
    return FileHistory(path)


def key_bindings(running: Callable[[], bool], interrupt: Callable[[], None]) -> KeyBindings:
    keys = KeyBindings()

    @keys.add("escape", "enter")
    def _newline(event: KeyPressEvent) -> None:
        """Alt-Enter (or Esc, then Enter): a new line in the message; Enter sends it."""
        event.current_buffer.insert_text("\n")

    @keys.add("c-c")
    def _interrupt(event: KeyPressEvent) -> None:
        """Ctrl-C cancels the running turn; with none, it clears what is typed."""
        buffer = event.current_buffer
        if buffer.text and not running():
            buffer.reset()
        else:
            interrupt()

    return keys


@contextlib.contextmanager
def logs_above() -> Iterator[None]:
    """Log records and stray prints go above the prompt (prompt_toolkit's stdout proxy)."""
    originals = (sys.stdout, sys.stderr)
    with patch_stdout():
        handlers = [h for h in logging.getLogger().handlers
                    if isinstance(h, logging.StreamHandler) and h.stream in originals]
        before = [h.setStream(sys.stderr) for h in handlers]
        try:
            yield
        finally:
            for handler, stream in zip(handlers, before, strict=True):
                handler.setStream(stream)


class Editor:
    """The screen and keyboard of `adapters.console.Console` on a terminal."""

    streams = True

    def __init__(self, history: Path | None, *, prompt: Callable[[], str],
                 running: Callable[[], bool], interrupt: Callable[[], None]) -> None:
        self._prompt = prompt
        self._live = ""
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._printer: asyncio.Task[None] | None = None
        self._logs = contextlib.ExitStack()
        self.session: PromptSession[str] = PromptSession(
            self._message, history=open_history(history), style=STYLE,
            key_bindings=key_bindings(running, interrupt),
            prompt_continuation=lambda width, _line, _wrap: " " * width)

    async def __aenter__(self) -> Editor:
        self._printer = asyncio.create_task(self._print(), name="console-printer")
        self._logs.enter_context(logs_above())
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            if kind is None:
                await self._queue.join()  # everything shown before the program ends
        finally:
            self._logs.close()
            if self._printer is not None:
                self._printer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._printer

    async def read(self) -> str | None:
        """The next message typed or pasted (None: Ctrl-D, the person is done)."""
        try:
            return await self.session.prompt_async(handle_sigint=False,
                                                   set_exception_handler=False)
        except EOFError:
            return None

    # -- the Screen of adapters.console -----------------------------------------------

    def show(self, text: str) -> None:
        self._queue.put_nowait(text)

    def status(self, line: str) -> None:
        self.show(line + "\n")

    def live(self, text: str) -> None:
        if text != self._live:
            self._live = text
            self.session.app.invalidate()

    # -- drawing ----------------------------------------------------------------------

    def _message(self) -> FormattedText:
        """The prompt, under the live line while the prompt is being edited (an accepted
        input stays on screen without it)."""
        app = self.session.app
        prompt = ("class:prompt", self._prompt())
        if not self._live or app.is_done:
            return FormattedText([prompt])
        width = max(app.output.get_size().columns - 1, 1)
        return FormattedText([("class:live", self._live[-width:] + "\n"), prompt])

    async def _print(self) -> None:
        """Print what `show` queued, in order; text queued meanwhile goes in one go."""
        while True:
            texts = [await self._queue.get()]
            while not self._queue.empty():
                texts.append(self._queue.get_nowait())
            try:
                await run_in_terminal(functools.partial(self._write, "".join(texts)))
            except OSError:  # the terminal is gone: nobody is left to read it
                log.debug("could not print to the terminal", exc_info=True)
            finally:
                for _ in texts:
                    self._queue.task_done()

    def _write(self, text: str) -> None:
        output = self.session.app.output
        output.write(text)  # escape characters are shown, never obeyed
        output.flush()
