"""File tools, confined to the workspace.

A path is resolved (symlinks included) and must stay inside the workspace. A regular file
with more than one hard link is refused: its other names may be outside. A file is opened
without following a symlink put in its place meanwhile (`O_NOFOLLOW`), and the open
descriptor is checked again (its hard links and, where the system tells, its real path).

Every write goes to a new file in the same folder that is then renamed over the old one:
atomic, and never through an existing link. A replaced file keeps its permission bits; a
new one is private (0600), and so is a folder made for it (0700).

Each conversation's uploads and long messages are its own (`uploads/<conversation>/`,
`inbox/<conversation>/`): the tools that read (`Tool.reads`) ask before they reach into
another conversation's, and an upload read back is content from outside
(`bot.turn.policy`, `bot.turn.taint`).

`list_dir` never follows a symlink and never shows a link's size: a link inside the
workspace is shown with where it points (`name -> sub/file.txt (link)`), one leading out
as `name -> (link outside the workspace)`, without looking at its target.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO

from bot.core.errors import PathRefused, ToolError
from bot.core.file_modes import PRIVATE_FILE, private_dir
from bot.tools import Tool, ToolContext, require_str

MAX_READ_BYTES = 2_000_000
MAX_LIST = 500


def _inside(root: Path, target: Path) -> bool:
    return target == root or root in target.parents


def _confine(ctx: ToolContext, raw: str, target: Path) -> Path:
    """`target` (a real path) if a file tool may use it, or PathRefused."""
    if not _inside(ctx.workspace.resolve(), target):
        raise PathRefused(f"{raw!r} is outside the workspace; file tools only work inside it")
    if target in ctx.protected or target.name == ".env":
        raise PathRefused(f"{raw!r} is protected and no tool may read or change it")
    return target


def resolve(ctx: ToolContext, raw: str) -> Path:
    """The real path of `raw` inside the workspace, or PathRefused."""
    if "\x00" in raw:
        raise PathRefused("the path contains a NUL byte")
    return _confine(ctx, raw, (ctx.workspace.resolve() / raw).resolve())


def _refuse_hard_link(raw: str, st: os.stat_result) -> None:
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise PathRefused(f"{raw!r} is a hard link (one file with {st.st_nlink} names, which "
                          "may be outside the workspace); Tandem will not follow hard links")


def _recheck(ctx: ToolContext, raw: str, fd: int, name: str = "") -> None:
    """Confine the real path of the open descriptor `fd` (joined with `name`) again, where
    the system tells it (Linux's /proc)."""
    try:
        real = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return
    _confine(ctx, raw, real / name)


def open_checked(ctx: ToolContext, raw: str, path: Path) -> BinaryIO:
    """The regular, singly-linked file `path` (resolved from `raw`), open for reading."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ToolError(f"cannot open {raw!r}: {exc.strerror}") from None
    fh = open(fd, "rb")  # the caller closes it
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{raw!r} is not a file")
        _refuse_hard_link(raw, st)
        _recheck(ctx, raw, fd)
    except BaseException:
        fh.close()
        raise
    return fh


def _read_checked(ctx: ToolContext, raw: str, path: Path, limit: int) -> bytes:
    """At most `limit + 1` bytes of the regular, singly-linked file `path`."""
    with open_checked(ctx, raw, path) as fh:
        return fh.read(limit + 1)


def _new_temp(name: str, dir_fd: int) -> tuple[int, str]:
    """A new empty, private file next to `name`: its descriptor and name."""
    for _ in range(100):
        tmp = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            return os.open(tmp, flags, PRIVATE_FILE, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
    raise ToolError(f"cannot create a temporary file next to {name!r}")


def _existing_mode(raw: str, name: str, dir_fd: int) -> int | None:
    """The permission bits of the file being replaced; None when there is none yet."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(f"{raw!r} is not a file")
    _refuse_hard_link(raw, st)
    return stat.S_IMODE(st.st_mode)


def _replace_file(ctx: ToolContext, raw: str, path: Path, data: bytes) -> None:
    """Write `data` to a new file next to `path`, then rename it over `path`."""
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _recheck(ctx, raw, dir_fd, path.name)
        mode = _existing_mode(raw, path.name, dir_fd)
        fd, tmp = _new_temp(path.name, dir_fd)
        try:
            with open(fd, "wb") as fh:
                if mode is not None:
                    os.fchmod(fd, mode)
                fh.write(data)
                fh.flush()
                os.fsync(fd)
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


async def read_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    raw = require_str(args, "path")
    path = resolve(ctx, raw)
    if not path.is_file():
        raise ToolError(f"{raw!r} is not a file")

    def read() -> str:
        data = _read_checked(ctx, raw, path, MAX_READ_BYTES)
        text = data[:MAX_READ_BYTES].decode("utf-8", errors="replace")
        return text + ("\n[file truncated]" if len(data) > MAX_READ_BYTES else "")

    return await asyncio.to_thread(read)


def _link_line(ctx: ToolContext, entry: os.DirEntry[str]) -> str | None:
    """A symlink's line, found from the link's text; a target outside is never looked at."""
    root = ctx.workspace.resolve()
    target = Path(os.path.normpath(Path(entry.path).parent / os.readlink(entry.path)))
    if _inside(root, target):
        target = target.resolve()
    if not _inside(root, target):
        return f"{entry.name} -> (link outside the workspace)"
    if target in ctx.protected:
        return None
    return f"{entry.name} -> {target.relative_to(root)} (link)"


def _entry_line(ctx: ToolContext, entry: os.DirEntry[str]) -> str | None:
    """One line of a listing, from `lstat`; None for a protected file."""
    if entry.is_symlink():
        return _link_line(ctx, entry)
    if Path(entry.path) in ctx.protected:
        return None
    if entry.is_dir(follow_symlinks=False):
        return f"{entry.name}/"
    if entry.is_file(follow_symlinks=False):
        return f"{entry.name} ({entry.stat(follow_symlinks=False).st_size} bytes)"
    return f"{entry.name} (not a regular file)"


def _listing(ctx: ToolContext, path: Path) -> str:
    with os.scandir(path) as found:
        entries = sorted(found, key=lambda e: e.name)
    lines = [line for e in entries[:MAX_LIST] if (line := _entry_line(ctx, e)) is not None]
    if len(entries) > MAX_LIST:
        lines.append(f"[... {len(entries) - MAX_LIST} more entries]")
    return "\n".join(lines) or "(empty directory)"


async def list_dir(ctx: ToolContext, args: dict[str, Any]) -> str:
    raw = args.get("path") or "."
    path = resolve(ctx, str(raw))
    if not path.is_dir():
        raise ToolError(f"{raw!r} is not a directory")
    return await asyncio.to_thread(_listing, ctx, path)


async def write_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    raw = require_str(args, "path")
    path = resolve(ctx, raw)
    data = require_str(args, "content", allow_empty=True).encode("utf-8")

    def write() -> None:
        private_dir(path.parent, below=ctx.workspace.resolve())
        _replace_file(ctx, raw, path, data)

    await asyncio.to_thread(write)
    return f"wrote {len(data)} bytes to {raw}"


def occurrences(text: str, needle: str) -> list[int]:
    """Every index where `needle` starts in `text`, overlapping ones included."""
    found, start = [], text.find(needle)
    while start != -1:
        found.append(start)
        start = text.find(needle, start + 1)
    return found


async def edit_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    raw = require_str(args, "path")
    old = require_str(args, "old")
    new = require_str(args, "new", allow_empty=True)
    path = resolve(ctx, raw)
    if not path.is_file():
        raise ToolError(f"{raw!r} is not a file; use write_file to create one")
    if old == new:
        raise ToolError("`old` and `new` are identical; there is nothing to change")

    def edit() -> str:
        data = _read_checked(ctx, raw, path, MAX_READ_BYTES)
        if len(data) > MAX_READ_BYTES:
            raise ToolError(f"{raw!r} is larger than {MAX_READ_BYTES:,} bytes; "
                            "edit it with the shell tool instead")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{raw!r} is not UTF-8 text; edit_file only changes text files") \
                from None
        found = occurrences(text, old)
        if not found:
            raise ToolError(f"`old` was not found in {raw!r}; read the file and copy the exact "
                            "text to replace, including whitespace and line breaks")
        if len(found) > 1:
            raise ToolError(f"`old` occurs {len(found)} times in {raw!r}; include more of the "
                            "surrounding text so it matches exactly once")
        at = found[0]
        _replace_file(ctx, raw, path, (text[:at] + new + text[at + len(old):]).encode("utf-8"))
        line = text.count("\n", 0, at) + 1
        return f"edited {raw}: replaced {len(old)} characters with {len(new)} at line {line}"

    return await asyncio.to_thread(edit)


def _shown_path(path: str) -> str:
    return path if path.isprintable() and not path.startswith('"') else json.dumps(path)


def edit_summary(args: dict[str, Any]) -> str:
    """The whole change on the approval card: path, the text replaced and its replacement."""
    path, old, new = args.get("path"), args.get("old"), args.get("new")
    if not (isinstance(path, str) and isinstance(old, str) and isinstance(new, str)):
        return json.dumps(args, ensure_ascii=False, indent=1, sort_keys=True)
    return (f"{_shown_path(path)}\n"
            f"--- old ({len(old)} characters)\n{old}\n"
            f"+++ new ({len(new)} characters)\n{new}")


PATH = {"type": "string", "description": "Path relative to the workspace"}

TOOLS = [
    Tool("read_file", "Read a text file from the workspace.",
         {"type": "object", "properties": {"path": PATH}, "required": ["path"]},
         read_file, policy="allow", summary_key="path", reads="path"),
    Tool("list_dir", "List a directory of the workspace.",
         {"type": "object", "properties": {"path": PATH}}, list_dir, policy="allow",
         summary_key="path", reads="path"),
    Tool("write_file", "Create or overwrite a text file in the workspace.",
         {"type": "object", "properties": {"path": PATH, "content": {"type": "string"}},
          "required": ["path", "content"]}, write_file, policy="ask", summary_key="path",
         lasting=True),
    Tool("edit_file",
         "Replace one exact piece of text in a workspace file. `old` must occur exactly once "
         "in the file (copy it verbatim, with enough surrounding lines to be unique); it is "
         "replaced by `new`. Prefer this to write_file for changing part of a file.",
         {"type": "object", "properties": {
             "path": PATH,
             "old": {"type": "string", "description": "The exact text to replace"},
             "new": {"type": "string", "description": "The replacement text (may be empty)"}},
          "required": ["path", "old", "new"]},
         edit_file, policy="ask", summary_key="path", lasting=True, render=edit_summary),
]
