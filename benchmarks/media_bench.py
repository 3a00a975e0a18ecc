"""What receiving media costs: the latency a photo and a voice note add before the model
call, and the peak memory while a 20 MB file comes in.

    python benchmarks/media_bench.py [--rounds 7] [--json out.json]

Everything is real except the two servers: Tandem (hub and Telegram adapter, started as
`tandem run` starts them, `benchmarks/running.py`) polls the project's fake Bot API
(`tests/fakes/telegram_server.py`) through python-telegram-bot, fetches files from it
over HTTP, and talks to the fake OpenAI-compatible server (`tests/fakes/model_server.py`)
through litellm, for the chat completions and for the Whisper transcriptions
(`media.vision: true`, `media.transcription.model: whisper-1`). The model answers at once.
Both fakes run in this process, on the same event loop as Tandem.

1. Latency before the model call: from the fake Telegram queueing the user's message
   (`push_message`, `push_photo`, `push_voice`) to the chat completion request reaching
   the fake model (stamped as its handler starts, `time.perf_counter()`), for a plain
   text message (the baseline), a ~1 MB 3000x2000 JPEG (Pillow) and a 30 s 16 kHz mono
   WAV (the standard library's `wave`). Added latency = the kind's median minus the
   baseline's. For the voice note, the fake's own handling of the transcription request
   (its handler, from the request's headers to its answer: reading the upload, checking
   it, answering) is measured and subtracted as well; its `transcription_delay_s` is 0.
   Each round sends one message of each kind, in turn, each in a chat of its own (a
   fresh conversation, so no picture from an earlier turn rides along) and waits for
   the turn to end; one warm-up round (litellm's import and first clients) is not
   counted. The photo's time is also split by the fakes' stamps (update handed out,
   getFile, download, model request), and Pillow's downscale and the base64 are timed
   alone on the same bytes.
2. Peak RSS while receiving a 20 MB file (20 * 1024 * 1024 bytes, Telegram's limit for
   bots) sent as a document: the fake holds the bytes in this process, so Tandem's cost
   is the rise of the peak: the kernel's high-water mark is reset (`/proc/self/clear_refs`
   with "5") once the fake has the bytes, `VmRSS` is read, the document is pushed, and
   once the model request naming the saved file arrives `VmHWM` is read; peak - before.
   Without `clear_refs`, `VmRSS` is sampled every 5 ms instead (and said so). Four files,
   after one text turn (litellm loaded) and before any photo; the figure is the largest
   rise (the first file's, which also opens the download session, is shown apart). The
   fake's own buffers for serving the file (up to one 1 MB chunk) count too, and the
   saved file's size is checked. Every turn of part 1 has its peak rise measured the
   same way (reset after the push), for comparison.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import array
import asyncio
import base64
import contextlib
import gc
import io
import itertools
import json
import logging
import math
import platform
import re
import statistics
import sys
import tempfile
import time
import wave
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from aiohttp import web  # noqa: E402
from PIL import Image, ImageChops, ImageOps  # noqa: E402

from adapters.telegram import create  # noqa: E402
from benchmarks.running import running  # noqa: E402
from bot.core import images  # noqa: E402
from bot.core.config import Config  # noqa: E402
from bot.llm import LiteLLMClient  # noqa: E402
from bot.media import MB  # noqa: E402
from bot.serve.hub import Hub  # noqa: E402
from tests.fakes.model_server import FakeModelServer, Reply, TranscriptionRequest  # noqa: E402
from tests.fakes.telegram_server import FakeTelegram, JSONDict  # noqa: E402

FIRST_USER = 10_000
USERS = 200
PHOTO_SIZE = (3000, 2000)
PHOTO_BYTES = 1_000_000
VOICE_SECONDS = 30
VOICE_RATE = 16_000
BLOB_BYTES = 20 * MB
RSS_ROUNDS = 3
KINDS = ("text", "photo", "voice")
SAVED = re.compile(r"saved as (uploads/\S+?)[ \]]")


def now() -> float:
    return time.perf_counter()


# --- the fakes, with stamps ----------------------------------------------------------------


class TimedModel(FakeModelServer):
    """The fake model, stamping when each chat completion request starts to arrive and how
    long each transcription request spends in its handler."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arrivals: list[float] = []
        self.heard: list[tuple[float, float, float]] = []
        """(handler entered, upload read, answered) per transcription request."""
        self._form_read = 0.0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append(now())
        return await super()._handle(request)

    async def _read_form(self, request: web.Request) -> tuple[TranscriptionRequest, int]:
        try:
            return await super()._read_form(request)
        finally:
            self._form_read = now()

    async def _handle_transcription(self, request: web.Request) -> web.StreamResponse:
        entered = now()
        try:
            return await super()._handle_transcription(request)
        finally:
            self.heard.append((entered, self._form_read, now()))


