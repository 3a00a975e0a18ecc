"""The model, through litellm: the only module that imports it, and lazily.

`LiteLLMClient.stream()` yields a `Delta` for every streamed chunk (so the runner can
check for cancel every N chunks), `Restart` when a retry begins after partial output,
and one final `Completion` with the assembled text, tool calls and usage.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import random
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.config import LLMConfig
from bot.errors import ModelError, ModelRateLimited
from bot.history import ToolCall

log = logging.getLogger(__name__)
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


StreamItem = Delta | Restart | Completion


class ContextExceeded(ModelError):
    """The provider says the request does not fit the model's context window."""


class ModelClient(Protocol):
    model: str

    def stream(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
    ) -> AsyncIterator[StreamItem]: ...


def _import_litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


def warm() -> None:
    """Import litellm, then freeze the heap built so far (`gc.freeze`).

    Everything loaded at start lives as long as the process; frozen, the garbage
    collector no longer walks it, and its full collections shrink from pauses of up to
    80 ms (which every chat would feel) to a few milliseconds.
    """
    _import_litellm()
    gc.collect()
    gc.freeze()


def preload() -> None:
    """`warm` in a background thread, so the first turn does not pay for the import."""
    threading.Thread(target=warm, name="tandem-preload", daemon=True).start()


def context_window(config: LLMConfig) -> int:
    if config.context_window:
        return config.context_window
    try:
        info = _import_litellm().get_model_info(config.model)
        return int(info.get("max_input_tokens") or DEFAULT_CONTEXT_WINDOW)
    except Exception:  # unknown model: litellm raises a plain Exception
        return DEFAULT_CONTEXT_WINDOW


@dataclass(slots=True)
class _Assembler:
    """Tool-call fragments arrive by index: the first has id and name, later ones args."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def feed(self, chunk: Any) -> str:
        usage = getattr(chunk, "usage", None)
        if usage is not None and getattr(usage, "prompt_tokens", None) is not None:
            self.prompt_tokens = usage.prompt_tokens
            self.completion_tokens = usage.completion_tokens
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


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        return float(headers.get("retry-after"))
    except (TypeError, ValueError):
        return None


class LiteLLMClient:
    def __init__(self, config: LLMConfig) -> None:
        self.config = config
        self.model = config.model

    def _targets(self) -> list[dict[str, Any]]:
        primary = {"model": self.config.model, "api_base": self.config.api_base,
                   "api_key": self.config.api_key}
        provider = self.config.model.split("/", 1)[0]
        targets = [primary]
        for model in self.config.fallbacks:
            same = model.split("/", 1)[0] == provider
            targets.append({"model": model, "api_base": primary["api_base"] if same else None,
                            "api_key": primary["api_key"] if same else None})
        return targets

    async def stream(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
    ) -> AsyncIterator[StreamItem]:
        litellm = _import_litellm()
        transient = (litellm.RateLimitError, litellm.InternalServerError,
                     litellm.ServiceUnavailableError, litellm.APIConnectionError,
                     litellm.Timeout, litellm.BadGatewayError)
        last: BaseException | None = None
        started = False
        for target in self._targets():
            for attempt in range(self.config.retries + 1):
                if started:
                    yield Restart()
                    started = False
                try:
                    async for item in self._once(litellm, target, messages, tools):
                        started = started or isinstance(item, Delta) and bool(item.text)
                        yield item
                    return
                except litellm.ContextWindowExceededError as exc:
                    raise ContextExceeded(str(exc)) from exc
                except transient as exc:
                    last = exc
                    log.warning("model %s attempt %d failed: %s", target["model"],
                                attempt + 1, type(exc).__name__)
                    if attempt < self.config.retries:
                        wait = _retry_after(exc) or min(8.0, 0.5 * 2**attempt)
                        await asyncio.sleep(wait * (0.8 + 0.4 * random.random()))
                except litellm.APIError as exc:
                    last = exc
                    log.warning("model %s refused the request: %s", target["model"],
                                type(exc).__name__, exc_info=True)
                    break
        if last is not None and isinstance(last, litellm.RateLimitError):
            raise ModelRateLimited("rate limited after retries") from last
        raise ModelError(f"model unavailable: {type(last).__name__}") from last

    async def _once(
        self, litellm: Any, target: dict[str, Any],
        messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
    ) -> AsyncIterator[StreamItem]:
        kwargs: dict[str, Any] = {
            "model": target["model"], "messages": list(messages), "stream": True,
            "stream_options": {"include_usage": True}, "timeout": self.config.timeout_s,
            "max_tokens": self.config.max_output_tokens, "max_retries": 0,
        }
        if tools:
            kwargs["tools"] = list(tools)
        if target["api_base"]:
            kwargs["api_base"] = target["api_base"]
        if target["api_key"]:
            kwargs["api_key"] = target["api_key"]
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        response = await litellm.acompletion(**kwargs)
        acc = _Assembler()
        async for chunk in response:
            yield Delta(acc.feed(chunk))
        yield Completion(
            "".join(acc.text), acc.tool_calls(), acc.prompt_tokens, acc.completion_tokens,
            self._cost(litellm, target["model"], acc), target["model"],
        )

    @staticmethod
    def _cost(litellm: Any, model: str, acc: _Assembler) -> float:
        if acc.prompt_tokens is None:
            return 0.0
        try:
            prompt, completion = litellm.cost_per_token(
                model=model, prompt_tokens=acc.prompt_tokens,
                completion_tokens=acc.completion_tokens or 0)
            return float(prompt + completion)
        except Exception:  # unknown model: no price known
            return 0.0
