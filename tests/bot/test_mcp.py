"""MCP tools: real SDK servers (stdio and streamable HTTP) behind Tandem's gate."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.core.config import McpServerConfig
from bot.core.events import ApprovalRequested, Cancel, Command, Decision, Verdict
from bot.tools import Registry, Tool
from bot.tools.mcp.tools import offered, result_text, schema_problem, tool_name
from tests.conftest import Core, said
from tests.fakes.mcp_servers import REPO_ROOT, http_server
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.waiting import eventually

# -- names, filters, schemas, results -----------------------------------------------------


def test_names_are_safe_short_and_unique() -> None:
    assert tool_name("github", "create_issue", set()) == "mcp_github_create_issue"
    assert tool_name("my server", "weird.name/v2", set()) == "mcp_my_server_weird_name_v2"
    long = tool_name("s", "x" * 100, set())
    assert len(long) == 64 and long.startswith("mcp_s_xxx")
    taken = {"mcp_a_b_c"}
    clash = tool_name("a_b", "c", taken)
    assert clash != "mcp_a_b_c" and clash.startswith("mcp_a_b_c_") and len(clash) <= 64
    assert tool_name("a_b", "c", taken) == clash  # stable


def test_include_and_exclude_take_names_and_globs() -> None:
    config = McpServerConfig(command="x", tools={"include": ["get_*", "echo"],
                                                 "exclude": ["get_secret*"]})
    assert [t for t in ("echo", "get_issue", "get_secret_key", "delete") if offered(config, t)] \
        == ["echo", "get_issue"]


@pytest.mark.parametrize(("schema", "usable"), [
    ({"type": "object", "properties": {"a": {"type": "string"}}}, True),
    ({"properties": {}}, True),
    ({"type": "array"}, False), ("nope", False), ({"type": "object", "properties": []}, False),
])
def test_a_schema_the_model_cannot_use_is_named(schema: Any, usable: bool) -> None:
    assert (schema_problem(schema) is None) is usable


def test_results_become_text_and_is_error_an_error() -> None:
    from mcp.types import CallToolResult, ImageContent, TextContent

    from bot.core.errors import ToolError

    ok = CallToolResult(content=[TextContent(type="text", text="hi"),
                                 ImageContent(type="image", data="AAAA", mime_type="image/png")])
    assert result_text("s", ok) == "hi\n[image from s: image/png, 3 bytes; not shown here]"
    kept: list[tuple[str, str, bytes]] = []

    def keep(kind: str, mime: str, data: bytes) -> str:
        kept.append((kind, mime, data))
        return "saved as there.png"

    assert result_text("s", ok, keep) == \
        "hi\n[image from s: image/png, 3 bytes; saved as there.png]"
    assert kept == [("image", "image/png", b"\0\0\0")]
    with pytest.raises(ToolError, match="broken"):
        result_text("s", CallToolResult(content=[TextContent(type="text", text="broken")],
                                        is_error=True))
    assert result_text("s", CallToolResult(content=[])) == "(no output)"


def test_an_unchanged_tool_list_keeps_the_prompt_as_it_is() -> None:
    async def run(*_: Any) -> str:
        return ""

    def tool(name: str) -> Tool:
        return Tool(name, "d", {"type": "object", "properties": {}}, run)

    registry = Registry([tool("read_file")])
    registry.set_group("mcp:b", [tool("mcp_b_y"), tool("mcp_b_x")])
    registry.set_group("mcp:a", [tool("mcp_a_z")])
    assert registry.names() == ["read_file", "mcp_a_z", "mcp_b_x", "mcp_b_y"]
    version, schemas = registry.version, registry.schemas()
    registry.set_group("mcp:b", [tool("mcp_b_x"), tool("mcp_b_y")])
    assert registry.version == version and registry.schemas() is schemas
    registry.set_group("mcp:b", [])
    assert registry.names() == ["read_file", "mcp_a_z"] and registry.version > version


# -- through the core, against the SDK's own servers ---------------------------------------


def stdio_server(log: Path, **extra: Any) -> dict[str, Any]:
    """The fake over stdio; its descriptions are this suite's own (`trusted`), so only
    its results taint (`tests/bot/test_mcp_security.py` tries one that is not)."""
    return {"command": sys.executable, "args": ["-m", "tests.fakes.mcp_servers", "stdio"],
            "cwd": str(REPO_ROOT), "env": {"MCP_FAKE_LOG": str(log)}, "timeout_s": 10,
            "trusted": True, **extra}


@asynccontextmanager
async def core_with(config_factory: Any, servers: dict[str, Any],
                    **overrides: Any) -> AsyncIterator[Core]:
    async with Core(config_factory(mcp__servers=servers, **overrides)) as core:
        core.hub.d.mcp.start()
        try:
            async with asyncio.timeout(30):
                assert await core.hub.d.mcp.ready(), core.hub.d.mcp.status()
            yield core
        finally:
            await core.hub.d.mcp.close()


async def logged(log: Path, line: str, timeout: float = 10.0) -> None:
    """Wait until the fake server has written `line` to its log."""
    async with asyncio.timeout(timeout):
        while not (log.exists() and line in log.read_text()):
            await asyncio.sleep(0.02)


def call(tool: str, **args: Any) -> Reply:
    return Reply(tool_calls=[ToolCallSpec(tool, args)])


def results(model: FakeModelServer) -> list[str]:
    return [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]


async def test_an_mcp_call_asks_runs_once_on_approve_and_its_result_taints(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    log = tmp_path / "mcp.log"
    model.script(call("mcp_fake_echo", text="hello"), Reply(text="It said hello."),
                 call("remember", fact="the echo works"), Reply(text="ok"))
    async with core_with(config_factory, {"fake": stdio_server(log)}) as core:
        tools = [s["function"]["name"] for s in core.hub.d.tools.schemas()]
        assert "mcp_fake_echo" in tools and "mcp_fake_weird_name_v2" in tools
        assert "mcp_fake_bad_schema" not in tools  # left out, the rest of the server stays
        await core.say("echo hello")
        [card] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        assert card.tool == "mcp_fake_echo"
        assert card.summary.startswith("fake › echo  (the server says: read-only)")
        assert json.loads(card.summary.split("\n", 1)[1]) == {"text": "hello"}
        assert "called echo" not in (log.read_text() if log.exists() else "")
        await core.hub.submit(Decision(core.key, core.user, card.approval_id, Verdict.APPROVE))
        await core.hub.submit(Decision(core.key, core.user, card.approval_id, Verdict.APPROVE))
        [ended] = await core.sink.ended()
        assert ended.text == "It said hello." and results(model) == ["hello"]
        assert log.read_text().count("called echo") == 1
        await core.say("remember that the echo works")  # the MCP result is in view
        [_, second] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested)[1:] and
                                           core.sink.of(ApprovalRequested))
        assert second.tool == "remember"
        assert second.reason == "Asked because this conversation has read content from " \
                                "mcp_fake_echo."


async def test_an_mcp_picture_is_kept_in_the_workspace_and_shown_in_the_chat(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    from tests.bot.test_media import MemoryPort

    log = tmp_path / "mcp.log"
    model.script(call("mcp_fake_image"), Reply(text="done"))
    servers = {"fake": stdio_server(log, approvals={"image": "allow"})}
    async with core_with(config_factory, servers) as core:
        port = MemoryPort()
        core.dispatch.ports["console"] = port
        await core.say("draw")
        await core.sink.ended()
        workspace = Path(core.config.workspace.dir)
    [picture] = results(model)
    assert "[image from fake: image/png, " in picture and "saved as mcp/fake/image.png" in picture
    assert picture.endswith("[image.png is shown in the chat]")
    kept = (workspace / "mcp" / "fake" / "image.png").read_bytes()
    assert kept.startswith(b"\x89PNG")
    assert [(name, data, pic) for _, name, data, _, pic in port.uploads] == \
        [("image.png", kept, True)]


async def test_deny_always_and_errors_reach_the_model(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    log = tmp_path / "mcp.log"
    model.script(call("mcp_fake_echo", text="a"), Reply(text="denied"),
                 call("mcp_fake_error_result"), Reply(text="broken"),
                 call("mcp_fake_echo", text="b"), Reply(text="b1"),
                 call("mcp_fake_echo", text="b"), Reply(text="b2"),
                 call("mcp_fake_echo", text="c"), Reply(text="c?"))
    servers = {"fake": stdio_server(log, approvals={"error_result": "allow"})}
    async with core_with(config_factory, servers) as core:
        await core.say("one")
        [card] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        await core.hub.submit(Decision(core.key, core.user, card.approval_id, Verdict.DENY))
        await core.sink.ended(1)
        assert results(model)[-1].startswith("denied:")
        await core.say("two")  # policy allow for this one tool: no card
        await core.sink.ended(2)
        assert results(model)[-1] == "error: the widget is broken"
        await core.say("three")
        cards = await core.sink.wait(lambda: core.sink.of(ApprovalRequested)[1:])
        await core.hub.submit(Decision(core.key, core.user, cards[-1].approval_id,
                                       Verdict.ALWAYS))
        await core.sink.ended(3)
        await core.say("four")  # the exact call: covered
        await core.sink.ended(4)
        await core.say("five")  # another argument: asks again
        await core.sink.wait(lambda: len(core.sink.of(ApprovalRequested)) == 3)
        assert log.read_text().count("called echo") == 2
        assert "called error_result" in log.read_text()


async def test_cancel_stops_a_hanging_call_within_a_second_and_the_server_stays_usable(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    log = tmp_path / "mcp.log"
    model.script(call("mcp_fake_hang"), call("mcp_fake_echo", text="still here"),
                 Reply(text="fine"))
    servers = {"fake": stdio_server(log, approvals={"hang": "allow", "echo": "allow"})}
    async with core_with(config_factory, servers) as core:
        await core.say("hang")
        await logged(log, "called hang")
        started = time.monotonic()
        assert (await core.hub.cancel(Cancel(core.key, core.user))).accepted
        [ended] = await core.sink.ended(1)
        assert time.monotonic() - started < 1.0 and ended.reason == "cancelled"
        await logged(log, "cancelled hang", timeout=5)  # the server was told
        await core.say("and now?")
        [_, last] = await core.sink.ended(2)
        assert last.text == "fine" and results(model)[-2:] == [
            "interrupted: the user cancelled while this was running", "still here"]


async def test_a_crash_mid_call_is_one_error_then_the_server_is_back(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(call("mcp_fake_crash"), Reply(text="it crashed"),
                 call("mcp_fake_echo", text="back"), Reply(text="back"))
    servers = {"fake": stdio_server(tmp_path / "mcp.log",
                                    approvals={"crash": "allow", "echo": "allow"})}
    async with core_with(config_factory, servers) as core:
        await core.say("crash it")
        await core.sink.ended(1, timeout=15)
        assert "went away during `crash`" in results(model)[-1]
        mcp = core.hub.d.mcp
        await eventually(lambda: mcp.connections["fake"].state == "connected", 15,
                         what="the MCP server connected again")
        await core.say("again")
        # the crashed call's result is in view: even an allowed MCP tool asks now
        [card] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        assert card.reason is not None and "mcp_fake_crash" in card.reason
        await core.hub.submit(Decision(core.key, core.user, card.approval_id, Verdict.APPROVE))
        await core.sink.ended(2)
        assert results(model)[-1] == "back"
        await core.hub.submit(Command(core.key, core.user, "status"))
        status = await core.sink.wait(lambda: [e for e in core.sink.events
                                               if "MCP servers" in getattr(e, "text", "")])
        assert "fake: connected, 11 tools, " not in status[-1].text  # no stale error
        assert "fake: connected, 11 tools" in status[-1].text


async def test_http_server_with_a_bearer_header_and_the_token_never_shows(
        model: FakeModelServer, config_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    token = "mcp-bearer-3f9c2b7a1d8e"
    model.script(call("mcp_web_echo", text=f"the token is {token}"), Reply(text="done"))
    async with http_server(token) as url:
        servers = {"web": {"url": url, "headers": {"Authorization": f"Bearer {token}"},
                           "approvals": {"echo": "allow"}, "trusted": True}}
        with caplog.at_level(logging.INFO):
            async with core_with(config_factory, servers) as core:
                await core.say("echo it")
                await core.sink.ended(1)
        assert results(model) == ["the token is [secret]"]
        assert all(token not in json.dumps(r) for r in model.requests)
        assert token not in caplog.text


async def test_a_restarted_http_server_is_reconnected_and_the_call_made_once(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    """The new server does not know the old session (HTTP 404, "Session terminated"):
    the request never ran there, so Tandem opens a session again and makes the call."""
    log = tmp_path / "mcp.log"
    model.script(call("mcp_web_echo", text="one"), Reply(text="1"),
                 call("mcp_web_echo", text="two"), Reply(text="2"))
    first = http_server(log=log)
    url = await first.__aenter__()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    servers = {"web": {"url": url, "approvals": {"echo": "allow"}, "timeout_s": 10,
                       "trusted": True}}
    try:
        async with core_with(config_factory, servers) as core:
            await core.say("first")
            await core.sink.ended(1)
            assert results(model) == ["one"]
            await first.__aexit__(None, None, None)  # the server stops...
            async with http_server(log=log, port=port):  # ...and another starts there
                await core.say("second")  # asks: an MCP result is in view
                [card] = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
                await core.hub.submit(Decision(core.key, core.user, card.approval_id,
                                               Verdict.APPROVE))
                await core.sink.ended(2)
                assert results(model)[-1] == "two"
    finally:
        await first.__aexit__(None, None, None)
    assert log.read_text().count("called echo") == 2


async def test_a_server_that_cannot_start_is_a_status_line_not_a_failure(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(call("mcp_gone_echo"), Reply(text="no such tool"), Reply(text="hello"))
    servers = {"gone": {"command": str(tmp_path / "no-such-server"), "connect_timeout_s": 2}}
    async with Core(config_factory(mcp__servers=servers)) as core:
        core.hub.d.mcp.start()
        async with asyncio.timeout(10):
            assert not await core.hub.d.mcp.ready()
        await core.say("hi")
        [ended] = await core.sink.ended(1)
        assert ended.text == "no such tool" and "no tool named `mcp_gone_echo`" in \
            results(model)[-1]
        await core.hub.submit(Command(core.key, core.user, "status"))
        status = await core.sink.wait(lambda: [e for e in core.sink.events
                                               if "MCP servers" in getattr(e, "text", "")])
        assert "gone: reconnecting, last error:" in status[-1].text
        await core.hub.d.mcp.close()
    assert said(model.requests[0]["messages"]) == ["[Ann] hi"] or model.requests


async def test_a_changed_tool_list_is_fetched_again_and_offered_next(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(call("mcp_fake_add_tool", name="shiny"), Reply(text="added"),
                 call("mcp_fake_shiny"), Reply(text="it ran"))
    servers = {"fake": stdio_server(tmp_path / "mcp.log",
                                    approvals={"add_tool": "allow", "shiny": "allow"})}
    async with core_with(config_factory, servers) as core:
        before = [s["function"]["name"] for s in core.hub.d.tools.schemas()]
        assert "mcp_fake_shiny" not in before
        await core.say("add a tool")
        await core.sink.ended(1)
        await eventually(lambda: core.hub.d.tools.get("mcp_fake_shiny"), 10,
                         what="the new tool registered")
        await core.say("use it")
        cards = await core.sink.wait(lambda: core.sink.of(ApprovalRequested))
        await core.hub.submit(Decision(core.key, core.user, cards[0].approval_id,
                                       Verdict.APPROVE))  # tainted by the first result
        await core.sink.ended(2)
    offered = [t["function"]["name"] for t in model.requests[-1]["tools"]]
    assert "mcp_fake_shiny" in offered and results(model)[-1] == "shiny ran"
    first = [t["function"]["name"] for t in model.requests[0]["tools"]]
    assert offered == sorted(set(first) | {"mcp_fake_shiny"}, key=offered.index)


async def test_a_call_that_hangs_ends_at_its_timeout_with_a_clear_error(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    model.script(call("mcp_fake_hang"), Reply(text="gave up"))
    servers = {"fake": stdio_server(tmp_path / "mcp.log", timeout_s=1,
                                    approvals={"hang": "allow"})}
    async with core_with(config_factory, servers) as core:
        started = time.monotonic()
        await core.say("hang")
        [ended] = await core.sink.ended(1)
        assert time.monotonic() - started < 5 and ended.text == "gave up"
    assert results(model)[-1] == "error: `hang` on the MCP server `fake` did not answer " \
                                 "within 1 s"
