"""`tandem` as a user runs it: a real process, the fake model, a real database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import PERSONA, said
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.waiting import eventually

REPO = Path(__file__).resolve().parent.parent


def write_config(tmp: Path, model: FakeModelServer, **extra: Any) -> Path:
    (tmp / "persona").mkdir(exist_ok=True)
    for f in PERSONA.glob("*.md"):
        (tmp / "persona" / f.name).write_text(f.read_text())
    data: dict[str, Any] = {
        "llm": {"model": "openai/fake", "api_base": "${FAKE_API_BASE}", "api_key": "sk-test",
                "context_window": 32000, "timeout_s": 10},
        "store": {"path": str(tmp / "t.db")},
        "persona": {"dir": str(tmp / "persona")},
        "workspace": {"dir": str(tmp / "ws")},
        **extra,
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def env(model: FakeModelServer | None = None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    out["PYTHONPATH"] = str(REPO)
    if model is not None:
        out["FAKE_API_BASE"] = model.api_base
    return out


async def tandem(config: Path, model: FakeModelServer, stdin: str,
                 *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "--config", str(config), *args, "chat",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env(model), cwd=config.parent)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def spawn_chat(config: Path, model: FakeModelServer) -> asyncio.subprocess.Process:
    """`tandem chat` with its stdin open (the test writes lines and kills it)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "--config", str(config), "chat", stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(model), cwd=config.parent)


def test_help_is_fast_and_lists_the_commands() -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bot", "--help"], capture_output=True,
                          text=True, env=env(), check=True)
    assert time.monotonic() - started < 2
    for command in ("run", "chat", "doctor"):
        assert command in done.stdout


def test_options_go_before_or_after_the_command_and_version_prints(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("llm:\n  timeout_s: soon\n")
    for argv in (["--config", str(bad), "doctor"], ["doctor", "--config", str(bad)],
                 ["chat", "-v", "--config", str(bad)]):
        done = subprocess.run([sys.executable, "-m", "bot", *argv], capture_output=True,
                              text=True, env=env())
        assert done.returncode == 2 and "llm.timeout_s" in done.stderr, (argv, done.stderr)
    done = subprocess.run([sys.executable, "-m", "bot", "--version"], capture_output=True,
                          text=True, env=env(), check=True)
    assert done.stdout.strip() == "tandem 0.1.0"


def test_a_bad_config_is_one_line_naming_the_key_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("llm:\n  timeout_s: soon\n")
    done = subprocess.run([sys.executable, "-m", "bot", "--config", str(bad), "chat"],
                          capture_output=True, text=True, env=env())
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "llm.timeout_s" in done.stderr
    assert "Traceback" not in done.stderr
    bad.write_text("llm:\n  api_key: ${MISSING_SECRET}\n")
    done = subprocess.run([sys.executable, "-m", "bot", "--config", str(bad), "chat"],
                          capture_output=True, text=True, env=env())
    assert done.returncode == 2 and "MISSING_SECRET" in done.stderr
    bad.write_text("llm: [unclosed\n")
    done = subprocess.run([sys.executable, "-m", "bot", "--config", str(bad), "doctor"],
                          capture_output=True, text=True, env=env())
    assert done.returncode == 2 and "not valid YAML" in done.stderr


async def test_scripted_chat_runs_shell_after_y_and_answers_after_n(
        model: FakeModelServer, tmp_path: Path) -> None:
    config = write_config(tmp_path, model)
    model.script(
        Reply(tool_calls=[ToolCallSpec("shell", {"command": "echo hello > out.txt"})]),
        Reply(text="The file is written."),
        Reply(tool_calls=[ToolCallSpec("shell", {"command": "rm out.txt"})]),
        Reply(text="Fine, I left it."),
    )
    code, out, err = await tandem(config, model, "write it\ny\nremove it\nn\n/status\n")
    assert code == 0, err
    assert "echo hello > out.txt" in out and "The file is written." in out
    assert "Fine, I left it." in out
    assert "Model: openai/fake" in out and "Context:" in out
    assert (tmp_path / "ws" / "out.txt").read_text() == "hello\n"
    assert model.last_messages()[-2]["content"].startswith("denied")  # before the note


def _alive(pattern: str) -> bool:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return bool(found.stdout.strip())


async def _wait_for(path: Path, timeout: float = 20) -> None:
    await eventually(path.exists, timeout, what=f"{path} appearing")


async def _read_until(stream: asyncio.StreamReader, needle: bytes,
                      timeout: float = 30) -> bytes:
    """What `stream` gave, read until `needle` shows in it."""
    got = b""
    async with asyncio.timeout(timeout):
        while needle not in got:
            chunk = await stream.read(4096)
            assert chunk, f"the output ended before {needle!r}: {got[-500:]!r}"
            got += chunk
    return got


async def test_kill_9_while_a_tool_runs_then_restart_repairs_the_history(
        model: FakeModelServer, tmp_path: Path) -> None:
    config = write_config(tmp_path, model, approvals={"tools": {"shell": "allow"}})
    model.script(Reply(tool_calls=[ToolCallSpec("shell",
                                                {"command": "touch started; sleep 31.7"})]),
                 Reply(text="Back after the restart."))
    proc = await spawn_chat(config, model)
    assert proc.stdin is not None
    proc.stdin.write(b"start the long job\n")
    await proc.stdin.drain()
    await _wait_for(tmp_path / "ws" / "started")
    proc.kill()
    await proc.communicate()
    code, out, err = await tandem(config, model, "are you there?\n")
    assert code == 0, err
    assert "Back after the restart." in out
    assert "was interrupted" in out
    tool = [m for m in model.last_messages() if m["role"] == "tool"]
    assert tool and tool[0]["content"].startswith("interrupted")
    assert not _alive("sleep 31.7"), "the killed Tandem left its tool process running"


async def test_kill_9_while_an_approval_waits_then_restart_stays_valid(
        model: FakeModelServer, tmp_path: Path) -> None:
    config = write_config(tmp_path, model)
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": "touch never"})]),
                 Reply(text="Moving on."))
    proc = await spawn_chat(config, model)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"touch it\n")
    await proc.stdin.drain()
    line = b""
    while b"Approve?" not in line:
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line, "no approval prompt"
    proc.kill()
    await proc.communicate()
    code, out, err = await tandem(config, model, "never mind that\n")
    assert code == 0, err
    assert "Moving on." in out
    assert not (tmp_path / "ws" / "never").exists()
    tool = [m for m in model.last_messages() if m["role"] == "tool"]
    assert tool and "not run" in tool[0]["content"]


