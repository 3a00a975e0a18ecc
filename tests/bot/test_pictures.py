"""Pictures cost the bot little: each is decoded once, when it arrives, in a worker thread,
and only its scaled result is kept (never its pixels); Tandem refuses from the header a
picture whose pixels would take too much memory; decoding one stays under ~70 MB of peak
RSS. Pillow's own limits are not relied on (a 0.2 MB PNG of 160 Mpx passes them)."""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bot.core import images
from bot.core.config import Config
from bot.core.events import Attachment, Notice, UserMessage
from tests.bot.test_media import image_parts, png, started, user_text
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec

REPO = Path(__file__).resolve().parents[2]
PEAK_MB = 70


def big_png(path: Path, width: int, height: int, mode: str = "RGB") -> Path:
    """A PNG of `width` x `height` written row by row (never whole in memory): a gradient,
    so it compresses to little; `mode` L, RGB or RGBA."""
    bands = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    color = {"L": 0, "RGB": 2, "RGBA": 6}[mode]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    def rows() -> Iterator[bytes]:
        line = bytes((x * 7) & 0xFF for x in range(width * bands))
        for y in range(height):
            yield b"\x00" + (line if y % 64 else bytes(width * bands))

    packer = zlib.compressobj(6)
    with path.open("wb") as out:
        out.write(b"\x89PNG\r\n\x1a\n")
        out.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)))
        pending = b""
        for row in rows():
            pending += packer.compress(row)
            if len(pending) > 1 << 20:
                out.write(chunk(b"IDAT", pending))
                pending = b""
        out.write(chunk(b"IDAT", pending + packer.flush()))
        out.write(chunk(b"IEND", b""))
    return path


MEASURE = """
import sys
from pathlib import Path
from bot.core import images

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024

images.encode(Path(sys.argv[2]).read_bytes())  # Pillow and its plugins loaded
path = Path(sys.argv[1])
path.read_bytes()
Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again here
before = status("VmRSS")
try:
    images.prepare(path)
    outcome = "kept"
except images.TooManyPixels:
    outcome = "refused"
print(outcome, status("VmHWM") - before)
"""


def peak(path: Path, tmp_path: Path) -> tuple[str, float]:
    """(kept | refused, the rise of peak RSS in MB) of preparing `path` in a fresh process
    (Linux: the high-water mark is reset through /proc/self/clear_refs)."""
    small = tmp_path / "small.png"
    small.write_bytes(png(3000, 10))
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(small)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=True)
    outcome, rise = done.stdout.split()
    return outcome, float(rise)


def test_a_huge_picture_in_a_small_png_is_refused_from_its_header(tmp_path: Path) -> None:
    bomb = big_png(tmp_path / "bomb.png", 16_000, 10_000, "L")  # 160 Mpx
    assert bomb.stat().st_size < 1_000_000
    outcome, rise = peak(bomb, tmp_path)
    assert outcome == "refused" and rise < 10, rise
    assert not images.scaled_path(bomb).exists()


@pytest.mark.parametrize(("width", "height", "mode"), [
    (3600, 2900, "RGB"), (3600, 2900, "RGBA"), (8000, 5200, "L")])
def test_decoding_a_picture_at_the_limit_stays_under_70_mb(
        tmp_path: Path, width: int, height: int, mode: str) -> None:
    picture = big_png(tmp_path / "big.png", width, height, mode)
    outcome, rise = peak(picture, tmp_path)
    print(f"{width} x {height} {mode}: peak RSS +{rise:.1f} MB")
    assert outcome == "kept" and rise <= PEAK_MB, rise
    kept = images.scaled_path(picture)
    assert kept.stat().st_size < 2_000_000 and kept.stat().st_mode & 0o777 == 0o600
    assert images.data_url(picture).startswith(("data:image/jpeg;base64,",
                                                "data:image/png;base64,"))


async def test_a_too_large_picture_is_kept_as_a_file_and_the_user_told(
        config_factory: Callable[..., Config], model: FakeModelServer, tmp_path: Path) -> None:
    core, port = started(config_factory(media__vision=True))
    data = big_png(tmp_path / "huge.png", 16_000, 10_000, "L").read_bytes()
    model.script(Reply(text="ok"))
    async with core:
        await core.hub.submit(UserMessage(core.key, core.user, "look", attachments=(
            Attachment("huge.png", "image/png", 0, "image", port.add("h", data)),)))
        await core.sink.ended()
    [note] = [n.text for n in core.sink.of(Notice)]
    assert "huge.png is too large a picture to look at" in note and "160 Mpx" in note
    assert image_parts(model.last_messages()) == []
    assert "[a picture too large to show: huge.png" in user_text(model.last_messages())


async def test_twenty_pictures_are_decoded_once_each_off_the_event_loop(
        config_factory: Callable[..., Config], model: FakeModelServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three requests carry all twenty pictures; each was decoded once, in a worker
    thread, when it arrived (a shared cache of sixteen decoded them again on every
    request, on the event loop)."""
    decoded: list[str] = []
    encode = images.encode

    def counted(data: bytes) -> tuple[str, bytes]:
        decoded.append(threading.current_thread().name)
        return encode(data)

    monkeypatch.setattr(images, "encode", counted)
    core, port = started(config_factory(media__vision=True))
    pictures = tuple(Attachment(f"p{i}.png", "image/png", 0, "image",
                                port.add(f"p{i}", png(3000, 40 + i))) for i in range(20))
    model.script(Reply(tool_calls=[ToolCallSpec("list_dir", {})]), Reply(text="seen"),
                 Reply(text="again"))
    async with core:
        await core.hub.submit(UserMessage(core.key, core.user, "look", attachments=pictures))
        await core.sink.ended()
        await core.say("and now?")
        await core.sink.ended(2)
    assert len(model.requests) == 3
    assert [len(image_parts(r["messages"])) for r in model.requests] == [20, 20, 20]
    assert [p.size[0] for p in image_parts(model.requests[-1]["messages"])] == [2048] * 20
    assert len(decoded) == 20 and threading.main_thread().name not in decoded


def test_a_request_never_decodes_a_picture(tmp_path: Path) -> None:
    """A picture nobody prepared (its scaled copy lost) is named, not decoded on the spot;
    once prepared it is sent; once gone it is named as gone."""
    from bot.core.history import Media

    pic = tmp_path / "p.png"
    pic.write_bytes(png(3000, 10))
    media = Media("image", "p.png", "uploads/p.png", str(pic), 10, "image/png", seen=True)
    assert media.part() == {"type": "text", "text": "[p.png cannot be shown; it is in the "
                                                    "workspace at uploads/p.png]"}
    images.prepare(pic)
    assert media.part()["type"] == "image_url"
    pic.unlink()
    images.scaled_path(pic).unlink()
    assert "is no longer in the workspace" in media.part()["text"]