class TimedTelegram(FakeTelegram):
    """The fake Bot API, stamping when each update is handed out, each sendMessage and
    getFile call, and each download (start, end)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.served: dict[int, float] = {}
        self.get_files: list[float] = []
        self.downloads_at: list[tuple[float, float]] = []
        self.sends: list[float] = []

    async def _get_updates(self, params: JSONDict) -> list[JSONDict]:
        result = await super()._get_updates(params)
        stamp = now()
        for update in result:
            self.served.setdefault(update["update_id"], stamp)
        return result

    async def _send_message(self, params: JSONDict) -> JSONDict:
        self.sends.append(now())
        return await super()._send_message(params)

    async def _get_file(self, params: JSONDict) -> JSONDict:
        self.get_files.append(now())
        return await super()._get_file(params)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        started = now()
        try:
            return await super()._download(request)
        finally:
            self.downloads_at.append((started, now()))


# --- what is sent --------------------------------------------------------------------------


def make_photo() -> tuple[bytes, int]:
    """A noisy 3000x2000 JPEG as near 1 MB as a quality setting gets it; (bytes, quality)."""
    ramp = Image.linear_gradient("L").resize(PHOTO_SIZE)
    red = ImageChops.add(ramp, Image.effect_noise(PHOTO_SIZE, 24), 2.0, 0)
    picture = Image.merge("RGB", (red, Image.effect_noise(PHOTO_SIZE, 24),
                                  ramp.transpose(Image.Transpose.ROTATE_180)))
    best: tuple[bytes, int] | None = None
    low, high = 20, 95
    while low <= high:  # the size grows with the quality: bisect for 1 MB
        quality = (low + high) // 2
        out = io.BytesIO()
        picture.save(out, "JPEG", quality=quality)
        data = out.getvalue()
        if best is None or abs(len(data) - PHOTO_BYTES) < abs(len(best[0]) - PHOTO_BYTES):
            best = (data, quality)
        if len(data) < PHOTO_BYTES:
            low = quality + 1
        else:
            high = quality - 1
    assert best is not None
    return best


def make_voice() -> bytes:
    """30 s of a wavering tone, 16 kHz mono 16-bit PCM, as a WAV file."""
    samples = array.array("h", (int(8000 * math.sin(i / 8) * (0.6 + 0.4 * math.sin(i / 4000)))
                                for i in range(VOICE_SECONDS * VOICE_RATE)))
    if sys.byteorder == "big":
        samples.byteswap()
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(VOICE_RATE)
        w.writeframes(samples.tobytes())
    return out.getvalue()


# --- memory --------------------------------------------------------------------------------


def status_kb(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field_name} in /proc/self/status")


def reset_peak() -> bool:
    """Reset the kernel's high-water mark of this process's RSS (Linux); False if it
    cannot be."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return status_kb("VmHWM") <= status_kb("VmRSS") + 256