async def test_kill_9_during_a_scheduled_turn_does_not_run_that_slot_again(
        model: FakeModelServer, tmp_path: Path) -> None:
    config = write_config(tmp_path, model)
    model.script(
        Reply(tool_calls=[ToolCallSpec("schedule_task", {"when": "in 2 seconds",
                                                         "prompt": "Say the scheduled words"})]),
        Reply(text="Scheduled."),
        Reply(text=" ".join(f"w{i}" for i in range(300)), chunk_delay=0.05))
    model.responder = lambda _m: Reply(text="Hello again.")
    proc = await spawn_chat(config, model)
    assert proc.stdin is not None
    proc.stdin.write(b"schedule it\n")
    await proc.stdin.drain()
    await model.wait_requests(3, timeout=30)
    await model.wait_streamed(model.chunks_sent + 3)  # the scheduled turn is streaming
    proc.kill()
    await proc.communicate()
    code, out, err = await tandem(config, model, "hello\n")
    assert code == 0, err
    assert "Hello again." in out
    runs = [r for r in model.requests
            if "[Scheduled task" in said(r["messages"])[-1]]
    assert len(runs) == 1


async def test_ctrl_c_cancels_the_turn_not_the_program(model: FakeModelServer,
                                                       tmp_path: Path) -> None:
    import signal

    config = write_config(tmp_path, model)
    model.script(Reply(text=" ".join(f"w{i}" for i in range(400)), chunk_delay=0.02),
                 Reply(text="Still here."))
    proc = await spawn_chat(config, model)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"talk a lot\n")
    await proc.stdin.drain()
    await model.wait_requests(1, timeout=30)
    await model.wait_streamed(model.chunks_sent + 3)  # the answer is streaming
    proc.send_signal(signal.SIGINT)
    shown = await _read_until(proc.stdout, b"Cancelled.")  # the turn is over
    proc.stdin.write(b"are you still there?\n")
    await proc.stdin.drain()
    proc.stdin.close()
    rest, err = await asyncio.wait_for(proc.communicate(), 60)
    out = shown + rest
    assert proc.returncode == 0, err
    assert "Cancelled." in out.decode() and "Still here." in out.decode()


async def test_doctor_says_what_is_wrong_in_plain_words(model: FakeModelServer,
                                                        tmp_path: Path) -> None:
    config = write_config(tmp_path, model)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "--config", str(config), "doctor",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(model), cwd=tmp_path)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    assert "All checks passed." in out.decode()
    (tmp_path / "persona" / "RULES.md").unlink()
    broken = env(model)
    broken["FAKE_API_BASE"] = "http://127.0.0.1:9/v1"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "--config", str(config), "doctor",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=broken, cwd=tmp_path)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    assert proc.returncode == 1
    assert "[FAIL] persona: missing" in text and "RULES.md" in text
    assert "[FAIL] model:" in text and "llm.api_base" in text
    # why and where, in one line
    assert "connection refused (http://127.0.0.1:9/v1)" in text


