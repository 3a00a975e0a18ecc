"""A conversation holding 20 pictures: what it costs the bot, and every other chat.

    python benchmarks/pictures_bench.py [--pictures 20] [--rounds 5] [--json out.json]

Tandem's core (the hub as `tandem run` builds it, on SQLite) with the console platform,
a port that serves files from memory, and the project's fake OpenAI-compatible model
server (`tests/fakes/model_server.py`, answering at once) in a process of its own, so that
its checks of every picture are not counted as Tandem's. Chat A is
sent `--pictures` pictures of 3,600 x 2,700 px (9.7 Mpx, a fractal in colour, PNG, just
under Tandem's limit of 10 Mpx in colour), one message each, then `--rounds` turns of
text; every request of chat A carries all its pictures. Meanwhile chat B's "event loop
probe" wakes every 5 ms and records how late it woke: the longest stall is the longest
time no other chat, webhook or heartbeat could have been served.

1. Receiving: the time from a picture's message to its turn's end (fetch, decode, scale,
   keep the result, the model call), the median; the longest loop stall meanwhile.
2. Request build: `Prompt.build` of chat A with every picture in it, timed alone on the
   event loop: the first build after a restart (nothing cached in memory, the kept
   scaled results read from disk) and the median of the warm ones; the longest loop
   stall over the text turns, each of which builds a request with every picture, and,
   for the machine's own noise, over as many turns of a chat C that holds no picture.
3. Peak RSS of preparing one picture at the limit, in a fresh process (the high-water
   mark reset through /proc/self/clear_refs first).
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import asyncio
import contextlib
import io
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from PIL import Image  # noqa: E402

from bot.core import images  # noqa: E402
from bot.core.config import Config  # noqa: E402
from bot.core.events import Attachment, ConvKey, Event, TurnEnded, User, UserMessage  # noqa: E402
from bot.media import MB  # noqa: E402
from bot.run.app import build  # noqa: E402

PERSONA = REPO / "persona"
SIZE = (3600, 2700)


def picture(n: int) -> bytes:
    """A 9.7 Mpx PNG with texture everywhere (so its scaled JPEG is photo-sized)."""
    w, h = SIZE
    fractal = Image.effect_mandelbrot((w, h), (-2.2 + n * 0.01, -1.2, 1.0, 1.2), 60)
    gradient = Image.linear_gradient("L").resize((w, h))
    out = io.BytesIO()
    Image.merge("RGB", (fractal, gradient, fractal.transpose(Image.Transpose.ROTATE_180))
                ).save(out, "PNG")
    return out.getvalue()


class MemoryPort:
    platform_name = "Console"
    download_limit = upload_limit = 50 * MB

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    async def download(self, attachment: Attachment, dest: Path, limit: int) -> int:
        data = self.files[attachment.source]
        with dest.open("wb") as out:  # in pieces, as the platforms' ports stream
            for start in range(0, len(data), 65536):
                out.write(data[start:start + 65536])
                await asyncio.sleep(0)
        return len(data)

    async def upload(self, conv: ConvKey, file: BinaryIO, name: str, caption: str, *,
                     picture: bool) -> None:
        raise ValueError("not here")


class Sink:
    def __init__(self) -> None:
        self.ended: list[TurnEnded] = []
        self.changed = asyncio.Event()

    async def emit(self, event: Event) -> None:
        if isinstance(event, TurnEnded):
            self.ended.append(event)
            self.changed.set()

    async def wait(self, count: int) -> None:
        while len(self.ended) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 120)


class Probe:
    """Chat B's view of the event loop: how late a 5 ms timer fires."""

    def __init__(self) -> None:
        self.stalls: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + 0.005
            await asyncio.sleep(0.005)
            self.stalls.append((loop.time() - due) * 1000)

    def start(self) -> None:
        self.stalls = []
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return max(self.stalls, default=0.0)


SERVE_MODEL = """
import asyncio, sys
from tests.fakes.model_server import FakeModelServer, Reply

async def main():
    server = FakeModelServer(port=int(sys.argv[1]))
    server.responder = lambda _messages: Reply(text="A picture.")
    await server.start()
    await asyncio.Event().wait()

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def model_process() -> AsyncIterator[str]:
    """The fake model server in a process of its own; its API base."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVE_MODEL, str(port), cwd=REPO,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(300):  # up to 30 s for it to listen
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        await proc.wait()


def config(tmp: Path, api_base: str) -> Config:
    persona = tmp / "persona"
    persona.mkdir()
    for f in PERSONA.glob("*.md"):
        (persona / f.name).write_text(f.read_text())
    (tmp / "workspace").mkdir()
    return Config.model_validate({
        "llm": {"model": "openai/fake", "api_base": api_base, "api_key": "sk-test",
                "context_window": 1_000_000, "timeout_s": 60, "retries": 0},
        "store": {"path": str(tmp / "tandem.db")}, "persona": {"dir": str(persona)},
        "workspace": {"dir": str(tmp / "workspace")}, "media": {"vision": True}})


async def run(pictures: int, rounds: int) -> dict[str, Any]:
    async with model_process() as api_base:
        return await _run(api_base, pictures, rounds)


