"""The model, through litellm: the only package that imports it, never on the event loop.

litellm takes seconds to import, so it is imported once per process in a worker thread:
`preload()` starts that at start-up and `await load()` waits for it (or starts it) without
blocking the loop. `LiteLLMClient.stream()` yields a `Delta` for every streamed chunk (so
the runner can check for cancel every N chunks), `Restart` when a retry begins after partial
output, and one final `Completion` with the assembled text, tool calls and usage.
`LiteLLMClient.window()` is the context window in tokens; `close()` releases litellm's HTTP
clients while the event loop still runs.

Layer: above `bot.core` only, beside `bot.store` (neither imports the other). It may
import `bot.core` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from bot.core.errors import ModelError, ModelRateLimited, ModelStreamCut, ModelUnreachable
from bot.core.history import ToolCall
from bot.core.llm_config import LLMConfig
from bot.llm.caching import cached_tokens, for_model
from bot.llm.failover import Health, Target, Unavailable, chosen, targets
from bot.llm.failures import cause, cut_cause, endpoint, one_line, retry_after
from bot.llm.loading import load, loaded, preload, settle, warm

log = logging.getLogger(__name__)
__all__ = ["Completion", "ContextExceeded", "Delta", "LiteLLMClient", "ModelClient", "Restart",
           "StreamItem", "close", "load", "loaded", "preload", "warm"]
DEFAULT_CONTEXT_WINDOW = 32_000


@dataclass(frozen=True, slots=True)
class Delta:
    text: str = ""


@dataclass(frozen=True, slots=True)
class Restart:
    """A retry started after partial output: discard the text streamed so far."""


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float = 0.0
    model: str = ""
    """The model that answered."""
    unavailable: tuple[Unavailable, ...] = ()
    """Models of the chain that were skipped or failed before `model` answered."""
    cache_read: int = 0
    """Of `prompt_tokens`: read from the provider's prompt cache (`bot.llm.caching`)."""
    cache_write: int = 0
    """Of `prompt_tokens`: written to the provider's prompt cache."""


StreamItem = Delta | Restart | Completion


class ContextExceeded(ModelError):
    """The provider says the request does not fit the model's context window."""


class ModelClient(Protocol):
    model: str

    async def window(self) -> int:
        """The model's context window in tokens (may wait for litellm; never blocks)."""
        ...

    def stream(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
    ) -> AsyncGenerator[StreamItem, None]: ...


async def close() -> None:
    """Stop calls abandoned by a cancel, then close litellm's cached HTTP clients (else
    they are closed at exit on another loop, warning of unclosed transports)."""
    loop = asyncio.get_running_loop()
    pending = [task for task in _orphans if task.get_loop() is loop]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await settle()  # stopped while litellm loads: its thread ends first
    if not loaded():
        return
    litellm = await load()
    with contextlib.suppress(Exception):
        await litellm.close_litellm_async_clients()


def _model_window(litellm: Any, model: str) -> int:
    try:
        info = litellm.get_model_info(model)
        return int(info.get("max_input_tokens") or DEFAULT_CONTEXT_WINDOW)
    except Exception:  # unknown model: litellm raises a plain Exception
        return DEFAULT_CONTEXT_WINDOW


# -- one call ---------------------------------------------------------------------------

_orphans: set[asyncio.Future[Any]] = set()
"""Calls whose caller was cancelled before they returned a stream (see `_open`)."""


async def _open(litellm: Any, kwargs: dict[str, Any]) -> Any:
    """`litellm.acompletion`, never cancelled half-way.

    acompletion builds the request in a thread, which returns a coroutine for the loop
    to await; cancelled in between, that coroutine is dropped unawaited ("coroutine
    'OpenAIChatCompletion.async_streaming' was never awaited"). So a cancel leaves the
    call running on its own; its stream is closed as soon as it opens (`close()` stops
    whatever is still waiting at shutdown).
    """
    call = asyncio.ensure_future(litellm.acompletion(**kwargs))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        _orphans.add(call)
        call.add_done_callback(_discard)
        raise


def _discard(call: asyncio.Future[Any]) -> None:
    _orphans.discard(call)
    if call.cancelled() or call.exception() is not None:
        return
    closing = asyncio.ensure_future(_close_stream(call.result()))
    _orphans.add(closing)
    closing.add_done_callback(_orphans.discard)


