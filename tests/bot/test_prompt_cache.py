"""Prompt caching: breakpoints where the provider needs them (valid for Anthropic's
checks), cached tokens counted in the metrics, `/status`, the audit log, the budgets and
the cost, on both usage shapes; and a trim that keeps the prefix until the low-water mark."""

from __future__ import annotations

import json
from typing import Any

import litellm
import pytest

from bot.core.config import Config
from bot.core.events import Command, Notice
from bot.llm.caching import MARK, for_model, mark, needs_breakpoints
from bot.ops import metrics
from bot.turn.compaction import SUMMARY_PROMPT
from tests.conftest import Core, make_config
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec, estimate_prompt_tokens
from tests.fakes.prompt_cache import PromptCache

CLAUDE = "openai/claude-cache-test"
"""Claude behind an OpenAI-compatible gateway (the fake): it needs breakpoints."""
CLAUDE_PRICES = {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05,
                 "cache_read_input_token_cost": 3e-07,
                 "cache_creation_input_token_cost": 3.75e-06,
                 "litellm_provider": "openai", "mode": "chat", "max_input_tokens": 200_000}


def breakpoints(value: Any) -> int:
    if isinstance(value, dict):
        return (MARK in value) + sum(breakpoints(v) for v in value.values())
    if isinstance(value, list):
        return sum(breakpoints(v) for v in value)
    return 0


# -- the marks, made breakpoints or removed --------------------------------------------


def test_marks_become_breakpoints_for_claude_and_vanish_for_openai() -> None:
    system = mark({"role": "system", "content": "persona"})
    history = [mark({"role": "user", "content": f"q{n}"}) for n in range(5)]
    empty = mark({"role": "assistant", "content": ""})
    messages = [system, *history, empty, {"role": "user", "content": "note"}]
    claude = for_model("anthropic/claude-sonnet-4-5", messages)
    assert breakpoints(claude) == 4  # the system prompt's and the newest three
    assert claude[0]["content"] == [{"type": "text", "text": "persona",
                                     MARK: {"type": "ephemeral"}}]
    assert claude[5]["content"][0]["text"] == "q4" and MARK in claude[5]["content"][0]
    assert claude[2] == {"role": "user", "content": "q1"}  # beyond four: a plain message
    assert claude[6] == {"role": "assistant", "content": ""}  # nothing to sit on
    plain = [{k: v for k, v in m.items() if k != MARK} for m in messages]
    assert for_model("openai/gpt-4o", messages) == plain
    assert for_model("deepseek/deepseek-chat", messages) == plain
    for model in ("bedrock/anthropic.claude-3-5-sonnet", "vertex_ai/claude-sonnet-4-5",
                  "openrouter/anthropic/claude-sonnet-4.5", "gemini/gemini-2.5-pro",
                  "vertex_ai/gemini-2.5-pro", "openrouter/google/gemini-2.5-pro",
                  "openai/claude-sonnet-4-5", "anthropic.claude-3-haiku"):
        assert needs_breakpoints(model), model
    for model in ("openai/gpt-4o", "xai/grok-4", "deepseek/deepseek-chat", "gpt-4o-mini",
                  "openai/gemini-2.5-flash"):  # Google's OpenAI-compatible endpoint
        assert not needs_breakpoints(model), model


# -- counted everywhere ----------------------------------------------------------------


@pytest.fixture
def claude_prices() -> Any:
    litellm.register_model({CLAUDE: CLAUDE_PRICES})
    yield
    litellm.model_cost.pop(CLAUDE, None)


def expected_usage(server: FakeModelServer, shape: str) -> list[tuple[int, int]]:
    """(read, written) of each request, replayed through a cache of the same rules."""
    cache = PromptCache(shape)
    out = []
    for body in server.requests:
        prompt = estimate_prompt_tokens(body["messages"], body.get("tools"))
        usage = cache.usage(body, prompt)
        read = usage.get("cache_read_input_tokens") or \
            usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        out.append((read, usage.get("cache_creation_input_tokens", 0)))
    return out