async def _run(api_base: str, pictures: int, rounds: int) -> dict[str, Any]:
    port, sink, probe = MemoryPort(), Sink(), Probe()
    key, ann = ConvKey("console", "A"), User("u1", "Ann")
    datas = [picture(n) for n in range(pictures)]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(Path(tmp), api_base)
        hub, dispatch = build(cfg)
        dispatch.ports["console"] = port
        dispatch.sinks["console"] = sink
        await hub.d.store.open()
        await hub.recover()
        try:
            await hub.submit(UserMessage(key, ann, "hello"))  # litellm loaded, first turn
            await sink.wait(1)
            received = []
            probe.start()
            for n, data in enumerate(datas):
                port.files[f"p{n}"] = data
                started = time.perf_counter()
                await hub.submit(UserMessage(key, ann, f"picture {n}", attachments=(
                    Attachment(f"p{n}.png", "image/png", len(data), "image", f"p{n}"),)))
                await sink.wait(n + 2)
                received.append((time.perf_counter() - started) * 1000)
            receive_stall = await probe.stop()
            hub.convs.drop(key)  # as after a restart: loaded from the store, nothing
            images._CACHE.clear()  # in memory but the kept results on disk
            images._cached_bytes = 0
            conv = await hub.convs.get(key)
            window = 1_000_000
            started = time.perf_counter()
            request = hub.d.prompt.build(conv, window)
            cold = (time.perf_counter() - started) * 1000
            parts = sum(1 for m in request.messages if isinstance(m["content"], list)
                        for p in m["content"] if p["type"] == "image_url")
            warm = []
            for _ in range(max(5, rounds)):
                started = time.perf_counter()
                hub.d.prompt.build(conv, window)
                warm.append((time.perf_counter() - started) * 1000)
            probe.start()
            for r in range(rounds):
                await hub.submit(UserMessage(key, ann, f"and now? {r}"))
                await sink.wait(pictures + 2 + r)
            turn_stall = await probe.stop()
            probe.start()  # the same turns in a chat with no picture: the machine's floor
            plain = ConvKey("console", "C")
            for r in range(rounds):
                await hub.submit(UserMessage(plain, ann, f"and now? {r}"))
                await sink.wait(pictures + 2 + rounds + r)
            plain_stall = await probe.stop()
            url_bytes = sum(len(images.data_url(Path(m.file))) for msg in conv.history
                            for m in msg.media if m.seen)
        finally:
            await hub.close()
            await hub.d.store.close()
    return {"pictures": pictures, "picture_png_bytes": statistics.median(map(len, datas)),
            "image_parts_per_request": parts, "receive_ms_p50": statistics.median(received),
            "receive_ms_max": max(received), "receive_loop_stall_ms": receive_stall,
            "build_cold_ms": cold, "build_warm_ms_p50": statistics.median(warm),
            "turns_loop_stall_ms": turn_stall, "plain_turns_loop_stall_ms": plain_stall,
            "request_picture_bytes": url_bytes, "load_average": os.getloadavg()[0],
            "peak_rss_mb": peak_rss()}


MEASURE = """
import sys
from pathlib import Path
from bot.core import images

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024

images.encode(Path(sys.argv[2]).read_bytes())
path = Path(sys.argv[1])
path.read_bytes()
Path("/proc/self/clear_refs").write_text("5")
before = status("VmRSS")
images.prepare(path)
print(status("VmHWM") - before)
"""


def peak_rss() -> float:
    """MB of peak RSS that preparing one picture at the limit adds, in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        big, small = Path(tmp) / "big.png", Path(tmp) / "small.png"
        big.write_bytes(picture(0))
        Image.new("RGB", (3000, 10)).save(small, "PNG")
        done = subprocess.run([sys.executable, "-c", MEASURE, str(big), str(small)],
                              cwd=REPO, capture_output=True, text=True, timeout=120,
                              check=True)
        return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pictures", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    found = asyncio.run(run(args.pictures, args.rounds))
    print(f"chat A: {found['pictures']} pictures of {SIZE[0]} x {SIZE[1]} px "
          f"(PNG, {found['picture_png_bytes'] / MB:.1f} MB each); "
          f"{found['image_parts_per_request']} image parts per request, "
          f"{found['request_picture_bytes'] / MB:.1f} MB of data URLs")
    print(f"receiving a picture (message to answer): p50 "
          f"{found['receive_ms_p50']:.0f} ms, max {found['receive_ms_max']:.0f} ms; "
          f"longest loop stall for chat B meanwhile: {found['receive_loop_stall_ms']:.1f} ms")
    print(f"request build with every picture: {found['build_cold_ms']:.1f} ms after a "
          f"restart, {found['build_warm_ms_p50']:.1f} ms warm (p50)")
    print(f"longest loop stall for chat B over {args.rounds} turns of chat A: "
          f"{found['turns_loop_stall_ms']:.1f} ms (target <= 50 ms); over as many turns of "
          f"a chat with no picture: {found['plain_turns_loop_stall_ms']:.1f} ms "
          f"(load average {found['load_average']:.1f})")
    print(f"peak RSS of preparing one picture at the limit: +{found['peak_rss_mb']:.1f} MB "
          f"(target ~70 MB)")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
