"""Private files and folders: what only the user running Tandem may read.

The database holds every conversation and tool output, and the persona's memory holds
what people told Tandem, so they are created private: folders 0700, files 0600. Nothing
here changes the mode of a file or folder that already exists; `tandem doctor` warns
about those instead (`too_open`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: str | Path, below: str | Path | None = None) -> Path:
    """Create the folder `path` as 0700. Missing parents get the usual mode, except those
    under `below`, which are 0700 too (`below` itself is only created when missing).

    An existing folder is left as it is.
    """
    folder = Path(path)
    if below is not None:
        top = Path(below)
        top.mkdir(parents=True, exist_ok=True)
        missing = []
        for parent in [folder, *folder.parents]:
            if parent == top or parent.exists():
                break
            missing.append(parent)
        for each in reversed(missing):
            with contextlib.suppress(FileExistsError):
                each.mkdir(mode=PRIVATE_DIR)
                os.chmod(each, PRIVATE_DIR)  # the umask may have taken bits away
    folder.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    return folder


def private_file(path: str | Path) -> bool:
    """Create the empty file `path` as 0600, in one step; True if it was created.

    An existing file is left as it is (False), and so is anything else already at
    `path`, a symlink included: the link is not followed.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def write_private(path: str | Path, data: bytes) -> None:
    """Write `data` to the new file `path`, created 0600 (FileExistsError if it exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                 PRIVATE_FILE)
    with open(fd, "wb") as fh:
        fh.write(data)


def too_open(path: str | Path) -> bool:
    """Whether group or others have any access to `path` (False when it is missing)."""
    try:
        return os.stat(path).st_mode & 0o077 != 0
    except OSError:
        return False
