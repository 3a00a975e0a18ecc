"""A strict fake OpenAI-compatible Chat Completions server for tests and benchmarks.

The real litellm client talks to it over HTTP::

    async with FakeModelServer() as server:
        server.script(Reply(text="hello"))
        await litellm.acompletion(
            model="openai/fake", api_base=server.api_base, api_key="sk-test", ...
        )

Every request is validated as strictly as OpenAI *and* Anthropic would: tool
results must immediately follow the assistant message that requested them,
every requested call must be answered exactly once, no tool result may be an
orphan, ``system`` may only be the first message.  Violations are answered with
OpenAI's exact HTTP 400 envelope and recorded in ``violations``.

Replies are scripted (FIFO, one per accepted request) or produced by
``responder``; a reply may carry a fault ("429", "500", "hang", "drop",
"context").  Requests rejected by validation or by ``context_limit`` do not
consume a scripted reply.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web

__all__ = ["FakeModelServer", "Reply", "ToolCallSpec"]

FAULTS = frozenset({"429", "500", "hang", "drop", "context"})
VALID_ROLES = frozenset({"system", "user", "assistant", "tool"})

MISSING_RESULTS = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding "
    "to each 'tool_call_id'. The following tool_call_ids did not have response messages: {ids}"
)
ORPHAN_RESULT = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
    "message with 'tool_calls'."
)
RATE_LIMIT_MESSAGE = "Rate limit reached for requests"
SERVER_ERROR_MESSAGE = "The server had an error while processing your request."
CONTEXT_MESSAGE = (
    "This model's maximum context length is {limit} tokens. However, your messages resulted "
    "in {n} tokens. Please reduce the length of the messages."
)


@dataclass
class ToolCallSpec:
    """One tool call the fake model makes."""

    name: str
    arguments: dict[str, Any] | str  # a str is sent verbatim (may be malformed JSON)
    id: str | None = None  # default: a generated unique "call_<n>"


@dataclass
class Reply:
    """One scripted model answer (or fault)."""

    text: str = ""
    tool_calls: list[ToolCallSpec] = field(default_factory=list)
    chunk_size: int = 4  # characters per streamed content/arguments fragment
    chunk_delay: float = 0.0  # seconds between streamed chunks
    fault: str | None = None  # None | "429" | "500" | "hang" | "drop" | "context"
    retry_after: int = 1  # seconds, for "429"
    usage: tuple[int, int] | None = None  # (prompt, completion); default: estimated

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {sorted(FAULTS)}")
        if self.chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")


@dataclass
class _Violation:
    message: str
    param: str


def estimate_prompt_tokens(messages: Any, tools: Any) -> int:
    """Rough prompt size: characters of the JSON-encoded messages and tools, divided by 4."""
    payload: list[Any] = list(messages) if isinstance(messages, list) else []
    if isinstance(tools, list):
        payload += tools
    return len(json.dumps(payload)) // 4


def _error_body(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


# --------------------------------------------------------------------------- validation


def _check_message_shape(i: int, msg: Any) -> _Violation | None:
    """Per-message checks that do not depend on neighbours."""
    if not isinstance(msg, dict):
        return _Violation(
            f"Invalid type for 'messages[{i}]': expected an object.", f"messages.[{i}]"
        )
    role = msg.get("role")
    param = f"messages.[{i}].role"
    if role not in VALID_ROLES:
        return _Violation(
            f"Invalid value: {role!r}. Supported values are: 'system', 'user', 'assistant' "
            "and 'tool'.",
            param,
        )
    if role == "system" and i != 0:
        return _Violation(
            f"Invalid 'messages[{i}]': a 'system' message may only appear as the first message.",
            param,
        )
    content = msg.get("content")
    if role == "assistant":
        if content is None and msg.get("tool_calls") is None:
            return _Violation(
                f"Invalid 'messages[{i}]': an assistant message must have 'content' or "
                "'tool_calls'.",
                param,
            )
    elif not isinstance(content, str | list):
        return _Violation(
            f"Invalid 'messages[{i}].content': expected a string or an array, got "
            f"{type(content).__name__}.",
            param,
        )
    if role == "tool" and not isinstance(msg.get("tool_call_id"), str):
        return _Violation(
            f"Invalid 'messages[{i}]': a 'tool' message must have a string 'tool_call_id'.",
            param,
        )
    return None


def _check_tool_calls(i: int, tool_calls: Any, seen_ids: set[str]) -> _Violation | None:
    """Shape of an assistant's ``tool_calls`` and global id uniqueness."""
    param = f"messages.[{i}].role"
    if not isinstance(tool_calls, list) or not tool_calls:
        return _Violation(f"Invalid 'messages[{i}].tool_calls': expected a non-empty array.", param)
    for j, call in enumerate(tool_calls):
        where = f"messages[{i}].tool_calls[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not call["id"]:
            return _Violation(f"Invalid '{where}': missing required 'id'.", param)
        if call.get("type", "function") != "function":
            return _Violation(f"Invalid '{where}.type': expected 'function'.", param)
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return _Violation(f"Invalid '{where}.function': missing required 'name'.", param)
        if not isinstance(function.get("arguments"), str):
            return _Violation(
                f"Invalid '{where}.function.arguments': expected a string, got "
                f"{type(function.get('arguments')).__name__}.",
                param,
            )
        if call["id"] in seen_ids:
            return _Violation(
                f"Invalid '{where}.id': duplicate tool_call_id {call['id']!r} in the request.",
                param,
            )
        seen_ids.add(call["id"])
    return None


