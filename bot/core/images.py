"""Pictures for the model: decoded once, when they arrive, never while a request is built.

`prepare` (run in a worker thread by whoever receives the picture) reads the picture's
header first and refuses one whose decoded pixels would take more than
`MAX_DECODED_BYTES` (Tandem's own limit, whatever Pillow's is: a small PNG can hold a
huge picture). Otherwise it decodes it (a JPEG at a reduced scale straight away), turns it
upright, scales it to at most 2,048 px a side and keeps the result, a JPEG or PNG of a
few hundred kB, next to the picture (`.scaled/<name>` in its folder); the pixels are
dropped. One picture is decoded at a time, so the memory it takes is bounded per process.

`data_url` only reads that kept result (no decoding), and keeps recent data URLs up to
`CACHE_BYTES`: a request with twenty pictures is built in milliseconds on the event loop.
"""

from __future__ import annotations

import base64
import io
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image

MAX_SIDE = 2048
MAX_DECODED_BYTES = 40 * 1024 * 1024
"""The most memory a picture's decoded pixels may take (`_bytes_per_pixel`): 10 Mpx in
colour, 40 Mpx in grey. Checked from the header, before anything is decoded; a JPEG
counts at the scale it decodes at. Scaling adds the result (at most 2,048² px) and one
band of rows (`_scaled`)."""
PIL_PIXELS = 1_000_000_000
"""Pillow's own bomb check, left far above Tandem's (which comes first)."""
SCALED = ".scaled"
CACHE_BYTES = 48 * 1024 * 1024
_CACHE: OrderedDict[tuple[str, int, int], str] = OrderedDict()
_cached_bytes = 0
_cache_lock = threading.Lock()
_decoding = threading.Lock()
"""One picture is decoded at a time: the memory it takes is bounded per process."""


class TooManyPixels(ValueError):
    """The picture's pixels, decoded, would take more than `MAX_DECODED_BYTES`."""


def scaled_path(path: Path) -> Path:
    """Where the picture at `path` is kept as the model gets it."""
    return path.parent / SCALED / path.name


def _bytes_per_pixel(mode: str) -> int:
    """What a decoded pixel of `mode` takes: Pillow keeps colour at 4 bytes a pixel."""
    if mode in ("1", "L", "P"):
        return 1
    if mode.startswith("I;16"):
        return 2
    return 4


BAND = 128
"""Rows of the scaled picture made at a time (`_scaled`)."""


def _scaled(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`image` scaled to `size`, a band of rows at a time: besides the result, only one
    band of the source is copied at once (a whole-picture resize makes an intermediate
    picture, and a premultiplied copy of one with transparency, as large as the source)."""
    from PIL import Image

    width, height = size
    if image.mode in ("1", "P"):
        return image.resize(size, Image.Resampling.NEAREST)
    out = Image.new(image.mode, size)
    scale = image.height / height
    margin = int(scale) + 2  # the filter's reach beyond the band, in source rows
    for top in range(0, height, BAND):
        bottom = min(height, top + BAND)
        first = max(0, int(top * scale) - margin)
        last = min(image.height, int(bottom * scale) + margin + 1)
        with image.crop((0, first, image.width, last)) as rows:
            piece = rows.resize((width, bottom - top), Image.Resampling.BILINEAR,
                                box=(0, top * scale - first, image.width, bottom * scale - first))
        out.paste(piece, (0, top))
    return out


def encode(source: bytes | Path) -> tuple[str, bytes]:
    """(mime, bytes) of the picture (its bytes, or the file: read in pieces as it is
    decoded) as the model gets it; ValueError if it is not one, TooManyPixels (a
    ValueError) if it is too large to decode."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = PIL_PIXELS
    try:
        with _decoding, Image.open(io.BytesIO(source) if isinstance(source, bytes)
                                   else source) as opened:
            fmt = opened.format
            if (fmt in ("JPEG", "PNG") and max(opened.size) <= MAX_SIDE
                    and not getattr(opened, "is_animated", False)
                    and opened.getexif().get(0x0112, 1) == 1):
                opened.load()  # decodes it whole (at most 2,048² px): a broken file fails
                data = source if isinstance(source, bytes) else source.read_bytes()
                return f"image/{fmt.lower()}", data  # already fine: sent as it is
            # shrink first (a JPEG decodes straight at a smaller scale), turn upright after:
            # no full-size copy is made
            opened.draft("RGB", (MAX_SIDE, MAX_SIDE))
            width, height = opened.size
            need = width * height * _bytes_per_pixel(opened.mode)
            if need > MAX_DECODED_BYTES:
                raise TooManyPixels(
                    f"it is {width:,} × {height:,} px ({width * height / 1e6:.0f} Mpx), more "
                    f"than Tandem decodes ({MAX_DECODED_BYTES // (4 << 20)} Mpx in colour)")
            upright = opened.getexif().get(0x0112, 1) in (0, 1)
            ratio = MAX_SIDE / max(opened.size)
            image = _scaled(opened, (max(1, round(opened.width * ratio)),
                                     max(1, round(opened.height * ratio)))) \
                if ratio < 1 else opened
            if not upright:
                image = ImageOps.exif_transpose(image)
    except TooManyPixels:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError,
            ValueError) as exc:
        raise ValueError(f"not a picture Tandem can read ({exc})") from None
    out = io.BytesIO()
    if image.mode in ("RGBA", "LA", "P"):
        image.save(out, "PNG", optimize=False)
        return "image/png", out.getvalue()
    (image if image.mode == "RGB" else image.convert("RGB")).save(out, "JPEG", quality=85)
    return "image/jpeg", out.getvalue()


def prepare(path: Path) -> Path:
    """Decode the picture at `path` and keep it as the model gets it (once: a kept result
    newer than the picture is used as it is). Blocking: run it in a worker thread.
    OSError, ValueError (TooManyPixels) when it is unusable."""
    from bot.core.file_modes import private_dir, write_private

    kept = scaled_path(path)
    st = path.stat()
    try:
        if kept.stat().st_mtime_ns >= st.st_mtime_ns:
            return kept
    except FileNotFoundError:
        pass
    _, data = encode(path)
    private_dir(kept.parent)
    tmp = kept.with_name(f".{kept.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write_private(tmp, data)
        os.replace(tmp, kept)
    finally:
        if tmp.exists():
            tmp.unlink()
    return kept


def _mime(data: bytes) -> str:
    return "image/png" if data.startswith(b"\x89PNG") else "image/jpeg"


def data_url(path: Path) -> str:
    """The picture at `path` as a data URL, from what `prepare` kept (nothing is decoded
    here). OSError when it was never prepared or is gone."""
    global _cached_bytes
    kept = scaled_path(path)
    st = kept.stat()
    key = (str(kept), st.st_mtime_ns, st.st_size)
    with _cache_lock:
        found = _CACHE.get(key)
        if found is not None:
            _CACHE.move_to_end(key)
            return found
    data = kept.read_bytes()
    url = f"data:{_mime(data)};base64,{base64.b64encode(data).decode('ascii')}"
    with _cache_lock:
        if key not in _CACHE:
            _CACHE[key] = url
            _cached_bytes += len(url)
        while _cached_bytes > CACHE_BYTES and len(_CACHE) > 1:
            _cached_bytes -= len(_CACHE.popitem(last=False)[1])
    return url


def warm(paths: list[Path]) -> None:
    """Prepare the pictures at `paths` now (in a worker thread) that were never prepared
    (a history from before pictures were kept scaled), so no request waits for them."""
    for path in paths:
        try:
            prepare(path)
        except (OSError, ValueError):
            continue  # gone or broken: the request names it as such
