"""Telegram webhook mode: an aiohttp server Telegram posts updates to.

`check` reads `telegram.webhook` before anything connects: a public https URL (plain
http only on a loopback host, as a local Bot API server allows) and a secret token,
without which anyone who finds the address could post updates. `WebhookServer` listens
on `webhook.host:port` at `webhook.path` and registers the URL with `setWebhook`. Each
POST must carry the secret in `X-Telegram-Bot-Api-Secret-Token` (else 401, the body
unread; an address that sends `THROTTLE_FAILURES` wrong secrets within `THROTTLE_S` gets
429 for its requests, unchecked, until that long has passed since its last failure: it
cannot go on guessing); a body that is not a JSON update (nested too deep for the
parser included) is a 400; an update is handed to the PTB
application's handlers and answered 200 once they took it (they only record and queue
it, so this is quick): Telegram retries any non-2xx, and the core dedupes a redelivered
update by its id. One the library cannot
parse is skipped with a 200, as polling skips it (`defuse_updates`), lest Telegram
retry it forever. Stopping leaves the webhook set: other workers may still receive.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from telegram import Update
from telegram.error import BadRequest
from telegram.ext import Application

from bot.core.config import TelegramWebhook
from bot.core.errors import ConfigError

log = logging.getLogger(__name__)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
ALLOWED_UPDATES = ["message", "edited_message", "callback_query"]
MIN_SECRET = 32
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")
THROTTLE_FAILURES = 10
THROTTLE_S = 60.0
THROTTLE_ADDRESSES = 4096
"""Addresses whose failures are remembered (the oldest is forgotten first)."""


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check(hook: TelegramWebhook) -> tuple[str, str]:
    """The webhook's public URL and secret, or a ConfigError naming the key at fault."""
    if not hook.url:
        raise ConfigError("telegram.webhook.url", "is required when telegram.mode is webhook")
    parts = urlsplit(hook.url)
    if not parts.hostname or not (parts.scheme == "https" or
                                  (parts.scheme == "http" and _loopback(parts.hostname))):
        raise ConfigError("telegram.webhook.url",
                          "must be an https:// address (Telegram posts only over HTTPS)")
    if not hook.secret_token:
        raise ConfigError("telegram.webhook.secret_token", "is required when telegram.mode "
                          "is webhook: without it anyone can post updates to the webhook")
    if not _SECRET.fullmatch(hook.secret_token):
        raise ConfigError("telegram.webhook.secret_token",
                          "must be 1-256 characters of A-Z, a-z, 0-9, _ and -")
    if len(hook.secret_token) < MIN_SECRET:
        raise ConfigError("telegram.webhook.secret_token",
                          f"must be at least {MIN_SECRET} characters (it has "
                          f"{len(hook.secret_token)}): `tandem init` writes one, or "
                          "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    if not hook.path.startswith("/"):
        raise ConfigError("telegram.webhook.path", "must start with /")
    return hook.url, hook.secret_token


class WebhookServer:
    """The HTTP endpoint of webhook mode, feeding `app.update_queue`."""

    def __init__(self, app: Application[Any, Any, Any, Any, Any, Any], hook: TelegramWebhook,
                 ) -> None:
        self.app, self.hook = app, hook
        self.public_url, secret = check(hook)
        self._secret = secret.encode()
        self.url: str | None = None
        """The endpoint as bound (port 0 picks a free port)."""
        self._runner: web.AppRunner | None = None
        self.throttle = Throttle()

    async def start(self) -> None:
        """Listen, then register the public URL with Telegram (which may post at once)."""
        web_app = web.Application()
        web_app.router.add_post(self.hook.path, self._receive)
        self._runner = web.AppRunner(web_app, handle_signals=False, access_log=None,
                                     shutdown_timeout=2.0)
        await self._runner.setup()
        host, port = self.hook.host, self.hook.port
        try:
            await web.TCPSite(self._runner, host, port).start()
        except OSError as exc:
            raise ConfigError("telegram.webhook.port", f"cannot listen on {host}:{port} "
                              f"({exc.strerror})") from None
        bound, port = self._runner.addresses[0][:2]
        self.url = f"http://{f'[{bound}]' if ':' in bound else bound}:{port}{self.hook.path}"
        try:
            await self.app.bot.set_webhook(
                self.public_url, secret_token=self._secret.decode(),
                allowed_updates=ALLOWED_UPDATES, drop_pending_updates=False)
        except BadRequest as exc:
            raise ConfigError("telegram.webhook.url",
                              f"was refused by Telegram ({exc.message})") from None

    async def stop(self) -> None:
        """Stop listening; the webhook stays set (other workers may still receive)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _receive(self, request: web.Request) -> web.Response:
        address = request.remote or ""
        wait = self.throttle.wait(address)
        if wait:
            return web.Response(status=429, headers={"Retry-After": str(wait)})
        given = request.headers.get(SECRET_HEADER, "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, self._secret):
            self.throttle.failed(address)
            return web.Response(status=401)
        try:
            data = json.loads(await request.read())
        except (ValueError, RecursionError):  # bytes that are not UTF-8; nested too deep
            return web.Response(status=400, text="not JSON")
        update_id = data.get("update_id") if isinstance(data, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            return web.Response(status=400, text="not an update")
        try:
            update = Update.de_json(data, self.app.bot)
        except Exception:  # whatever the library raises on junk
            log.warning("Telegram: update %s could not be parsed; skipped", update_id)
            return web.Response()
        # handled before the answer: a 200 means the core has recorded it (a worker that
        # dies before that gets no 200, and Telegram delivers the update again); the
        # handlers only record and queue, the turns run elsewhere
        await self.app.process_update(update)
        return web.Response()


class Throttle:
    """Wrong secrets per address: after `THROTTLE_FAILURES` within `THROTTLE_S`, the
    address waits until `THROTTLE_S` has passed since its last failure. Behind a reverse
    proxy every request comes from the proxy's address: a flood of wrong secrets then
    delays Telegram's deliveries too (it retries them), never loses them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._failures: OrderedDict[str, list[float]] = OrderedDict()

    def wait(self, address: str) -> int:
        """Seconds `address` must wait before it is heard again (0: now)."""
        times = self._failures.get(address)
        if not times or len(times) < THROTTLE_FAILURES or times[-1] - times[0] >= THROTTLE_S:
            return 0
        left = times[-1] + THROTTLE_S - self.clock()
        if left <= 0:
            del self._failures[address]
            return 0
        return max(1, math.ceil(left))

    def failed(self, address: str) -> None:
        times = [*self._failures.get(address, []), self.clock()]
        self._failures[address] = times[-THROTTLE_FAILURES:]
        self._failures.move_to_end(address)
        while len(self._failures) > THROTTLE_ADDRESSES:
            self._failures.popitem(last=False)
        if self.wait(address):
            log.warning("Telegram webhook: %d wrong secrets from %s within %.0f s; its "
                        "requests get 429 for a while", THROTTLE_FAILURES, address or "?",
                        THROTTLE_S)