async def test_doctor_connects_to_each_mcp_server(model: FakeModelServer, tmp_path: Path) -> None:
    servers = {"fake": {"command": sys.executable, "args": ["-m", "tests.fakes.mcp_servers",
                                                            "stdio"], "cwd": str(REPO)},
               "gone": {"command": str(tmp_path / "no-such-server"), "connect_timeout_s": 2}}
    config = write_config(tmp_path, model, mcp={"servers": servers})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "--config", str(config), "doctor",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(model), cwd=tmp_path)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    assert proc.returncode == 1, text
    assert "[ok  ] mcp fake: connected, 11 tools offered" in text
    assert "[FAIL] mcp gone: could not connect:" in text


async def test_doctor_says_when_a_slack_file_scope_is_missing(model: FakeModelServer,
                                                              tmp_path: Path) -> None:
    from tests.fakes.slack_server import DEFAULT_SCOPES, FakeSlackServer

    async with FakeSlackServer(scopes=DEFAULT_SCOPES - {"files:write"}) as slack:
        slack_config = {"enabled": True, "mode": "socket", "bot_token": "xoxb-test",
                        "app_token": "xapp-test", "base_url": slack.api_url,
                        "allowed_users": ["U1"]}

        async def doctor() -> str:
            config = write_config(tmp_path, model, slack=slack_config)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "--config", str(config), "doctor",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(model), cwd=tmp_path)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            return out.decode()

        text = await doctor()
        assert "[warn] slack files: the bot token lacks files:write" in text, text
        slack.scopes.add("files:write")
        assert "[ok  ] slack files: files:read and files:write granted" in await doctor()


def test_the_license_file_is_the_one_pyproject_names() -> None:
    root = Path(__file__).resolve().parent.parent
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    assert meta["project"]["license"] == {"file": "LICENSE"}
    assert (root / "LICENSE").read_text().startswith("MIT License")


async def run_telegram(tmp_path: Path, model: FakeModelServer, base_url: str,
                       token: str) -> tuple[int, str]:
    """`tandem run` with Telegram at `base_url`: its exit status and what it wrote to
    stderr."""
    config = write_config(tmp_path, model, telegram={
        "enabled": True, "token": token, "base_url": base_url, "allowed_users": [42]})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", "--config", str(config),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(model), cwd=tmp_path)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_a_token_telegram_rejects_is_one_line_and_exit_2(model: FakeModelServer,
                                                               tmp_path: Path) -> None:
    from tests.fakes.telegram_server import FakeTelegram

    async with FakeTelegram(token="123:RIGHT") as fake:
        code, text = await run_telegram(tmp_path, model, f"{fake.url}/bot", "123:WRONG")
    assert code == 2, text
    assert "telegram.token" in text and "rejected" in text and "Traceback" not in text


async def test_telegram_unreachable_at_start_is_one_line(model: FakeModelServer,
                                                        tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, text = await run_telegram(tmp_path, model, f"http://127.0.0.1:{port}/bot", "123:ABC")
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 1, lines
    assert "Traceback" not in text and len(lines) <= 2, lines
    assert any(f"cannot reach http://127.0.0.1:{port}" in line for line in lines), lines


async def test_run_with_no_platform_says_so(model: FakeModelServer, tmp_path: Path) -> None:
    model.script(Reply(text="hello back"))
    config = write_config(tmp_path, model)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", "--config", str(config),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env(model), cwd=tmp_path)
    out, err = await asyncio.wait_for(proc.communicate(b"hello\n"), 60)
    assert proc.returncode == 0
    assert "no platform is enabled" in err.decode() and "hello back" in out.decode()


@pytest.mark.parametrize("where", ["a-folder", "a-file/tandem.db", "not-a-db.txt"])
def test_a_store_path_that_cannot_be_the_database_is_one_line_and_exit_2(
        tmp_path: Path, where: str) -> None:
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "not-a-db.txt").write_text("notes, not a database\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"store:\n  path: {tmp_path / where}\n")
    for command in ("chat", "migrate"):
        done = subprocess.run([sys.executable, "-m", "bot", command, "--config", str(config)],
                              capture_output=True, text=True, env=env(), timeout=30,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 2, (command, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "store.path" in lines[0] and where in lines[0], lines
    assert (tmp_path / "not-a-db.txt").read_text() == "notes, not a database\n"


async def test_the_terminal_revokes_a_rule_by_number_and_status_counts_after_new(
        model: FakeModelServer, tmp_path: Path) -> None:
    config = write_config(tmp_path, model)
    model.script(
        Reply(tool_calls=[ToolCallSpec("shell", {"command": "echo one"})], usage=(1000, 50)),
        Reply(text="Ran it.", usage=(1100, 10)),
    )
    code, out, err = await tandem(config, model,
                                  "run it\na\n/approvals\n/revoke 1\n/approvals\n/new\n/status\n")
    assert code == 0, err
    assert "1. shell: echo one" in out and "Revoke 1: /revoke " in out  # typed, not a button
    assert "Rule revoked: that call will ask again." in out
    assert "No standing rules in this chat." in out
    assert "This conversation: 0 prompt + 0 completion tokens, $0.0000" in out
