"""The fake model server, exercised through the real litellm client over HTTP."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import time
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image

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
    AUDIO_CORRUPT_MESSAGE,
    AUDIO_FORMAT_MESSAGE,
    AUDIO_SHORT_MESSAGE,
    EMPTY_CONTENT_MESSAGE,
    EMPTY_TEXT_MESSAGE,
    FILE_DATA_MESSAGE,
    IMAGE_FORMAT_MESSAGE,
    IMAGE_PART_TOKENS,
    IMAGE_ROLE_MESSAGE,
    IMAGE_URL_MESSAGE,
    INVALID_IMAGE_MESSAGE,
    MISSING_FILE_MESSAGE,
    MISSING_RESULTS,
    NO_VISION_MESSAGE,
    ORPHAN_RESULT,
    FakeModelServer,
    Reply,
    ToolCallSpec,
    Transcript,
    TranscriptionRequest,
    estimate_prompt_tokens,
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


# --------------------------------------------------------------------------- content parts


def _picture(fmt: str = "PNG", size: tuple[int, int] = (64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(out, fmt)
    return out.getvalue()


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _image_part(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def _with_image(url: str, role: str = "user") -> list[dict[str, Any]]:
    """A conversation whose last message (of ``role``) carries the picture."""
    parts = [{"type": "text", "text": "look"}, _image_part(url)]
    if role == "tool":
        return [
            USER,
            _assistant_calls("c1"),
            {"role": "tool", "tool_call_id": "c1", "content": parts},
        ]
    if role == "system":
        return [{"role": "system", "content": parts}, USER]
    return [USER, {"role": role, "content": parts}]


async def _complete(server: FakeModelServer, messages: list[dict[str, Any]]) -> Any:
    return await litellm.acompletion(
        model="openai/fake",
        api_base=server.api_base,
        api_key="sk-test",
        messages=messages,
        timeout=5,
        max_retries=0,
    )


@pytest.mark.parametrize(
    ("fmt", "mime"), [("PNG", "png"), ("JPEG", "jpeg"), ("GIF", "gif"), ("WEBP", "webp")]
)
async def test_data_url_picture_passes(server: FakeModelServer, fmt: str, mime: str) -> None:
    picture = _picture(fmt, (640, 480))
    server.script(Reply(text="a red rectangle"))
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                _image_part(_data_url(picture, f"image/{mime}"), detail="low"),
            ],
        }
    ]
    response = await _complete(server, messages)
    assert response.choices[0].message.content == "a red rectangle"
    assert server.violations == []
    (seen,) = server.image_parts()
    assert seen == picture
    with Image.open(io.BytesIO(seen)) as opened:
        assert opened.size == (640, 480)
    # a picture counts a fixed number of tokens, not the length of its base64
    assert response.usage.prompt_tokens < IMAGE_PART_TOKENS + 100


async def test_streamed_picture_http_url_and_pdf_pass(server: FakeModelServer) -> None:
    pdf = b"%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n%%EOF\n"
    content = [
        {"type": "text", "text": "two things"},
        _image_part("https://example.com/cat.png", detail="high"),
        {
            "type": "file",
            "file": {"filename": "a.pdf", "file_data": _data_url(pdf, "application/pdf")},
        },
        {"type": "file", "file": {"file_id": "file-abc123"}},
    ]
    server.script(Reply(text="seen"))
    assert _text(await _stream(server, [{"role": "user", "content": content}])) == "seen"
    assert server.violations == []
    assert server.image_parts() == []  # an http(s) URL has no bytes here
    assert server.file_parts() == [("a.pdf", pdf)]


async def test_image_parts_by_request_index(server: FakeModelServer) -> None:
    small, large = _picture(size=(8, 8)), _picture(size=(300, 200))
    await _complete(server, [{"role": "user", "content": [_image_part(_data_url(large))]}])
    await _complete(server, [{"role": "user", "content": [_image_part(_data_url(small))]}, USER])
    assert server.image_parts(0) == [large]
    assert server.image_parts() == [small]
    assert server.image_parts(-1) == server.image_parts(1)


async def test_malformed_data_url_is_refused(server: FakeModelServer) -> None:
    with pytest.raises(BadRequestError) as info:
        await _complete(server, _with_image("data:image/png;base64,not*base64!"))
    expected = IMAGE_URL_MESSAGE.format(
        where="messages[1].content[1].image_url.url", reason="an invalid base64-encoded value"
    )
    assert expected in str(info.value)
    assert server.violations == [expected]
    assert len(server.requests) == 1


async def test_non_image_disguised_as_png_is_refused(server: FakeModelServer) -> None:
    server.script(Reply(text="kept"))
    with pytest.raises(BadRequestError) as info:
        await _complete(server, _with_image(_data_url(b"#!/bin/sh\necho not a picture\n")))
    assert INVALID_IMAGE_MESSAGE in str(info.value)
    assert server.violations == [INVALID_IMAGE_MESSAGE]
    # the refused request did not consume the script
    assert (await _complete(server, [USER])).choices[0].message.content == "kept"


async def test_image_in_tool_message_is_refused(server: FakeModelServer) -> None:
    # sent as it is (litellm would move it: see the next test)
    body = {"model": "fake", "messages": _with_image(_data_url(_picture()), role="tool")}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.api_base}/chat/completions", json=body) as resp,
    ):
        assert resp.status == 400
        message = (await resp.json())["error"]["message"]
    assert message == (
        "Invalid 'messages[2]'. Image URLs are only allowed for messages with role 'user', "
        "but this message with role 'tool' contains an image URL."
    )
    assert server.violations == [message]


async def test_litellm_moves_tool_images_into_a_user_message(server: FakeModelServer) -> None:
    """litellm 1.110 hoists media out of tool messages; what arrives is valid."""
    picture = _picture()
    await _complete(server, _with_image(_data_url(picture), role="tool"))
    assert server.violations == []
    tool, user = server.last_messages()[2:]
    assert tool["role"] == "tool" and tool["content"] == [{"type": "text", "text": "look"}]
    assert user["role"] == "user"
    assert user["content"][0]["text"].startswith("[The following images are tool output")
    assert server.image_parts() == [picture]


async def test_image_in_assistant_message_is_refused(server: FakeModelServer) -> None:
    with pytest.raises(BadRequestError) as info:
        await _complete(server, _with_image(_data_url(_picture()), role="assistant"))
    expected = IMAGE_ROLE_MESSAGE.format(i=1, role="assistant")
    assert expected in str(info.value)
    assert server.violations == [expected]
    assert len(server.requests) == 1


async def test_vision_false_refuses_every_picture() -> None:
    async with FakeModelServer(vision=False) as server:
        with pytest.raises(BadRequestError) as info:
            await _complete(server, _with_image(_data_url(_picture())))
        assert NO_VISION_MESSAGE in str(info.value)
        assert server.violations == [NO_VISION_MESSAGE]
        with pytest.raises(BadRequestError):
            await _complete(server, _with_image("https://example.com/cat.png"))
        assert server.violations == [NO_VISION_MESSAGE] * 2
        # text parts are still fine
        text_only = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        assert (await _complete(server, text_only)).choices[0].message.content == "ok"
        assert len(server.violations) == 2


def _user_parts(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


PNG = _picture()
PART_CASES: list[tuple[str, list[dict[str, Any]], str]] = [
    ("empty list", [{"role": "user", "content": []}], EMPTY_CONTENT_MESSAGE.format(i=0)),
    ("empty text", _user_parts({"type": "text", "text": ""}), EMPTY_TEXT_MESSAGE),
    (
        "text not a string",
        _user_parts({"type": "text", "text": 3}),
        "Invalid type for 'messages[0].content[0].text': expected a string, but got an integer "
        "instead.",
    ),
    (
        "part not an object",
        _user_parts("hello"),
        "Invalid type for 'messages[0].content[0]': expected an object, but got a string instead.",
    ),
    (
        "unknown type",
        _user_parts({"type": "video", "video": {}}),
        "Invalid value: 'video'. Supported values are: 'text', 'image_url', 'input_audio', and "
        "'file'.",
    ),
    (
        "missing type",
        _user_parts({"text": "x"}),
        "Missing required parameter: 'messages[0].content[0].type'.",
    ),
    (
        "image_url a string",
        _user_parts({"type": "image_url", "image_url": "https://example.com/a.png"}),
        "Invalid type for 'messages[0].content[0].image_url': expected an object, but got a string "
        "instead.",
    ),
    (
        "bad detail",
        _user_parts(_image_part(_data_url(PNG), detail="ultra")),
        "Invalid value: 'ultra'. Supported values are: 'auto', 'low', and 'high'.",
    ),
    (
        "no data: prefix",
        _user_parts(_image_part(base64.b64encode(PNG).decode())),
        IMAGE_URL_MESSAGE.format(
            where="messages[0].content[0].image_url.url",
            reason="a value without the 'data:' prefix",
        ),
    ),
    (
        "not base64",
        _user_parts(_image_part("data:image/png," + PNG.hex())),
        IMAGE_URL_MESSAGE.format(
            where="messages[0].content[0].image_url.url", reason="an invalid base64-encoded value"
        ),
    ),
    (
        "empty base64",
        _user_parts(_image_part("data:image/png;base64,")),
        IMAGE_URL_MESSAGE.format(
            where="messages[0].content[0].image_url.url", reason="empty base64-encoded bytes"
        ),
    ),
    (
        "not an image MIME type",
        _user_parts(_image_part(_data_url(PNG, "text/plain"))),
        IMAGE_URL_MESSAGE.format(
            where="messages[0].content[0].image_url.url",
            reason="unsupported MIME type 'text/plain'",
        ),
    ),
    (
        "unsupported image type",
        _user_parts(_image_part(_data_url(_picture("BMP"), "image/bmp"))),
        IMAGE_FORMAT_MESSAGE,
    ),
    (
        "jpeg labelled png",
        _user_parts(_image_part(_data_url(_picture("JPEG")))),
        INVALID_IMAGE_MESSAGE,
    ),
    (
        "truncated png",
        _user_parts(_image_part(_data_url(PNG[: len(PNG) // 2]))),
        INVALID_IMAGE_MESSAGE,
    ),
    (
        "image in assistant message",
        _with_image(_data_url(PNG), role="assistant"),
        IMAGE_ROLE_MESSAGE.format(i=1, role="assistant"),
    ),
    (
        "image in system message",
        _with_image(_data_url(PNG), role="system"),
        IMAGE_ROLE_MESSAGE.format(i=0, role="system"),
    ),
    (
        "file part in tool message",
        [
            USER,
            _assistant_calls("c1"),
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": [{"type": "file", "file": {"file_id": "f"}}],
            },
        ],
        "Invalid value: 'file'. Supported values are: 'text'.",
    ),
    (
        "pdf with another MIME type",
        _user_parts({"type": "file", "file": {"file_data": _data_url(b"%PDF-1.4", "text/plain")}}),
        FILE_DATA_MESSAGE.format(
            where="messages[0].content[0].file.file_data",
            reason="unsupported MIME type 'text/plain'",
        ),
    ),
    (
        "pdf that is no PDF",
        _user_parts({"type": "file", "file": {"file_data": _data_url(PNG, "application/pdf")}}),
        FILE_DATA_MESSAGE.format(
            where="messages[0].content[0].file.file_data", reason="bytes that are not a PDF"
        ),
    ),
    (
        "file with neither data nor id",
        _user_parts({"type": "file", "file": {"filename": "a.pdf"}}),
        "Invalid 'messages[0].content[0].file': exactly one of 'file_data' or 'file_id' must be "
        "provided.",
    ),
]


@pytest.mark.parametrize(
    ("messages", "message"), [c[1:] for c in PART_CASES], ids=[c[0] for c in PART_CASES]
)
async def test_content_part_violations(
    server: FakeModelServer, messages: list[dict[str, Any]], message: str
) -> None:
    body = {"model": "fake", "messages": messages}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.api_base}/chat/completions", json=body) as resp,
    ):
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["message"] == message
    assert error["type"] == "invalid_request_error"
    assert server.violations == [message]
    assert server.requests == [body]


async def test_openai_envelope_of_image_errors(server: FakeModelServer) -> None:
    async def post(messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": "fake", "messages": messages}
        async with http.post(f"{server.api_base}/chat/completions", json=body) as resp:
            assert resp.status == 400
            return dict(await resp.json())

    async with aiohttp.ClientSession() as http:
        assert await post(_user_parts(_image_part("ftp://example.com/a.png"))) == {
            "error": {
                "message": IMAGE_URL_MESSAGE.format(
                    where="messages[0].content[0].image_url.url",
                    reason="a value without the 'data:' prefix",
                ),
                "type": "invalid_request_error",
                "param": "messages[0].content[0].image_url.url",
                "code": "invalid_value",
            }
        }
        assert await post(_with_image(_data_url(PNG), role="tool")) == {
            "error": {
                "message": IMAGE_ROLE_MESSAGE.format(i=2, role="tool"),
                "type": "invalid_request_error",
                "param": "messages.[2].content.[1].type",
                "code": None,
            }
        }


def test_token_estimate_counts_pictures_not_base64() -> None:
    big = _picture(size=(2048, 2048))
    assert len(_data_url(big)) > 10_000
    text_only = estimate_prompt_tokens([{"role": "user", "content": "look"}], None)
    with_picture = estimate_prompt_tokens(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "look"}, _image_part(_data_url(big))],
            }
        ],
        None,
    )
    assert IMAGE_PART_TOKENS <= with_picture - text_only < IMAGE_PART_TOKENS + 20
    assert estimate_prompt_tokens([{"role": "user", "content": ["odd", 3, None]}], None) > 0
    assert estimate_prompt_tokens("not a list", "nor this") == 0


async def test_context_limit_counts_a_picture_as_fixed_tokens() -> None:
    picture = _data_url(_picture(size=(1500, 1500)))
    async with FakeModelServer(context_limit=IMAGE_PART_TOKENS + 200) as server:
        await _complete(server, [{"role": "user", "content": [_image_part(picture)]}])
        with pytest.raises(ContextWindowExceededError):
            await _complete(server, [{"role": "user", "content": [_image_part(picture)] * 2}])
        assert server.violations == []


# --------------------------------------------------------------------------- transcriptions


def _wav(path: Path, seconds: float = 0.5, rate: int = 16_000) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(b"\x00\x01" * int(rate * seconds))
    return path


async def _transcribe(
    server: FakeModelServer, path: Path, model: str = "whisper-1", **kwargs: Any
) -> Any:
    params: dict[str, Any] = {"timeout": 5, "max_retries": 0}
    params.update(kwargs)
    with path.open("rb") as audio:
        return await litellm.atranscription(
            model=model, file=audio, api_base=server.api_base, api_key="sk-test", **params
        )


async def _post_form(server: FakeModelServer, form: aiohttp.FormData) -> tuple[int, str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.api_base}/audio/transcriptions", data=form) as resp,
    ):
        raw = await resp.text()
        body = json.loads(raw) if resp.content_type == "application/json" else raw
        return resp.status, resp.content_type, body


def _form(data: bytes | None, filename: str = "note.wav", **fields: str) -> aiohttp.FormData:
    form = aiohttp.FormData(default_to_multipart=True)
    for name, value in {"model": "whisper-1", **fields}.items():
        form.add_field(name, value)
    if data is not None:
        form.add_field("file", io.BytesIO(data), filename=filename, content_type="audio/wav")
    return form


@pytest.mark.parametrize("model", ["whisper-1", "openai/whisper-1"])
async def test_transcription_returns_scripted_text(
    server: FakeModelServer, tmp_path: Path, model: str
) -> None:
    path = _wav(tmp_path / "note.wav")
    server.transcribe_script("hello there")
    result = await _transcribe(server, path, model=model)
    assert result.text == "hello there"
    (seen,) = server.transcriptions
    data = path.read_bytes()
    assert seen == TranscriptionRequest(
        model="whisper-1",  # litellm strips the provider prefix
        filename="note.wav",
        content_type="audio/x-wav",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        data=data,
        fields={"response_format": "verbose_json"},  # litellm asks whisper-1 for durations
        authorization="Bearer sk-test",
    )
    assert seen.response_format == "verbose_json"
    assert (seen["model"], seen["size"]) == ("whisper-1", len(data))  # reads like a dict too
    with pytest.raises(KeyError):
        seen["nope"]
    assert server.violations == []
    assert server.requests == []  # nothing went to the chat endpoint


async def test_transcripts_fifo_then_transcriber_then_default(
    server: FakeModelServer, tmp_path: Path
) -> None:
    path = _wav(tmp_path / "voice.wav")
    server.transcribe_script("one", Transcript("two", language="german"))
    assert (await _transcribe(server, path)).text == "one"
    assert (await _transcribe(server, path, language="de")).text == "two"
    assert server.transcriptions[1].language == "de"
    assert len(server.transcripts) == 0
    server.transcriber = lambda record: f"heard {record.size} bytes"
    size = path.stat().st_size
    assert (await _transcribe(server, path)).text == f"heard {size} bytes"
    server.transcriber = None
    default = (await _transcribe(server, path)).text
    assert default.startswith(f"Transcript of voice.wav ({size} bytes, sha256 ")
    assert (await _transcribe(server, path)).text == default  # deterministic
    await server.wait_transcriptions(5)


async def test_transcription_response_formats(server: FakeModelServer, tmp_path: Path) -> None:
    data = _wav(tmp_path / "a.wav", seconds=2.0).read_bytes()
    text = "Hello there. How are you?"
    server.transcribe_script(*[text] * 6)
    assert await _post_form(server, _form(data)) == (200, "application/json", {"text": text})
    assert await _post_form(server, _form(data, response_format="text")) == (
        200,
        "text/plain",
        text + "\n",
    )
    status, _, verbose = await _post_form(
        server, _form(data, response_format="verbose_json", language="de", temperature="0.2")
    )
    assert status == 200
    assert verbose["task"] == "transcribe"
    assert verbose["language"] == "german"
    assert verbose["duration"] == 2.0  # read from the WAV
    assert verbose["text"] == text
    assert [s["text"] for s in verbose["segments"]] == [" Hello there.", " How are you?"]
    assert verbose["segments"][-1]["end"] == 2.0
    assert server.transcriptions[-1].temperature == 0.2
    assert await _post_form(server, _form(data, response_format="srt")) == (
        200,
        "text/plain",
        "1\n00:00:00,000 --> 00:00:01,000\nHello there.\n\n"
        "2\n00:00:01,000 --> 00:00:02,000\nHow are you?\n",
    )
    _, _, vtt = await _post_form(server, _form(data, response_format="vtt"))
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nHello there.\n")
    result = await _transcribe(server, tmp_path / "a.wav", response_format="text")
    assert result.text == text + "\n"  # OpenAI ends a text transcript with a newline


async def test_transcription_bad_extension_is_refused(
    server: FakeModelServer, tmp_path: Path
) -> None:
    path = tmp_path / "note.txt"
    path.write_bytes(_wav(tmp_path / "real.wav").read_bytes())
    server.transcribe_script("kept")
    with pytest.raises(BadRequestError) as info:
        await _transcribe(server, path)
    assert AUDIO_FORMAT_MESSAGE == (
        "Invalid file format. Supported formats: ['flac', 'm4a', 'mp3', 'mp4', 'mpeg', 'mpga', "
        "'oga', 'ogg', 'wav', 'webm']"
    )
    assert AUDIO_FORMAT_MESSAGE in str(info.value)
    assert server.violations == [AUDIO_FORMAT_MESSAGE]
    assert server.transcriptions[0].filename == "note.txt"
    assert list(server.transcripts) == [Transcript("kept")]  # not consumed
    status, _, body = await _post_form(server, _form(path.read_bytes(), filename="noextension"))
    assert (status, body["error"]["param"]) == (400, None)


async def test_transcription_missing_file_envelope(server: FakeModelServer) -> None:
    assert await _post_form(server, _form(None)) == (
        400,
        "application/json",
        {
            "error": {
                "message": MISSING_FILE_MESSAGE,
                "type": "invalid_request_error",
                "param": "file",
                "code": None,
            }
        },
    )
    assert server.transcriptions[0].filename is None
    assert server.violations == [MISSING_FILE_MESSAGE]


async def test_transcription_over_25_mb_is_refused(server: FakeModelServer, tmp_path: Path) -> None:
    path = tmp_path / "long.mp3"
    path.write_bytes(b"ID3" + bytes(26_214_400))
    with pytest.raises(APIError) as info:  # litellm raises APIError for OpenAI's 413
        await _transcribe(server, path, timeout=30)
    assert info.value.status_code == 413
    assert "Maximum content size limit (26214400) exceeded (" in str(info.value)
    assert server.transcriptions[0].size == 26_214_403
    status, _, body = await _post_form(server, _form(bytes(26_214_400), filename="a.mp3"))
    assert status == 413
    assert body["error"]["type"] == "server_error"
    assert body["error"]["message"].startswith("Maximum content size limit (26214400) exceeded (")
    # just under the limit is taken
    small = path.with_name("ok.mp3")
    small.write_bytes(b"ID3" + bytes(1_000_000))
    assert (await _transcribe(server, small)).text.startswith("Transcript of ok.mp3")


async def test_transcription_checks_the_audio(server: FakeModelServer, tmp_path: Path) -> None:
    garbage = tmp_path / "voice.ogg"
    garbage.write_bytes(b"<html>not audio</html>")
    with pytest.raises(BadRequestError) as info:
        await _transcribe(server, garbage)
    assert AUDIO_CORRUPT_MESSAGE in str(info.value)
    with pytest.raises(BadRequestError) as info:
        await _transcribe(server, _wav(tmp_path / "blip.wav", seconds=0.05))
    assert AUDIO_SHORT_MESSAGE in str(info.value)
    assert server.violations == [AUDIO_CORRUPT_MESSAGE, AUDIO_SHORT_MESSAGE]
    # any container Whisper takes, under any of its extensions
    opus = tmp_path / "voice.oga"
    opus.write_bytes(b"OggS" + bytes(4000))
    assert (await _transcribe(server, opus)).text
    async with FakeModelServer(check_audio=False) as lax:
        assert (await _transcribe(lax, garbage)).text.startswith("Transcript of voice.ogg")


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"response_format": "xml"}, "Invalid value: 'xml'. Supported values are: 'json', "),
        ({"language": "English"}, "Invalid language 'English'."),
        ({"temperature": "1.5"}, "decimal above maximum value"),
        ({"temperature": "warm"}, "expected a decimal"),
        ({"model": ""}, "you must provide a model parameter"),
    ],
)
async def test_transcription_form_violations(
    server: FakeModelServer, tmp_path: Path, fields: dict[str, str], fragment: str
) -> None:
    status, _, body = await _post_form(
        server, _form(_wav(tmp_path / "a.wav").read_bytes(), **fields)
    )
    assert status == 400
    assert fragment in body["error"]["message"]
    assert server.violations == [body["error"]["message"]]


async def test_transcription_needs_multipart(server: FakeModelServer) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.api_base}/audio/transcriptions", json={"model": "whisper-1"}) as resp,
    ):
        assert resp.status == 400
        message = (await resp.json())["error"]["message"]
    assert message.startswith("Invalid Content-Type header (application/json), expected multipart")
    assert server.transcriptions == []


async def test_transcription_faults(server: FakeModelServer, tmp_path: Path) -> None:
    path = _wav(tmp_path / "a.wav")
    server.transcribe_script(Transcript(fault="500"), Transcript(fault="429", retry_after=4))
    with pytest.raises(InternalServerError):
        await _transcribe(server, path)
    with pytest.raises(RateLimitError) as info:
        await _transcribe(server, path)
    assert info.value.response.headers["retry-after"] == "4"
    server.transcribe_script(Transcript(fault="hang"), "after the hang")
    with pytest.raises(Timeout):
        await _transcribe(server, path, timeout=0.5)
    assert (await _transcribe(server, path)).text == "after the hang"
    assert len(server.transcriptions) == 4
    with pytest.raises(ValueError, match="unknown fault"):
        Transcript(fault="drop")


async def test_transcription_delay(tmp_path: Path) -> None:
    path = _wav(tmp_path / "a.wav")
    async with FakeModelServer(transcription_delay_s=0.3) as server:
        started = time.monotonic()
        await _transcribe(server, path)
        assert time.monotonic() - started >= 0.3
        server.transcription_delay_s = 0.0
        started = time.monotonic()
        await _transcribe(server, path)
        assert time.monotonic() - started < 0.3
