"""The edges of a turn in the core: odd model output and a registry that changed under a
waiting call. The real hub, SQLite and litellm against the strict fake model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    Cancel,
    Decision,
    Event,
    Notice,
    Progress,
    Suspended,
    TurnEnded,
    Verdict,
)
from bot.serve.intake import Receipt
from bot.tools import Tool, ToolContext
from tests.conftest import Core
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec


@pytest.mark.parametrize("arguments", ["[1]", "null", "7", '"text"', "true"])
async def test_arguments_that_are_json_but_no_object_go_back_as_an_object(
        model: FakeModelServer, config_factory: Any, arguments: str) -> None:
    model.script(Reply(tool_calls=[ToolCallSpec("read_file", arguments)]),
                 Reply(text="Sorry, fixed."), Reply(text="Later."))
    async with Core(config_factory()) as core:
        await core.say("read")
        [ended] = await core.sink.ended()
        await core.say("and now?")
        await core.sink.ended(2)
    assert ended.text == "Sorry, fixed."
    for request in model.requests[1:]:
        for message in request["messages"]:
            for call in message.get("tool_calls") or []:
                sent = json.loads(call["function"]["arguments"])
                assert isinstance(sent, dict), call
    tool = [m["content"] for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert "must be a JSON object" in str(tool[0])
    assert model.violations == []


async def test_an_approved_call_whose_tool_left_the_registry_is_told_to_the_model(
        model: FakeModelServer, config_factory: Any) -> None:
    """An MCP server's `tools/list_changed` removed the tool while its card waited: the
    approval runs nothing, the model reads why, and the turn goes on."""
    ran: list[dict[str, Any]] = []

    async def deploy(_ctx: ToolContext, args: dict[str, Any]) -> str:
        ran.append(args)
        return "deployed"

    tool = Tool("deploy", "Deploy the site", {"type": "object", "properties": {}}, deploy)
    model.script(Reply(tool_calls=[ToolCallSpec("deploy", {})]), Reply(text="It is gone."),
                 Reply(text="Still here."))
    async with Core(config_factory()) as core:
        core.hub.d.tools.set_group("site", [tool])
        await core.say("deploy it")
        await core.sink.wait(lambda: bool(core.sink.of(ApprovalRequested)))
        core.hub.d.tools.set_group("site", [])  # the server took it back
        approval = core.sink.of(ApprovalRequested)[0]
        await core.hub.submit(Decision(core.key, core.user, approval.approval_id,
                                       Verdict.APPROVE))
        [ended] = await core.sink.ended()
        await core.say("and now?")
        second = (await core.sink.ended(2))[1]
    assert ran == []
    assert ended.text == "It is gone." and ended.reason == "completed"
    assert second.text == "Still here."
    tool_results = [m["content"] for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert "`deploy` is not available now" in tool_results[0]
    assert not any("interrupted" in n.text for n in core.sink.of(Notice))
    assert model.violations == []


async def test_a_cancel_pressed_while_the_turn_suspends_ends_it(
        model: FakeModelServer, config_factory: Any, tmp_path: Path) -> None:
    """The ⏹ press lands while the turn is storing and showing its pause: it was
    acknowledged ("Cancelling…"), then lost, and a later Approve ran the command."""
    marker = tmp_path / "workspace" / "ran.txt"
    model.script(Reply(tool_calls=[ToolCallSpec("shell", {"command": f"touch {marker}"})]),
                 Reply(text="Later."))
    async with Core(config_factory()) as core:
        receipts: list[Receipt] = []
        record = core.sink.emit

        async def pressing(event: Event) -> None:
            if isinstance(event, Suspended):  # the press arrives just as the turn pauses
                receipts.append(await core.hub.cancel(Cancel(core.key, core.user)))
            await record(event)

        core.sink.emit = pressing  # type: ignore[method-assign]
        await core.say("touch it")
        [ended] = await core.sink.ended()
        approval = core.sink.of(ApprovalRequested)[0]
        late = await core.hub.submit(Decision(core.key, core.user, approval.approval_id,
                                              Verdict.APPROVE))
        await core.hub.idle()
        resolved = core.sink.of(ApprovalResolved)
    assert receipts and receipts[0].accepted
    assert ended.reason == "cancelled"
    assert [r.outcome for r in resolved] == ["cancelled"]
    assert late.accepted or late.note  # answered, and it changes nothing
    assert not marker.exists()
    assert len(model.requests) == 1


async def test_a_shutdown_is_not_the_users_cancel(model: FakeModelServer,
                                                  config_factory: Any) -> None:
    """Tandem stops while a turn streams: the chat is not told "⏹ Cancelled.", the model is
    never told the user cancelled, and the next start repairs the turn like a crash."""
    model.script(Reply(text="A long answer " * 40, chunk_delay=0.05), Reply(text="Again."))
    config = config_factory()
    async with Core(config) as core:
        await core.say("tell me everything")
        await core.sink.wait(lambda: any(p.text for p in core.sink.of(Progress)))
    assert core.sink.of(TurnEnded) == []
    async with Core(config) as again:
        told = await again.sink.wait(lambda: again.sink.of(Notice) or again.sink.of(TurnEnded))
        await again.say("and now?")
        ended = await again.sink.ended(len(again.sink.of(TurnEnded)) + 1)
    said = " ".join(str(n.text) for n in told)
    assert "interrupted" in said and "Cancelled" not in said
    assert ended[-1].text == "Again."
    sent = json.dumps(model.requests[-1]["messages"])
    assert "the user cancelled" not in sent and "Cancelled" not in sent
