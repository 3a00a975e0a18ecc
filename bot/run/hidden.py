"""Tandem's own process, out of reach of the commands it runs.

An approved shell command runs as Tandem's user, and a process of the same user may read
another's `/proc/<pid>/environ` (the environment Tandem was started with: its tokens and
keys), `mem`, `maps` and file descriptors; base64 would carry the secrets past redaction.
`hide` marks Tandem not dumpable (`prctl(PR_SET_DUMPABLE, 0)`): those files then belong
to root and need `CAP_SYS_PTRACE` besides, so no other user can open them; a Tandem run
as root is not protected (it should never be). Its children are dumpable again from
their `exec` (nothing of theirs is hidden). Core dumps of Tandem are off too, and a
debugger can attach only as root.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)
PR_SET_DUMPABLE = 4


def hide() -> bool:
    """Make this process not dumpable; False where that cannot be done (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except (OSError, AttributeError) as exc:
        log.warning("could not hide Tandem's environment from the commands it runs (%s)",
                    exc)
        return False
    return True


__all__ = ["hide"]
