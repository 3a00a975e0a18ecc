"""MCP tools through the real platform adapters, and an MCP call when Tandem is killed.

The fake MCP server (`tests.fakes.mcp_servers`, built with the SDK) sits behind Tandem's
approval gate. Every scenario runs through the real Telegram adapter (python-telegram-bot
against `FaultyTelegram`) and the real Slack adapter (slack-bolt in Socket Mode against
`FaultySlack`), with one server over streamable HTTP shared by the module (a stdio server
takes seconds to start; an HTTP connection milliseconds). Checked: the card names the
server's tool and shows its arguments; Approve runs the call once; Deny never reaches the
server; Always covers that exact call only; Cancel (the placeholder's button or `/stop`)
stops a hanging call within a second, the server is told, and the next call works.
Last, `tandem run` with a stdio server is killed with SIGKILL while an MCP call sleeps: the
server must not outlive it, and the restarted Tandem reports the call as interrupted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from bot.core.buttons import ApprovalButton, CancelButton, unpack
from bot.core.events import Verdict
from bot.serve.hub import Hub
from tests.fakes.mcp_servers import LOG_ENV, REPO_ROOT, stdio_command
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.fakes.slack_server import FakeSlackMessage, block_text
from tests.fakes.telegram_server import FakeMessage, FakeTelegram
from tests.suites.harness import ANN, FaultySlack, FaultyTelegram, SlackRig, TgRig, tg_rig
from tests.suites.test_crash import without_note
from tests.suites.test_crash_telegram import start as start_tandem
from tests.suites.test_crash_telegram import write_config
from tests.waiting import eventually, within

PLATFORMS = ("telegram", "slack")
CANCELLED = "⏹ Cancelled."
SLACK_VERDICTS = {Verdict.APPROVE: "tandem_approve", Verdict.DENY: "tandem_deny",
                  Verdict.ALWAYS: "tandem_always"}


class ServerLog:
    """The fake server's log (`called <tool>`, `cancelled <tool>`), from the moment this
    object was made."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = len(self._read())

    def _read(self) -> str:
        return self.path.read_text() if self.path.exists() else ""

    def text(self) -> str:
        return self._read()[self.start:]

    def count(self, line: str) -> int:
        return self.text().splitlines().count(line)

    async def shows(self, line: str, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while line not in self.text():
                await asyncio.sleep(0.01)


@dataclass(frozen=True, slots=True)
class HttpServer:
    url: str
    log: Path


@pytest.fixture(scope="module")
def mcp_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """The fake MCP server over streamable HTTP, for every platform test here."""
    log = tmp_path_factory.mktemp("mcp") / "mcp.log"
    env = {**os.environ, LOG_ENV: str(log), "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen([sys.executable, "-m", "tests.fakes.mcp_servers", "http",
                           "--port", "0"], cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().decode().strip()
            assert url.startswith("http://"), f"the fake MCP server exited with {proc.poll()}"
            yield HttpServer(url, log)
        finally:
            proc.kill()


@pytest.fixture
def server_log(mcp_http: HttpServer) -> ServerLog:
    return ServerLog(mcp_http.log)


def http_server(server: HttpServer, **extra: Any) -> dict[str, Any]:
    """`mcp.servers.fake` for the shared HTTP server."""
    return {"url": server.url, "timeout_s": 10, "trusted": True, **extra}


def stdio_server(log: Path, **extra: Any) -> dict[str, Any]:
    """`mcp.servers.fake` over stdio, logging to `log`."""
    command, args = stdio_command()
    return {"command": command, "args": args, "cwd": str(REPO_ROOT),
            "env": {LOG_ENV: str(log)}, "timeout_s": 10, "trusted": True, **extra}


def call(name: str, **args: Any) -> Reply:
    return Reply(tool_calls=[ToolCallSpec(name, args)])


def results(model: FakeModelServer, index: int = -1) -> list[str]:
    """The tool results in a model request."""
    return [str(m["content"]) for m in model.requests[index]["messages"] if m["role"] == "tool"]


# -- one chat on either platform ----------------------------------------------------------


class Card(Protocol):
    text: str
    """The card as the user reads it."""

    async def press(self, verdict: Verdict) -> None: ...


class Chat(Protocol):
    """A direct conversation with Tandem on one platform, as its one allowed user."""

    hub: Hub

    async def say(self, text: str) -> None: ...

    async def card(self, n: int) -> Card:
        """The `n`th approval card (1-based) once it is shown with its buttons."""

    def cards(self) -> int:
        """How many approval cards the chat shows."""

    async def answered(self, text: str) -> None:
        """Wait until `text` is shown as a finished answer."""

    async def press_cancel(self) -> None:
        """Press the Cancel button of the live placeholder."""

    async def cancelled(self, timeout: float) -> None:
        """Wait until the turn shows as cancelled, with no Cancel button left."""


class TelegramCard:
    def __init__(self, chat: TelegramChat, message_id: int, approval_id: str,
                 text: str) -> None:
        self.chat, self.message_id, self.approval_id = chat, message_id, approval_id
        self.text = text

    async def press(self, verdict: Verdict) -> None:
        rig = self.chat.rig
        rig.press(ANN, ANN, rig.fake.message(ANN, self.message_id), self.approval_id, verdict)


class TelegramChat:
    def __init__(self, rig: TgRig) -> None:
        self.rig, self.hub = rig, rig.hub

    async def say(self, text: str) -> None:
        self.rig.fake.push_message(ANN, ANN, text)

    def _cards(self) -> list[FakeMessage]:
        return [m for m in self.rig.bot(ANN) if m.text.startswith("🔐")]

    async def card(self, n: int) -> Card:
        await self.rig.until(lambda: len(self._cards()) >= n and
                             self._cards()[n - 1].reply_markup is not None)
        message = self._cards()[n - 1]
        assert message.reply_markup is not None
        button = unpack(message.reply_markup["inline_keyboard"][0][0]["callback_data"])
        assert isinstance(button, ApprovalButton)
        return TelegramCard(self, message.message_id, button.approval_id, message.text)

    def cards(self) -> int:
        return len(self._cards())

    async def answered(self, text: str) -> None:
        await self.rig.answered(ANN, text)

    def _cancel_button(self) -> tuple[int, str] | None:
        for message in self.rig.bot(ANN):
            for row in (message.reply_markup or {}).get("inline_keyboard", []):
                for button in row:
                    data = button.get("callback_data", "")
                    if isinstance(unpack(data), CancelButton):
                        return message.message_id, data
        return None

    async def press_cancel(self) -> None:
        await self.rig.until(lambda: self._cancel_button() is not None)
        found = self._cancel_button()
        assert found is not None
        self.rig.fake.push_callback(ANN, ANN, *found)

    async def cancelled(self, timeout: float) -> None:
        await self.rig.until(lambda: any(m.text.endswith(CANCELLED) for m in self.rig.bot(ANN))
                             and self._cancel_button() is None, timeout)


class SlackCard:
    def __init__(self, rig: SlackRig, message: FakeSlackMessage) -> None:
        self.rig, self.ts = rig, message.ts
        self.text = block_text(message.blocks)

    async def press(self, verdict: Verdict) -> None:
        await self.rig.press("D1", "U1", self.ts, SLACK_VERDICTS[verdict])


def _slack_buttons(message: FakeSlackMessage) -> list[str]:
    return [e["action_id"] for b in message.blocks or [] if b["type"] == "actions"
            for e in b["elements"]]


class SlackChat:
    def __init__(self, rig: SlackRig) -> None:
        self.rig, self.hub = rig, rig.hub

    async def say(self, text: str) -> None:
        await self.rig.say("D1", "U1", text)

    async def card(self, n: int) -> Card:
        return SlackCard(self.rig, await self.rig.card("D1", n))

    def cards(self) -> int:
        return sum("wants to run" in block_text(m.blocks)
                   for m in self.rig.fake.bot_messages("D1"))

    async def answered(self, text: str) -> None:
        def done() -> bool:
            return any(m.text == text and not _slack_buttons(m)
                       for m in self.rig.fake.bot_messages("D1"))

        await self.rig.fake.wait_for(done)

    def _live(self) -> FakeSlackMessage | None:
        return next((m for m in self.rig.fake.bot_messages("D1")
                     if "tandem_cancel" in _slack_buttons(m)), None)

    async def press_cancel(self) -> None:
        live = await self.rig.fake.wait_for(self._live)
        assert live is not None
        await self.rig.press("D1", "U1", live.ts, "tandem_cancel")

    async def cancelled(self, timeout: float) -> None:
        await self.rig.fake.wait_for(
            lambda: any(CANCELLED in t for t in self.rig.texts("D1")) and self._live() is None,
            timeout)


@asynccontextmanager
async def mcp_started(hub: Hub) -> AsyncIterator[None]:
    hub.d.mcp.start()
    try:
        async with asyncio.timeout(30):
            assert await hub.d.mcp.ready(), hub.d.mcp.status()
        yield
    finally:
        await hub.d.mcp.close()


@asynccontextmanager
async def open_chat(platform: str, tmp_path: Path, model: FakeModelServer,
                    servers: dict[str, Any]) -> AsyncIterator[Chat]:
    """A running Tandem on `platform` with `servers` connected."""
    chat: Chat
    if platform == "telegram":
        async with FaultyTelegram(flood=False) as tg, \
                tg_rig(tmp_path, model, tg, overrides={"mcp__servers": servers}) as rig:
            async with mcp_started(rig.hub):
                chat = TelegramChat(rig)
                yield chat
                await rig.settle()
    else:
        async with FaultySlack(rate_limit=False) as fake, \
                SlackRig(fake, model, tmp_path, "socket", mcp__servers=servers) as rig:
            async with mcp_started(rig.hub):
                chat = SlackChat(rig)
                yield chat
                await rig.settle()
    assert model.violations == []


# -- approvals -----------------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_an_mcp_card_shows_the_call_and_approve_runs_it_once(
        platform: str, model: FakeModelServer, tmp_path: Path, mcp_http: HttpServer,
        server_log: ServerLog) -> None:
    model.script(call("mcp_fake_echo", text="hello there"), Reply(text="It said hello."))
    async with open_chat(platform, tmp_path, model, {"fake": http_server(mcp_http)}) as chat:
        await chat.say("echo hello there")
        card = await chat.card(1)
        assert "mcp_fake_echo" in card.text and "fake › echo" in card.text
        assert '"text": "hello there"' in card.text
        assert server_log.count("called echo") == 0  # nothing runs before the press
        await card.press(Verdict.APPROVE)
        await chat.answered("It said hello.")
        await chat.hub.idle()
    assert server_log.count("called echo") == 1
    assert results(model) == ["hello there"] and len(model.requests) == 2


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_deny_tells_the_model_and_the_server_never_sees_the_call(
        platform: str, model: FakeModelServer, tmp_path: Path, mcp_http: HttpServer,
        server_log: ServerLog) -> None:
    model.script(call("mcp_fake_echo", text="secret"), Reply(text="I did not echo it."))
    async with open_chat(platform, tmp_path, model, {"fake": http_server(mcp_http)}) as chat:
        await chat.say("echo secret")
        card = await chat.card(1)
        await card.press(Verdict.DENY)
        await chat.answered("I did not echo it.")
        await chat.hub.idle()
    [denied] = results(model)
    assert denied.startswith("denied:")
    assert "called" not in server_log.text()


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_always_covers_the_exact_call_only(
        platform: str, model: FakeModelServer, tmp_path: Path, mcp_http: HttpServer,
        server_log: ServerLog) -> None:
    model.script(call("mcp_fake_echo", text="b"), Reply(text="first b"),
                 call("mcp_fake_echo", text="b"), Reply(text="second b"),
                 call("mcp_fake_echo", text="c"), Reply(text="no c"))
    async with open_chat(platform, tmp_path, model, {"fake": http_server(mcp_http)}) as chat:
        await chat.say("echo b")
        card = await chat.card(1)
        await card.press(Verdict.ALWAYS)
        await chat.answered("first b")
        await chat.hub.idle()
        await chat.say("echo b again")
        await chat.answered("second b")
        await chat.hub.idle()
        assert chat.cards() == 1 and server_log.count("called echo") == 2
        assert results(model)[-1] == "b"
        await chat.say("echo c")  # another argument: a card again
        card = await chat.card(2)
        assert '"text": "c"' in card.text
        await card.press(Verdict.DENY)
        await chat.answered("no c")
        await chat.hub.idle()
    assert server_log.count("called echo") == 2
    assert results(model)[-1].startswith("denied:")


