"""The `shell` tool: one command in the workspace, with a timeout, no secrets in its
environment, and the whole process group killed on cancel.

Its output (stderr with stdout, as they come) is read as it streams: the head and the
tail are kept up to the output limit and what falls between is only counted, so a
command that prints gigabytes costs Tandem about the limit in memory. An output that
fits goes whole to the runner, which redacts it, then caps it; a longer one is cut here,
each kept end redacted so that no secret the cut splits shows a part (`Redactor.head`,
`Redactor.tail`), and the result fits the limit: the runner has nothing left to cut.

With `tools.shell.sandbox: bwrap` the command runs in the sandbox (`bot.tools.sandbox`),
without the network unless the call says `network: true`.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any, BinaryIO

from bot.core.errors import ToolError
from bot.core.redact import SECRET_NAME as _SECRET_NAME
from bot.core.redact import Redactor
from bot.core.tools_config import ShellConfig
from bot.tools import ERROR, Tool, ToolContext, cut_note, require_str, sandbox

SECRET_NAME = re.compile(rf"{_SECRET_NAME.pattern}|^TANDEM_", re.IGNORECASE)
SUPERVISOR = str(Path(__file__).with_name("supervise.py"))
READ_BYTES = 1 << 16
"""Read from the pipe at most this much at a time (its buffer holds at most twice that)."""
MARGIN = 1024
"""Characters kept past each end's share of the limit (with the redactor's reach): room
for a secret that the cut splits to be seen whole, and for a run of token characters
at the start of the tail."""


class Output:
    """A command's output as it streams in: the first `head` and the last `tail`
    characters kept, the ones between only counted."""

    def __init__(self, head: int, tail: int) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        self._room = (head, tail)
        self.head = self.tail = ""
        self.dropped = 0
        """Characters that fell between the head and the tail."""

    def add(self, data: bytes, *, final: bool = False) -> None:
        text = self._decode(data, final)
        head, tail = self._room
        if len(self.head) < head:
            taken = head - len(self.head)
            self.head, text = self.head + text[:taken], text[taken:]
        if len(text) >= tail:
            self.dropped += len(self.tail) + len(text) - tail
            self.tail = text[len(text) - tail:]
        elif (over := len(self.tail) + len(text) - tail) > 0:
            self.dropped += over
            self.tail = self.tail[over:] + text
        else:
            self.tail += text

    def text(self, redactor: Redactor, limit: int) -> str:
        """The whole output, or (once some fell between) its two ends redacted and cut
        where no secret is split, with the count of what is left out: `limit` at most."""
        if not self.dropped:
            return self.head + self.tail  # the runner redacts it, then caps it
        total = len(self.head) + self.dropped + len(self.tail)
        room = max(0, limit - len(cut_note(total)))  # no count is longer than the total's
        head, head_used = redactor.head(self.head, room * 2 // 3)
        tail, tail_used = redactor.tail(self.tail, room - room * 2 // 3)
        return f"{head}{cut_note(total - head_used - tail_used)}{tail}"


def clean_env(environ: dict[str, str], secrets: list[str]) -> dict[str, str]:
    """The environment a tool sees: no variable that names or holds a secret."""
    return {k: v for k, v in environ.items()
            if not SECRET_NAME.search(k) and not any(s and s in v for s in secrets)}


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def wrapper(ctx: ToolContext, args: dict[str, Any]) -> list[str]:
    """The supervisor's limits and the sandbox's command line (nothing: no sandbox)."""
    config = ctx.extras.get("shell")
    if not isinstance(config, ShellConfig) or not sandbox.enabled(config):
        return []
    persona, store = ctx.extras.get("persona_dir"), ctx.extras.get("store_dir")
    hide = sandbox.hidden(ctx.protected, config, ctx.workspace,
                          *(Path(p) for p in (persona, store) if p))
    return [sandbox.limits(config), *sandbox.argv(
        config, ctx.workspace, ctx.env, network=sandbox.wants_network(args), hide=hide)]


async def start(ctx: ToolContext, command: str, output: int,
                wrap: list[str] | None = None) -> asyncio.subprocess.Process:
    """`command` started under its supervisor (in the sandbox `wrap` gives), `output` its
    stdout and stderr (a pipe of Tandem's own: the process's exit never waits for that
    pipe to be read)."""
    env = sandbox.environment(ctx.workspace, ctx.env) if wrap else ctx.env  # bwrap's too
    spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
        sys.executable, "-S", "-I", SUPERVISOR, command, str(os.getpid()), *(wrap or []),
        cwd=ctx.workspace, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=output, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
    ))
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:  # cancelled while starting: the process may exist
        proc = await spawn
        kill_group(proc.pid)
        await proc.wait()
        raise


async def collect(pipe: BinaryIO, out: Output) -> None:
    """Read the pipe into `out` until no process writes to it any more; stopped (a
    cancel, a timeout), the pipe is closed and whatever still writes to it gets EPIPE."""
    reader = asyncio.StreamReader(limit=READ_BYTES)  # paused past twice that, unread
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        while data := await reader.read(READ_BYTES):
            out.add(data)
    finally:
        transport.close()
    out.add(b"", final=True)


async def shell(ctx: ToolContext, args: dict[str, Any]) -> str:
    command = require_str(args, "command")
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    limit = ctx.output_chars
    margin = ctx.redactor.reach + MARGIN
    out = Output(limit * 2 // 3 + margin, limit - limit * 2 // 3 + margin)
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb", buffering=0) as pipe:  # an open pipe: nothing blocks
        try:
            proc = await start(ctx, command, write_end, wrapper(ctx, args))
        finally:
            os.close(write_end)  # the command's copies are the only ones left
        track = ctx.extras.get("track_process")
        try:
            if callable(track):
                await track(proc.pid)
            await asyncio.wait_for(_finish(proc, pipe, out), ctx.shell_timeout_s)
        except TimeoutError:
            kill_group(proc.pid)
            await proc.wait()
            timeout = ctx.shell_timeout_s
            raise ToolError(f"the command timed out after {timeout:g} s and was killed"
                            ) from None
        except asyncio.CancelledError:
            kill_group(proc.pid)
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.wait())
            raise
        finally:
            kill_group(proc.pid)  # children left in the group die with the command
            untrack = ctx.extras.get("untrack_process")
            if callable(untrack):
                await untrack(proc.pid)
    if proc.returncode:
        status = f"exit status {proc.returncode}\n"
        raise ToolError(status + out.text(ctx.redactor, limit - len(ERROR + status)))
    return out.text(ctx.redactor, limit) or "(no output)"


async def _finish(proc: asyncio.subprocess.Process, pipe: BinaryIO, out: Output) -> None:
    await collect(pipe, out)
    await proc.wait()


TOOLS = [
    Tool("shell", "Run a shell command in the workspace and return its output.",
         {"type": "object", "properties": {"command": {"type": "string"}},
          "required": ["command"]}, shell, policy="ask", summary_key="command", lasting=True),
]
class SandboxedShell(Tool):
    """The shell with a `network` argument: an "always" binds the network too, so one given
    to a command without the network never lets it run with the network, and one given
    with it covers only that."""

    __slots__ = ()

    def rule_key(self, args: dict[str, Any]) -> str:
        key = Tool.rule_key(self, args)
        if not sandbox.wants_network(args):
            return key
        return json.dumps({"command": key, "network": True}, ensure_ascii=False)


SANDBOXED = SandboxedShell(
    "shell", "Run a shell command in the workspace and return its output. It runs in a "
    "sandbox: only the workspace is writable, /tmp is private, and there is no network "
    "unless `network` is true (which may need a person's approval).",
    {"type": "object", "properties": {
        "command": {"type": "string"},
        "network": {"type": "boolean", "description": "Run with the network (default false)."}},
     "required": ["command"]}, shell, policy="ask", summary_key="command", lasting=True)


def tools(config: ShellConfig | None = None) -> list[Tool]:
    """The shell as `tools.shell` configures it (with `network` when it is sandboxed)."""
    return [SANDBOXED] if sandbox.enabled(config) else TOOLS
