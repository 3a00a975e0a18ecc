"""A fake model endpoint that can be down: it fails, hangs or refuses every request while
told to, and records the API key each request carried.

It is the strict `FakeModelServer` (same validation, same scripted replies when it is up);
a failover test runs two of them, a primary and a fallback, each on its own port::

    async with FailingModel() as primary, FailingModel() as backup:
        primary.down = "500"      # "500" | "hang" | "refuse" (401) | None (up)
"""

from __future__ import annotations

from typing import Any

from aiohttp import hdrs, web

from tests.fakes.model_server import FakeModelServer, Reply

MODES = frozenset({"500", "hang", "refuse"})
INVALID_KEY = "Incorrect API key provided."


class FailingModel(FakeModelServer):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.down: str | None = None
        """While set, every request fails this way (scripted replies are kept)."""
        self.only: str | None = None
        """When set, only requests for this model (the request's `model`) are down."""
        self.keys: list[str | None] = []
        """Each request's API key (its `Authorization: Bearer` header), in order."""
        self.failed = 0
        """Requests failed because the endpoint was down."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get(hdrs.AUTHORIZATION, "")
        self.keys.append(auth.removeprefix("Bearer ") if auth else None)
        mode = self.down
        if mode is not None and mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(MODES)}")
        body = await request.json() if mode is not None else None
        if mode is None or (self.only is not None and body.get("model") != self.only):
            return await super()._handle(request)
        await self._record(body)
        self.failed += 1
        if mode == "refuse":
            return web.json_response({"error": {
                "message": INVALID_KEY, "type": "invalid_request_error", "param": None,
                "code": "invalid_api_key"}}, status=401)
        response = await self._fault(request, Reply(fault=mode), 0)
        assert response is not None
        return response


class Clock:
    """A clock the test moves (`now`), for a model's cool-down."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