async def _close_stream(response: Any) -> None:
    aclose = getattr(response, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:  # closing a broken stream: nothing left to do
        log.debug("closing the model's stream failed", exc_info=True)


@dataclass(slots=True)
class _Assembler:
    """Tool-call fragments arrive by index: the first has id and name, later ones args."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cache: tuple[int, int] = (0, 0)
    """(read, written) tokens of the prompt cache."""
    chunks: int = 0

    def feed(self, chunk: Any) -> str:
        self.chunks += 1
        usage = getattr(chunk, "usage", None)
        prompt = getattr(usage, "prompt_tokens", None) if usage is not None else None
        completion = getattr(usage, "completion_tokens", None) if usage is not None else None
        # 0 and 0 is what litellm reports when the provider sent no usage (it does not
        # count tokens itself: `disable_token_counter`): unknown, not free.
        if prompt is not None and (prompt or completion):
            self.prompt_tokens = prompt
            self.completion_tokens = completion
            self.cache = cached_tokens(usage)
        if not chunk.choices:
            return ""
        delta = chunk.choices[0].delta
        piece = getattr(delta, "content", None) or ""
        if piece:
            self.text.append(piece)
        for frag in getattr(delta, "tool_calls", None) or []:
            slot = self.calls.setdefault(frag.index or 0, ["", "", ""])
            if frag.id:
                slot[0] = frag.id
            fn = frag.function
            if fn is not None and fn.name:
                slot[1] = fn.name
            if fn is not None and fn.arguments:
                slot[2] += fn.arguments
        return piece

    def tool_calls(self) -> tuple[ToolCall, ...]:
        out = []
        for index in sorted(self.calls):
            call_id, name, args = self.calls[index]
            out.append(ToolCall(call_id or f"call_{index}", name or "unknown", args or "{}"))
        return tuple(out)


@dataclass(slots=True)
class _Failure:
    exc: BaseException
    cut: bool
    """The stream had started (at least one chunk arrived) when it failed."""


@dataclass(slots=True)
class _Call:
    """One `stream()` across the chain's models and their retries."""

    last: _Failure | None = None
    started: bool = False
    """The current attempt streamed text (a retry restarts it)."""
    shown: bool = False
    """Text of this call reached the chat."""
    unavailable: list[Unavailable] = field(default_factory=list)


class LiteLLMClient:
    def __init__(self, config: LLMConfig, health: Health | None = None) -> None:
        self.config = config
        self.model = config.model
        self._window = config.context_window or 0
        self.health = health or Health.of(config)
        """Shared by every conversation of the process (one client per process)."""

    async def window(self) -> int:
        """`llm.context_window`, else what litellm knows of the model (looked up once, in
        a worker thread), else 32,000."""
        if not self._window:
            litellm = await load()
            self._window = await asyncio.to_thread(_model_window, litellm, self.model)
        return self._window

    async def stream(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
    ) -> AsyncGenerator[StreamItem, None]:
        """The chain's first model that answers (`bot.llm.failover`); a model skipped or
        failed on the way is named in the `Completion`. Once text of this call is on
        screen, a cut ends it (`ModelStreamCut`) unless `llm.failover.after_cut`."""
        litellm = await load()
        call = _Call()
        for target in targets(self.config, chosen()):
            if call.shown and not self.config.failover.after_cut:
                break
            if not self.health.available(target.key):
                call.unavailable.append(Unavailable(target.model, self.health.outage(target.key)))
                continue
            try:
                async for item in self._attempts(litellm, target, messages, tools, call):
                    yield item
                    if isinstance(item, Completion):
                        return
            finally:  # a trial call that was cancelled leaves the model to the next one
                self.health.release(target.key)
            call.unavailable.append(Unavailable(target.model, self.health.outage(target.key),
                                                cut=call.shown))
        raise self._error(litellm, call) from call.last.exc if call.last else None

    async def _attempts(
        self, litellm: Any, target: Target, messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]], call: _Call,
    ) -> AsyncGenerator[StreamItem, None]:
        """One model of the chain, retried; returns (having yielded no `Completion`) when
        the next model should be tried."""
        transient = (litellm.RateLimitError, litellm.InternalServerError,
                     litellm.ServiceUnavailableError, litellm.APIConnectionError,
                     litellm.Timeout, litellm.BadGatewayError)
        refusals = (litellm.APIError, litellm.AuthenticationError, litellm.NotFoundError,
                    litellm.BadRequestError, litellm.PermissionDeniedError)
        for attempt in range(self.config.retries + 1):
            if call.started:
                yield Restart()
                call.started = False
            acc = _Assembler()
            try:
                async with contextlib.aclosing(
                        self._once(litellm, target, messages, tools, acc)) as items:
                    async for item in items:
                        if isinstance(item, Completion):
                            self.health.succeeded(target.key)
                            item = replace(item, unavailable=tuple(call.unavailable))
                        elif isinstance(item, Delta) and item.text:
                            call.started = call.shown = True
                        yield item
                return
            except litellm.ContextWindowExceededError as exc:
                raise ContextExceeded(str(exc)) from exc
            except (*transient, *refusals) as exc:
                call.last = _Failure(exc, acc.chunks > 0)  # cut off: the stream had begun
                if call.last.cut or not isinstance(exc, litellm.BadRequestError):
                    self.health.failed(target.key)  # a bad request is the request's fault
                if not call.last.cut and not isinstance(exc, transient):
                    log.warning("model %s refused the request: %s", target.model,
                                one_line(exc), exc_info=log.isEnabledFor(logging.DEBUG))
                    return
                log.info("model %s attempt %d %s: %s", target.model, attempt + 1,
                         "was cut off" if call.last.cut else "failed", one_line(exc))
                if isinstance(exc, litellm.Timeout) and self._more_after(target):
                    return  # a hung model is not waited for twice: the next one answers
                if attempt < self.config.retries:
                    wait = retry_after(exc) or min(8.0, 0.5 * 2**attempt)
                    await asyncio.sleep(wait * (0.8 + 0.4 * random.random()))

    def _more_after(self, target: Target) -> bool:
        """Another model of the chain comes after `target` and may be called."""
        chain = targets(self.config, chosen())
        keys = [t.key for t in chain]
        rest = chain[keys.index(target.key) + 1:] if target.key in keys else []
        return any(self.health.available_later(t.key) for t in rest)

    def _error(self, litellm: Any, call: _Call) -> ModelError:
        last = call.last
        failed = last.exc if last is not None else None
        if last is not None and last.cut:
            return ModelStreamCut(f"the stream was cut off: {one_line(last.exc)}",
                                  cut_cause(last.exc))
        if isinstance(failed, litellm.RateLimitError):
            return ModelRateLimited("rate limited after retries")
        where = endpoint(self.config.api_base, self.config.model)
        if failed is None:
            why = "it failed repeatedly and is paused for a moment"
            names = ", ".join(u.model for u in call.unavailable) or self.config.model
            return ModelUnreachable(f"every model is paused ({names})", why, where)
        why = cause(failed, self.config.timeout_s)
        return ModelUnreachable(f"model call failed: {why} ({where})", why, where)

    async def _once(
        self, litellm: Any, target: Target, messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]], acc: _Assembler,
    ) -> AsyncGenerator[StreamItem, None]:
        kwargs: dict[str, Any] = {
            "model": target.model, "messages": for_model(target.model, messages),
            "stream": True,
            "stream_options": {"include_usage": True}, "timeout": target.timeout_s,
            "max_tokens": target.max_output_tokens, "max_retries": 0,
        }
        if tools:
            kwargs["tools"] = list(tools)
        if target.api_base:
            kwargs["api_base"] = target.api_base
        if target.api_key:
            kwargs["api_key"] = target.api_key
        if target.temperature is not None:
            kwargs["temperature"] = target.temperature
        response = await _open(litellm, kwargs)
        try:
            async for chunk in response:
                yield Delta(acc.feed(chunk))
        finally:  # done, failed, cancelled or abandoned: the connection goes back
            await _close_stream(response)
        yield Completion(
            "".join(acc.text), acc.tool_calls(), acc.prompt_tokens, acc.completion_tokens,
            self._cost(litellm, target.model, acc), target.model,
            cache_read=acc.cache[0], cache_write=acc.cache[1],
        )

    @staticmethod
    def _cost(litellm: Any, model: str, acc: _Assembler) -> float:
        if acc.prompt_tokens is None:
            return 0.0
        read, written = acc.cache
        try:  # cached input priced as the provider prices it: a read's discount, a write's premium
            prompt, completion = litellm.cost_per_token(
                model=model, prompt_tokens=acc.prompt_tokens,
                completion_tokens=acc.completion_tokens or 0,
                cache_read_input_tokens=read, cache_creation_input_tokens=written)
            return float(prompt + completion)
        except Exception:  # unknown model: no price known
            return 0.0
