"""The `sandboxed` policy through whole turns, with the real `bwrap`: inside the sandbox a
command runs unasked, with `network: true` or without a sandbox it asks, and a denied call
never runs. Where bwrap cannot run, Tandem does not start with `sandbox: bwrap`, and
`tandem doctor` says why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.core.config import Config
from bot.core.errors import ConfigError
from bot.core.events import ApprovalRequested, Decision, Verdict
from bot.run.app import build
from tests.bot.test_sandbox import Listener, connect, listener
from tests.conftest import Core
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.test_cli import env, write_config
from tests.waiting import eventually

__all__ = ["listener"]  # the fixture


def test_an_unavailable_bwrap_refuses_to_start(tmp_path: Path, model: FakeModelServer,
                                               config_factory: Any) -> None:
    missing = str(tmp_path / "no-bwrap")
    config: Config = config_factory(tools__shell__sandbox="bwrap", tools__shell__bwrap=missing)
    with pytest.raises(ConfigError, match="tools.shell.sandbox: .*was not found"):
        build(config)
    path = write_config(tmp_path, model, tools={"shell": {"sandbox": "bwrap",
                                                           "bwrap": missing}})
    done = subprocess.run([sys.executable, "-m", "bot", "--config", str(path), "chat"],
                          capture_output=True, text=True, env=env(model), cwd=tmp_path,
                          input="hello\n", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "tools.shell.sandbox" in done.stderr and "Traceback" not in done.stderr
    assert not model.requests  # nothing was answered
    done = subprocess.run([sys.executable, "-m", "bot", "--config", str(path), "doctor",
                           "--quick"], capture_output=True, text=True, env=env(model),
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 1 and "[FAIL] sandbox: " in done.stdout, done.stdout
    path = write_config(tmp_path, model, tools={"shell": {"sandbox": "bwrap"}})
    done = subprocess.run([sys.executable, "-m", "bot", "--config", str(path), "doctor",
                           "--quick"], capture_output=True, text=True, env=env(model),
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and "[ok  ] sandbox: " in done.stdout, done.stdout


def call(command: str, **args: Any) -> Reply:
    return Reply(tool_calls=[ToolCallSpec("shell", {"command": command, **args})])


def shell_parameters(core: Core) -> dict[str, Any]:
    tool = core.hub.d.tools.get("shell")
    assert tool is not None
    return dict(tool.parameters["properties"])


async def decide(core: Core, verdict: Verdict, n: int = 1) -> None:
    await core.sink.wait(lambda: len(core.sink.of(ApprovalRequested)) >= n)
    approval = core.sink.of(ApprovalRequested)[n - 1]
    await core.hub.submit(Decision(core.key, core.user, approval.approval_id, verdict))


async def test_sandboxed_runs_unasked_inside_and_asks_for_the_network(
        model: FakeModelServer, config_factory: Any, tmp_path: Path,
        listener: Listener) -> None:
    model.script(call("echo inside > a.txt"), Reply(text="done"),
                 call(connect(listener.port), network=True), Reply(text="denied"),
                 call(connect(listener.port), network=True), Reply(text="connected"))
    config = config_factory(tools__shell__sandbox="bwrap",
                            approvals__tools={"shell": "sandboxed"})
    async with Core(config) as core:
        assert list(shell_parameters(core)) == ["command", "network"]
        await core.say("write a")
        await core.sink.ended(1)
        assert not core.sink.of(ApprovalRequested)  # ran in the sandbox, unasked
        assert (tmp_path / "workspace" / "a.txt").read_text() == "inside\n"
        await core.say("connect")
        await decide(core, Verdict.DENY)
        await core.sink.ended(2)
        assert listener.accepted == 0  # the denied call never ran
        await core.say("connect again")
        await decide(core, Verdict.APPROVE, 2)
        await core.sink.ended(3)
    await eventually(lambda: listener.accepted == 1, what="the approved call connected")
    tools = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert tools[-1].strip() == "connected"


async def test_sandboxed_without_a_sandbox_asks(model: FakeModelServer, config_factory: Any,
                                                tmp_path: Path) -> None:
    model.script(call("echo outside > b.txt"), Reply(text="not run"))
    config = config_factory(approvals__tools={"shell": "sandboxed"})
    async with Core(config) as core:
        assert list(shell_parameters(core)) == ["command"]
        await core.say("write b")
        await decide(core, Verdict.DENY)
        await core.sink.ended(1)
    assert not (tmp_path / "workspace" / "b.txt").exists()


async def test_always_binds_the_network(model: FakeModelServer, config_factory: Any) -> None:
    """An "always" given to a command in the sandbox without the network never lets the
    same command run with it; one given with the network covers that call only."""
    model.script(call("echo one"), Reply(text="1"), call("echo one", network=True),
                 Reply(text="2"), call("echo one", network=True), Reply(text="3"),
                 call("echo one"), Reply(text="4"))
    async with Core(config_factory(tools__shell__sandbox="bwrap")) as core:
        await core.say("first")
        await decide(core, Verdict.ALWAYS)
        await core.sink.ended(1)
        await core.say("with the network")
        await decide(core, Verdict.ALWAYS, 2)  # asked again: the rule was for no network
        await core.sink.ended(2)
        await core.say("with the network again")
        await core.sink.ended(3)
        await core.say("without")
        await core.sink.ended(4)
        assert len(core.sink.of(ApprovalRequested)) == 2