# -- cancel --------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["button", "stop"])
@pytest.mark.parametrize("platform", PLATFORMS)
async def test_cancel_stops_a_hanging_call_within_a_second(
        platform: str, how: str, model: FakeModelServer, tmp_path: Path,
        mcp_http: HttpServer, server_log: ServerLog) -> None:
    model.script(call("mcp_fake_hang"), call("mcp_fake_echo", text="still here"),
                 Reply(text="Still working."))
    servers = {"fake": http_server(mcp_http, approvals={"hang": "allow", "echo": "allow"})}
    async with open_chat(platform, tmp_path, model, servers) as chat:
        await chat.say("hang for a while")
        await server_log.shows("called hang")
        pressed = time.monotonic()
        if how == "button":
            await chat.press_cancel()
        else:
            await chat.say("/stop")
        await chat.cancelled(timeout=1.0)
        await server_log.shows("cancelled hang", timeout=pressed + 1.0 - time.monotonic())
        assert time.monotonic() - pressed < 1.0
        await chat.hub.idle()
        await chat.say("and now?")
        await chat.answered("Still working.")
        await chat.hub.idle()
    assert results(model)[-2:] == ["interrupted: the user cancelled while this was running",
                                   "still here"]
    assert server_log.count("called echo") == 1 and server_log.count("called hang") == 1


