"""Media: pictures, voice notes and files that come with messages or go out to a chat.

A received file is kept in the workspace (`uploads/<date>/<name>`); the history keeps a
`Media` reference to it (kind, name, paths, size, transcript), never its bytes. A picture
or a PDF the model can read is turned into a content part when the request is built, from
the file as it is then: a file removed since is named as gone instead.

Platforms fetch and post files through a `FilePort` that their adapter registers; the core
never sees a platform object.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from bot.events import Attachment, ConvKey

log = logging.getLogger(__name__)

MB = 1024 * 1024
IMAGE_TOKENS = 1_600
"""A picture of at most 2,048 px a side costs about this much (OpenAI 765, Anthropic ~1,600)."""
PDF_PAGE_TOKENS = 2_000


class TooLarge(Exception):
    """A download went past its limit (the file was bigger than declared)."""


class FilePort(Protocol):
    """What an adapter offers for files: limits in bytes, a download, an upload."""

    download_limit: int
    upload_limit: int
    platform_name: str

    async def download(self, attachment: Attachment, dest: Path, limit: int) -> int:
        """Stream the file into `dest` (created, empty); the bytes written. Raises
        TooLarge past `limit`, ValueError with a plain reason when it cannot."""

    async def upload(self, conv: ConvKey, file: BinaryIO, name: str, caption: str, *,
                     picture: bool) -> None:
        """Post the file to the conversation (as a picture when `picture`); raises
        ValueError with a plain reason when the platform refuses it."""


@dataclass(frozen=True, slots=True)
class Media:
    """A file that came with a user's message, as the history keeps it."""

    kind: str
    """image | audio | pdf | document"""
    name: str
    """The name the user gave it."""
    path: str
    """Where it is in the workspace (relative), as the model is told."""
    file: str
    """The absolute path (what the request reads)."""
    size: int
    mime: str
    transcript: str | None = None
    seen: bool = False
    """Sent to the model as a content part (a picture or a PDF it can read)."""
    tokens: int = 0
    """Estimated cost of its part."""

    def part(self) -> dict[str, Any]:
        """The content part for the model, read from the file now."""
        path = Path(self.file)
        try:
            if self.kind == "image":
                from bot.media.images import data_url  # Pillow loads on first use

                return {"type": "image_url", "image_url": {"url": data_url(path)}}
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            return {"type": "file", "file": {"filename": self.name,
                                             "file_data": f"data:{self.mime};base64,{data}"}}
        except (OSError, ValueError) as exc:
            log.info("media %s is unreadable: %s", self.path, exc)
            return {"type": "text", "text": f"[{self.name} was sent earlier but is no longer "
                                            f"in the workspace at {self.path}]"}


def new_file(workspace: Path, folder: str, name: str) -> Path:
    """A new, empty, private file `<workspace>/<folder>/<name>` (`name-2.ext`, `-3`... when
    the name is taken: nothing is overwritten). OSError if the folder leads outside."""
    from bot.file_modes import private_dir, private_file

    where = private_dir(workspace / folder)
    if workspace.resolve() not in where.resolve().parents:  # a link put in the way leads out
        raise OSError(f"{folder} leads outside the workspace")
    stem, dot, ext = name.rpartition(".") if "." in name[1:] else (name, "", "")
    for n in range(1, 10_000):
        candidate = where / (name if n == 1 else f"{stem}-{n}{dot}{ext}")
        if private_file(candidate):
            return candidate
    raise OSError(f"too many files named {name} in {folder}")


def media_to_json(media: tuple[Media, ...]) -> str | None:
    return json.dumps([asdict(m) for m in media], ensure_ascii=False) if media else None


def media_from_json(raw: str | None) -> tuple[Media, ...]:
    if not raw:
        return ()
    try:
        return tuple(Media(**item) for item in json.loads(raw))
    except (ValueError, TypeError):
        log.warning("unreadable media reference in the history: %.80s", raw)
        return ()


def wire_content(text: str, media: tuple[Media, ...]) -> str | list[dict[str, Any]]:
    """A user message's content: its text, then the parts of what the model can see."""
    seen = [m for m in media if m.seen]
    if not seen:
        return text
    return [{"type": "text", "text": text or "(no caption)"}, *(m.part() for m in seen)]


def size_text(size: int) -> str:
    """1,234 bytes as "1.2 kB", 3,400,000 as "3.2 MB" (1 kB = 1,024 bytes)."""
    if size < 1024:
        return f"{size} bytes"
    if size < MB:
        return f"{size / 1024:.1f} kB"
    return f"{size / MB:.1f} MB"