def _check_tool_run(
    i: int, requested: list[str], messages: list[dict[str, Any]]
) -> tuple[_Violation | None, int]:
    """Check the contiguous run of tool messages after assistant message ``i``.

    Returns the first violation (if any) and the index of the first message after the run.
    """
    answered: set[str] = set()
    k = i + 1
    run: list[tuple[int, str]] = []
    while k < len(messages) and messages[k].get("role") == "tool":
        run.append((k, messages[k]["tool_call_id"]))
        k += 1
    missing = [cid for cid in requested if cid not in {tid for _, tid in run}]
    if missing:
        return _Violation(MISSING_RESULTS.format(ids=", ".join(missing)), f"messages.[{i}].role"), k
    for idx, tid in run:
        if tid not in requested:
            return _Violation(ORPHAN_RESULT, f"messages.[{idx}].role"), k
        if tid in answered:
            return _Violation(
                f"Invalid 'messages[{idx}]': duplicate tool result for tool_call_id {tid!r}.",
                f"messages.[{idx}].role",
            ), k
        answered.add(tid)
    return None, k


def validate_messages(messages: Any) -> _Violation | None:
    """Return the first problem with ``messages`` (OpenAI + Anthropic rules), or None."""
    if not isinstance(messages, list) or not messages:
        return _Violation("Invalid 'messages': expected a non-empty array.", "messages")
    for i, msg in enumerate(messages):
        problem = _check_message_shape(i, msg)
        if problem is not None:
            return problem
    seen_ids: set[str] = set()
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg["role"] == "tool":
            return _Violation(ORPHAN_RESULT, f"messages.[{i}].role")
        if msg["role"] == "assistant" and "tool_calls" in msg and msg["tool_calls"] is not None:
            problem = _check_tool_calls(i, msg["tool_calls"], seen_ids)
            if problem is not None:
                return problem
            requested = [call["id"] for call in msg["tool_calls"]]
            problem, i = _check_tool_run(i, requested, messages)
            if problem is not None:
                return problem
            continue
        i += 1
    return None


# --------------------------------------------------------------------------- server


