"""Pictures for the model: decoded, turned upright, downscaled to at most 2,048 px a side
and encoded as a data URL (Pillow does the work; a few recent results are kept)."""

from __future__ import annotations

import base64
import io
from collections import OrderedDict
from pathlib import Path

MAX_SIDE = 2048
MAX_PIXELS = 80_000_000
"""A larger picture is refused rather than decoded (a decompression bomb)."""
_CACHE: OrderedDict[tuple[str, int, int], str] = OrderedDict()
_CACHE_SIZE = 16


def encode(data: bytes) -> tuple[str, bytes]:
    """(mime, bytes) of the picture as the model gets it; ValueError if it is not one."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        with Image.open(io.BytesIO(data)) as opened:
            fmt = opened.format
            if (fmt in ("JPEG", "PNG") and max(opened.size) <= MAX_SIDE
                    and not getattr(opened, "is_animated", False)
                    and opened.getexif().get(0x0112, 1) == 1):
                opened.load()  # decodes it whole: a broken file fails here
                return f"image/{fmt.lower()}", data  # already fine: sent as it is
            # shrink first (a JPEG decodes straight at a smaller scale), turn upright after:
            # no full-size copy is made
            opened.draft("RGB", (MAX_SIDE, MAX_SIDE))
            opened.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.BILINEAR, reducing_gap=2.0)
            image = ImageOps.exif_transpose(opened)
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError) as exc:
        raise ValueError(f"not a picture Tandem can read ({exc})") from None
    out = io.BytesIO()
    if image.mode in ("RGBA", "LA", "P"):
        image.save(out, "PNG", optimize=False)
        return "image/png", out.getvalue()
    image.convert("RGB").save(out, "JPEG", quality=85)
    return "image/jpeg", out.getvalue()


def data_url(path: Path) -> str:
    """The picture at `path` as a data URL (OSError, ValueError when it is unusable)."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    found = _CACHE.get(key)
    if found is not None:
        _CACHE.move_to_end(key)
        return found
    mime, data = encode(path.read_bytes())
    url = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
    _CACHE[key] = url
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return url


def warm(paths: list[Path]) -> None:
    """Encode the pictures at `paths` now (in a worker thread), so building a request
    later finds them ready instead of decoding on the event loop."""
    for path in paths[-_CACHE_SIZE:]:
        try:
            data_url(path)
        except (OSError, ValueError):
            continue  # gone or broken: the request names it as such
