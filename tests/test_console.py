"""`tandem chat` as a person uses it: a real process on a pseudo-terminal, the fake model.

The test reads what Tandem draws through a small terminal (`Screen`) that keeps what a
person would see: text the program erased or drew over is gone from it, as on a real
terminal, so "the answer is on screen, whole" and "the typed line is under it" can fail.
"""

from __future__ import annotations

import asyncio
import codecs
import fcntl
import os
import pty
import re
import stat
import string
import struct
import sys
import termios
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adapters.console import Answer, history_path
from tests.conftest import said
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.test_cli import env, tandem, write_config

PROMPT = "› "
LONG = "".join(string.ascii_letters[i % 52] for i in range(10_010))
_CSI = re.compile(r"\x1b\[([?>=]?)([0-9;]*)([ -/]*)([@-~])")


class Screen:
    """Enough of a VT100 terminal to see what a line editor leaves on it: text, CR, LF,
    backspace, tab, cursor moves (CSI A B C D G H), erasing (CSI J K), autowrap (?7) and
    the cursor position report (CSI 6n, answered in `replies`). Colours and other modes
    are ignored. Lines scrolled off the top stay readable."""

    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self.lines: list[list[str]] = [[]]
        self.y = self.x = self.top = 0
        self.autowrap = True
        self.replies: list[str] = []
        self._rest = ""

    def feed(self, text: str) -> None:
        text, self._rest = self._rest + text, ""
        i = 0
        while i < len(text):
            char = text[i]
            if char != "\x1b":
                self._char(char)
                i += 1
                continue
            used = self._escape(text, i)
            if used == 0:  # incomplete: wait for the rest
                self._rest = text[i:]
                return
            i += used

    def _escape(self, text: str, i: int) -> int:
        if i + 1 >= len(text):
            return 0
        if text[i + 1] == "[":
            match = _CSI.match(text, i)
            if match is None:
                return 0 if not re.search(r"[@-~]", text[i + 2 :]) else 2
            self._csi(match.group(1), match.group(2), match.group(4))
            return match.end() - i
        if text[i + 1] == "]":  # OSC, up to BEL or ST
            end = min((p for p in (text.find("\x07", i), text.find("\x1b\\", i)) if p >= 0),
                      default=-1)
            return 0 if end < 0 else end - i + (1 if text[end] == "\x07" else 2)
        return 2  # ESC and one character: keypad modes, save/restore cursor

    def _csi(self, private: str, params: str, final: str) -> None:
        args = [int(p) if p else 0 for p in params.split(";")] if params else []
        n = max(args[0], 1) if args else 1
        if private == "?":
            if 7 in args and final in "hl":
                self.autowrap = final == "h"
            return
        match final:
            case "A":
                self.y = max(self.top, self.y - n)
            case "B":
                self.y = min(self.top + self.rows - 1, self.y + n)
            case "C":
                self.x = min(self.cols - 1, self.x + n)
            case "D":
                self.x = max(0, min(self.x, self.cols - 1) - n)
            case "G":
                self.x = min(self.cols - 1, n - 1)
            case "H" | "f":
                row, col = (args + [1, 1])[:2]
                self.y, self.x = self.top + max(row, 1) - 1, max(col, 1) - 1
            case "J":
                self._erase_down(args[0] if args else 0)
            case "K":
                self._erase_line(args[0] if args else 0)
            case "n" if args == [6]:
                self.replies.append(f"\x1b[{self.y - self.top + 1};{self.x + 1}R")
        self._grow()

    def _grow(self) -> None:
        while len(self.lines) <= self.y:
            self.lines.append([])

    def _erase_down(self, mode: int) -> None:
        self._grow()
        if mode == 0:
            del self.lines[self.y][self.x :]
            del self.lines[self.y + 1 :]
        elif mode == 2:
            del self.lines[self.top :]
            self._grow()

    def _erase_line(self, mode: int) -> None:
        self._grow()
        line = self.lines[self.y]
        if mode == 0:
            del line[self.x :]
        elif mode == 1:
            line[: self.x + 1] = [" "] * min(self.x + 1, len(line))
        else:
            line.clear()

    def _char(self, char: str) -> None:
        if char == "\r":
            self.x = 0
        elif char == "\n":
            self._line_feed()
        elif char == "\b":
            self.x = max(0, min(self.x, self.cols - 1) - 1)
        elif char == "\t":
            self.x = min(self.cols - 1, (self.x // 8 + 1) * 8)
        elif char >= " ":
            self._put(char)

    def _line_feed(self) -> None:
        self.y += 1
        self._grow()
        if self.y - self.top >= self.rows:
            self.top = self.y - self.rows + 1

    def _put(self, char: str) -> None:
        if self.x >= self.cols:
            if self.autowrap:
                self.x = 0
                self._line_feed()
            else:
                self.x = self.cols - 1
        self._grow()
        line = self.lines[self.y]
        line.extend(" " * (self.x + 1 - len(line)))
        line[self.x] = char
        self.x += 1

    def text(self) -> list[str]:
        """Every line down to the last with something on it (the scrolled-off ones too),
        without trailing blanks."""
        lines = ["".join(line).rstrip() for line in self.lines]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    def last(self) -> str:
        """The last line with something on it."""
        return (self.text() or [""])[-1]


class Terminal:
    """`tandem chat` on a pseudo-terminal of `rows` x `cols`."""

    def __init__(self, rows: int = 30, cols: int = 100) -> None:
        self.screen = Screen(rows, cols)
        self.master, self._slave = pty.openpty()
        fcntl.ioctl(self._slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc: asyncio.subprocess.Process | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._changed = asyncio.Event()
        self.closed = False

    async def start(self, config: Path, model: FakeModelServer) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--config", str(config), "chat",
            stdin=self._slave, stdout=self._slave, stderr=self._slave,
            env={**env(model), "TERM": "xterm"}, cwd=config.parent, start_new_session=True)
        os.close(self._slave)
        asyncio.get_running_loop().add_reader(self.master, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the program closed the terminal
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
            self.closed = True
        text = self._decoder.decode(data)
        self.screen.feed(text)
        for reply in self.screen.replies:
            os.write(self.master, reply.encode())
        self.screen.replies.clear()
        self._changed.set()

    async def send(self, text: str) -> None:
        """Type (or paste) `text`, all of it, however long (the program reads as we write)."""
        data = text.encode()
        await asyncio.to_thread(self._write_all, data)

    def _write_all(self, data: bytes) -> None:
        while data:
            data = data[os.write(self.master, data) :]

    async def until(self, predicate: Callable[[], Any], what: str, timeout: float = 30) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            shown = "\n".join(self.screen.text()[-15:])
            raise AssertionError(f"never saw {what}; the screen ends:\n{shown}") from None

    async def shows(self, text: str, timeout: float = 30) -> None:
        await self.until(lambda: any(text in line for line in self.screen.text()),
                         repr(text), timeout)

    async def prompt(self, typed: str = "") -> None:
        """Wait until the last line is the prompt with `typed` in it."""
        await self.until(lambda: self.screen.last() == (PROMPT + typed).rstrip(),
                         f"the prompt {PROMPT + typed!r}")

    async def close(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.kill()
        code = await asyncio.wait_for(self.proc.wait(), 30)
        if not self.closed:
            asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)
        return code


async def chat(tmp_path: Path, model: FakeModelServer, **extra: Any) -> Terminal:
    term = Terminal()
    await term.start(write_config(tmp_path, model, **extra), model)
    await term.prompt()
    return term


def last_said(model: FakeModelServer, request: int = -1) -> str:
    return said(model.requests[request]["messages"])[-1]


def test_a_streamed_answer_prints_each_line_once() -> None:
    answer = Answer()
    assert answer.advance("Hello wor") == "" and answer.partial == "Hello wor"
    assert answer.advance("Hello world\nand mo") == "Hello world\n"
    assert answer.partial == "and mo"
    assert answer.finish("Hello world\nand more.") == "and more.\n"
    answer.advance("Let me look")  # a step that then calls a tool
    assert answer.cut() == "Let me look\n" and answer.advance("") == ""
    answer.advance("First try")
    assert answer.advance("Second") == "First try\n"  # the model restarted its answer
    assert answer.finish("Something else.") == "Second\nSomething else.\n"
    assert Answer().finish("Whole.") == "Whole.\n"  # not streamed: printed at the end


def test_the_history_lives_beside_a_sqlite_database() -> None:
    assert history_path("data/tandem.db") == Path("data/chat_history")
    assert history_path("sqlite:///var/lib/tandem/t.db") == Path("/var/lib/tandem/chat_history")
    assert history_path("postgresql://db/tandem") is None
    assert history_path(":memory:") is None


async def test_a_10010_character_line_typed_at_the_terminal_arrives_whole(
        model: FakeModelServer, tmp_path: Path) -> None:
    term = await chat(tmp_path, model)
    try:
        await term.send(LONG + "\r")
        await model.wait_requests(1, timeout=30)
        assert last_said(model).endswith(LONG)  # not 4,095 characters: the tty's line limit
        await term.shows("ok")
    finally:
        await term.close()


async def test_a_pasted_block_is_one_message_with_its_newline(model: FakeModelServer,
                                                              tmp_path: Path) -> None:
    term = await chat(tmp_path, model)
    try:
        await term.send("\x1b[200~line1\nline2\x1b[201~")
        await term.until(lambda: term.screen.text()[-2:] == [PROMPT + "line1", "  line2"],
                         "the paste in the input, not yet sent")
        await term.send("\r")
        await model.wait_requests(1, timeout=30)
        assert last_said(model).endswith("line1\nline2")
        await term.prompt()
        await term.send("then this\r")
        await model.wait_requests(2, timeout=30)
        messages = said(model.requests[1]["messages"])
        assert len(messages) == 2 and messages[0].endswith("line1\nline2")
        await term.prompt()
        await term.send("typed\x1b\rby hand\r")  # Esc, Enter: a new line typed by hand
        await model.wait_requests(3, timeout=30)
        assert last_said(model).endswith("typed\nby hand")
    finally:
        await term.close()


async def test_thinking_shows_until_the_answer_comes_then_goes(model: FakeModelServer,
                                                               tmp_path: Path) -> None:
    model.script(Reply(text="The answer is 42.", chunk_size=100, chunk_delay=0.5))
    term = await chat(tmp_path, model)
    try:
        await term.send("what is it?\r")
        await term.shows("thinking…")
        assert not any("The answer" in line for line in term.screen.text())
        await term.until(lambda: term.screen.text()[-2:] == ["The answer is 42.", "›"]
                         and not any("thinking…" in line for line in term.screen.text()),
                         "the answer in place of thinking…")
        await term.send("and?\r")
        await term.until(lambda: term.screen.text()[-2:] == ["ok", "›"], "the next answer")
        assert term.screen.text().count("The answer is 42.") == 1  # shown live, printed once
    finally:
        await term.close()


async def test_up_arrow_recalls_the_last_line_also_after_a_restart(model: FakeModelServer,
                                                                   tmp_path: Path) -> None:
    term = await chat(tmp_path, model)
    try:
        await term.send("first question\r")
        await model.wait_requests(1, timeout=30)
        await term.prompt()
        await term.send("\x1b[A")
        await term.prompt("first question")
        await term.send("\r")
        await model.wait_requests(2, timeout=30)
        assert last_said(model, 1).endswith("first question")
    finally:
        await term.close()
    history = tmp_path / "chat_history"  # beside the database, t.db
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    term = await chat(tmp_path, model)
    try:
        await term.send("\x1b[A")
        await term.prompt("first question")
    finally:
        await term.close()


async def test_an_unusable_history_file_means_history_for_this_session_only(
        model: FakeModelServer, tmp_path: Path) -> None:
    (tmp_path / "chat_history").mkdir()  # where the file would go
    term = await chat(tmp_path, model)
    try:
        await term.shows("the chat history cannot be kept in")
        await term.send("remember me\r")
        await model.wait_requests(1, timeout=30)
        await term.prompt()
        await term.send("\x1b[A")
        await term.prompt("remember me")
    finally:
        await term.close()


async def test_an_answer_streams_above_a_half_typed_line(model: FakeModelServer,
                                                         tmp_path: Path) -> None:
    lines = [f"line {i:02d} of the answer" for i in range(12)]
    model.script(Reply(text="\n".join(lines), chunk_size=5, chunk_delay=0.05))
    term = await chat(tmp_path, model)
    try:
        await term.send("tell me\r")
        await term.shows(lines[2])  # streaming, with more to come
        await term.send("half typed")
        await term.shows(lines[-1])
        await term.prompt("half typed")
        shown = term.screen.text()
        for line in lines:  # each line whole, on its own
            assert line in shown, (line, shown)
        assert shown.index(lines[-1]) < len(shown) - 1
        await term.send("\r")
        await model.wait_requests(2, timeout=30)
        assert last_said(model).endswith("] half typed")
    finally:
        await term.close()


async def test_ctrl_c_cancels_the_turn_and_ctrl_d_quits(model: FakeModelServer,
                                                        tmp_path: Path) -> None:
    model.script(Reply(text=" ".join(f"w{i}" for i in range(400)), chunk_delay=0.02))
    term = await chat(tmp_path, model)
    try:
        await term.send("a draft")
        await term.prompt("a draft")
        await term.send("\x03")  # nothing runs: Ctrl-C clears what is typed
        await term.prompt()
        await term.send("\x03")
        await term.shows("(nothing is running; Ctrl-D quits)")
        await term.send("talk a lot\r")
        await term.shows("w1")
        await term.send("\x03")
        await term.shows("Cancelled.")
        await term.prompt()
        await term.send("\x04")
        assert term.proc is not None
        assert await asyncio.wait_for(term.proc.wait(), 30) == 0
    finally:
        await term.close()


async def test_an_approval_is_answered_at_the_prompt(model: FakeModelServer,
                                                     tmp_path: Path) -> None:
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "echo hi > out.txt"})]),
                 Reply(text="Written."))
    term = await chat(tmp_path, model)
    try:
        await term.send("write it\r")
        await term.shows("Approve? [y]es / [n]o / [a]lways in this chat")
        await term.until(lambda: term.screen.last() == "y/n/s/a›", "the approval prompt")
        await term.send("y\r")
        await term.shows("Written.")
        assert (tmp_path / "ws" / "out.txt").read_text() == "hi\n"
    finally:
        await term.close()


async def test_a_10010_character_line_piped_in_arrives_whole(model: FakeModelServer,
                                                             tmp_path: Path) -> None:
    config = write_config(tmp_path, model)
    code, out, err = await tandem(config, model, LONG + "\nand the next line\n")
    assert code == 0, err
    assert said(model.requests[0]["messages"])[-1].endswith(LONG)
    assert last_said(model).endswith("] and the next line")