class FakeModelServer:
    """A strict, scriptable OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    def __init__(self, *, context_limit: int | None = None, port: int = 0) -> None:
        self._port = port
        self.context_limit = context_limit
        self.api_base: str = ""
        self.responder: Callable[[list[dict[str, Any]]], Reply] | None = None
        self.requests: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self._queue: deque[Reply] = deque()
        self._call_ids = itertools.count(1)
        self._completion_ids = itertools.count(1)
        self._arrived = asyncio.Condition()
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("server already started")
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/chat/completions", self._handle)
        # handler_cancellation: a hung handler is cancelled when its client goes away.
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self._port)
        await site.start()
        self._runner = runner
        port = runner.addresses[0][1]
        self.api_base = f"http://127.0.0.1:{port}/v1"

    async def close(self) -> None:
        self._closing.set()  # releases every "hang" handler
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> FakeModelServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ test API

    def script(self, *replies: Reply) -> None:
        """Queue replies; each accepted request consumes one (FIFO)."""
        self._queue.extend(replies)

    async def wait_requests(self, n: int, timeout: float = 5.0) -> None:
        """Wait until at least ``n`` requests have been received (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests) >= n)

    def last_messages(self) -> list[dict[str, Any]]:
        if not self.requests:
            raise AssertionError("no request received yet")
        messages = self.requests[-1].get("messages", [])
        return messages if isinstance(messages, list) else []

    # ------------------------------------------------------------------ handler

    async def _record(self, body: dict[str, Any]) -> None:
        async with self._arrived:
            self.requests.append(body)
            self._arrived.notify_all()

    def _reject(self, problem: _Violation) -> web.Response:
        self.violations.append(problem.message)
        return web.json_response(
            _error_body(problem.message, "invalid_request_error", problem.param, None),
            status=400,
        )

    def _context_error(self, n: int) -> web.Response:
        limit = self.context_limit if self.context_limit is not None else max(n - 1, 0)
        message = CONTEXT_MESSAGE.format(limit=limit, n=n)
        return web.json_response(
            _error_body(message, "invalid_request_error", "messages", "context_length_exceeded"),
            status=400,
        )

    def _next_reply(self, messages: list[dict[str, Any]]) -> Reply:
        if self._queue:
            return self._queue.popleft()
        if self.responder is not None:
            return self.responder(messages)
        return Reply(text="ok")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return self._reject(
                _Violation("We could not parse the JSON body of your request.", "body")
            )
        await self._record(body)
        messages = body.get("messages")
        problem = validate_messages(messages)
        if problem is not None:
            return self._reject(problem)
        assert isinstance(messages, list)
        prompt_tokens = estimate_prompt_tokens(messages, body.get("tools"))
        if self.context_limit is not None and prompt_tokens > self.context_limit:
            return self._context_error(prompt_tokens)

        reply = self._next_reply(messages)
        if reply.fault is not None:
            fault_response = await self._fault(request, reply, prompt_tokens)
            if fault_response is not None:
                return fault_response
        stream_options = body.get("stream_options") or {}
        if body.get("stream"):
            include_usage = isinstance(stream_options, dict) and bool(
                stream_options.get("include_usage")
            )
            return await self._stream(request, body, reply, prompt_tokens, include_usage)
        completion = self._completion(body, reply, prompt_tokens)
        if reply.fault == "drop":
            return await self._drop_json(request, completion)
        return web.json_response(completion)

    async def _fault(
        self, request: web.Request, reply: Reply, prompt_tokens: int
    ) -> web.StreamResponse | None:
        """Answer a non-streaming fault; None means carry on (the "drop" fault streams)."""
        if reply.fault == "429":
            return web.json_response(
                _error_body(RATE_LIMIT_MESSAGE, "requests", None, "rate_limit_exceeded"),
                status=429,
                headers={"retry-after": str(reply.retry_after)},
            )
        if reply.fault == "500":
            return web.json_response(
                _error_body(SERVER_ERROR_MESSAGE, "server_error", None, None), status=500
            )
        if reply.fault == "context":
            return self._context_error(max(prompt_tokens, (self.context_limit or 0) + 1))
        if reply.fault == "hang":
            # Never answers; the client's timeout fires and its disconnect cancels this
            # handler, or close() releases it.
            await self._closing.wait()
            if request.transport is not None:
                request.transport.close()  # still no answer: just hang up
            return web.Response()
        return None

    # ------------------------------------------------------------------ answers

    def _resolve_calls(self, reply: Reply) -> list[tuple[str, str, str]]:
        calls: list[tuple[str, str, str]] = []
        for spec in reply.tool_calls:
            call_id = spec.id or f"call_{next(self._call_ids)}"
            args = spec.arguments if isinstance(spec.arguments, str) else json.dumps(spec.arguments)
            calls.append((call_id, spec.name, args))
        return calls

    @staticmethod
    def _usage(
        reply: Reply, prompt_tokens: int, calls: list[tuple[str, str, str]]
    ) -> dict[str, int]:
        if reply.usage is not None:
            prompt, completion = reply.usage
        else:
            produced = len(reply.text) + sum(len(name) + len(args) for _, name, args in calls)
            prompt, completion = prompt_tokens, max(1, produced // 4)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _completion(self, body: dict[str, Any], reply: Reply, prompt_tokens: int) -> dict[str, Any]:
        calls = self._resolve_calls(reply)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in calls
            ]
        return {
            "id": f"chatcmpl-{next(self._completion_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model", "fake")),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": self._usage(reply, prompt_tokens, calls),
        }

    @staticmethod
    async def _drop_json(request: web.Request, completion: dict[str, Any]) -> web.StreamResponse:
        """Send half of a non-streamed body (with the full Content-Length), then cut."""
        data = json.dumps(completion).encode()
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.content_length = len(data)
        await response.prepare(request)
        try:
            await response.write(data[: len(data) // 2])
        except ConnectionError:
            return response
        if request.transport is not None:
            request.transport.close()
        return response

    def _chunks(
        self, body: dict[str, Any], reply: Reply, prompt_tokens: int, include_usage: bool
    ) -> list[dict[str, Any]]:
        calls = self._resolve_calls(reply)
        base: dict[str, Any] = {
            "id": f"chatcmpl-{next(self._completion_ids)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": str(body.get("model", "fake")),
        }

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            return {**base, "choices": [choice]}

        chunks = [chunk({"role": "assistant", "content": ""})]
        chunks += [chunk({"content": piece}) for piece in _pieces(reply.text, reply.chunk_size)]
        for index, (call_id, name, args) in enumerate(calls):
            first = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            chunks.append(chunk({"tool_calls": [first]}))
            chunks += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                for piece in _pieces(args, reply.chunk_size)
            ]
        chunks.append(chunk({}, "tool_calls" if calls else "stop"))
        if include_usage:
            usage = self._usage(reply, prompt_tokens, calls)
            chunks.append({**base, "choices": [], "usage": usage})
        return chunks

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        reply: Reply,
        prompt_tokens: int,
        include_usage: bool,
    ) -> web.StreamResponse:
        chunks = self._chunks(body, reply, prompt_tokens, include_usage)
        dropping = reply.fault == "drop"
        if dropping:
            chunks = chunks[: max(1, len(chunks) // 2)]
        response = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        await response.prepare(request)
        events = [b"data: " + json.dumps(payload).encode() + b"\n\n" for payload in chunks]
        if not dropping:
            events.append(b"data: [DONE]\n\n")
        try:
            if reply.chunk_delay > 0:
                for n, event in enumerate(events):
                    if n:
                        await asyncio.sleep(reply.chunk_delay)
                    await response.write(event)
            else:
                # One write: the client still sees separate SSE events, and the server stays
                # fast enough for benchmarks.
                await response.write(b"".join(events))
            if dropping:
                if request.transport is not None:
                    request.transport.close()  # flush what was sent, then cut the connection
                return response
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away mid-stream
        return response
