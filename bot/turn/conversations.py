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
MAX_CACHED_MESSAGES = 200_000
"""Messages held by all cached conversations together (each holds about its window)."""


class Conversations:
    def __init__(self, load: Callable[[ConvKey], Awaitable[Conversation]],
                 busy: Callable[[ConvKey], bool], limit: int = MAX_CACHED,
                 max_messages: int = MAX_CACHED_MESSAGES) -> None:
        self._load = load
        self._busy = busy
        self._limit = limit
        self._max_messages = max_messages
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
        """The least recently used idle conversations go while the cache holds too many
        conversations or too many messages."""
        size = sum(len(c.history) for c in self._cache.values())
        for key in list(self._cache):
            if len(self._cache) <= self._limit and size <= self._max_messages:
                return
            if not self._busy(key):
                size -= len(self._cache.pop(key).history)