@pytest.mark.parametrize(("shape", "model"), [("anthropic", CLAUDE), ("openai", "openai/gpt-4o")])
async def test_cached_tokens_are_counted_in_metrics_status_audit_budget_and_cost(
        tmp_path: Any, claude_prices: Any, shape: str, model: str) -> None:
    server = FakeModelServer(cache=shape)
    await server.start()
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "plan.txt").write_text("ship on friday\n" * 50)
    server.script(Reply(text="Hello, team."),
                  Reply(tool_calls=[ToolCallSpec("read_file", {"path": "plan.txt"})]),
                  Reply(text="The plan says friday."), Reply(text="Yes."), Reply(text="Done."))
    config = make_config(tmp_path, server, llm__model=model, metrics__listen="127.0.0.1:0",
                         limits__budget={"per_conversation_day": {"cost": 100.0}})
    try:
        async with Core(config) as core:
            for n, text in enumerate(["hi all", "what does the plan say?", "friday?", "ok"]):
                await core.say(text)
                await core.sink.ended(n + 1)
                await core.hub.idle()
            await core.hub.submit(Command(core.key, core.user, "status", ""))
            [status] = await core.sink.wait(lambda: [n for n in core.sink.of(Notice)
                                                     if "Prompt cache" in n.text])
            watcher = metrics.of(core.hub.d.watch.watchers)
            assert watcher is not None
            body = (await watcher.render())[0].decode()
            await core.hub.d.watch.flush()
            rows = await core.hub.d.store.audit()
            audit = [json.loads(r.detail) for r in rows if r.kind == "usage"]
            await core.hub.submit(Command(core.key, core.user, "audit", ""))
            [shown] = await core.sink.wait(lambda: [n for n in core.sink.of(Notice)
                                                    if "audit entries" in n.text])
            budget = core.hub.d.budget
            assert budget is not None
            row = await core.hub.d.store.conversation(core.key)
            spent = await core.hub.d.store.spent(budget.day(), budget.scopes(row, "u1"))
    finally:
        await server.close()
    assert server.violations == []
    if shape == "anthropic":  # valid breakpoints: the system prompt's and the newest
        assert all(1 <= breakpoints(r["messages"]) <= 4 for r in server.requests)
        assert all(MARK in r["messages"][0]["content"][-1] for r in server.requests)
    else:
        assert all(breakpoints(r) == 0 for r in server.requests)
    usage = expected_usage(server, shape)
    read, written = sum(u[0] for u in usage), sum(u[1] for u in usage)
    assert read > 0 and (written > 0) is (shape == "anthropic")
    # metrics
    assert f'tandem_tokens_total{{kind="cache_read"}} {float(read)}' in body
    if written:
        assert f'tandem_tokens_total{{kind="cache_write"}} {float(written)}' in body
    # the audit log: one entry per turn (kept out of the chat's `/audit`, which shows the
    # tool runs)
    assert len(audit) == 4
    assert "ran by u1: read_file" in shown.text and "usage" not in shown.text
    assert "cache_read=" in next(r.line() for r in rows if r.kind == "usage")  # `tandem audit`
    assert sum(e["cache_read"] for e in audit) == read
    assert sum(e.get("cache_write", 0) for e in audit) == written
    prompt = sum(e["prompt_tokens"] for e in audit)
    completion = sum(e["completion_tokens"] for e in audit)
    # /status: the hit ratio of the recent turns
    assert f"{100 * read // prompt}% of input tokens read from the cache " \
           f"({read:,} of {prompt:,})" in status.text
    # cost, priced as the provider prices cached input
    priced = sum(sum(litellm.cost_per_token(
        model=model, prompt_tokens=e["prompt_tokens"], completion_tokens=e["completion_tokens"],
        cache_read_input_tokens=e["cache_read"],
        cache_creation_input_tokens=e.get("cache_write", 0))) for e in audit)
    uncached = sum(litellm.cost_per_token(model=model, prompt_tokens=prompt,
                                          completion_tokens=completion))
    cost = sum(e["cost"] for e in audit)
    assert cost == pytest.approx(priced, rel=1e-3)
    assert cost != pytest.approx(uncached, rel=1e-3)
    assert row.cost == pytest.approx(cost, rel=1e-3)
    # the budget: the same cost, and every token
    [day] = [s for k, s in spent.items() if k.startswith("conv:")]
    assert day.cost == pytest.approx(cost, rel=1e-3)
    assert day.tokens == prompt + completion


