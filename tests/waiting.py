"""Waiting on a condition in tests, for state that has no event to await (a file, a
process, another process's log or endpoint): the condition is looked at again every
`POLL_S` until it holds or the deadline passes. Nothing here waits out a fixed time.

`eventually` fails the test at the deadline; `within` tells whether the condition held
in time. A condition may be a plain function or a coroutine function.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.02
"""How often a condition is looked at again."""


async def within(condition: Callable[[], T | Awaitable[T]], timeout: float, *,
                 step: float = POLL_S) -> T | None:
    """`condition()`'s first truthy value within `timeout` seconds, else None."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        found = condition()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return found
        if loop.time() >= deadline:
            return None
        await asyncio.sleep(step)


async def eventually(condition: Callable[[], T | Awaitable[T]], timeout: float = 10.0, *,
                     what: str = "the condition", step: float = POLL_S) -> T:
    """`condition()`'s first truthy value; the test fails if none comes within `timeout`."""
    found = await within(condition, timeout, step=step)
    if not found:
        raise AssertionError(f"{what}: not met within {timeout:g} s")
    return found


def processes(needle: str) -> list[int]:
    """Pids of the live processes whose command line contains `needle` (a zombie's is
    empty: it is not counted)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if needle.encode() in cmdline.replace(b"\0", b" "):
                pids.append(int(entry.name))
    return pids
