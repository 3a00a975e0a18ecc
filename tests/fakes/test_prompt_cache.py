"""The fake model's prompt cache, through the real litellm client: usage in OpenAI's and
Anthropic's shapes, the 5-minute lifetime, and Anthropic's checks of `cache_control`."""

from __future__ import annotations

from typing import Any

import litellm
import pytest

from tests.fakes.model_server import FakeModelServer
from tests.fakes.prompt_cache import LOOKBACK_BLOCKS, TTL_S, blocks

SYSTEM = "You are a careful assistant. " * 100
BREAK = {"type": "ephemeral"}


def marked(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": BREAK}]


async def call(server: FakeModelServer, messages: list[dict[str, Any]]) -> Any:
    stream = await litellm.acompletion(
        model="openai/claude-fake", api_base=server.api_base, api_key="sk-test",
        messages=messages, stream=True, stream_options={"include_usage": True})
    usage = None
    async for chunk in stream:
        usage = getattr(chunk, "usage", None) or usage
    assert usage is not None
    return usage


def talk(turns: int, *, marks: bool) -> list[dict[str, Any]]:
    """A system prompt and `turns` user messages; with `marks`, breakpoints on the system
    prompt and on the newest message."""
    messages: list[dict[str, Any]] = [{"role": "system",
                                       "content": marked(SYSTEM) if marks else SYSTEM}]
    for n in range(turns):
        messages.append({"role": "user", "content": f"question {n}: " + "words " * 40})
        messages.append({"role": "assistant", "content": f"answer {n}"})
    messages.append({"role": "user", "content": "and now?"})
    if marks:
        messages[-1] = {**messages[-1], "content": marked("and now?")}
    return messages


async def test_openai_reports_the_longest_prefix_shared_with_an_earlier_request() -> None:
    async with FakeModelServer(cache="openai") as server:
        first = await call(server, talk(1, marks=False))
        second = await call(server, talk(2, marks=False))
        other = await call(server, [{"role": "system", "content": "another prompt"},
                                    {"role": "user", "content": "hi"}])
    assert first.prompt_tokens_details.cached_tokens == 0
    shared = second.prompt_tokens_details.cached_tokens
    # everything of the first request but its last message is the second's beginning
    assert 0.7 * first.prompt_tokens < shared < first.prompt_tokens < second.prompt_tokens
    assert other.prompt_tokens_details.cached_tokens == 0
    assert not getattr(second, "cache_creation_input_tokens", None)


async def test_anthropic_caches_only_at_breakpoints_and_reports_reads_and_writes() -> None:
    async with FakeModelServer(cache="anthropic") as server:
        plain = [await call(server, talk(n, marks=False)) for n in (1, 2)]
        first = await call(server, talk(1, marks=True))
        second = await call(server, talk(2, marks=True))
    assert [u.cache_read_input_tokens for u in plain] == [0, 0]  # no breakpoint, no cache
    assert [u.cache_creation_input_tokens for u in plain] == [0, 0]
    assert first.cache_read_input_tokens == 0
    assert first.cache_creation_input_tokens == first.prompt_tokens  # up to the last mark
    # the second reads the system prompt's entry: its first user message differs from
    # the first request's last one ("and now?"), so only the system prompt is shared
    assert 0 < second.cache_read_input_tokens < first.prompt_tokens
    assert second.cache_read_input_tokens + second.cache_creation_input_tokens == \
        second.prompt_tokens
    assert second.prompt_tokens_details.cached_tokens == second.cache_read_input_tokens


async def test_a_breakpoint_reads_an_entry_up_to_20_blocks_back_and_no_further() -> None:
    def later(extra: int) -> list[dict[str, Any]]:
        """The first request and `extra` messages more, marked only at the end."""
        messages = talk(1, marks=False) + [{"role": "user", "content": f"more {i}"}
                                           for i in range(extra)]
        messages[-1] = {**messages[-1], "content": marked(messages[-1]["content"])}
        return messages

    async with FakeModelServer(cache="anthropic") as server:
        await call(server, talk(1, marks=True))  # writes an entry ending at "and now?"
        miss = await call(server, later(LOOKBACK_BLOCKS + 1))
        hit = await call(server, later(LOOKBACK_BLOCKS))
    assert len(blocks({"messages": later(LOOKBACK_BLOCKS)})) - \
        len(blocks({"messages": talk(1, marks=False)})) == LOOKBACK_BLOCKS
    assert hit.cache_read_input_tokens > 0
    assert miss.cache_read_input_tokens == 0


async def test_entries_live_five_minutes() -> None:
    now = [1000.0]
    async with FakeModelServer(cache="openai", clock=lambda: now[0]) as server:
        await call(server, talk(1, marks=False))
        now[0] += TTL_S - 1
        kept = await call(server, talk(1, marks=False))
        now[0] += TTL_S + 1
        gone = await call(server, talk(1, marks=False))
    assert kept.prompt_tokens_details.cached_tokens > 0
    assert gone.prompt_tokens_details.cached_tokens == 0


@pytest.mark.parametrize(("change", "message"), [
    ("five", "A maximum of 4 blocks with cache_control may be provided. Found 5."),
    ("empty", "messages.2.content.0.text: cache_control cannot be set for empty text blocks"),
    ("persistent", "messages.0.cache_control.type: Input should be 'ephemeral'"),
    ("call", "messages.2.tool_calls.0: cache_control is not permitted on this block"),
])
async def test_breakpoints_anthropic_refuses_are_refused_with_its_error(
        change: str, message: str) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "hello"},
                                      {"role": "user", "content": "bye"}]
    if change == "five":
        messages = [{**m, "content": marked(str(m["content"]))} for m in messages]
        messages.append({"role": "assistant", "content": marked("one too many")})
    elif change == "empty":
        messages[2] = {"role": "assistant", "content": marked(" ")}
    elif change == "persistent":
        messages[0] = {**messages[0], "cache_control": {"type": "persistent"}}
    else:
        call_ = {"id": "c1", "type": "function", "cache_control": BREAK,
                 "function": {"name": "f", "arguments": "{}"}}
        messages[2] = {"role": "assistant", "content": None, "tool_calls": [call_]}
        messages.insert(3, {"role": "tool", "tool_call_id": "c1", "content": "done"})
    async with FakeModelServer(cache="anthropic") as server:
        with pytest.raises(litellm.BadRequestError) as refused:
            await call(server, messages)
    assert message in str(refused.value)
    assert server.violations == [message]