# -- kill -9 during an MCP call ------------------------------------------------------------


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child nobody reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def server_pids(log: Path) -> list[int]:
    """Live processes of the fake MCP server that logs to `log`."""
    wanted = f"{LOG_ENV}={log}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tests.fakes.mcp_servers" in cmdline and wanted in environ \
                and alive(int(entry.name)):
            pids.append(int(entry.name))
    return pids


async def gone(pid: int, timeout: float) -> bool:
    return bool(await within(lambda: not alive(pid), timeout))


async def mcp_connected(tg: FakeTelegram, timeout: float = 30.0) -> None:
    """Ask `/status` until it lists the fake server as connected (only `/status` tells:
    Tandem runs in another process)."""
    async def connected() -> bool:
        seen = len(tg.bot_texts(ANN))
        tg.push_message(ANN, ANN, "/status")
        await tg.wait_for(lambda: len(tg.bot_texts(ANN)) > seen, timeout=timeout)
        return any("fake: connected" in t for t in tg.bot_texts(ANN)[seen:])

    await eventually(connected, timeout, step=0.2, what="the MCP server connected")


def sleep_or_answer(messages: list[dict[str, Any]]) -> Reply:
    """The model: "sleep" calls the MCP sleep tool for 30 s; anything else gets a reply."""
    last = without_note(messages)[-1]
    if last["role"] == "user" and "sleep" in str(last.get("content")):
        return call("mcp_fake_sleep", seconds=30)
    return Reply(text="Back again.")


