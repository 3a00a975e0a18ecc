"""The fake model server, exercised through the real litellm client over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from litellm.exceptions import (
    APIConnectionError,
    APIError,
    BadRequestError,
    ContextWindowExceededError,
    InternalServerError,
    MidStreamFallbackError,
    RateLimitError,
    Timeout,
)

from tests.fakes.model_server import (
    MISSING_RESULTS,
    ORPHAN_RESULT,
    FakeModelServer,
    Reply,
    ToolCallSpec,
)

litellm.suppress_debug_info = True

# litellm lazily imports a provider module on the first call whose pydantic TypedDict uses
# ReadOnly; pydantic warns about it, which the project's filterwarnings=error would turn into a
# failure of whichever test happens to make the first call.
pytestmark = pytest.mark.filterwarnings("ignore:.*using the `ReadOnly` qualifier:UserWarning")

USER = {"role": "user", "content": "hi"}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}},
                "required": ["cmd"],
            },
        },
    }
]


def _call(call_id: str, name: str = "shell", arguments: str = '{"cmd": "ls"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _assistant_calls(*ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [_call(i) for i in ids]}


def _tool(call_id: str, content: str = "done") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


@pytest.fixture
async def server() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as s:
        yield s


async def _stream(
    server: FakeModelServer,
    messages: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """One streamed litellm completion against the fake; returns every chunk."""
    params: dict[str, Any] = {
        "model": "openai/fake",
        "api_base": server.api_base,
        "api_key": "sk-test",
        "messages": messages if messages is not None else [USER],
        "tools": TOOLS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "timeout": 5,
    }
    params.update(kwargs)
    response = await litellm.acompletion(**params)
    return [chunk async for chunk in response]


def _text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _tool_calls(chunks: list[Any]) -> dict[int, dict[str, str]]:
    """Assemble streamed tool-call fragments by index, the way a client must."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        for frag in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(frag.index, {"id": "", "name": "", "arguments": ""})
            if frag.id:
                call["id"] = frag.id
            if frag.function is not None:
                call["name"] += frag.function.name or ""
                call["arguments"] += frag.function.arguments or ""
    return calls


def _finish_reason(chunks: list[Any]) -> str | None:
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    return next((r for r in reversed(reasons) if r), None)


# --------------------------------------------------------------------------- streaming


async def test_streamed_text_assembles(server: FakeModelServer) -> None:
    text = "Hello, streaming world! Ünïcode too."
    server.script(Reply(text=text, chunk_size=3))
    chunks = await _stream(server)
    assert _text(chunks) == text
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= len(text) // 3
    assert _finish_reason(chunks) == "stop"
    assert server.requests[0]["stream"] is True
    assert server.last_messages() == [USER]
    assert server.violations == []


async def test_parallel_tool_calls_assemble_by_index(server: FakeModelServer) -> None:
    first = {"cmd": "ls -la /tmp", "cwd": "/"}
    server.script(
        Reply(
            text="Let me look.",
            tool_calls=[
                ToolCallSpec("shell", first, id="call_one"),
                ToolCallSpec("read_file", '{"path": "/etc/hosts"}'),
            ],
            chunk_size=5,
        )
    )
    chunks = await _stream(server)
    calls = _tool_calls(chunks)
    assert sorted(calls) == [0, 1]
    assert calls[0]["id"] == "call_one"
    assert calls[0]["name"] == "shell"
    assert json.loads(calls[0]["arguments"]) == first
    assert calls[1]["id"].startswith("call_")
    assert calls[1]["name"] == "read_file"
    assert json.loads(calls[1]["arguments"]) == {"path": "/etc/hosts"}
    assert _text(chunks) == "Let me look."
    assert _finish_reason(chunks) == "tool_calls"
    arg_fragments = [
        frag
        for c in chunks
        if c.choices
        for frag in c.choices[0].delta.tool_calls or []
        if frag.function is not None and frag.function.arguments
    ]
    assert len(arg_fragments) > 4  # really fragmented


