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

A user message's ``content`` may be a list of parts: ``text``, ``image_url`` (an http(s)
URL or a base64 data URL of a PNG, JPEG, GIF or WebP whose bytes really are that type),
``file`` (a base64 PDF data URL or a ``file_id``) and ``input_audio``; other roles may
only carry text (``refusal`` too for the assistant).  With ``vision=False`` every image
is refused, as a text-only model does.  ``image_parts()`` hands back the decoded pictures.

``POST /v1/audio/transcriptions`` takes the multipart form the OpenAI client sends
(``litellm.atranscription(model="whisper-1", file=..., api_base=server.api_base)``),
refuses what OpenAI refuses (no file, over 25 MB, an extension Whisper does not take,
bytes that are no audio container) and answers with the next scripted ``Transcript``
(``transcribe_script``), else ``transcriber``, else a deterministic text naming the
file.  Every request is recorded in ``transcriptions``.

``cache="openai"`` or ``cache="anthropic"`` reports cached input tokens in that provider's
usage shape (``tests.fakes.prompt_cache``); a request carrying ``cache_control`` is checked
as Anthropic checks it either way, and refused with Anthropic's error.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import itertools
import json
import re
import time
import wave
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import BodyPartReader, hdrs, web

from tests.fakes.prompt_cache import PromptCache, check_cache_control

__all__ = ["FakeModelServer", "Reply", "ToolCallSpec", "Transcript", "TranscriptionRequest"]

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

# content parts
IMAGE_PART_TOKENS = 765
"""What one picture counts in ``estimate_prompt_tokens`` (OpenAI's figure for 1024x1024)."""
PDF_PAGE_TOKENS = 1_000
"""What one page of a PDF ``file`` part counts in ``estimate_prompt_tokens``."""
IMAGE_FORMATS = ("png", "jpeg", "gif", "webp")
MAX_IMAGE_BYTES = 20 * 1024 * 1024
IMAGE_ROLE_MESSAGE = (
    "Invalid 'messages[{i}]'. Image URLs are only allowed for messages with role 'user', "
    "but this message with role '{role}' contains an image URL."
)
NO_VISION_MESSAGE = "Invalid content type. image_url is only supported by certain models."
INVALID_IMAGE_MESSAGE = "You uploaded an unsupported image. Please make sure your image is valid."
IMAGE_FORMAT_MESSAGE = (
    "You uploaded an unsupported image. Please make sure your image has of one the following "
    "formats: ['png', 'jpeg', 'gif', 'webp']."
)
IMAGE_SIZE_MESSAGE = (
    "You uploaded an unsupported image. Please make sure your image is below 20 MB in size and "
    "is of one the following formats: ['png', 'jpeg', 'gif', 'webp']."
)
IMAGE_URL_MESSAGE = (
    "Invalid image URL: '{where}'. Expected a base64-encoded data URL with an image MIME type "
    "(e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got {reason}."
)
FILE_DATA_MESSAGE = (
    "Invalid file data: '{where}'. Expected a base64-encoded data URL with an application/pdf "
    "MIME type (e.g. 'data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ=='), but got {reason}."
)
EMPTY_CONTENT_MESSAGE = (
    "Invalid 'messages[{i}].content': empty array. Expected an array with minimum length 1, "
    "but got an empty array instead."
)
EMPTY_TEXT_MESSAGE = "messages: text content blocks must be non-empty"  # Anthropic's wording
PART_TYPES: dict[str, tuple[str, ...]] = {
    "user": ("text", "image_url", "input_audio", "file"),
    "system": ("text",),
    "assistant": ("text", "refusal"),
    "tool": ("text",),
}

