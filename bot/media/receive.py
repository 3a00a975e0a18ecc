"""Receiving what comes with a message: each file is fetched into the conversation's own
folder of the workspace (`uploads/<conversation>/<date>/<name>`, never outside it, never
over another file), then a recording is transcribed, a picture (scaled once, off the event
loop) or a PDF is shown to the model if it can take it, and any other file is named with
where it is and how large, for the file tools.

Only a voice note the user recorded (`voice`) is their own words; any other recording (an
audio or video file, music, a forwarded voice note) is transcribed as a file's content,
which is outside content (`bot.turn.taint`).

Whatever cannot be used is said to the user in words (too large, a video, no transcription
model, a model that cannot see pictures); nothing is dropped without a word.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from bot.core.config import Config
from bot.core.errors import ModelError
from bot.core.events import Attachment, UserMessage
from bot.core.history import Media
from bot.llm.senses import Senses, Spend
from bot.media import (
    IMAGE_TOKENS,
    MB,
    PDF_PAGE_TOKENS,
    UPLOADS,
    FilePort,
    TooLarge,
    conversation_folder,
    new_file,
    size_text,
)

log = logging.getLogger(__name__)

AUDIO_MIMES = ("audio/", "video/mp4", "video/webm")
_UNSAFE = re.compile(r"[^\w.\- ()+,@=]+")


@dataclass(slots=True)
class Received:
    """What a message's files add to the turn."""

    lines: list[str] = field(default_factory=list)
    """For the model: transcripts and where each file is."""
    media: list[Media] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """For the user: what was heard, what could not be used and why."""


def safe_name(name: str, fallback: str) -> str:
    """A file name that stays one name in one folder: no separators, no dot-files, and no
    leading `-` (a shell command given `uploads/*` must not read it as an option)."""
    name = unicodedata.normalize("NFC", name).replace("/", "_").replace("\\", "_")
    name = _UNSAFE.sub("_", name).strip(" .")[:120].lstrip("-. ")
    return name or fallback


def kind_of(attachment: Attachment) -> str:
    """voice (a recording the user made) | image | audio | pdf | video | document"""
    mime = attachment.mime.lower()
    if attachment.kind == "voice":
        return "voice"
    if attachment.kind == "audio" or mime.startswith(AUDIO_MIMES) and attachment.kind != "video":
        return "audio"
    if attachment.kind == "image" or mime.startswith("image/"):
        return "image"
    if attachment.kind == "video" or mime.startswith("video/"):
        return "video"
    if mime == "application/pdf" or attachment.name.lower().endswith(".pdf"):
        return "pdf"
    return "document"


def pdf_pages(data: bytes) -> int:
    """A rough page count (each page object names its type)."""
    return max(1, data.count(b"/Type /Page") + data.count(b"/Type/Page")
               - data.count(b"/Type /Pages") - data.count(b"/Type/Pages"))


