"""Media: pictures, voice notes and files that come with messages or go out to a chat.

A received file is kept in the workspace, in its conversation's own folder
(`uploads/<conversation>/<date>/<name>`; a long message goes to `inbox/<conversation>/`);
the history keeps a `Media` reference to it (`bot.core.history.Media`: kind, name, paths,
size, transcript), never its bytes. Pictures are scaled for the model once, when they
arrive, by `bot.core.images`. Everything saved is private: files 0600 in 0700 folders.

Platforms fetch and post files through a `FilePort` that their adapter registers; the core
never sees a platform object.

Layer: below `bot.tools`, above `bot.llm` (a voice note is transcribed by
`bot.llm.senses`); imports `bot.core` and `bot.llm`, never the turn, the store or anything
above.
"""

from __future__ import annotations

import hashlib
import os
import re
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


UPLOADS = "uploads"
INBOX = "inbox"
SHARED_FOLDERS = (UPLOADS, INBOX)
"""Workspace folders that hold one folder per conversation."""
_UNSAFE_PART = re.compile(r"[^A-Za-z0-9_.-]+")


def conversation_folder(conv: ConvKey) -> str:
    """The name of `conv`'s own folder under `uploads/` and `inbox/`: readable, with a
    hash so two conversations never share one."""
    parts = [conv.platform, conv.chat_id, *([conv.thread_id] if conv.thread_id else [])]
    readable = "_".join(_UNSAFE_PART.sub("-", p).strip("-.") or "-" for p in parts)[:80]
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:8]
    return f"{readable}-{digest}"


def shared_area(raw: str, workspace: Path | None = None) -> tuple[str, str | None] | None:
    """Where the workspace path `raw` leads among the per-conversation folders:
    (`uploads` or `inbox`, the conversation folder or None for the top), or None when it
    is elsewhere. Read from the text of the path (`a/../uploads/x` too) and, with
    `workspace`, from where it really leads (a link included)."""
    candidates = [Path(os.path.normpath(raw))]
    if workspace is not None:
        root = workspace.resolve()
        try:
            candidates.append((root / raw).resolve().relative_to(root))
        except (ValueError, OSError, RuntimeError):
            pass
    for path in candidates:
        parts = [p for p in path.parts if p not in ("/", ".")]
        if path.is_absolute() and workspace is None:  # no root known: its names tell
            parts = parts[next((i for i, p in enumerate(parts) if p in SHARED_FOLDERS),
                               len(parts)):]
        if parts and parts[0] in SHARED_FOLDERS:
            return parts[0], parts[1] if len(parts) > 1 else None
    return None


def foreign(raw: str, conv: ConvKey, workspace: Path | None = None) -> str | None:
    """Why a file tool touching `raw` needs a human: it is among other conversations'
    uploads or long messages (their folder, or the folder of them all). None when `raw`
    is in `conv`'s own folders or outside those shared folders."""
    found = shared_area(raw, workspace)
    if found is None or found[1] == conversation_folder(conv):
        return None
    area, folder = found
    if folder is None:
        return f"{area}/ holds every conversation's files, not only this one's"
    return f"{area}/{folder} is another conversation's folder"


def new_file(workspace: Path, folder: str, name: str) -> Path:
    """A new, empty, private file `<workspace>/<folder>/<name>` (`name-2.ext`, `-3`... when
    the name is taken: nothing is overwritten). OSError if the folder leads outside. Every
    folder made on the way is private too."""
    from bot.core.file_modes import private_dir, private_file

    where = private_dir(workspace / folder, below=workspace)
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
