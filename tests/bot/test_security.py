"""Secrets stay out of logs and tool environments; tools stay in the workspace."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bot.core import redact
from bot.core.errors import PathRefused, ToolError
from bot.run.logs import Redactor
from bot.tools import ToolContext
from bot.tools.files import read_file, write_file
from bot.tools.shell import clean_env, shell


def test_logs_never_show_configured_secrets_or_token_shapes() -> None:
    redactor = Redactor(["sk-live-secret-value"])
    record = logging.LogRecord("t", logging.INFO, __file__, 1,
                               "calling with %s and %s", ("sk-live-secret-value",
                               "123456789:AAFakeTelegramTokenValue1234567890abcd"), None)
    redactor.filter(record)
    text = record.getMessage()
    assert "sk-live-secret-value" not in text and "AAFakeTelegram" not in text
    assert text.count("[secret]") == 2
    slack = logging.LogRecord("t", logging.INFO, __file__, 1, "xoxb-1111-2222-abcdefgh", (),
                              None)
    redactor.filter(slack)
    assert slack.getMessage() == "[secret]"


async def test_the_shell_sees_no_secrets(tmp_path: Path) -> None:
    environ = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "OPENAI_API_KEY": "sk-a",
               "TANDEM_TELEGRAM__TOKEN": "1:x", "SLACK_BOT_TOKEN": "xoxb-b",
               "DB_PASSWORD": "p", "INNOCENT": "holds sk-configured-secret inside"}
    env = clean_env(environ, ["sk-configured-secret"])
    assert set(env) == {"PATH", "HOME"}
    ctx = ToolContext(workspace=tmp_path, protected=frozenset(), env=env)
    out = await shell(ctx, {"command": "env"})
    assert "sk-" not in out and "xoxb" not in out and "TANDEM" not in out


async def test_a_long_shell_output_is_cut_by_the_shell_its_kept_ends_redacted(
        tmp_path: Path) -> None:
    ctx = ToolContext(workspace=tmp_path, protected=frozenset(), env={"PATH": "/usr/bin:/bin"},
                      output_chars=1000, redactor=redact.Redactor(["sk-configured-secret"]))
    out = await shell(ctx, {"command": "echo sk-configured-secret; seq 1 100000; "
                                       "echo sk-configured-secret"})
    assert out.startswith("[secret]\n1\n2\n") and out.endswith("\n100000\n[secret]\n")
    assert "characters cut" in out and len(out) <= 1000  # the runner has nothing to cut
    assert "sk-" not in out  # (tests/bot/test_shell_output.py: split by a cut, too)


async def test_shell_times_out_and_reports_failures(tmp_path: Path) -> None:
    ctx = ToolContext(workspace=tmp_path, protected=frozenset(), env={"PATH": "/usr/bin:/bin"},
                      shell_timeout_s=0.5)
    with pytest.raises(ToolError, match="timed out"):
        await shell(ctx, {"command": "sleep 5"})
    with pytest.raises(ToolError, match="exit status 3"):
        await shell(ctx, {"command": "echo oops; exit 3"})


async def test_file_tools_stay_inside_the_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    secret = tmp_path / "outside.txt"
    secret.write_text("secret")
    (workspace / "link").symlink_to(secret)
    protected = tmp_path / "ws" / "config.yaml"
    protected.write_text("llm: {}")
    ctx = ToolContext(workspace=workspace, protected=frozenset({protected.resolve()}), env={})
    for path in ("../outside.txt", str(secret), "link", "config.yaml", ".env"):
        with pytest.raises(PathRefused):
            await read_file(ctx, {"path": path})
    with pytest.raises(PathRefused):
        await write_file(ctx, {"path": "../escape.txt", "content": "x"})
    assert await write_file(ctx, {"path": "notes/a.txt", "content": "hi"})
    assert await read_file(ctx, {"path": "notes/a.txt"}) == "hi"
