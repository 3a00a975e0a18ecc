"""What the model can take in besides text: voice notes (transcribed by any litellm
transcription model) and, where the model supports them, pictures and PDFs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from bot.core.config import LLMConfig, MediaConfig
from bot.core.errors import ModelError
from bot.llm.loading import load

log = logging.getLogger(__name__)


AUDIO_EXTENSIONS = frozenset({"flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav",
                              "webm"})
_BY_MIME = {"audio/ogg": "ogg", "audio/mpeg": "mp3", "audio/mp4": "m4a", "audio/x-m4a": "m4a",
            "audio/wav": "wav", "audio/x-wav": "wav", "audio/webm": "webm", "audio/flac": "flac",
            "video/mp4": "mp4", "video/webm": "webm"}


def audio_name(name: str, mime: str) -> str:
    """The name sent with a recording: transcription services go by its extension."""
    if name.rpartition(".")[2].lower() in AUDIO_EXTENSIONS:
        return name
    return f"{name}.{_BY_MIME.get(mime.lower(), 'ogg')}"


Spend = Callable[[int, float], Awaitable[None]]
"""Told a model call's tokens and cost (the daily budgets count them)."""


class Senses:
    def __init__(self, llm: LLMConfig, media: MediaConfig) -> None:
        self.llm = llm
        self.media = media
        self._known: dict[str, bool] = {}

    @property
    def transcribes(self) -> bool:
        return bool(self.media.transcription.model)

    async def transcribe(self, path: Path, mime: str = "", spend: Spend | None = None) -> str:
        """The words of the recording at `path`; ModelError with a plain reason. What the
        transcription cost (tokens where the service counts them, and dollars) goes to
        `spend`."""
        settings = self.media.transcription
        if not settings.model:
            raise ModelError("no transcription model is configured (media.transcription.model)")
        litellm = await load()
        data = await asyncio.to_thread(path.read_bytes)
        try:
            result = await asyncio.wait_for(litellm.atranscription(
                model=settings.model, file=(audio_name(path.name, mime), data),
                api_base=settings.api_base or self.llm.api_base,
                api_key=settings.api_key or self.llm.api_key), settings.timeout_s)
        except TimeoutError:
            raise ModelError(f"the transcription took longer than {settings.timeout_s:g} s") \
                from None
        except Exception as exc:  # litellm raises many kinds; each is a failed transcription
            log.warning("transcription with %s failed: %s", settings.model, exc)
            raise ModelError(f"the transcription model {settings.model} failed "
                             f"({type(exc).__name__})") from None
        if spend is not None:
            await spend(*_usage(result))
        text = str(getattr(result, "text", "") or "").strip()
        if not text:
            raise ModelError("the recording has no words the transcription model could hear")
        return text

    async def vision(self) -> bool:
        """The model sees pictures: `media.vision`, else what litellm knows of it."""
        if self.media.vision is not None:
            return self.media.vision
        return await self._supports("supports_vision")

    async def pdf(self) -> bool:
        """The model reads PDFs: `media.pdf`, else what litellm knows of it."""
        if self.media.pdf is not None:
            return self.media.pdf
        return await self._supports("supports_pdf_input")

    async def _supports(self, check: str) -> bool:
        if check not in self._known:
            litellm = await load()
            try:
                found = await asyncio.to_thread(getattr(litellm, check), self.llm.model)
            except Exception:  # an unknown model: litellm cannot say, so it cannot
                found = False
            self._known[check] = bool(found)
        return self._known[check]


def _usage(result: object) -> tuple[int, float]:
    """(tokens, dollars) of a transcription: litellm prices it (by the recording's length
    for whisper) in its hidden parameters; token-billed models report usage too."""
    usage = getattr(result, "usage", None)
    tokens = getattr(usage, "total_tokens", None) if usage is not None else None
    if tokens is None and isinstance(usage, dict):
        tokens = usage.get("total_tokens")
    hidden = getattr(result, "_hidden_params", None)
    cost = hidden.get("response_cost") if isinstance(hidden, dict) else None
    return (tokens if isinstance(tokens, int) else 0,
            float(cost) if isinstance(cost, int | float) else 0.0)