# -- the trim keeps the prefix ---------------------------------------------------------


def answer(messages: list[dict[str, Any]]) -> Reply:
    if str(messages[0].get("content")).startswith(SUMMARY_PROMPT[:40]):
        return Reply(text=f"Summary: {len(messages[1]['content'])} characters were discussed.")
    return Reply(text="Noted. " * 30)


async def converse(tmp_path: Any, low_water: float, summary: bool, turns: int = 30,
                   model: str = "openai/fake", cache: str | None = None,
                   ) -> list[dict[str, Any]]:
    """`turns` turns of a chat at the window's limit; the requests the model got (the
    summary requests left out)."""
    tmp_path.mkdir()
    server = FakeModelServer(cache=cache)
    await server.start()
    server.responder = answer
    config: Config = make_config(tmp_path, server, llm__context_window=6000,
                                 llm__max_output_tokens=300, context__low_water=low_water,
                                 context__summary=summary, llm__model=model)
    try:
        async with Core(config) as core:
            for n in range(turns):
                await core.say(f"message {n}: " + "we need to decide this. " * 40)
                await core.sink.ended(n + 1, timeout=20)
                await core.hub.idle()
    finally:
        await server.close()
    assert server.violations == []
    return [r for r in server.requests if not answer(r["messages"]).text.startswith("Summary")]


def trims(requests: list[dict[str, Any]]) -> list[int]:
    """The requests after which the start of the history changed (a trim)."""
    return [k for k in range(1, len(requests))
            if requests[k]["messages"][:2] != requests[k - 1]["messages"][:2]]


@pytest.mark.parametrize("summary", [False, True])
async def test_the_prefix_is_byte_identical_across_turns_until_the_low_water_mark(
        tmp_path: Any, summary: bool) -> None:
    requests = await converse(tmp_path / "low", 0.65, summary)
    cut = trims(requests)
    assert cut, "the window never filled"
    for k in range(1, len(requests)):
        before, now = requests[k - 1], requests[k]
        assert now["tools"] == before["tools"]
        if k in cut:
            continue
        kept = before["messages"][:-1]  # all but the state note, byte for byte
        assert json.dumps(now["messages"][:len(kept)]) == json.dumps(kept), k
    # a trim goes down to the low-water mark, so several turns pass before the next one
    assert all(b - a >= 3 for a, b in zip(cut, cut[1:], strict=False)), cut
    if summary:  # the summary is part of the stable prefix: in the system prompt
        assert "Summary:" in requests[-1]["messages"][0]["content"]
    every_turn = trims(await converse(tmp_path / "every", 1.0, summary))
    assert len(every_turn) >= 2 * len(cut), (cut, every_turn)


async def test_claude_requests_stay_valid_and_mostly_cached_across_trims_and_summaries(
        tmp_path: Any) -> None:
    requests = await converse(tmp_path / "claude", 0.65, True, model=CLAUDE,
                              cache="anthropic")  # the strict fake refused nothing
    assert trims(requests)
    assert all(1 <= breakpoints(r["messages"]) <= 4 for r in requests)
    replay = PromptCache("anthropic")
    read = total = 0
    for k, body in enumerate(requests):
        prompt = estimate_prompt_tokens(body["messages"], body.get("tools"))
        usage = replay.usage(body, prompt)
        if k >= 10:
            read, total = read + usage["cache_read_input_tokens"], total + prompt
    # at this small window a trim comes every 6 turns (its turn reads only the tools and
    # system prompt); the benchmark's 12,000-token window reads 94 %
    assert read >= 0.7 * total, (read, total)


async def test_breakpoints_can_be_turned_off_for_an_endpoint_that_refuses_them(
        tmp_path: Any) -> None:
    server = FakeModelServer(cache="anthropic")
    await server.start()
    config = make_config(tmp_path, server, llm__model=CLAUDE,
                         context__cache_breakpoints=False)
    try:
        async with Core(config) as core:
            for n in range(2):
                await core.say(f"question {n}")
                await core.sink.ended(n + 1)
    finally:
        await server.close()
    assert len(server.requests) == 2
    assert all(breakpoints(r) == 0 for r in server.requests)
    assert server.requests[0]["messages"][0]["content"] == core.hub.d.prompt.system()