@asynccontextmanager
async def sampled_peak() -> AsyncIterator[list[int]]:
    """VmRSS every 5 ms while the block runs; the list holds the largest seen."""
    peak = [status_kb("VmRSS")]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], status_kb("VmRSS"))
            await asyncio.sleep(0.005)

    task = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        peak[0] = max(peak[0], status_kb("VmRSS"))


# --- the rig -------------------------------------------------------------------------------


@dataclass
class Rig:
    hub: Hub
    tg: TimedTelegram
    model: TimedModel
    workspace: Path
    users: Callable[[], int]

    async def turn(self, push: Callable[[int], int]) -> tuple[dict[str, float], dict[str, Any]]:
        """Push one message in a chat of its own, wait for the model request and the
        turn's end; the stamps (ms after the push; `rss_rise`: MB the peak rose from the
        push to the model request) and the request's body."""
        files, downloads = len(self.tg.get_files), len(self.tg.downloads_at)
        heard, requests = len(self.model.heard), len(self.model.requests)
        sends = len(self.tg.sends)
        user = self.users()
        update = push(user)  # the fake's own work (a photo's thumbnails) is done here
        exact = reset_peak()
        before = status_kb("VmRSS")
        pushed = now()
        await self.model.wait_requests(requests + 1, timeout=60)
        peak = status_kb("VmHWM") if exact else status_kb("VmRSS")
        await asyncio.wait_for(self.hub.idle(), 60)
        body = self.model.requests[requests]

        def ms(stamp: float) -> float:
            return (stamp - pushed) * 1000

        stamps = {"served": ms(self.tg.served[update]),
                  "model": ms(self.model.arrivals[requests]), "rss_rise": (peak - before) / 1024}
        if len(self.tg.sends) > sends and self.tg.sends[sends] < self.model.arrivals[requests]:
            stamps["sent_before_model"] = ms(self.tg.sends[sends])
        if len(self.tg.get_files) > files:
            stamps["get_file"] = ms(self.tg.get_files[files])
        if len(self.tg.downloads_at) > downloads:
            begun, ended = self.tg.downloads_at[downloads]
            stamps["download_start"], stamps["download_end"] = ms(begun), ms(ended)
        if len(self.model.heard) > heard:
            entered, read, answered = self.model.heard[heard]
            stamps["transcription_start"] = ms(entered)
            stamps["transcription_read"] = ms(read)
            stamps["transcription_end"] = ms(answered)
            stamps["fake_transcription"] = (answered - entered) * 1000
        return stamps, body


@asynccontextmanager
async def rig() -> AsyncIterator[Rig]:
    tg, model = TimedTelegram(flood=False), TimedModel()
    async with tg, model:  # entered as themselves, the subclasses' stamps typed
        model.responder = lambda _messages: Reply(text="Got it.")
        with tempfile.TemporaryDirectory() as tmp:
            config = Config.model_validate({
                "llm": {"model": "openai/fake", "api_base": model.api_base, "api_key": "sk-x",
                        "context_window": 32000},
                "store": {"path": f"{tmp}/bench.db"},
                "persona": {"dir": str(REPO / "persona")}, "workspace": {"dir": f"{tmp}/ws"},
                "media": {"vision": True, "transcription": {"model": "whisper-1"}},
                "telegram": {"enabled": True, "token": tg.token, "base_url": f"{tg.url}/bot",
                             "allowed_users": list(range(FIRST_USER, FIRST_USER + USERS))}})
            ids = itertools.count(FIRST_USER)
            async with running(config, LiteLLMClient(config.llm), create) as hub:
                yield Rig(hub, tg, model, Path(config.workspace.dir), lambda: next(ids))
        if model.violations:
            raise RuntimeError(f"the fake model refused requests: {model.violations}")


# --- 1. latency before the model call ------------------------------------------------------


def image_part_bytes(body: dict[str, Any]) -> int:
    """Length of the data URL of the (one) picture in the request."""
    for message in body.get("messages", []):
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            if part.get("type") == "image_url":
                return len(part["image_url"]["url"])
    raise RuntimeError("the request carries no picture")


