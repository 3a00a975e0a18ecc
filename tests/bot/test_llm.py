"""bot/llm/ against the strict fake model: loading litellm off the event loop, the
context window, streams cut mid-way, cancels, and what `tandem chat` prints for them."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import logging
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

from bot import llm
from bot.core.config import LLMConfig
from bot.core.errors import ModelError, ModelStreamCut, user_message
from bot.run import logs
from tests.fakes.model_server import FakeModelServer, Reply
from tests.test_cli import REPO, env, write_config
from tests.waiting import eventually


def client(server: FakeModelServer, **overrides: Any) -> llm.LiteLLMClient:
    data: dict[str, Any] = {"model": "openai/fake", "api_base": server.api_base,
                            "api_key": "sk-test", "timeout_s": 5, "retries": 1}
    return llm.LiteLLMClient(LLMConfig.model_validate({**data, **overrides}))


async def collect(c: llm.LiteLLMClient, text: str = "hi") -> list[llm.StreamItem]:
    return [item async for item in c.stream([{"role": "user", "content": text}], [])]


# -- A: litellm is only ever imported off the event loop ----------------------------------

FIRST_TURN = textwrap.dedent("""
    import asyncio, json, os, sys, time
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from bot import llm
    from bot.core.config import LLMConfig
    from tests.fakes.model_server import FakeModelServer, Reply
    assert "litellm" not in sys.modules

    async def main():
        async with FakeModelServer() as server:
            server.script(Reply(text="hello there"))
            gaps, done, ticking = [0.0], False, asyncio.Event()

            async def tick():
                last = time.perf_counter()
                while not done:
                    await asyncio.sleep(0.01)
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now
                    ticking.set()

            ticker = asyncio.create_task(tick())
            await ticking.wait()
            llm.preload()  # as `tandem run` does: it is importing when the turn starts
            client = llm.LiteLLMClient(LLMConfig(
                model="openai/gpt-4o-mini", api_base=server.api_base, api_key="sk-test",
                timeout_s=10, retries=0))
            started = time.perf_counter()
            loaded = await llm.load() if hasattr(llm, "load") else None
            window = await client.window() if hasattr(client, "window") else 0
            items = [item async for item in client.stream(
                [{"role": "user", "content": "hi"}], [])]
            took = time.perf_counter() - started
            done = True
            await ticker
            print(json.dumps({"max_gap_ms": max(gaps) * 1000, "took_s": took,
                              "window": window, "text": items[-1].text,
                              "same_module": loaded is sys.modules.get("litellm")}))

    asyncio.run(main())
