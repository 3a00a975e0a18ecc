"""The edges of a turn in the core: odd model output and a registry that changed under a
waiting call. The real hub, SQLite and litellm against the strict fake model."""

from __future__ import annotations

import json
from typing import Any

import pytest

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
