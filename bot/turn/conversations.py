"""The conversations in memory: loaded once, repaired once, evicted when idle.

Loading is single-flight: when the recovery pass and a waiting message ask for the
same conversation at once, one load (and one repair) serves both.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from bot.core.events import ConvKey
from bot.turn.conversation import Conversation

MAX_CACHED = 2000


class Conversations:
    def __init__(self, load: Callable[[ConvKey], Awaitable[Conversation]],
                 busy: Callable[[ConvKey], bool], limit: int = MAX_CACHED) -> None:
        self._load = load
        self._busy = busy
        self._limit = limit
        self._cache: OrderedDict[ConvKey, Conversation] = OrderedDict()
        self._loading: dict[ConvKey, asyncio.Future[Conversation]] = {}

    async def get(self, key: ConvKey) -> Conversation:
        conv = self._cache.get(key)
        if conv is not None:
            self._cache.move_to_end(key)
            return conv
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Conversation] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            conv = await self._load(key)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here, so an unshared failure is not "never seen"
            raise
        finally:
            del self._loading[key]
        future.set_result(conv)
        self._cache[key] = conv
        self._evict()
        return conv

    def cached(self, key: ConvKey) -> Conversation | None:
        return self._cache.get(key)

    def drop(self, key: ConvKey) -> None:
        """Forget it: the next `get` loads (and repairs) it from the store."""
        self._cache.pop(key, None)

    def _evict(self) -> None:
        while len(self._cache) > self._limit:
            oldest = next(iter(self._cache))
            if self._busy(oldest):
                break
            self._cache.popitem(last=False)
