"""Loading litellm: once per process, in a worker thread, never on the event loop.

`preload()` starts the import at start-up and `await load()` waits for it (or starts
it) without blocking the loop; whichever thread asks first imports, the others wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import importlib
import logging
import os
import sys
import threading
from typing import Any

log = logging.getLogger(__name__)

# Modules litellm 1.110 imports on the first completion, not at import: imported by the
# loader thread instead, they no longer hold the event loop's thread on the first turn.
_FIRST_CALL_MODULES = (
    "anyio._backends._asyncio", "anyio.streams.tls",
    "litellm._service_logger", "litellm.integrations.prometheus_services",
    "litellm.integrations.generic_api.generic_api_callback",
    "litellm.litellm_core_utils.logging_callback_manager",
    "litellm.litellm_core_utils.duration_parser",
    "litellm.llms.github_copilot.authenticator", "litellm.llms.github_copilot.github_host",
    "litellm.llms.github_copilot.per_user_auth",
    "litellm.llms.litellm_proxy.chat.transformation",
    "litellm.llms.openai.chat.gpt_audio_transformation",
    "litellm.llms.openai_like.dynamic_config",
    "litellm.llms.bedrock.chat.invoke_transformations.amazon_ai21_transformation",
    "litellm.proxy._types", "litellm.proxy.openai_files_endpoints.common_utils",
    "litellm.proxy.types_utils.utils", "litellm.proxy.mcp_server.stdio_gate",
    "litellm.proxy.spend_tracking.savings",
    "litellm.types.litellm_core_utils.streaming_chunk_builder_utils",
)

_lock = threading.Lock()
_loaded: concurrent.futures.Future[Any] | None = None
"""The one import of litellm: running, done, or failed (then the next caller retries)."""


def _import_litellm() -> Any:
    """The import itself, then what Tandem sets on litellm. Blocking: seconds, cold."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    cold = "litellm" not in sys.modules
    collecting = gc.isenabled()
    if cold and collecting:
        # The import builds ~400k objects, and the collector would walk the growing heap
        # over and over (7 full collections, ~1.3 s, each a pause of up to 0.3 s for the
        # event loop's thread too). What it leaves behind is all alive (~2k objects are
        # garbage): freezing it, instead of one last full collection, costs nothing.
        gc.disable()
    try:
        import litellm

        litellm.suppress_debug_info = True
        litellm.telemetry = False
        # litellm counts the prompt's tokens with tiktoken to price a stream before its
        # usage arrives: the first turn would load cl100k (~40 MB, 0.3-0.6 s on the loop)
        # and every turn would tokenize the whole prompt on the loop. Tandem uses the
        # provider's usage; without it, usage is unknown (not litellm's estimate).
        litellm.disable_token_counter = True
        # litellm.utils keeps the parsed Anthropic tokenizer (~13 MB of objects) beside the
        # JSON string its tokenizer is built from; nothing reads the parsed copy.
        utils = sys.modules.get("litellm.utils")
        if isinstance(getattr(utils, "json_data", None), dict):
            utils.json_data = None  # type: ignore[union-attr]
        if cold:
            for name in _FIRST_CALL_MODULES:
                try:
                    importlib.import_module(name)
                except Exception:  # another litellm version: the first call imports it
                    log.debug("could not preload %s", name, exc_info=True)
    finally:
        if cold and collecting:
            gc.freeze()
            gc.enable()
    return litellm


def _claim() -> tuple[concurrent.futures.Future[Any], bool]:
    """The import's future, and whether the caller is the one to run it."""
    global _loaded
    with _lock:
        future = _loaded
        if future is not None and not (future.done() and future.exception() is not None):
            return future, False
        future = _loaded = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # no waiter can cancel it from now on
        return future, True


def _fulfil(future: concurrent.futures.Future[Any]) -> Any:
    try:
        litellm = _import_litellm()
    except BaseException as exc:
        future.set_exception(exc)
        raise
    future.set_result(litellm)
    return litellm


def _import_once() -> Any:
    """litellm, imported by the first thread to ask; the others wait for that import.

    Blocking: call it from a worker thread (`load`) or the preload thread, never the loop.
    """
    future, mine = _claim()
    return _fulfil(future) if mine else future.result()


async def load() -> Any:
    """The litellm module, imported in a worker thread; waits for `preload`'s import if
    one is under way. The event loop keeps running meanwhile."""
    future = _loaded
    if future is not None and future.done() and future.exception() is None:
        return future.result()
    if future is not None and not future.done():
        return await asyncio.wrap_future(future)
    return await asyncio.to_thread(_import_once)


async def settle() -> None:
    """Wait for an import under way to end (a process must not exit while a thread is
    importing: the interpreter aborts). Its failure is the first model call's business."""
    future = _loaded
    if future is not None and not future.done():
        with contextlib.suppress(BaseException):
            await asyncio.wrap_future(future)


def loaded() -> bool:
    """litellm is imported (what needs it will not wait)."""
    future = _loaded
    return future is not None and future.done() and future.exception() is None


def warm() -> None:
    """Import litellm here (blocking), then freeze the heap built so far (`gc.freeze`).

    Everything loaded at start lives as long as the process; frozen, the garbage
    collector no longer walks it, and its full collections shrink from pauses of up to
    80 ms (which every chat would feel) to a few milliseconds.
    """
    _import_once()
    gc.freeze()


def preload() -> None:
    """Start importing litellm in a background thread (at once, if nothing has yet), so
    the first turn does not wait for the whole import; `load()` waits for the rest."""
    future, mine = _claim()
    if mine:
        threading.Thread(target=_preload, args=(future,), name="tandem-preload",
                         daemon=True).start()


def _preload(future: concurrent.futures.Future[Any]) -> None:
    try:
        _fulfil(future)  # a cold import ends with the heap frozen, as `warm` does
    except Exception:  # the first model call retries the import and reports it
        log.warning("could not load litellm in the background", exc_info=True)


