"""Slack files: what a message shares, fetched to disk in pieces, and files posted.

A shared file's private URL answers only with the bot token (`files:read`); without it
Slack sends its HTML sign-in page with status 200, so the content type is checked. The
token goes only to Slack's own hosts. Posting uses `files_upload_v2` (`files:write`),
in the conversation's thread.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.downloads import stream
from bot.core.events import Attachment, ConvKey
from bot.media import MB

log = logging.getLogger(__name__)

FILE_LIMIT = 1024 * MB
"""Slack takes files up to 1 GB."""
SCOPES = ("files:read", "files:write")


def attachments(files: Any) -> tuple[Attachment, ...]:
    """The usable files of a message event's `files` list."""
    found = []
    for f in files if isinstance(files, list) else ():
        if not isinstance(f, dict):
            continue  # a hidden or deleted file has no URL: fetching it says so
        url = f.get("url_private_download") or f.get("url_private")
        mime = str(f.get("mimetype") or "")
        kind = "image" if mime.startswith("image/") else "audio" if mime.startswith("audio/") \
            else "video" if mime.startswith("video/") else "file"
        if f.get("subtype") == "slack_audio":  # a clip recorded in Slack: the sender's words
            kind = "voice"
        found.append(Attachment(str(f.get("name") or "file"), mime,
                                f["size"] if isinstance(f.get("size"), int) else 0, kind,
                                url if isinstance(url, str) else ""))
    return tuple(found)


def missing_scopes(headers: Any) -> list[str]:
    """The file scopes the bot token lacks, from a Web API reply's `x-oauth-scopes`
    (empty when the reply does not say)."""
    granted = None
    for key, value in dict(headers or {}).items():
        if str(key).lower() == "x-oauth-scopes":
            granted = {s.strip() for s in str(value).split(",")}
    return [] if granted is None else [s for s in SCOPES if s not in granted]


class SlackFiles:
    """The core's `FilePort` for Slack (attached to the adapter's client once it starts)."""

    platform_name = "Slack"
    download_limit = FILE_LIMIT
    upload_limit = FILE_LIMIT

    def __init__(self, token: str, api_base: str) -> None:
        self._token = token
        self._hosts = {urlsplit(api_base).hostname or "slack.com"}
        self.client: AsyncWebClient | None = None
        self.session: aiohttp.ClientSession | None = None

    def _trusted(self, url: str) -> bool:
        parts = urlsplit(url)
        host = parts.hostname or ""
        return parts.scheme in ("https", "http") and (
            host in self._hosts or host == "slack.com" or host.endswith(".slack.com"))

    async def download(self, attachment: Attachment, dest: Path, limit: int) -> int:
        url = attachment.source
        if self.session is None or not url or not self._trusted(url):
            raise ValueError("Slack gave no address on its own servers for it")

        def not_a_sign_in_page(reply: aiohttp.ClientResponse) -> None:
            if reply.content_type == "text/html" and \
                    not attachment.mime.startswith("text/html"):
                raise ValueError("Slack sent its sign-in page instead of the file (the "
                                 "Slack app needs the files:read scope)")

        return await stream(self.session, url, dest, limit, check=not_a_sign_in_page,
                            headers={"Authorization": f"Bearer {self._token}"})

    async def upload(self, conv: ConvKey, file: BinaryIO, name: str, caption: str, *,
                     picture: bool) -> None:
        if self.client is None:
            raise ValueError("Slack is not connected")
        options: dict[str, Any] = {"channel": conv.chat_id, "file": file, "filename": name,
                                   "title": name}
        if conv.thread_id:
            options["thread_ts"] = conv.thread_id
        if caption:
            options["initial_comment"] = caption
        try:
            await self.client.files_upload_v2(**options)
        except SlackApiError as exc:
            error = str(exc.response.get("error") or "an error")
            hint = " (the Slack app needs the files:write scope)" \
                if error == "missing_scope" else ""
            raise ValueError(f"Slack answered {error}{hint}") from None


async def check(client: AsyncWebClient) -> list[tuple[str, str, str]]:
    """The doctor's look at the file scopes, from `auth.test`'s `x-oauth-scopes`."""
    try:
        auth = await client.auth_test()
    except SlackApiError as exc:
        return [("slack files", "fail", f"Slack refused the bot token "
                                        f"({exc.response.get('error')})")]
    except (aiohttp.ClientError, TimeoutError) as exc:
        return [("slack files", "warn", f"Slack could not be reached ({type(exc).__name__})")]
    missing = missing_scopes(auth.headers)
    if missing:
        return [("slack files", "warn", f"the bot token lacks {', '.join(missing)}: files "
                 "people share cannot be fetched and send_file cannot post (add the scopes "
                 "under OAuth & Permissions and reinstall the app)")]
    return [("slack files", "ok", "files:read and files:write granted")]