class Receiver:
    def __init__(self, config: Config, ports: Mapping[str, FilePort], senses: Senses) -> None:
        self.config = config
        self.ports = ports
        self.senses = senses
        self.workspace = Path(config.workspace.dir)

    async def receive(self, message: UserMessage, spend: Spend | None = None) -> Received:
        """Fetch and take in the message's files; a transcription's cost goes to `spend`."""
        got = Received()
        for attachment in message.attachments:
            try:
                await self._one(message, attachment, got, spend)
            except Exception:  # one bad file must not lose the message
                log.error("could not receive %s", attachment.name, exc_info=True)
                got.notes.append(f"Tandem could not take {attachment.name}: something went "
                                 "wrong on its side (the details are in its logs).")
        return got

    async def _one(self, message: UserMessage, attachment: Attachment, got: Received,
                   spend: Spend | None) -> None:
        kind = kind_of(attachment)
        name = attachment.name
        if kind == "video":
            got.notes.append(f"Tandem cannot watch videos, so {name} was not used. Send the "
                             "sound as a voice note or describe what is in it.")
            return
        port = self.ports.get(message.conv.platform)
        if port is None:
            got.notes.append(f"Tandem cannot fetch files here, so {name} was not used.")
            return
        limit, rule = self._limit(port)
        if attachment.size > limit:
            got.notes.append(f"{name} is {size_text(attachment.size)}; {rule}, so it was "
                             "not used.")
            return
        stored = await self._fetch(port, message, attachment, limit, kind, got)
        if stored is None:
            return
        path, size = stored
        rel = path.relative_to(self.workspace.resolve()).as_posix()
        media = Media(kind, name, rel, str(path), size, attachment.mime or "")
        if kind in ("voice", "audio"):
            await self._hear(media, got, spend)
        elif kind == "image":
            await self._see(media, got)
        else:
            await self._read(media, got)

    def _limit(self, port: FilePort) -> tuple[int, str]:
        """(the largest file taken from `port`, the rule that says so in words)."""
        own = int(self.config.media.max_mb * MB)
        if port.download_limit <= own:  # the platform's own rule binds: name it
            return port.download_limit, (f"{port.platform_name} lets bots fetch files up to "
                                         f"{size_text(port.download_limit)}")
        return own, f"Tandem takes files up to {size_text(own)} (media.max_mb)"

    async def _fetch(self, port: FilePort, message: UserMessage, attachment: Attachment,
                     limit: int, kind: str, got: Received) -> tuple[Path, int] | None:
        fallback = {"voice": "voice-note.ogg", "audio": "audio.ogg",
                    "image": "picture.jpg"}.get(kind, "file")
        try:
            path = self._new_path(message, safe_name(attachment.name, fallback))
        except OSError as exc:
            got.notes.append(f"Tandem could not save {attachment.name}: {exc}")
            return None
        try:
            size = await port.download(attachment, path, limit)
        except TooLarge:
            got.notes.append(f"{attachment.name} is larger than {size_text(limit)}, the most "
                             "Tandem takes, so it was not used.")
        except (ValueError, OSError) as exc:
            got.notes.append(f"Tandem could not fetch {attachment.name}: {exc}")
        else:
            return path.resolve(), size
        with contextlib.suppress(OSError):
            path.unlink()
        return None

    def _new_path(self, message: UserMessage, name: str) -> Path:
        """A new, empty file `uploads/<conversation>/<date>/<name>` (`name-2`, `-3`... if
        it is taken)."""
        day = datetime.now(ZoneInfo(self.config.scheduler.timezone)).strftime("%Y-%m-%d")
        return new_file(self.workspace, f"{UPLOADS}/{conversation_folder(message.conv)}/{day}",
                        name)

    async def _hear(self, media: Media, got: Received, spend: Spend | None) -> None:
        if not self.senses.transcribes:
            got.notes.append(f"Tandem cannot listen to voice notes: no transcription model is "
                             f"set (media.transcription.model). It is saved as {media.path}.")
            return
        try:
            words = await self.senses.transcribe(Path(media.file), media.mime, spend)
        except ModelError as exc:
            got.notes.append(f"Tandem could not understand {media.name}: {exc}. Nothing else "
                             "was done; send it again or type it.")
            return
        got.notes.append(f"Heard: “{words}”")
        if media.kind == "voice":  # the user's own words
            got.lines.append(words)
        else:
            got.lines.append(f"[the recording {media.name}, saved as {media.path}, says: "
                             f"“{words}”]")
        got.media.append(_with(media, transcript=words))

    async def _see(self, media: Media, got: Received) -> None:
        if not await self.senses.vision():
            got.notes.append(f"The model ({self.config.llm.model}) cannot see pictures, so it "
                             f"was only told that {media.name} is saved as {media.path}.")
            got.lines.append(_saved("a picture", media))
            got.media.append(media)
            return
        from bot.core.images import TooManyPixels, prepare

        try:  # decoded once, here and off the event loop; the scaled result is kept
            await asyncio.to_thread(prepare, Path(media.file))
        except TooManyPixels as exc:
            got.notes.append(f"{media.name} is too large a picture to look at: {exc}. It is "
                             f"saved as {media.path}; send a smaller one or a JPEG.")
            got.lines.append(_saved("a picture too large to show", media))
            got.media.append(_with(media, kind="document"))
            return
        except (OSError, ValueError) as exc:
            got.notes.append(f"{media.name} could not be read as a picture ({exc}); it is "
                             f"saved as {media.path}.")
            got.lines.append(_saved("a file", media))
            got.media.append(_with(media, kind="document"))
            return
        got.lines.append(f"[picture {media.name}, also saved as {media.path}]")
        got.media.append(_with(media, seen=True, tokens=IMAGE_TOKENS))

    async def _read(self, media: Media, got: Received) -> None:
        if media.kind == "pdf" and await self.senses.pdf():
            data = await asyncio.to_thread(Path(media.file).read_bytes)
            got.lines.append(f"[PDF {media.name} ({size_text(media.size)}), also saved as "
                             f"{media.path}]")
            got.media.append(_with(media, seen=True, tokens=pdf_pages(data) * PDF_PAGE_TOKENS,
                                   mime="application/pdf"))
            return
        got.lines.append(_saved("a file", media))
        got.media.append(_with(media, kind="document"))


def _saved(what: str, media: Media) -> str:
    return (f"[{what}: {media.name}, {size_text(media.size)}, saved as {media.path} in the "
            "workspace; read it with the file tools]")


def _with(media: Media, **changes: object) -> Media:
    return replace(media, **changes)  # type: ignore[arg-type]