def said(body: dict[str, Any]) -> str:
    out = []
    for message in body.get("messages", []):
        if message.get("role") == "user":
            content = message.get("content")
            out += ([str(p.get("text", "")) for p in content] if isinstance(content, list)
                    else [str(content)])
    return "\n".join(out)


async def latency(r: Rig, rounds: int, photo: bytes, voice: bytes) -> dict[str, Any]:
    pushes: dict[str, Callable[[int], int]] = {
        "text": lambda u: r.tg.push_message(u, u, "hello there"),
        "photo": lambda u: r.tg.push_photo(u, u, photo, caption="what is this"),
        "voice": lambda u: r.tg.push_voice(u, u, voice, duration=VOICE_SECONDS,
                                           mime_type="audio/wav"),
    }
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    warmup: dict[str, dict[str, float]] = {}
    picture_url = 0
    for n in range(rounds + 1):  # round 0 warms up
        order = KINDS[n % len(KINDS):] + KINDS[:n % len(KINDS)]  # each kind first in turn
        for kind in order:
            stamps, body = await r.turn(pushes[kind])
            if kind == "photo":
                picture_url = image_part_bytes(body)
            if kind == "voice" and ("fake_transcription" not in stamps
                                    or "Transcript of " not in said(body)):
                raise RuntimeError("the voice note was not transcribed into the turn")
            if n:
                runs[kind].append(stamps)
            else:
                warmup[kind] = stamps

    def median(kind: str, key: str) -> float:
        return statistics.median(s[key] for s in runs[kind])

    def adjusted(stamps: dict[str, float]) -> float:
        return stamps["model"] - stamps["fake_transcription"]

    base = median("text", "model")
    voice_adjusted = statistics.median(adjusted(s) for s in runs["voice"])
    result: dict[str, Any] = {
        "text_ms": base, "photo_ms": median("photo", "model"),
        "voice_raw_ms": median("voice", "model"), "voice_adjusted_ms": voice_adjusted,
        "fake_transcription_ms": median("voice", "fake_transcription"),
        "photo_added_ms": median("photo", "model") - base,
        "voice_added_raw_ms": median("voice", "model") - base,
        "voice_added_ms": voice_adjusted - base,
        "picture_data_url_bytes": picture_url,
        "rss_rise_mb": {kind: {"warmup": warmup[kind]["rss_rise"],
                               "max": max(s["rss_rise"] for s in runs[kind])}
                        for kind in KINDS},
        "rounds": runs, "warmup": warmup,
    }
    result["photo_split"] = {
        "update_served": median("photo", "served"),
        "to_get_file": statistics.median(s["get_file"] - s["served"] for s in runs["photo"]),
        "get_file_to_download_end": statistics.median(
            s["download_end"] - s["get_file"] for s in runs["photo"]),
        "download": statistics.median(s["download_end"] - s["download_start"]
                                      for s in runs["photo"]),
        "download_end_to_model": statistics.median(s["model"] - s["download_end"]
                                                   for s in runs["photo"]),
    }
    result["voice_split"] = {
        "download_end_to_transcription": statistics.median(
            s["transcription_start"] - s["download_end"] for s in runs["voice"]),
        "fake_reads_upload": statistics.median(
            s["transcription_read"] - s["transcription_start"] for s in runs["voice"]),
        "transcribed_to_heard_sent": statistics.median(
            s.get("sent_before_model", math.nan) - s["transcription_end"]
            for s in runs["voice"]),
        "transcribed_to_model": statistics.median(
            s["model"] - s["transcription_end"] for s in runs["voice"]),
    }
    result["text_split"] = {"update_served": median("text", "served")}
    return result