async def test_malformed_arguments_are_sent_verbatim(server: FakeModelServer) -> None:
    server.script(Reply(tool_calls=[ToolCallSpec("shell", '{"cmd": "ls', id="call_bad")]))
    calls = _tool_calls(await _stream(server))
    assert calls[0]["arguments"] == '{"cmd": "ls'


async def test_usage_chunk_with_include_usage(server: FakeModelServer) -> None:
    server.script(Reply(text="hi there", usage=(11, 7)), Reply(text="estimated"))
    chunks = await _stream(server)
    usages = [c.usage for c in chunks if getattr(c, "usage", None) is not None]
    assert usages, "no usage chunk"
    assert (usages[-1].prompt_tokens, usages[-1].completion_tokens) == (11, 7)
    assert usages[-1].total_tokens == 18
    usage = [c.usage for c in await _stream(server) if getattr(c, "usage", None)][-1]
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0


async def test_raw_stream_wire_format(server: FakeModelServer) -> None:
    server.script(Reply(text="abcdef", tool_calls=[ToolCallSpec("shell", {"a": 1}, id="c1")]))
    body = {"model": "fake", "messages": [USER], "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.api_base}/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = (await resp.read()).decode()
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    first_call = next(c for c in chunks if "tool_calls" in c["choices"][0]["delta"])
    assert first_call["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "shell", "arguments": ""}}
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all("usage" not in c for c in chunks)  # include_usage not requested


async def test_non_streamed_completion(server: FakeModelServer) -> None:
    server.script(Reply(text="plain"), Reply(tool_calls=[ToolCallSpec("shell", {"cmd": "pwd"})]))
    base: dict[str, Any] = {
        "model": "openai/fake",
        "api_base": server.api_base,
        "api_key": "sk-test",
        "messages": [USER],
        "timeout": 5,
    }
    response = await litellm.acompletion(**base)
    assert response.choices[0].message.content == "plain"
    assert response.usage.total_tokens > 0
    response = await litellm.acompletion(**base, tools=TOOLS)
    (call,) = response.choices[0].message.tool_calls
    assert call.function.name == "shell"
    assert json.loads(call.function.arguments) == {"cmd": "pwd"}
    assert response.choices[0].finish_reason == "tool_calls"


async def test_script_is_fifo_then_responder(server: FakeModelServer) -> None:
    server.script(Reply(text="one"), Reply(text="two"))
    seen: list[int] = []

    def responder(messages: list[dict[str, Any]]) -> Reply:
        seen.append(len(messages))
        return Reply(text=f"dynamic {len(messages)}")

    server.responder = responder
    assert _text(await _stream(server)) == "one"
    assert _text(await _stream(server)) == "two"
    assert _text(await _stream(server, [USER, {"role": "assistant", "content": "x"}, USER])) == (
        "dynamic 3"
    )
    assert seen == [3]
    server.responder = None
    assert _text(await _stream(server)) == "ok"
    assert len(server.requests) == 4


async def test_wait_requests(server: FakeModelServer) -> None:
    server.script(Reply(text="slow", chunk_size=1, chunk_delay=0.01))
    task = asyncio.create_task(_stream(server))
    await server.wait_requests(1)
    assert server.last_messages() == [USER]
    assert _text(await task) == "slow"
    with pytest.raises(TimeoutError):
        await server.wait_requests(2, timeout=0.05)


# --------------------------------------------------------------------------- validation


async def test_missing_tool_result_is_rejected(server: FakeModelServer) -> None:
    messages = [USER, _assistant_calls("call_a", "call_b"), _tool("call_a"), USER]
    with pytest.raises(BadRequestError) as info:
        await _stream(server, messages)
    expected = MISSING_RESULTS.format(ids="call_b")
    assert expected.endswith("did not have response messages: call_b")
    assert expected in str(info.value)
    assert server.violations == [expected]
    assert len(server.requests) == 1  # 400 is not retried


async def test_missing_results_lists_every_id(server: FakeModelServer) -> None:
    messages = [USER, _assistant_calls("call_a", "call_b")]
    with pytest.raises(BadRequestError):
        await _stream(server, messages)
    assert server.violations == [
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        "call_a, call_b"
    ]


async def test_orphan_tool_result_is_rejected(server: FakeModelServer) -> None:
    messages = [USER, {"role": "assistant", "content": "sure"}, _tool("call_x")]
    with pytest.raises(BadRequestError) as info:
        await _stream(server, messages)
    assert "must be a response to a preceeding message with 'tool_calls'" in str(info.value)
    assert server.violations == [ORPHAN_RESULT]
    assert len(server.requests) == 1


async def test_error_envelope_is_openai_exact(server: FakeModelServer) -> None:
    cases: list[tuple[list[dict[str, Any]], str, str]] = [
        (
            [USER, _assistant_calls("call_a", "call_b"), USER],
            MISSING_RESULTS.format(ids="call_a, call_b"),
            "messages.[1].role",
        ),
        ([USER, _tool("call_z")], ORPHAN_RESULT, "messages.[1].role"),
        (
            [USER, _assistant_calls("call_a"), _tool("call_a"), _tool("call_q")],
            ORPHAN_RESULT,
            "messages.[3].role",
        ),
    ]
    async with aiohttp.ClientSession() as http:
        for messages, message, param in cases:
            body = {"model": "fake", "messages": messages}
            async with http.post(f"{server.api_base}/chat/completions", json=body) as resp:
                assert resp.status == 400
                assert await resp.json() == {
                    "error": {
                        "message": message,
                        "type": "invalid_request_error",
                        "param": param,
                        "code": None,
                    }
                }
    assert server.violations == [message for _, message, _ in cases]


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([USER, _assistant_calls("c1"), _tool("c1"), _tool("c1")], "duplicate tool result"),
        (
            [USER, _assistant_calls("c1"), _tool("c1"), _assistant_calls("c1"), _tool("c1")],
            "duplicate tool_call_id",
        ),
        ([USER, {"role": "system", "content": "late"}], "'system' message may only appear"),
        ([USER, {"role": "robot", "content": "beep"}], "Invalid value: 'robot'"),
        (
            [
                USER,
                {"role": "assistant", "tool_calls": [{**_call("c1"), "function": {"name": "x"}}]},
            ],
            "function.arguments': expected a string",
        ),
        (
            [
                USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "x", "arguments": {}}}
                    ],
                },
                _tool("c1"),
            ],
            "expected a string, got dict",
        ),
        ([USER, {"role": "assistant", "content": None}], "must have 'content' or 'tool_calls'"),
        ([USER, {"role": "assistant", "content": None, "tool_calls": []}], "non-empty array"),
        ([USER, _assistant_calls("c1"), USER, _tool("c1")], "did not have response messages: c1"),
        ([], "non-empty array"),
    ],
)
async def test_other_violations(
    server: FakeModelServer, messages: list[dict[str, Any]], fragment: str
) -> None:
    body = {"model": "fake", "messages": messages}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.api_base}/chat/completions", json=body) as resp,
    ):
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] is None
    assert fragment in error["message"]
    assert server.violations == [error["message"]]
    assert server.requests == [body]


