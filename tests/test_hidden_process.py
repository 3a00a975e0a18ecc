"""An approved shell command cannot read Tandem's own environment through /proc: a real
`tandem chat`, the fake model, the shell tool without a sandbox.

Tandem runs here as an unprivileged user, as it should (README: Security promises). A
test run as root starts it as `nobody` with one capability kept, CAP_DAC_READ_SEARCH (to
reach the interpreter under /root; its commands inherit it): file modes then let the
command open /proc/<pid>/environ, so only the process being non-dumpable stands in the
way, which is what is tested."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.test_cli import env, write_config
from tests.waiting import eventually

SECRET = "kept-in-the-environment-only-4b7e"
"""Under a secret name (so the shell's own environment never holds it) and of no known
shape: only Tandem's /proc/<pid>/environ has it, and base64 hides it from redaction."""
CONTROL = "a-process-that-hides-nothing-91c3"
OUT = re.compile(r"B64:([A-Za-z0-9+/=]*):END")
NOBODY = 65534


def unprivileged() -> list[str]:
    """What runs a command as an unprivileged user (nothing: the tests' user is one)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv to start Tandem as another user")
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


def give_away(root: Path) -> None:
    if os.geteuid() == 0:
        for path in [root, *root.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)


async def test_an_approved_command_cannot_read_tandems_environment(
        model: FakeModelServer, tmp_path: Path) -> None:
    home = tmp_path / "tandem"
    home.mkdir()
    config = write_config(home, model)
    (home / "ws").mkdir()
    give_away(home)
    as_user = unprivileged()
    holder = await asyncio.create_subprocess_exec(  # another process of the same user
        *as_user, "sleep", "60", env={"ACME_API_TOKEN": CONTROL})
    proc = await asyncio.create_subprocess_exec(
        *as_user, sys.executable, "-m", "bot", "--config", str(config), "chat",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**env(model), "ACME_API_TOKEN": SECRET, "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=home)
    every = "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -a '^ACME_API_TOKEN='"
    command = (f"echo B64:$({every} | base64 -w0):END; "
               f"echo B64:$(base64 -w0 /proc/{proc.pid}/environ):END; "
               f"echo B64:$(cat /proc/{proc.pid}/environ | base64 -w0):END")
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": command})]),
                 Reply(text="Done."))
    try:
        out, err = await asyncio.wait_for(proc.communicate(b"dump it\ny\n"), 60)
    finally:
        holder.kill()
        await holder.wait()
    assert proc.returncode == 0, err.decode()
    [result] = [m["content"] for m in model.last_messages() if m.get("role") == "tool"]
    decoded = [base64.b64decode(found).decode("utf-8", "replace")
               for found in OUT.findall(result)]
    assert len(decoded) == 3, result
    assert f"ACME_API_TOKEN={CONTROL}" in decoded[0]  # others' environments are readable
    assert not any(SECRET in text for text in decoded), decoded
    assert result.count("Permission denied") == 2, result
    assert SECRET not in out.decode()


async def test_the_workers_supervisor_is_hidden_too(tmp_path: Path) -> None:
    """`tandem run --workers 2` holds the same environment as its workers. Its workers
    cannot reach the database here and exit; it stays, starting them again."""
    home = tmp_path / "tandem"
    home.mkdir()
    config = home / "config.yaml"
    config.write_text("store: {url: 'postgresql://127.0.0.1:1/none'}\n")
    give_away(home)
    as_user = unprivileged()
    proc = await asyncio.create_subprocess_exec(
        *as_user, sys.executable, "-m", "bot", "--config", str(config), "run", "--workers",
        "2", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**env(), "ACME_API_TOKEN": SECRET, "PYTHONDONTWRITEBYTECODE": "1"}, cwd=home)

    def supervising() -> bool:  # its workers started: it is past its start
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        return bool(children.read_text().split())

    try:
        await eventually(supervising, 20, what="the supervisor's workers")
        reader = await asyncio.create_subprocess_exec(
            *as_user, "cat", f"/proc/{proc.pid}/environ", stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        out, err = await reader.communicate()
        assert SECRET.encode() not in out, "the supervisor's environment was read"
        assert reader.returncode != 0 and b"Permission denied" in err, err
        assert proc.returncode is None  # still supervising
    finally:
        proc.terminate()
        await proc.wait()
