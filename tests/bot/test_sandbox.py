"""The shell's bubblewrap sandbox, tried from inside with the real `bwrap`: no network
(unless the call asks), no other process, no write outside the workspace, no Tandem
environment or files, memory and process limits, nothing left after a timeout; a bwrap
that fails is explained. The `sandboxed` policy: tests/bot/test_sandbox_policy.py."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.core.errors import ToolError
from bot.core.tools_config import ShellConfig
from bot.tools import ToolContext, sandbox
from bot.tools.shell import shell
from tests.waiting import eventually, processes

SANDBOX = ShellConfig(sandbox="bwrap")
SECRET = "sk-sandbox-Zq8Wv0pLm4sTrK2xN7"
PATH = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def context(workspace: Path, config: ShellConfig | None = SANDBOX, **kwargs: Any) -> ToolContext:
    workspace.mkdir(exist_ok=True)
    extras = {"shell": config} if config else {}
    return ToolContext(workspace=workspace, protected=kwargs.pop("protected", frozenset()),
                       env=kwargs.pop("env", PATH), extras=extras, **kwargs)


async def run(ctx: ToolContext, command: str, **args: Any) -> tuple[bool, str]:
    """(whether it succeeded, its output or error)."""
    try:
        return True, await shell(ctx, {"command": command, **args})
    except ToolError as exc:
        return False, str(exc)


class Listener:
    """A loopback TCP server that counts the connections it accepts."""

    def __init__(self) -> None:
        self.accepted = 0
        self.port = 0

    async def _accept(self, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        writer.close()


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    found = Listener()
    server = await asyncio.start_server(found._accept, "127.0.0.1", 0)
    found.port = server.sockets[0].getsockname()[1]
    async with server:
        yield found


def connect(port: int) -> str:
    return (f"{sys.executable} -c \"import socket; "
            f"socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')\"")


async def test_the_sandbox_has_no_network_unless_the_call_asks(tmp_path: Path,
                                                                listener: Listener) -> None:
    ws = tmp_path / "ws"
    ok, out = await run(context(ws), connect(listener.port))
    assert not ok and "ConnectionRefusedError" in out, out
    assert listener.accepted == 0
    ok, out = await run(context(ws), connect(listener.port), network=True)
    assert ok and "connected" in out, out
    await eventually(lambda: listener.accepted == 1, what="the connection accepted")


async def test_the_sandbox_sees_no_other_process(tmp_path: Path) -> None:
    listing = ("for p in /proc/[0-9]*; do echo \"${p#/proc/} $(tr '\\0' ' ' < $p/cmdline)\"; "
               "done")
    ok, out = await run(context(tmp_path / "ws"), listing)
    assert ok, out
    seen = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert str(os.getpid()) not in seen
    # bwrap's own init, the shell and what the loop runs: nothing of Tandem's
    assert all(cmd.startswith(("bwrap ", "/bin/sh ", "tr ")) for cmd in seen.values()), seen
    assert not any("supervise.py" in cmd for cmd in seen.values()), seen
    ok, out = await run(context(tmp_path / "ws"), f"kill -0 {os.getpid()}")
    assert not ok
    ok, out = await run(context(tmp_path / "ws", config=None), listing)  # and without it
    assert ok and str(os.getpid()) in out


async def test_only_the_workspace_is_writable(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    outside = tmp_path / "outside.txt"
    with tempfile.TemporaryDirectory(dir="/var/tmp") as kept:
        for target in (Path("/etc/tandem-sandbox-test"), Path(kept) / "x"):
            ok, out = await run(context(ws), f"echo escaped > {target}")
            assert not ok and "Read-only file system" in out, out
            assert not target.exists()
        ok, out = await run(context(ws), f"echo escaped > {outside}")  # the private /tmp's
        assert not outside.exists()
        ok, out = await run(context(ws), "echo inside > made.txt && echo tmp > /tmp/t && "
                            "cat /tmp/t")
        assert ok and out == "tmp\n", out
    assert (ws / "made.txt").read_text() == "inside\n"
    assert not Path("/tmp/t").exists() or Path("/tmp/t").read_text() != "tmp\n"


async def test_tandems_environment_and_files_are_out_of_reach(tmp_path: Path) -> None:
    # a process of Tandem's user with a secret in its environment, as Tandem's own is
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; sys.stdin.read()", stdin=subprocess.PIPE,
        env={**PATH, "TANDEM_LLM__API_KEY": SECRET})
    ws = tmp_path / "ws"
    config = ws / "config.yaml"  # a protected file in the workspace
    ws.mkdir()
    config.write_text(f"llm: {{api_key: {SECRET}}}\n")
    try:
        with tempfile.TemporaryDirectory(dir="/var/tmp") as private:
            (Path(private) / "id_rsa").write_text(SECRET)
            hide = ShellConfig(sandbox="bwrap", hide=[private])
            ctx = context(ws, hide, env={**PATH, "HARMLESS": SECRET},
                          protected=frozenset({config.resolve()}))
            read = (f"cat /proc/*/environ /proc/{holder.pid}/environ {config} "
                    f"{private}/id_rsa 2>/dev/null | base64 -w0")
            ok, out = await run(ctx, read)
            assert ok, out
            assert SECRET.encode() not in base64.b64decode(out)
            assert (Path(private) / "id_rsa").read_text() == SECRET  # hidden, not touched
        ok, out = await run(context(ws, None), f"base64 -w0 /proc/{holder.pid}/environ")
        assert ok and SECRET.encode() in base64.b64decode(out)  # without the sandbox: there
    finally:
        await holder.communicate(b"")


async def test_memory_and_process_limits_apply(tmp_path: Path) -> None:
    small = ShellConfig(sandbox="bwrap", memory_mb=200, processes=64)
    ok, out = await run(context(tmp_path / "ws", small),
                        f"{sys.executable} -c 'bytearray(400 * 1024 * 1024)'")
    assert not ok and "MemoryError" in out, out
    ok, out = await run(context(tmp_path / "ws", small),
                        f"{sys.executable} -c 'bytearray(50 * 1024 * 1024)' && "
                        "grep 'Max processes' /proc/self/limits")
    assert ok and out.split()[2:4] == ["64", "64"], out


async def test_a_timeout_kills_everything_in_the_sandbox(tmp_path: Path) -> None:
    marker = f"sleep 31.{os.getpid()}"
    ctx = context(tmp_path / "ws", shell_timeout_s=1.0)
    ok, out = await run(ctx, f"{marker} & {marker}")
    assert not ok and "timed out" in out
    await eventually(lambda: not processes(marker), what="the sandbox's processes gone")


async def test_the_output_limit_holds_in_the_sandbox(tmp_path: Path) -> None:
    ok, out = await run(context(tmp_path / "ws", output_chars=1000), "seq 1 200000")
    assert ok and out.startswith("1\n2\n") and out.endswith("\n200000\n"), out[-50:]
    assert "characters cut" in out and len(out) <= 1000


def test_a_failing_bwrap_is_explained() -> None:
    failing = ShellConfig(sandbox="bwrap", bwrap="false")
    why = sandbox.check(failing)
    assert why is not None and "user namespaces" in why


SYSTEM_PYTHON = Path("/usr/bin/python3")
FORK_60 = "for i in $(seq 60); do sleep 5 & done; echo forked all"


def as_nobody(ws: Path, processes: int | None) -> subprocess.CompletedProcess[str]:
    """60 processes forked in the sandbox by the unprivileged user `nobody`, through the
    supervisor as the shell tool runs it (the system's Python: pytest's is root's alone)."""
    config = ShellConfig(sandbox="bwrap", processes=processes)
    supervisor = Path(sandbox.__file__).with_name("supervise.py")
    return subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
         str(SYSTEM_PYTHON), "-S", "-I", str(supervisor), FORK_60, str(os.getpid()),
         sandbox.limits(config), *sandbox.argv(config, ws, PATH, network=False)],
        capture_output=True, text=True, timeout=60, cwd=ws, env=PATH, check=False,
        start_new_session=True)


@pytest.mark.skipif(os.geteuid() != 0 or not SYSTEM_PYTHON.exists(),
                    reason="needs root to switch to an unprivileged user, and /usr/bin/python3")
def test_the_process_limit_holds_for_an_unprivileged_user() -> None:
    """The kernel never limits root's processes; as the unprivileged user the README says
    to run Tandem as, the sandbox's limit stops a fork bomb."""
    with tempfile.TemporaryDirectory() as tmp:  # pytest's folders are root's alone
        Path(tmp).chmod(0o755)
        ws = Path(tmp) / "ws"
        ws.mkdir()
        os.chown(ws, 65534, 65534)
        limited, unlimited = as_nobody(ws, 30), as_nobody(ws, None)
    assert limited.returncode != 0 and "forked all" not in limited.stdout
    assert "fork" in limited.stderr.lower(), limited.stderr
    assert "forked all" in unlimited.stdout, unlimited.stderr
