"""Telegram files: what a message carries, fetched to disk in pieces, and files posted.

Bots may download files up to 20 MB and upload up to 50 MB (photos up to 10 MB). A
download streams from Telegram's file URL into the file the core gave, 64 kB at a time,
so a large file never sits in memory; the URL holds the bot token and is never logged.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import BinaryIO

import aiohttp
from telegram import InputFile, Message
from telegram.error import BadRequest, TelegramError
from telegram.ext import filters

from adapters.downloads import stream
from adapters.telegram_api import BotApi
from bot.core.events import Attachment, ConvKey
from bot.media import MB, TooLarge

log = logging.getLogger(__name__)

DOWNLOAD_LIMIT = 20 * MB
UPLOAD_LIMIT = 50 * MB
PHOTO_LIMIT = 10 * MB
CAPTION_LIMIT = 1024
MEDIA = (filters.PHOTO | filters.VOICE | filters.AUDIO | filters.VIDEO_NOTE | filters.Document.ALL
         | filters.VIDEO | filters.ANIMATION | filters.Sticker.ALL)
"""Messages with something to fetch (with or without a caption)."""


def attachments(message: Message) -> tuple[Attachment, ...]:
    """The files a message carries, largest photo size only. A voice or video note is
    `voice` (the sender's own words) unless the message is forwarded."""
    n = message.message_id
    recorded = "audio" if message.forward_origin is not None else "voice"
    found: list[Attachment] = []
    if message.photo:
        best = message.photo[-1]
        found.append(Attachment(f"photo-{n}.jpg", "image/jpeg", best.file_size or 0, "image",
                                best.file_id))
    if message.voice:
        v = message.voice
        found.append(Attachment(f"voice-{n}.ogg", v.mime_type or "audio/ogg", v.file_size or 0,
                                recorded, v.file_id))
    if message.audio:
        a = message.audio
        found.append(Attachment(a.file_name or f"audio-{n}.mp3", a.mime_type or "audio/mpeg",
                                a.file_size or 0, "audio", a.file_id))
    if message.video_note:
        vn = message.video_note
        found.append(Attachment(f"video-note-{n}.mp4", "video/mp4", vn.file_size or 0,
                                recorded, vn.file_id))
    if message.document:
        d = message.document
        found.append(Attachment(d.file_name or f"file-{n}", d.mime_type or "",
                                d.file_size or 0, "file", d.file_id))
    for video in (message.video, message.animation):
        if video:
            found.append(Attachment(video.file_name or f"video-{n}.mp4",
                                    video.mime_type or "video/mp4", video.file_size or 0,
                                    "video", video.file_id))
    if message.sticker:
        s = message.sticker
        moving = s.is_animated or s.is_video
        found.append(Attachment(f"sticker-{n}.{'webm' if moving else 'webp'}",
                                "video/webm" if moving else "image/webp", s.file_size or 0,
                                "video" if moving else "image", s.file_id))
    return tuple(found)


class TelegramFiles:
    """The core's `FilePort` for Telegram."""

    platform_name = "Telegram"
    download_limit = DOWNLOAD_LIMIT
    upload_limit = UPLOAD_LIMIT

    def __init__(self, api: BotApi, send_timeout: float = 60.0) -> None:
        self.api, self.bot = api, api.bot
        self.send_timeout = send_timeout
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def download(self, attachment: Attachment, dest: Path, limit: int) -> int:
        try:
            found = await self.bot.get_file(attachment.source)
        except BadRequest as exc:
            if "too big" in exc.message.lower():
                raise TooLarge from None
            raise ValueError(f"Telegram said: {exc.message}") from None
        except TelegramError as exc:
            raise ValueError(f"Telegram could not be reached ({type(exc).__name__})") from None
        if found.file_size and found.file_size > limit:
            raise TooLarge
        if not found.file_path:
            raise ValueError("Telegram gave no address for the file")
        return await self._stream(found.file_path, dest, limit)

    async def _stream(self, url: str, dest: Path, limit: int) -> int:
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=True)
        return await stream(self._session, url, dest, limit)

    async def upload(self, conv: ConvKey, file: BinaryIO, name: str, caption: str, *,
                     picture: bool) -> None:
        chat = int(conv.chat_id)
        thread = int(conv.thread_id) if conv.thread_id else None
        head, rest = (caption, "") if len(caption) <= CAPTION_LIMIT else ("", caption)
        size = os.fstat(file.fileno()).st_size
        try:
            if picture and size <= PHOTO_LIMIT and await self._photo(chat, thread, file, name,
                                                                      head):
                pass
            else:
                document = InputFile(file, filename=name)
                await self.api.paced(chat, lambda: self.bot.send_document(
                    chat, document, caption=head or None, message_thread_id=thread,
                    read_timeout=self.send_timeout, write_timeout=self.send_timeout))
            if rest:
                await self.api.paced(chat, lambda: self.bot.send_message(
                    chat, rest, message_thread_id=thread))
        except TelegramError as exc:
            raise ValueError(getattr(exc, "message", str(exc))) from None

    async def _photo(self, chat: int, thread: int | None, file: BinaryIO, name: str,
                     caption: str) -> bool:
        """Sent as a photo; False when Telegram will not take it as one (then it goes as a
        document)."""
        photo = InputFile(file, filename=name)
        try:
            await self.api.paced(chat, lambda: self.bot.send_photo(
                chat, photo, caption=caption or None, message_thread_id=thread,
                read_timeout=self.send_timeout, write_timeout=self.send_timeout))
        except BadRequest as exc:
            log.info("Telegram: %s not taken as a photo (%s); sending it as a file", name,
                     exc.message)
            file.seek(0)
            return False
        return True
