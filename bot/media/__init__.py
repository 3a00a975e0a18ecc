"""Media: pictures, voice notes and files that come with messages or go out to a chat.

A received file is kept in the workspace (`uploads/<date>/<name>`); the history keeps a
`Media` reference to it (`bot.core.history.Media`: kind, name, paths, size, transcript),
never its bytes. Pictures are encoded for the model by `bot.core.images`.

Platforms fetch and post files through a `FilePort` that their adapter registers; the core
never sees a platform object.

Layer: below `bot.tools`, above `bot.llm` (a voice note is transcribed by
`bot.llm.senses`); imports `bot.core` and `bot.llm`, never the turn, the store or anything
above.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Protocol

from bot.core.events import Attachment, ConvKey

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


def new_file(workspace: Path, folder: str, name: str) -> Path:
    """A new, empty, private file `<workspace>/<folder>/<name>` (`name-2.ext`, `-3`... when
    the name is taken: nothing is overwritten). OSError if the folder leads outside."""
    from bot.core.file_modes import private_dir, private_file

    where = private_dir(workspace / folder)
    if workspace.resolve() not in where.resolve().parents:  # a link put in the way leads out
        raise OSError(f"{folder} leads outside the workspace")
    stem, dot, ext = name.rpartition(".") if "." in name[1:] else (name, "", "")
    for n in range(1, 10_000):
        candidate = where / (name if n == 1 else f"{stem}-{n}{dot}{ext}")
        if private_file(candidate):
            return candidate
    raise OSError(f"too many files named {name} in {folder}")


def size_text(size: int) -> str:
    """1,234 bytes as "1.2 kB", 3,400,000 as "3.2 MB" (1 kB = 1,024 bytes)."""
    if size < 1024:
        return f"{size} bytes"
    if size < MB:
        return f"{size / 1024:.1f} kB"
    return f"{size / MB:.1f} MB"