# transcriptions
TRANSCRIPT_FAULTS = frozenset({"429", "500", "hang"})
MAX_AUDIO_BYTES = 26_214_400
AUDIO_FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav", "webm")
AUDIO_SIZE_MESSAGE = "Maximum content size limit (26214400) exceeded ({n} bytes read)"
AUDIO_FORMAT_MESSAGE = f"Invalid file format. Supported formats: {list(AUDIO_FORMATS)}"
AUDIO_CORRUPT_MESSAGE = "Audio file might be corrupted or unsupported"
AUDIO_SHORT_MESSAGE = "Audio file is too short. Minimum audio length is 0.1 seconds."
MISSING_FILE_MESSAGE = "Missing required parameter: 'file'."
MISSING_MODEL_MESSAGE = "you must provide a model parameter"
MULTIPART_MESSAGE = (
    "Invalid Content-Type header ({content_type}), expected multipart/form-data. (HINT: If "
    "you're using curl, you can pass -F 'key=value' pairs to pass data as multipart/form-data)"
)
RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
LANGUAGE_NAMES = {
    "en": "english",
    "de": "german",
    "fr": "french",
    "es": "spanish",
    "it": "italian",
    "pt": "portuguese",
    "nl": "dutch",
    "ru": "russian",
    "uk": "ukrainian",
    "pl": "polish",
    "ja": "japanese",
    "zh": "chinese",
    "ko": "korean",
    "ar": "arabic",
    "tr": "turkish",
}


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
class Transcript:
    """One scripted transcription answer (or fault)."""

    text: str = ""
    language: str | None = None  # verbose_json's "language"; default: the request's, or english
    duration: float | None = None  # seconds; default: read from a WAV, else guessed from the size
    fault: str | None = None  # None | "429" | "500" | "hang"
    retry_after: int = 1  # seconds, for "429"

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in TRANSCRIPT_FAULTS:
            raise ValueError(
                f"unknown fault {self.fault!r}; expected one of {sorted(TRANSCRIPT_FAULTS)}"
            )


@dataclass
class TranscriptionRequest:
    """One multipart ``/audio/transcriptions`` request, as received (also the refused ones)."""

    model: str | None
    filename: str | None  # None: no ``file`` part with a filename
    content_type: str | None  # the file part's own Content-Type
    size: int
    sha256: str
    data: bytes
    fields: dict[str, str]  # every other form field, as sent (a repeated one: the last)
    authorization: str | None  # the Authorization header, as sent

    def __getitem__(self, key: str) -> Any:
        """``record["size"]`` is ``record.size``: a record reads like a request body too."""
        if key.startswith("_") or not hasattr(self, key):
            raise KeyError(key)
        return getattr(self, key)

    @property
    def language(self) -> str | None:
        return self.fields.get("language")

    @property
    def prompt(self) -> str | None:
        return self.fields.get("prompt")

    @property
    def response_format(self) -> str:
        return self.fields.get("response_format") or "json"

    @property
    def temperature(self) -> float | None:
        raw = self.fields.get("temperature")
        return float(raw) if raw is not None else None


@dataclass
class _Violation:
    message: str
    param: str | None
    code: str | None = None
    status: int = 400
    type: str = "invalid_request_error"