async def test_rejected_request_does_not_consume_script(server: FakeModelServer) -> None:
    server.script(Reply(text="kept"))
    with pytest.raises(BadRequestError):
        await _stream(server, [USER, _tool("nope")])
    assert _text(await _stream(server)) == "kept"


async def test_valid_tool_round_trip_has_no_violations(server: FakeModelServer) -> None:
    server.script(
        Reply(
            tool_calls=[
                ToolCallSpec("shell", {"cmd": "ls"}),
                ToolCallSpec("shell", {"cmd": "pwd"}),
            ]
        ),
        Reply(text="All done."),
    )
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}, USER]
    calls = _tool_calls(await _stream(server, messages))
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _call(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())
            ],
        }
    )
    # results may come back in any order
    messages += [_tool(calls[1]["id"], "/root"), _tool(calls[0]["id"], "a b c")]
    assert _text(await _stream(server, messages)) == "All done."
    assert server.violations == []
    assert [m["role"] for m in server.last_messages()] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
    ]


# --------------------------------------------------------------------------- faults


async def test_context_limit_raises_context_window_exceeded() -> None:
    async with FakeModelServer(context_limit=50) as server:
        big = [{"role": "user", "content": "x" * 400}]
        with pytest.raises(ContextWindowExceededError) as info:
            await _stream(server, big)
        assert "maximum context length is 50 tokens" in str(info.value)
        assert len(server.requests) == 1
        assert server.violations == []
        server.script(Reply(text="fits"))
        assert _text(await _stream(server, [USER], tools=None)) == "fits"