def pillow_alone(photo: bytes, rounds: int) -> dict[str, float]:
    """`images.encode` (decode, downscale to 2048 px, JPEG q85) and the base64 of its
    result, each alone on the same bytes; then encode's steps one by one (decode, its
    upright copy, `thumbnail`, the RGB copy, the JPEG). Median ms of `rounds`."""
    times: dict[str, list[float]] = {key: [] for key in (
        "encode_ms", "base64_ms", "decode_ms", "upright_copy_ms", "downscale_ms",
        "rgb_copy_ms", "jpeg_ms")}

    def timed(key: str, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        started = now()
        out = step(*args, **kwargs)
        times[key].append((now() - started) * 1000)
        return out

    small = b""
    for _ in range(rounds + 1):  # the first warms up
        _mime, small = timed("encode_ms", images.encode, photo)
        timed("base64_ms", base64.b64encode, small)
        with Image.open(io.BytesIO(photo)) as opened:
            timed("decode_ms", opened.load)
            upright = timed("upright_copy_ms", ImageOps.exif_transpose, opened)
        timed("downscale_ms", upright.thumbnail, (images.MAX_SIDE, images.MAX_SIDE))
        rgb = timed("rgb_copy_ms", upright.convert, "RGB")
        timed("jpeg_ms", rgb.save, io.BytesIO(), "JPEG", quality=85)
    result = {key: statistics.median(values[1:]) for key, values in times.items()}
    result["encoded_bytes"] = float(len(small))
    return result


# --- 2. peak RSS while a 20 MB file comes in -----------------------------------------------


async def rss_once(r: Rig, blob: bytes, exact: bool) -> dict[str, float]:
    requests = len(r.model.requests)
    gc.collect()
    if exact:
        reset_peak()
    before = status_kb("VmRSS")
    started = now()
    user = r.users()
    r.tg.push_document(user, user, blob, file_name="blob.bin",
                       mime_type="application/octet-stream")
    if exact:
        await r.model.wait_requests(requests + 1, timeout=60)
        peak = status_kb("VmHWM")
    else:
        async with sampled_peak() as sampled:
            await r.model.wait_requests(requests + 1, timeout=60)
        peak = sampled[0]
    elapsed = (now() - started) * 1000
    await asyncio.wait_for(r.hub.idle(), 60)
    found = SAVED.search(said(r.model.requests[requests]))
    if found is None:
        raise RuntimeError("the model was not told where the file is")
    size = (r.workspace / found.group(1)).stat().st_size
    if size != len(blob):
        raise RuntimeError(f"saved {size} bytes of {len(blob)}")
    return {"before_mb": before / 1024, "peak_mb": peak / 1024,
            "rise_mb": (peak - before) / 1024, "on_disk_bytes": float(size),
            "to_model_ms": elapsed}


async def rss(r: Rig) -> dict[str, Any]:
    blob = os.urandom(BLOB_BYTES)
    exact = reset_peak()
    first = await rss_once(r, blob, exact)
    runs = [await rss_once(r, blob, exact) for _ in range(RSS_ROUNDS)]
    worst = max([first, *runs], key=lambda run: run["rise_mb"])
    return {"method": "VmHWM after clear_refs" if exact else "VmRSS sampled every 5 ms",
            "first": first, "runs": runs, "rise_mb": worst["rise_mb"],
            "rise_median_mb": statistics.median(run["rise_mb"] for run in runs),
            "on_disk_bytes": worst["on_disk_bytes"]}


# --- report --------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    photo, quality = make_photo()
    with Image.open(io.BytesIO(photo)) as opened:
        width, height = opened.size
    voice = make_voice()
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs; photo {width}x{height} "
          f"JPEG q{quality}, {len(photo):,} bytes ({len(photo) / MB:.2f} MB); voice "
          f"{VOICE_SECONDS} s WAV {VOICE_RATE // 1000} kHz mono, {len(voice):,} bytes",
          flush=True)
    results: dict[str, Any] = {
        "photo": {"width": width, "height": height, "bytes": len(photo), "quality": quality},
        "voice": {"seconds": VOICE_SECONDS, "rate": VOICE_RATE, "bytes": len(voice)}}
    async with rig() as r:
        await r.turn(lambda u: r.tg.push_message(u, u, "hello"))  # litellm loads
        memory = results["rss"] = await rss(r)  # before any picture is decoded here
        lat = results["latency"] = await latency(r, args.rounds, photo, voice)
    alone = results["pillow_alone"] = pillow_alone(photo, args.rounds)

    print(f"1. push to the model request (p50 of {args.rounds}, one warm-up round not "
          "counted; added = minus the text baseline)")
    print(f"  {'text message (baseline)':40} {lat['text_ms']:7.1f} ms")
    print(f"  {'1 MB photo':40} {lat['photo_ms']:7.1f} ms   added {lat['photo_added_ms']:+7.1f}"
          " ms")
    print(f"  {'30 s voice note, raw':40} {lat['voice_raw_ms']:7.1f} ms   added "
          f"{lat['voice_added_raw_ms']:+7.1f} ms")
    print(f"  {'30 s voice note, fake transcription out':40} {lat['voice_adjusted_ms']:7.1f} ms"
          f"   added {lat['voice_added_ms']:+7.1f} ms   (the fake's handler: "
          f"{lat['fake_transcription_ms']:.1f} ms)")
    split = lat["photo_split"]
    print(f"  photo, where the time goes (ms, p50): update handed out "
          f"{split['update_served']:.1f}; then to getFile {split['to_get_file']:.1f}; getFile "
          f"+ download {split['get_file_to_download_end']:.1f} (download alone "
          f"{split['download']:.1f}); download end to the model request "
          f"{split['download_end_to_model']:.1f}")
    print(f"  Pillow alone on the same bytes: images.encode {alone['encode_ms']:.1f} ms (to "
          f"{alone['encoded_bytes'] / 1024:.0f} kB), base64 {alone['base64_ms']:.2f} ms; the "
          f"request's data URL {lat['picture_data_url_bytes'] / 1024:.0f} kB")
    print(f"  encode's steps alone: decode {alone['decode_ms']:.1f} ms, upright copy "
          f"{alone['upright_copy_ms']:.1f} ms, downscale (thumbnail to {images.MAX_SIDE} px) "
          f"{alone['downscale_ms']:.1f} ms, RGB copy {alone['rgb_copy_ms']:.1f} ms, JPEG q85 "
          f"{alone['jpeg_ms']:.1f} ms")
    voiced = lat["voice_split"]
    print(f"  voice, where the time goes (ms, p50): download end to the transcription request "
          f"{voiced['download_end_to_transcription']:.1f}; the fake reads the upload "
          f"{voiced['fake_reads_upload']:.1f}; transcribed to the \"Heard\" notice at the fake "
          f"{voiced['transcribed_to_heard_sent']:.1f}, to the model request "
          f"{voiced['transcribed_to_model']:.1f}")
    rises = lat["rss_rise_mb"]
    print("  peak RSS rise from the push to the model request, MB (warm-up round / largest "
          "counted): " + ", ".join(f"{kind} {rises[kind]['warmup']:.1f} / {rises[kind]['max']:.1f}"
                                   for kind in KINDS))
    print(f"2. a 20 MB document ({BLOB_BYTES:,} bytes), peak RSS ({memory['method']})")
    first = memory["first"]
    print(f"  first file   {first['before_mb']:.0f} -> {first['peak_mb']:.0f} MB, rise "
          f"{first['rise_mb']:.1f} MB")
    for n, one in enumerate(memory["runs"], 1):
        print(f"  file {n}       {one['before_mb']:.0f} -> {one['peak_mb']:.0f} MB, rise "
              f"{one['rise_mb']:.1f} MB, in {one['to_model_ms']:.0f} ms to the model request")
    print(f"  peak rise {memory['rise_mb']:.1f} MB (largest of {RSS_ROUNDS + 1}); on disk "
          f"{memory['on_disk_bytes']:,.0f} bytes")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    results = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