""")


def test_the_first_turn_after_a_start_never_freezes_the_event_loop() -> None:
    """A fresh process (litellm not imported): preload is importing when the first turn
    awaits `load()`, the window and the first stream; a 10 ms ticker keeps ticking."""
    done = subprocess.run([sys.executable, "-c", FIRST_TURN], capture_output=True,
                          text=True, env=env(), cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["text"] == "hello there" and figures["same_module"]
    assert figures["window"] == 128_000  # openai/gpt-4o-mini, from litellm's model info
    assert figures["max_gap_ms"] < 200, figures


async def test_load_is_one_import_shared_by_every_caller() -> None:
    first, second = await asyncio.gather(llm.load(), llm.load())
    assert first is second is sys.modules["litellm"]
    assert llm.loaded()
    assert first.disable_token_counter is True  # no tiktoken: Tandem uses the usage


async def test_window_is_the_config_else_litellm_model_info(model: FakeModelServer) -> None:
    assert await client(model, context_window=1234).window() == 1234
    assert await client(model, model="openai/gpt-4o-mini").window() == 128_000
    assert await client(model).window() == llm.DEFAULT_CONTEXT_WINDOW  # unknown model


# -- D: a stream cut mid-way ------------------------------------------------------------


async def test_a_stream_cut_mid_way_is_retried_then_says_cut_off(
        model: FakeModelServer) -> None:
    model.script(Reply(text="The answer starts well and then " * 4, fault="drop"),
                 Reply(text="Again it starts and then " * 4, fault="drop"))
    c = client(model)
    items: list[llm.StreamItem] = []
    try:
        async for item in c.stream([{"role": "user", "content": "hi"}], []):
            items.append(item)
    except ModelStreamCut as exc:
        text = user_message(exc)
    else:
        raise AssertionError(f"no error; got {items[-3:]}")
    assert text == ("The model's answer was cut off mid-way (the connection was lost); "
                    "please try again.")
    assert any(isinstance(i, llm.Restart) for i in items)  # the retry dropped the first half
    assert len(model.requests) == 2


async def test_a_refused_key_and_a_silent_server_are_named() -> None:
    from bot.llm.failures import cause, endpoint

    litellm = await llm.load()
    refused = litellm.AuthenticationError("bad key", llm_provider="openai", model="x")
    assert cause(refused, 10) == "the API key was refused (401)"
    slow = litellm.Timeout("took too long", model="x", llm_provider="openai")
    assert cause(slow, 7.5) == "no answer within 7.5 s"
    assert endpoint("https://user:secret@llm.example:8443/v1?key=abc", "openai/x") == \
        "https://llm.example:8443/v1"
    assert endpoint(None, "anthropic/claude") == "anthropic's API"


async def test_a_cut_then_a_full_answer_is_just_the_answer(model: FakeModelServer) -> None:
    model.script(Reply(text="half of an answer that will be cut " * 3, fault="drop"),
                 Reply(text="the whole answer"))
    items = await collect(client(model))
    assert isinstance(items[-1], llm.Completion) and items[-1].text == "the whole answer"


async def test_a_model_nobody_answers_for_is_still_unreachable() -> None:
    server = FakeModelServer()
    await server.start()
    base = server.api_base
    await server.close()  # nothing listens there any more
    c = llm.LiteLLMClient(LLMConfig(model="openai/fake", api_base=base, api_key="sk-test",
                                    timeout_s=5, retries=0))
    try:
        await collect(c)
    except ModelError as exc:
        assert not isinstance(exc, ModelStreamCut)
        # one line: the cause and the address (without credentials)
        assert user_message(exc) == ("The model call failed: connection refused "
                                     f"({base}). Please try again in a moment.")
    else:
        raise AssertionError("the call succeeded")


class NoUsage(FakeModelServer):
    """A provider that ignores `stream_options.include_usage`."""

    async def _stream(self, request: Any, body: dict[str, Any], reply: Reply,
                      prompt_tokens: int, include_usage: bool) -> Any:
        return await super()._stream(request, body, reply, prompt_tokens, False)


async def test_without_the_providers_usage_the_usage_is_unknown_not_zero() -> None:
    async with NoUsage() as server:
        server.script(Reply(text="no usage here"))
        items = await collect(client(server))
    done = items[-1]
    assert isinstance(done, llm.Completion) and done.text == "no usage here"
    assert done.prompt_tokens is None and done.cost == 0.0


# -- D: cancels leave nothing behind ----------------------------------------------------


async def test_cancels_at_any_moment_leave_no_unawaited_coroutine_or_open_stream(
        model: FakeModelServer) -> None:
    """acompletion builds the request in a thread; a cancel in between used to drop the
    coroutine it returns ("coroutine 'OpenAIChatCompletion.async_streaming' was never
    awaited")."""
    model.responder = lambda _m: Reply(text="a slow answer " * 20, chunk_delay=0.01)
    c = client(model, retries=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for delay in (0, 0, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.02, 0.05):
            task = asyncio.ensure_future(collect(c))
            await asyncio.sleep(delay)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # abandoned calls finish, and their streams are closed
        await eventually(lambda: not llm._orphans, 10, what="abandoned calls closed")
        await llm.close()
        gc.collect()
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "never awaited" in m or "unclosed" in m], messages
    assert not llm._orphans


async def test_an_abandoned_stream_is_closed(model: FakeModelServer) -> None:
    """A consumer that stops early (the runner does, on cancel) and closes the stream."""
    model.script(Reply(text="many chunks " * 50, chunk_delay=0.01))
    stream = client(model).stream([{"role": "user", "content": "hi"}], [])
    async for item in stream:
        if isinstance(item, llm.Delta) and item.text:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    await model.wait_streams_ended(1)  # the fake saw the client go; no call runs any more
    assert len(model.requests) == 1


# -- D: expected failures log one line ----------------------------------------------------


def test_an_expected_model_failure_logs_one_line_and_its_traceback_only_with_v() -> None:
    def record(verbose: bool) -> str:
        out = io.StringIO()
        handler = logging.StreamHandler(out)
        if not verbose:
            handler.addFilter(logs.OneLine())
        logger = logging.getLogger("test_llm.one_line")
        logger.addHandler(handler)
        logger.propagate = False
        try:
            try:
                try:
                    raise ConnectionError("peer closed the connection")
                except ConnectionError as cause:
                    raise ModelStreamCut("the stream was cut off: APIConnectionError") from cause
            except ModelError:
                logger.warning("model call failed in %s", "console:you", exc_info=True)
        finally:
            logger.removeHandler(handler)
        return out.getvalue()

    quiet = record(verbose=False)
    assert quiet.strip() == ("model call failed in console:you (ModelStreamCut: the stream "
                             "was cut off: APIConnectionError)")
    assert "Traceback" in record(verbose=True)


# -- D: `tandem chat` end to end --------------------------------------------------------

WARNINGS = ("-W", "always::RuntimeWarning", "-W", "always::ResourceWarning")


async def chat(config: Path, model: FakeModelServer, stdin: str,
               *bot_args: str) -> tuple[int, str, str]:
    """`tandem chat` showing every RuntimeWarning and ResourceWarning."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *WARNINGS, "-m", "bot", "--config", str(config), *bot_args, "chat",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env(model), cwd=config.parent)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_tandem_chat_says_cut_off_in_one_line_and_shuts_down_without_warnings(
        model: FakeModelServer, tmp_path: Path) -> None:
    config = write_config(tmp_path, model)
    cut = Reply(text="This answer gets cut somewhere in the middle. " * 3, fault="drop")
    model.script(Reply(text="All fine."), cut, cut, cut)  # 3 attempts: retries is 2
    code, out, err = await chat(config, model, "hello\nand again\n")
    assert code == 0, err
    assert "All fine." in out
    assert ("The model's answer was cut off mid-way (the connection was lost); "
            "please try again.") in out
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "model call failed" in lines[0], err  # no traceback, no warning
    model.script(cut, cut, cut)
    code, out, err = await chat(config, model, "once more\n", "-v")
    assert code == 0, err
    assert "cut off mid-way" in out
    for bad in ("never awaited", "unclosed", "Task was destroyed", "Exception ignored"):
        assert bad not in err, err