async def test_context_fault_forces_error_once(server: FakeModelServer) -> None:
    server.script(Reply(fault="context"))
    with pytest.raises(ContextWindowExceededError):
        await _stream(server)
    assert _text(await _stream(server)) == "ok"


async def test_rate_limit_429(server: FakeModelServer) -> None:
    server.script(Reply(fault="429", retry_after=7))
    with pytest.raises(RateLimitError) as info:
        await _stream(server, max_retries=0)
    assert info.value.response.headers["retry-after"] == "7"
    assert "Rate limit reached for requests" in str(info.value)
    assert len(server.requests) == 1

    server.script(Reply(fault="429", retry_after=3))
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.api_base}/chat/completions", json={"messages": [USER]}) as resp,
    ):
        assert resp.status == 429
        assert resp.headers["retry-after"] == "3"
        assert await resp.json() == {
            "error": {
                "message": "Rate limit reached for requests",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }


async def test_server_error_500(server: FakeModelServer) -> None:
    server.script(Reply(fault="500"))
    with pytest.raises(InternalServerError) as info:
        await _stream(server, num_retries=0)
    assert isinstance(info.value, APIError | InternalServerError)
    assert "The server had an error" in str(info.value)
    assert len(server.requests) == 1


async def test_hang_times_out_and_close_is_prompt() -> None:
    server = FakeModelServer()
    await server.start()
    try:
        server.script(Reply(fault="hang"))
        with pytest.raises(Timeout):
            await _stream(server, timeout=0.5, max_retries=0)
        assert len(server.requests) == 1
        # a second hang left pending while the server closes
        server.script(Reply(fault="hang"))
        body = {"model": "fake", "messages": [USER]}
        async with aiohttp.ClientSession() as http:
            pending = asyncio.create_task(
                http.post(f"{server.api_base}/chat/completions", json=body)
            )
            await server.wait_requests(2)
            started = time.monotonic()
            await server.close()
            assert time.monotonic() - started < 1.5
            with pytest.raises(aiohttp.ClientError):
                (await pending).release()
    finally:
        await server.close()


async def test_drop_mid_stream_raises(server: FakeModelServer) -> None:
    text = "This answer is cut off half way through the stream."
    server.script(Reply(text=text, chunk_size=4, fault="drop"))
    received: list[Any] = []
    response = await litellm.acompletion(
        model="openai/fake",
        api_base=server.api_base,
        api_key="sk-test",
        messages=[USER],
        stream=True,
        stream_options={"include_usage": True},
        timeout=5,
        max_retries=0,
    )
    with pytest.raises(Exception) as info:  # the class is asserted below
        async for chunk in response:
            received.append(chunk)
    # litellm 1.110 wraps the transport error: MidStreamFallbackError(APIConnectionError)
    assert isinstance(info.value, MidStreamFallbackError | APIConnectionError)
    if isinstance(info.value, MidStreamFallbackError):
        assert isinstance(info.value.original_exception, APIConnectionError)
    partial = _text(received)
    assert partial and text.startswith(partial) and partial != text
    assert len(server.requests) == 1


async def test_drop_non_streamed_raises(server: FakeModelServer) -> None:
    server.script(Reply(text="cut", fault="drop"))
    # litellm 1.110 maps the openai SDK's "Connection error." to InternalServerError here
    with pytest.raises((InternalServerError, APIConnectionError)) as info:
        await litellm.acompletion(
            model="openai/fake",
            api_base=server.api_base,
            api_key="sk-test",
            messages=[USER],
            timeout=5,
            max_retries=0,
        )
    assert "Connection error" in str(info.value)
    assert len(server.requests) == 1
