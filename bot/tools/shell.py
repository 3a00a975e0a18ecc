"""The `shell` tool: one command in the workspace, with a timeout (its output is
redacted and capped by the runner), no secrets in its environment, and the whole
process group killed on cancel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from bot.core.errors import ToolError
from bot.core.redact import SECRET_NAME as _SECRET_NAME
from bot.tools import Tool, ToolContext, require_str

SECRET_NAME = re.compile(rf"{_SECRET_NAME.pattern}|^TANDEM_", re.IGNORECASE)
SUPERVISOR = str(Path(__file__).with_name("supervise.py"))


def clean_env(environ: dict[str, str], secrets: list[str]) -> dict[str, str]:
    """The environment a tool sees: no variable that names or holds a secret."""
    return {k: v for k, v in environ.items()
            if not SECRET_NAME.search(k) and not any(s and s in v for s in secrets)}


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def shell(ctx: ToolContext, args: dict[str, Any]) -> str:
    command = require_str(args, "command")
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
        sys.executable, "-S", "-I", SUPERVISOR, command, str(os.getpid()),
        cwd=ctx.workspace, env=ctx.env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    ))
    try:
        proc = await asyncio.shield(spawn)
    except asyncio.CancelledError:  # cancelled while starting: the process may exist
        proc = await spawn
        kill_group(proc.pid)
        await proc.wait()
        raise
    track = ctx.extras.get("track_process")
    if callable(track):
        await track(proc.pid)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), ctx.shell_timeout_s)
    except TimeoutError:
        kill_group(proc.pid)
        await proc.wait()
        limit = ctx.shell_timeout_s
        raise ToolError(f"the command timed out after {limit:g} s and was killed") from None
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
    text = out.decode("utf-8", errors="replace")  # redacted, then capped, by the runner
    if proc.returncode:
        raise ToolError(f"exit status {proc.returncode}\n{text}")
    return text or "(no output)"


TOOLS = [
    Tool("shell", "Run a shell command in the workspace and return its output.",
         {"type": "object", "properties": {"command": {"type": "string"}},
          "required": ["command"]}, shell, policy="ask", summary_key="command", lasting=True),
]
