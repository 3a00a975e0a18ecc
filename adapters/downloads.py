"""One file fetched over HTTP into a file on disk, 64 kB at a time, with a size limit
(both platforms' file ports use it; the URL may hold a token and is never logged)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import aiohttp

from bot.media import TooLarge

CHUNK = 64 * 1024
TIMEOUT = aiohttp.ClientTimeout(total=600, sock_read=60)


async def stream(session: aiohttp.ClientSession, url: str, dest: Path, limit: int, *,
                 headers: Mapping[str, str] | None = None,
                 check: Callable[[aiohttp.ClientResponse], None] | None = None) -> int:
    """The bytes written to `dest`. TooLarge past `limit`; ValueError with a plain
    reason on a failed answer (or one `check` refuses) or a broken connection."""
    written = 0
    try:
        async with session.get(url, headers=headers, timeout=TIMEOUT) as reply:
            if reply.status != 200:
                raise ValueError(f"the download failed (HTTP {reply.status})")
            if check is not None:
                check(reply)
            with dest.open("wb") as out:
                async for chunk in reply.content.iter_chunked(CHUNK):
                    written += len(chunk)
                    if written > limit:
                        raise TooLarge
                    out.write(chunk)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ValueError(f"the download broke off ({type(exc).__name__})") from None
    return written