async def test_kill_9_during_an_mcp_call_leaves_no_server_and_reports_it_interrupted(
        tmp_path: Path) -> None:
    log = ServerLog(tmp_path / "mcp.log")
    stray: list[int] = []
    async with FaultyTelegram(flood=False) as tg, FakeModelServer() as model:
        model.responder = sleep_or_answer
        config = write_config(tmp_path, model, tg)
        data = json.loads(config.read_text())
        data["mcp"] = {"servers": {"fake": stdio_server(log.path, approvals={"sleep": "allow"})}}
        config.write_text(json.dumps(data))
        proc = await start_tandem(config, tg, tmp_path)
        try:
            await mcp_connected(tg)
            [server] = server_pids(log.path)
            tg.push_message(ANN, ANN, "sleep for 30 s please")
            await log.shows("called sleep", timeout=30)
            proc.kill()
            await proc.wait()
            assert await gone(server, timeout=3.0), (
                f"the stdio MCP server (pid {server}) outlived the killed Tandem")
            proc = await start_tandem(config, tg, tmp_path)
            told = "An earlier answer here was interrupted (mcp_fake_sleep was interrupted)"
            await tg.wait_for(lambda: any(t.startswith(told) for t in tg.bot_texts(ANN)),
                              timeout=20)
            before = len(model.requests)
            tg.push_message(ANN, ANN, "are you there?")
            await tg.wait_for(lambda: "Back again." in tg.bot_texts(ANN), timeout=30)
            assert results(model, before) == [
                "interrupted: Tandem stopped while this call was running; it may or may not "
                "have completed"]
            assert model.violations == []
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            stray = [pid for pid in server_pids(log.path) if not await gone(pid, timeout=3.0)]
            for pid in stray:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert stray == [], "an MCP server outlived Tandem"
    assert log.count("called sleep") == 1  # not run again after the restart