def _pdf_pages(part: dict[str, Any]) -> int:
    file = part.get("file")
    data = file.get("file_data") if isinstance(file, dict) else None
    if not isinstance(data, str) or "," not in data:
        return 1
    try:
        raw = base64.b64decode(data.split(",", 1)[1])
    except (binascii.Error, ValueError):
        return 1
    return max(1, len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", raw)))


def _part_tokens(content: list[Any]) -> tuple[list[Any], int]:
    """The parts with pictures and PDFs stubbed out, and the fixed tokens they count instead."""
    parts: list[Any] = []
    extra = 0
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url":
            extra += IMAGE_PART_TOKENS
        elif kind == "file":
            extra += PDF_PAGE_TOKENS * _pdf_pages(part)
        else:
            parts.append(part)
            continue
        parts.append({"type": kind})
    return parts, extra


def estimate_prompt_tokens(messages: Any, tools: Any) -> int:
    """Rough prompt size: characters of the JSON-encoded messages and tools, divided by 4.

    A picture counts ``IMAGE_PART_TOKENS`` and a PDF ``PDF_PAGE_TOKENS`` a page, not the
    length of their base64.
    """
    payload: list[Any] = []
    extra = 0
    for msg in messages if isinstance(messages, list) else []:
        if isinstance(msg, dict) and isinstance(msg.get("content"), list):
            parts, tokens = _part_tokens(msg["content"])
            msg = {**msg, "content": parts}
            extra += tokens
        payload.append(msg)
    if isinstance(tools, list):
        payload += tools
    return len(json.dumps(payload)) // 4 + extra


def _error_body(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


# --------------------------------------------------------------------------- validation


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    names = {int: "an integer", float: "a decimal", str: "a string", list: "an array"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), "an object")


def _one_of(values: tuple[str, ...]) -> str:
    quoted = [f"'{v}'" for v in values]
    if len(quoted) < 3:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


def _type_error(where: str, expected: str, value: Any) -> _Violation:
    return _Violation(
        f"Invalid type for '{where}': expected {expected}, but got {_json_type(value)} instead.",
        where,
        "invalid_type",
    )


def _missing(where: str) -> _Violation:
    return _Violation(
        f"Missing required parameter: '{where}'.", where, "missing_required_parameter"
    )


_DATA_URL = re.compile(r"data:(?P<mime>[^;,]*)(?P<params>(?:;[^;,]*)*),(?P<payload>.*)", re.DOTALL)


def _split_data_url(url: str) -> tuple[str, str] | str:
    """(mime, base64 payload) of a base64 data URL, or what is wrong with it (OpenAI's words)."""
    if not url.startswith("data:"):
        return "a value without the 'data:' prefix"
    match = _DATA_URL.fullmatch(url)
    if match is None or "base64" not in match["params"].lower().split(";"):
        return "an invalid base64-encoded value"
    return match["mime"].lower(), match["payload"]


def _b64(payload: str) -> bytes | str:
    """The decoded bytes, or what is wrong with them (OpenAI's words)."""
    if not payload:
        return "empty base64-encoded bytes"
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return "an invalid base64-encoded value"


def _data_url_bytes(url: Any) -> bytes | None:
    split = _split_data_url(url) if isinstance(url, str) else None
    data = _b64(split[1]) if isinstance(split, tuple) else None
    return data if isinstance(data, bytes) else None


_IMAGE_MAGIC = (
    (0, b"\x89PNG\r\n\x1a\n", "png"),
    (0, b"\xff\xd8\xff", "jpeg"),
    (0, b"GIF87a", "gif"),
    (0, b"GIF89a", "gif"),
    (8, b"WEBP", "webp"),  # after b"RIFF" + size
)


def _image_kind(data: bytes) -> str | None:
    """The picture format its first bytes declare (png, jpeg, gif, webp), or None."""
    for offset, magic, kind in _IMAGE_MAGIC:
        if data[offset : offset + len(magic)] == magic and (offset == 0 or data[:4] == b"RIFF"):
            return kind
    return None


def _pillow_reads(data: bytes, kind: str) -> bool:
    """Pillow (when installed) opens and verifies ``data`` as a picture of ``kind``."""
    try:
        from PIL import Image
    except ImportError:
        return True
    try:
        with Image.open(io.BytesIO(data)) as image:
            found = (image.format or "").lower()
            image.verify()
    except Exception:  # Pillow raises OSError, SyntaxError, ValueError, struct.error, ...
        return False
    return found == kind


def _check_image_data(url: str, where: str) -> _Violation | None:
    at = f"{where}.image_url.url"
    split = _split_data_url(url)
    if isinstance(split, str):
        return _Violation(IMAGE_URL_MESSAGE.format(where=at, reason=split), at, "invalid_value")
    mime, payload = split
    if not mime.startswith("image/"):
        reason = f"unsupported MIME type '{mime}'"
        return _Violation(IMAGE_URL_MESSAGE.format(where=at, reason=reason), at, "invalid_value")
    if mime.removeprefix("image/") not in IMAGE_FORMATS:
        return _Violation(IMAGE_FORMAT_MESSAGE, None, "invalid_image_format")
    data = _b64(payload)
    if isinstance(data, str):
        return _Violation(IMAGE_URL_MESSAGE.format(where=at, reason=data), at, "invalid_value")
    if len(data) > MAX_IMAGE_BYTES:
        return _Violation(IMAGE_SIZE_MESSAGE, None, "invalid_image_format")
    kind = mime.removeprefix("image/")
    if _image_kind(data) != kind or not _pillow_reads(data, kind):
        return _Violation(INVALID_IMAGE_MESSAGE, None, "invalid_image")
    return None


def _check_text_part(where: str, part: dict[str, Any]) -> _Violation | None:
    if "text" not in part:
        return _missing(f"{where}.text")
    if not isinstance(part["text"], str):
        return _type_error(f"{where}.text", "a string", part["text"])
    if not part["text"]:
        return _Violation(EMPTY_TEXT_MESSAGE, f"{where}.text")
    return None


def _check_refusal_part(where: str, part: dict[str, Any]) -> _Violation | None:
    if "refusal" not in part:
        return _missing(f"{where}.refusal")
    if not isinstance(part["refusal"], str):
        return _type_error(f"{where}.refusal", "a string", part["refusal"])
    return None


def _check_image_part(where: str, part: dict[str, Any]) -> _Violation | None:
    image = part.get("image_url")
    if image is None:
        return _missing(f"{where}.image_url")
    if not isinstance(image, dict):
        return _type_error(f"{where}.image_url", "an object", image)
    url = image.get("url")
    if url is None:
        return _missing(f"{where}.image_url.url")
    if not isinstance(url, str):
        return _type_error(f"{where}.image_url.url", "a string", url)
    detail = image.get("detail", "auto")
    if detail not in ("auto", "low", "high"):
        return _Violation(
            f"Invalid value: {detail!r}. Supported values are: 'auto', 'low', and 'high'.",
            f"{where}.image_url.detail",
            "invalid_value",
        )
    if url.startswith(("http://", "https://")):
        return None  # the fake does not fetch it
    return _check_image_data(url, where)


def _check_pdf_data(url: str, at: str) -> _Violation | None:
    split = _split_data_url(url)
    reason: str | None = split if isinstance(split, str) else None
    if isinstance(split, tuple):
        mime, payload = split
        data = _b64(payload)
        if mime != "application/pdf":
            reason = f"unsupported MIME type '{mime}'"
        elif isinstance(data, str):
            reason = data
        elif not data.startswith(b"%PDF-"):
            reason = "bytes that are not a PDF"
    if reason is None:
        return None
    return _Violation(FILE_DATA_MESSAGE.format(where=at, reason=reason), at, "invalid_value")


def _check_file_part(where: str, part: dict[str, Any]) -> _Violation | None:
    file = part.get("file")
    if file is None:
        return _missing(f"{where}.file")
    if not isinstance(file, dict):
        return _type_error(f"{where}.file", "an object", file)
    if "filename" in file and not isinstance(file["filename"], str):
        return _type_error(f"{where}.file.filename", "a string", file["filename"])
    if ("file_id" in file) == ("file_data" in file):
        return _Violation(
            f"Invalid '{where}.file': exactly one of 'file_data' or 'file_id' must be provided.",
            f"{where}.file",
            "invalid_value",
        )
    if "file_id" in file:
        if not isinstance(file["file_id"], str) or not file["file_id"]:
            return _type_error(f"{where}.file.file_id", "a non-empty string", file["file_id"])
        return None
    if not isinstance(file["file_data"], str):
        return _type_error(f"{where}.file.file_data", "a string", file["file_data"])
    return _check_pdf_data(file["file_data"], f"{where}.file.file_data")


def _check_audio_part(where: str, part: dict[str, Any]) -> _Violation | None:
    audio = part.get("input_audio")
    if audio is None:
        return _missing(f"{where}.input_audio")
    if not isinstance(audio, dict):
        return _type_error(f"{where}.input_audio", "an object", audio)
    data = audio.get("data")
    if not isinstance(data, str):
        return _type_error(f"{where}.input_audio.data", "a string", data)
    decoded = _b64(data)
    if isinstance(decoded, str):
        return _Violation(
            f"Invalid '{where}.input_audio.data': expected base64-encoded audio, but got "
            f"{decoded}.",
            f"{where}.input_audio.data",
            "invalid_value",
        )
    if audio.get("format") not in ("wav", "mp3"):
        return _Violation(
            f"Invalid value: {audio.get('format')!r}. Supported values are: 'wav' and 'mp3'.",
            f"{where}.input_audio.format",
            "invalid_value",
        )
    return None


_PART_CHECKS: dict[str, Callable[[str, dict[str, Any]], _Violation | None]] = {
    "text": _check_text_part,
    "refusal": _check_refusal_part,
    "image_url": _check_image_part,
    "file": _check_file_part,
    "input_audio": _check_audio_part,
}


def _check_part(i: int, j: int, role: str, part: Any, vision: bool) -> _Violation | None:
    where = f"messages[{i}].content[{j}]"
    if not isinstance(part, dict):
        return _type_error(where, "an object", part)
    kind = part.get("type")
    if kind is None:
        return _missing(f"{where}.type")
    if kind == "image_url" and not vision:
        return _Violation(NO_VISION_MESSAGE, f"messages.[{i}].content.[{j}].type")
    if kind == "image_url" and role != "user":
        return _Violation(
            IMAGE_ROLE_MESSAGE.format(i=i, role=role), f"messages.[{i}].content.[{j}].type"
        )
    allowed = PART_TYPES[role]
    if kind not in allowed:
        return _Violation(
            f"Invalid value: {kind!r}. Supported values are: {_one_of(allowed)}.",
            f"{where}.type",
            "invalid_value",
        )
    return _PART_CHECKS[kind](where, part)


def _check_parts(i: int, role: str, content: list[Any], vision: bool) -> _Violation | None:
    """A list ``content``: non-empty, each part well formed and allowed for ``role``."""
    if not content:
        return _Violation(
            EMPTY_CONTENT_MESSAGE.format(i=i), f"messages[{i}].content", "empty_array"
        )
    for j, part in enumerate(content):
        problem = _check_part(i, j, role, part, vision)
        if problem is not None:
            return problem
    return None


def _check_message_shape(i: int, msg: Any, vision: bool = True) -> _Violation | None:
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
    if isinstance(content, list):
        return _check_parts(i, role, content, vision)
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


def validate_messages(messages: Any, *, vision: bool = True) -> _Violation | None:
    """Return the first problem with ``messages`` (OpenAI + Anthropic rules), or None.

    ``vision=False`` refuses every picture, as a text-only model does.
    """
    if not isinstance(messages, list) or not messages:
        return _Violation("Invalid 'messages': expected a non-empty array.", "messages")
    for i, msg in enumerate(messages):
        problem = _check_message_shape(i, msg, vision)
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


# --------------------------------------------------------------------------- transcriptions

_AUDIO_MAGIC = (
    (0, b"fLaC", "flac"),
    (0, b"OggS", "ogg"),  # ogg, oga, opus voice notes
    (0, b"\x1a\x45\xdf\xa3", "webm"),  # EBML: webm, mkv
    (4, b"ftyp", "mp4"),  # mp4, m4a
    (0, b"ID3", "mp3"),
    (0, b"\x00\x00\x01\xba", "mpeg"),  # MPEG program stream
)


def _audio_kind(data: bytes) -> str | None:
    """The audio container the first bytes declare, or None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    for offset, magic, kind in _AUDIO_MAGIC:
        if data[offset : offset + len(magic)] == magic:
            return kind
    if len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0:
        return "mp3"  # a bare MPEG audio frame
    return None


def _wav_duration(data: bytes) -> float | None:
    try:
        with wave.open(io.BytesIO(data)) as wav:
            frames, rate = wav.getnframes(), wav.getframerate()
    except (wave.Error, EOFError, ValueError):
        return None
    return frames / rate if rate > 0 else None


def _audio_problem(data: bytes) -> _Violation | None:
    """What OpenAI would say of bytes that are no audio it can decode."""
    kind = _audio_kind(data)
    duration = _wav_duration(data) if kind == "wav" else None
    if kind is None or (kind == "wav" and duration is None):
        return _Violation(AUDIO_CORRUPT_MESSAGE, "file", "invalid_value")
    if duration is not None and duration < 0.1:
        return _Violation(AUDIO_SHORT_MESSAGE, "file", "audio_too_short")
    return None


def _check_temperature(raw: str | None) -> _Violation | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return _type_error("temperature", "a decimal", raw)
    if not 0 <= value <= 1:
        side, bound = ("above maximum", "<= 1") if value > 1 else ("below minimum", ">= 0")
        return _Violation(
            f"Invalid 'temperature': decimal {side} value. Expected a value {bound}, but got "
            f"{raw} instead.",
            "temperature",
            f"decimal_{side.replace(' ', '_')}_value",
        )
    return None


def _check_form(record: TranscriptionRequest) -> _Violation | None:
    """The form fields other than the file."""
    if not record.model:
        return _Violation(MISSING_MODEL_MESSAGE, None)
    fmt = record.fields.get("response_format", "json")
    if fmt not in RESPONSE_FORMATS:
        return _Violation(
            f"Invalid value: {fmt!r}. Supported values are: {_one_of(RESPONSE_FORMATS)}.",
            "response_format",
            "invalid_value",
        )
    language = record.fields.get("language")
    if language is not None and not re.fullmatch(r"[a-z]{2,3}", language):
        return _Violation(
            f"Invalid language '{language}'. Language parameter must be specified in ISO-639-1 "
            "format.",
            "language",
            "invalid_language_format",
        )
    return _check_temperature(record.fields.get("temperature"))


def check_transcription(
    record: TranscriptionRequest, body_size: int, check_audio: bool = True
) -> _Violation | None:
    """The first problem OpenAI would find with a transcription request, or None."""
    read = max(body_size, record.size)
    if read > MAX_AUDIO_BYTES:
        return _Violation(AUDIO_SIZE_MESSAGE.format(n=read), None, status=413, type="server_error")
    problem = _check_form(record)
    if problem is not None:
        return problem
    if record.filename is None:
        return _Violation(MISSING_FILE_MESSAGE, "file")
    _, dot, extension = record.filename.rpartition(".")
    if not dot or extension.lower() not in AUDIO_FORMATS:
        return _Violation(AUDIO_FORMAT_MESSAGE, None)
    return _audio_problem(record.data) if check_audio else None


def _segments(text: str, duration: float) -> list[dict[str, Any]]:
    """Whisper-like segments: one a sentence, timed in proportion to its length."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]
    total = sum(len(s) for s in sentences) or 1
    segments: list[dict[str, Any]] = []
    start = 0.0
    for n, sentence in enumerate(sentences):
        end = round(start + duration * len(sentence) / total, 3)
        segments.append(
            {
                "id": n,
                "seek": 0,
                "start": start,
                "end": end,
                "text": f" {sentence}",
                "tokens": [50364 + k for k in range(len(sentence.split()))],
                "temperature": 0.0,
                "avg_logprob": -0.25,
                "compression_ratio": 1.0,
                "no_speech_prob": 0.01,
            }
        )
        start = end
    return segments


def _timestamp(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    hours, minutes, secs = ms // 3_600_000, ms // 60_000 % 60, ms // 1000 % 60
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{sep}{ms % 1000:03d}"


def _subtitles(segments: list[dict[str, Any]], fmt: str) -> str:
    sep = "," if fmt == "srt" else "."
    blocks = []
    for seg in segments:
        cue = f"{_timestamp(seg['start'], sep)} --> {_timestamp(seg['end'], sep)}"
        head = f"{seg['id'] + 1}\n" if fmt == "srt" else ""
        blocks.append(f"{head}{cue}\n{seg['text'].strip()}\n")
    body = "\n".join(blocks)
    return body if fmt == "srt" else f"WEBVTT\n\n{body}"


def _transcription_response(record: TranscriptionRequest, transcript: Transcript) -> web.Response:
    """The answer in the requested ``response_format``."""
    text = transcript.text
    fmt = record.response_format
    if fmt == "json":
        return web.json_response({"text": text})
    if fmt == "text":
        return web.Response(text=f"{text}\n", content_type="text/plain")
    duration = transcript.duration
    if duration is None:
        duration = _wav_duration(record.data) if _audio_kind(record.data) == "wav" else None
    if duration is None:
        duration = max(0.1, record.size / 16_000)  # about 128 kbit/s
    duration = round(duration, 3)
    segments = _segments(text, duration)
    if fmt != "verbose_json":
        return web.Response(text=_subtitles(segments, fmt), content_type="text/plain")
    code = record.language or "en"
    body = {
        "task": "transcribe",
        "language": transcript.language or LANGUAGE_NAMES.get(code, code),
        "duration": duration,
        "text": text,
        "segments": segments,
    }
    return web.json_response(body)


def default_transcript_text(record: TranscriptionRequest) -> str:
    """What the fake hears when nothing is scripted: the file named, deterministically."""
    return f"Transcript of {record.filename} ({record.size} bytes, sha256 {record.sha256[:12]})."


# --------------------------------------------------------------------------- server

CLIENT_MAX_SIZE = 64 * 1024 * 1024
"""Largest JSON body the chat endpoint reads (aiohttp's default, 1 MiB, is one big picture)."""


class FakeModelServer:
    """A strict, scriptable OpenAI-compatible ``/v1/chat/completions`` and
    ``/v1/audio/transcriptions`` endpoint.

    ``vision=False`` makes it a text-only model (every picture is refused);
    ``transcription_delay_s`` is how long each transcription takes (the fake's own time,
    which a benchmark can subtract); ``check_audio=False`` accepts any bytes as audio.
    """

    def __init__(
        self,
        *,
        context_limit: int | None = None,
        port: int = 0,
        vision: bool = True,
        transcription_delay_s: float = 0.0,
        check_audio: bool = True,
        cache: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._port = port
        self.cache = PromptCache(cache, clock=clock) if cache is not None else None
        """Reports cached input tokens in ``cache``'s usage shape (None: none)."""
        self.context_limit = context_limit
        self.vision = vision
        self.transcription_delay_s = transcription_delay_s
        self.check_audio = check_audio
        self.api_base: str = ""
        self.responder: Callable[[list[dict[str, Any]]], Reply] | None = None
        self.transcriber: Callable[[TranscriptionRequest], Transcript | str] | None = None
        self.requests: list[dict[str, Any]] = []
        self.transcriptions: list[TranscriptionRequest] = []
        self.transcripts: deque[Transcript] = deque()
        self.violations: list[str] = []
        self.chunks_sent = 0
        """Streamed events written so far, all streams together."""
        self.streams_ended = 0
        """Streams over: written to the end, cut by a "drop" fault, or left by the client."""
        self._queue: deque[Reply] = deque()
        self._cached: dict[int, dict[str, Any]] = {}
        """The cache's usage fields of each request being answered (by id of its body)."""
        self._call_ids = itertools.count(1)
        self._completion_ids = itertools.count(1)
        self._arrived = asyncio.Condition()
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("server already started")
        app = web.Application(client_max_size=CLIENT_MAX_SIZE)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/chat/completions", self._handle)
        app.router.add_post("/v1/audio/transcriptions", self._handle_transcription)
        app.router.add_post("/audio/transcriptions", self._handle_transcription)
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

    async def wait_streamed(self, chunks: int, timeout: float = 5.0) -> None:
        """Wait until ``chunks_sent`` reaches ``chunks`` (a paced stream is under way)."""
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: self.chunks_sent >= chunks)

    async def wait_streams_ended(self, n: int, timeout: float = 5.0) -> None:
        """Wait until ``n`` streams are over (a client that went away is seen at the next
        write of a paced stream)."""
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: self.streams_ended >= n)

    async def _changed(self) -> None:
        async with self._arrived:
            self._arrived.notify_all()

    def last_messages(self) -> list[dict[str, Any]]:
        if not self.requests:
            raise AssertionError("no request received yet")
        messages = self.requests[-1].get("messages", [])
        return messages if isinstance(messages, list) else []

    def _parts(self, request_index: int, kind: str) -> list[dict[str, Any]]:
        if not self.requests:
            raise AssertionError("no request received yet")
        messages = self.requests[request_index].get("messages")
        return [
            part
            for msg in (messages if isinstance(messages, list) else [])
            if isinstance(msg, dict) and isinstance(msg.get("content"), list)
            for part in msg["content"]
            if isinstance(part, dict) and part.get("type") == kind
        ]

    def image_parts(self, request_index: int = -1) -> list[bytes]:
        """The decoded bytes of each data-URL picture in a request (default: the last one),
        in order; http(s) URLs and undecodable data are left out."""
        found = []
        for part in self._parts(request_index, "image_url"):
            image = part.get("image_url")
            data = _data_url_bytes(image.get("url") if isinstance(image, dict) else None)
            if data is not None:
                found.append(data)
        return found

    def file_parts(self, request_index: int = -1) -> list[tuple[str | None, bytes]]:
        """(filename, decoded bytes) of each ``file_data`` part in a request (default: the last)."""
        found = []
        for part in self._parts(request_index, "file"):
            file = part.get("file")
            if not isinstance(file, dict):
                continue
            data = _data_url_bytes(file.get("file_data"))
            if data is not None:
                name = file.get("filename")
                found.append((name if isinstance(name, str) else None, data))
        return found

    def transcribe_script(self, *transcripts: Transcript | str) -> None:
        """Queue transcripts (a str is ``Transcript(text=...)``); each accepted transcription
        request consumes one (FIFO)."""
        self.transcripts.extend(
            t if isinstance(t, Transcript) else Transcript(t) for t in transcripts
        )

    async def wait_transcriptions(self, n: int, timeout: float = 5.0) -> None:
        """Wait until at least ``n`` transcription requests have been received."""
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: len(self.transcriptions) >= n)

    # ------------------------------------------------------------------ handler

    async def _record(self, body: dict[str, Any]) -> None:
        async with self._arrived:
            self.requests.append(body)
            self._arrived.notify_all()

    def _reject(self, problem: _Violation) -> web.Response:
        self.violations.append(problem.message)
        return web.json_response(
            _error_body(problem.message, problem.type, problem.param, problem.code),
            status=problem.status,
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
        problem = validate_messages(messages, vision=self.vision)
        if problem is not None:
            return self._reject(problem)
        assert isinstance(messages, list)
        refusal = check_cache_control(body)
        if refusal is not None:
            self.violations.append(refusal.message)
            return web.json_response(refusal.body(), status=400)
        prompt_tokens = estimate_prompt_tokens(messages, body.get("tools"))
        if self.context_limit is not None and prompt_tokens > self.context_limit:
            return self._context_error(prompt_tokens)
        if self.cache is not None:  # read back (and dropped) by the answer's usage
            self._cached[id(body)] = self.cache.usage(body, prompt_tokens)

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
        self, request: web.Request, reply: Reply | Transcript, prompt_tokens: int
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

    # ------------------------------------------------------------------ transcriptions

    async def _read_form(self, request: web.Request) -> tuple[TranscriptionRequest, int]:
        """The multipart form as a record, and how many body bytes were read."""
        reader = await request.multipart()
        fields: dict[str, str] = {}
        filename: str | None = None
        content_type: str | None = None
        data = b""
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise ValueError("a nested multipart body")
            if part.name == "file":
                filename = part.filename or ""
                content_type = part.headers.get(hdrs.CONTENT_TYPE)
                data = bytes(await part.read())  # all of it, to answer even a too-large file
                continue
            value = (await part.read()).decode("utf-8", "replace")
            name = part.name or ""
            fields[name] = f"{fields[name]},{value}" if name in fields else value
        record = TranscriptionRequest(
            model=fields.pop("model", None),
            filename=filename,
            content_type=content_type,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            data=data,
            fields=fields,
            authorization=request.headers.get(hdrs.AUTHORIZATION),
        )
        return record, request.content.total_bytes

    async def _record_transcription(self, record: TranscriptionRequest) -> None:
        async with self._arrived:
            self.transcriptions.append(record)
            self._arrived.notify_all()

    def _next_transcript(self, record: TranscriptionRequest) -> Transcript:
        if self.transcripts:
            return self.transcripts.popleft()
        if self.transcriber is not None:
            made = self.transcriber(record)
            return made if isinstance(made, Transcript) else Transcript(made)
        return Transcript(default_transcript_text(record))

    async def _handle_transcription(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "multipart/form-data":
            message = MULTIPART_MESSAGE.format(content_type=request.content_type)
            return self._reject(_Violation(message, None))
        try:
            record, body_size = await self._read_form(request)
        except (ValueError, AssertionError, RuntimeError):
            return self._reject(
                _Violation("We could not parse the multipart body of your request.", None)
            )
        await self._record_transcription(record)
        problem = check_transcription(record, body_size, self.check_audio)
        if problem is not None:
            return self._reject(problem)
        transcript = self._next_transcript(record)
        if transcript.fault is not None:
            fault_response = await self._fault(request, transcript, 0)
            if fault_response is not None:
                return fault_response
        if self.transcription_delay_s > 0:
            await asyncio.sleep(self.transcription_delay_s)
        return _transcription_response(record, transcript)

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
        reply: Reply, prompt_tokens: int, calls: list[tuple[str, str, str]],
        cached: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if reply.usage is not None:
            prompt, completion = reply.usage
        else:
            produced = len(reply.text) + sum(len(name) + len(args) for _, name, args in calls)
            prompt, completion = prompt_tokens, max(1, produced // 4)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            **(cached or {}),
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
            "usage": self._usage(reply, prompt_tokens, calls, self._cached.pop(id(body), None)),
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
            usage = self._usage(reply, prompt_tokens, calls, self._cached.pop(id(body), None))
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
                    self.chunks_sent += 1
                    await self._changed()
            else:
                # One write: the client still sees separate SSE events, and the server stays
                # fast enough for benchmarks.
                await response.write(b"".join(events))
                self.chunks_sent += len(events)
            if dropping:
                if request.transport is not None:
                    request.transport.close()  # flush what was sent, then cut the connection
                return response
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away mid-stream
        finally:
            self.streams_ended += 1
            await self._changed()
        return response
