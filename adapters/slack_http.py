"""Slack's requests as they reach Tandem: the connection (Socket Mode, or HTTP mode's
endpoint and its checks), the workspace gate, and bolt's error handling.

`signed_only` is the aiohttp middleware of HTTP mode: it refuses what is not signed with
the signing secret, and what bolt could not read, before bolt sees it. `on_bolt_error`
acks what no listener takes (so Slack does not retry it) and logs what failed once.
`Failures` tells the watchers of every Web API call that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.error import BoltUnhandledRequestError
from slack_bolt.request.internals import parse_body
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack_inbound import PLATFORM, as_str, odd_shape, teams
from bot.core.config import SlackConfig
from bot.core.errors import ConfigError, TandemError
from bot.core.watch import PlatformCall, Watch

log = logging.getLogger(__name__)


class Failures(AsyncRetryHandler):
    """Tells `watch` of each Web API attempt that failed (`PlatformCall`: its HTTP status,
    429 when Slack limits the rate, 0 when no answer came). slack_sdk asks its retry
    handlers about every answer; this one, asked first, never retries."""

    def __init__(self, watch: Watch) -> None:
        super().__init__(max_retry_count=0)
        self.watch = watch

    async def can_retry_async(self, *, state: RetryState, request: HttpRequest,
                              response: HttpResponse | None = None,
                              error: Exception | None = None) -> bool:
        status = response.status_code if response is not None else 0
        if status >= 400 or status == 0:
            method = request.url.partition("?")[0].rpartition("/")[2]
            method = method if _METHOD.fullmatch(method) else "other"  # an upload URL
            await self.watch.see(PlatformCall(PLATFORM, method, status))
        return False


_METHOD = re.compile(r"[a-z]+(\.[A-Za-z]+)+")
"""A Web API method's name (`chat.postMessage`), as a metric's label."""


def signed_only(secret: str) -> Any:
    """Refuse (401) anything not signed with `secret` within 5 minutes, malformed headers
    and bodies that are not UTF-8 (Slack's signature is over UTF-8 text) included, and
    (400, one log line) a signed body bolt could not read, before bolt parses it: bolt
    would answer that with a 500, which Slack retries. Whatever bolt still raises outside
    its own error handling (building its request, or in that handler) is answered as
    `_failed` decides, never with aiohttp's 500 and traceback."""
    verifier = SignatureVerifier(secret)

    def signed(body: bytes, stamp: str, signature: str) -> bool:
        try:
            return stamp.isdigit() and verifier.is_valid(body=body.decode(), timestamp=stamp,
                                                         signature=signature)
        except UnicodeDecodeError:
            return False

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.read()
        if not signed(body, request.headers.get("X-Slack-Request-Timestamp", ""),
                      request.headers.get("X-Slack-Signature", "")):
            return web.json_response({"error": "invalid request"}, status=401)
        problem = _unreadable(body, request.content_type, request.charset)
        if problem is not None:
            log.warning("slack: refused a signed request whose body is %s", problem)
            return web.json_response({"error": "invalid payload"}, status=400)
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException:
            raise
        except Exception as exc:  # past bolt's own error handler; see `_failed`
            return web.json_response({"error": "request failed"}, status=_failed(exc))
        return response

    return check


def _unreadable(raw: bytes, content_type: str, charset: str | None) -> str | None:
    """What is wrong with a request body, read the way bolt reads it (JSON, or a form with
    a JSON `payload`, or a slash command's form); None when nothing is."""
    try:
        body = parse_body(raw.decode(charset or "utf-8"), content_type)
    except (UnicodeDecodeError, LookupError):
        return f"not {charset or 'UTF-8'} text"
    except ValueError:
        return "not valid JSON"
    if not isinstance(body, dict):
        return "not a JSON object"
    if not (isinstance(body.get("type"), str) or "command" in body or "ssl_check" in body):
        return "without a type"
    odd = odd_shape(body)
    return None if odd is None else f"misshapen: {odd}"


async def on_bolt_error(error: Exception, body: dict[str, Any],
                         response: BoltResponse | None) -> BoltResponse | None:
    """Bolt's error handler (`app.error`), in both modes, for what its dispatch raised.

    A payload no listener takes (an event or interaction Tandem does not handle) is acked
    with an empty 200: bolt's default is a 404 that Slack retries. Any other error is
    logged once by `_failed`; when it came before the ack (after one, bolt passes no
    `response`), the request is answered with the status `_failed` picks."""
    if isinstance(error, BoltUnhandledRequestError):
        log.debug("slack: acked a %s payload that nothing handles",
                  as_str(body.get("type")) or "typeless")
        return BoltResponse(status=200, body="")
    status = _failed(error)
    return None if response is None else BoltResponse(status=status, body="")


def _failed(error: BaseException) -> int:
    """Log what handling a request raised, once, and the status to answer it with.

    Raised with Tandem's code on the stack (a listener, the workspace check): Tandem's bug,
    logged with its traceback, a 500. Raised inside slack-bolt alone: a payload of a shape
    `slack_inbound.odd_shape` does not know that bolt could not read, one line, a 400 (Slack
    retries a 5xx, and the same payload would fail the same way again)."""
    if _raised_in_tandem(error):
        log.error("slack: handling a request failed", exc_info=error)
        return 500
    what = f"{type(error).__name__}: {error}".replace("\n", " ")[:200]
    log.warning("slack: refused a payload slack-bolt could not read (%s)", what)
    return 400


def _raised_in_tandem(error: BaseException) -> bool:
    """Whether a frame of Tandem's (`adapters`, `bot`) lies between the frame that caught
    `error` and the one that raised it."""
    tb = error.__traceback__.tb_next if error.__traceback__ is not None else None
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith(("adapters.", "bot.")):
            return True
        tb = tb.tb_next
    return False


class SlackUnavailable(TandemError):
    """Slack could not be reached at start."""


async def connect_socket(app: AsyncApp, app_token: str | None,
                         client: AsyncWebClient) -> AsyncSocketModeHandler:
    """Socket Mode: the connection open, or the reason it would not (a closed handler)."""
    socket = AsyncSocketModeHandler(app, app_token=app_token, web_client=client)
    try:
        await socket.connect_async()  # type: ignore[no-untyped-call]
    except SlackApiError as exc:
        await socket.close_async()  # type: ignore[no-untyped-call]
        raise ConfigError("slack.app_token", "was rejected by Slack "
                          f"({exc.response.get('error')})") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        await socket.close_async()  # type: ignore[no-untyped-call]
        raise SlackUnavailable(f"slack: cannot open the Socket Mode connection "
                               f"({type(exc).__name__})") from None
    return socket


async def listen(app: AsyncApp, slack: SlackConfig) -> tuple[web.AppRunner, str]:
    """HTTP mode: the events endpoint listening (signed requests only), and its URL."""
    http = slack.http
    web_app = app.web_app(path=http.path)
    web_app.middlewares.append(signed_only(slack.signing_secret or ""))
    runner = web.AppRunner(web_app, handle_signals=False, access_log=None,
                           shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, http.host, http.port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError("slack.http.port", f"cannot listen on {http.host}:{http.port} "
                          f"({exc.strerror})") from None
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}{http.path}"
    log.info("slack: listening for events on %s", url)
    return runner, url


class WorkspaceGate:
    """Bolt middleware: a payload that names another workspace is acked (an empty 200) and
    goes no further; nothing of it reaches a listener or the core. Each such workspace is
    logged once."""

    def __init__(self, home: Callable[[], str | None]) -> None:
        self.home = home
        self._logged: set[str] = set()

    async def __call__(self, body: dict[str, Any], resp: BoltResponse,
                       next_: Callable[[], Awaitable[None]]) -> BoltResponse:
        foreign = sorted(teams(body) - {self.home() or ""})
        if not foreign:
            await next_()
            return resp
        if foreign[0] not in self._logged and len(self._logged) < 10_000:
            self._logged.add(foreign[0])
            log.warning("slack: ignoring payloads from workspace %s (this bot serves %s); "
                        "later ones from it are not logged", foreign[0], self.home())
        return BoltResponse(status=200, body="")


class Inflight:
    """Listener work running in bolt's tasks, held so that `end` can finish it."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __bool__(self) -> bool:
        return bool(self._tasks)

    @contextlib.contextmanager
    def tracked(self) -> Iterator[None]:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def end(self, grace: float) -> None:
        """Wait up to `grace` seconds for the work under way, then cancel what is left."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=grace)
            for task in self._tasks:
                task.cancel()
