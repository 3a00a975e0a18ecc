"""What MCP support costs: Tandem's overhead per call, listing 200 tools, start-up.

    python benchmarks/mcp_bench.py [--calls 500] [--rounds 7] [--starts 5] [--json out.json]

The server is the project's fake MCP server (`tests/fakes/mcp_servers.py`, built with the
official SDK), over stdio and over streamable HTTP.

1. Overhead per call: `Connection.call("echo", {"text": "x"})` through Tandem (timeout,
   error mapping, result conversion to text) against the same call made with the bare
   SDK, `ClientSession.call_tool`, on an identical connection of its own to the same
   server: the bare call is the server's (and the SDK's) own time. The two are called in
   turn, so both see the same machine load. Target: at most 3 ms above the bare call, p50.
2. 200 tools: the server publishes 200 more (`MCP_FAKE_EXTRA_TOOLS=200`). Tandem's connect
   + list + `build_tools` (from `Servers.start()` until `ready()`, which includes spawning
   the server), next to the same with the server's own 12 tools; then the listing alone
   (`list_tools` on an open session) and `build_tools` alone.
3. Start-up: `python -m bot --config <cfg> run` with Telegram enabled against the fake
   Telegram, as `run_all.py` measures its cold start: time from process start to the first
   getUpdates poll, with three stdio MCP servers configured and with none (the servers
   connect in the background). Target: at most 0.7 s with the servers. Also when all three
   were connected (Tandem's log line "mcp: <name> connected").
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import asyncio
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx2  # noqa: E402
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from benchmarks.running import run_config  # noqa: E402
from bot.core.config import McpConfig, McpServerConfig  # noqa: E402
from bot.tools import Registry  # noqa: E402
from bot.tools.mcp import Servers  # noqa: E402
from bot.tools.mcp.connection import Connection  # noqa: E402
from bot.tools.mcp.tools import build_tools  # noqa: E402
from tests.fakes.mcp_servers import EXTRA_TOOLS_ENV, http_server, stdio_command  # noqa: E402
from tests.fakes.model_server import FakeModelServer, Reply  # noqa: E402
from tests.fakes.telegram_server import FakeTelegram  # noqa: E402

OVERHEAD_TARGET_MS = 3.0
STARTUP_TARGET_S = 0.7
EXTRA = 200


def stdio_config(extra: int = 0) -> McpServerConfig:
    command, args = stdio_command()
    env = {EXTRA_TOOLS_ENV: str(extra)} if extra else {}
    return McpServerConfig(command=command, args=args, cwd=str(REPO), env=env)


def pct(times: list[float], q: float) -> float:
    return sorted(times)[min(len(times) - 1, int(len(times) * q))]


# --- connections -----------------------------------------------------------------------------


@asynccontextmanager
async def tandem(config: McpServerConfig) -> AsyncIterator[Servers]:
    """Tandem's servers with `config` as the one server `bench`, connected."""
    servers = Servers(McpConfig(servers={"bench": config}), Registry())
    servers.start()
    try:
        if not await servers.ready():
            raise RuntimeError(servers.status()[0])
        yield servers
    finally:
        await servers.close()


@asynccontextmanager
async def bare(config: McpServerConfig) -> AsyncIterator[ClientSession]:
    """The bare SDK client on the connection Tandem would open for `config`."""
    if config.url:
        async with (httpx2.AsyncClient(headers=config.headers) as http,
                    streamable_http_client(config.url, http_client=http) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            yield session
        return
    assert config.command is not None
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **config.env}
    params = StdioServerParameters(command=config.command, args=config.args, cwd=config.cwd,
                                   env=env)
    async with (stdio_client(params) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


# --- 1. overhead per call --------------------------------------------------------------------


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


async def overhead(config: McpServerConfig, calls: int) -> dict[str, float]:
    async with tandem(config) as servers, bare(config) as session:
        connection: Connection = servers.connections["bench"]
        assert await connection.call("echo", {"text": "x"}) == "x"

        def through_tandem() -> Awaitable[str]:
            return connection.call("echo", {"text": "x"})

        def through_sdk() -> Awaitable[Any]:
            return session.call_tool("echo", {"text": "x"})

        ours: list[float] = []
        theirs: list[float] = []
        for i in range(calls + 20):  # the first 20 of each warm up
            pair = [(through_tandem, ours), (through_sdk, theirs)]
            for call, times in pair if i % 2 else reversed(pair):
                times.append(await timed(call))
    ours, theirs = ours[20:], theirs[20:]
    result = {"tandem_p50_ms": statistics.median(ours), "tandem_p99_ms": pct(ours, 0.99),
              "bare_p50_ms": statistics.median(theirs), "bare_p99_ms": pct(theirs, 0.99)}
    result["overhead_p50_ms"] = result["tandem_p50_ms"] - result["bare_p50_ms"]
    result["overhead_p99_ms"] = result["tandem_p99_ms"] - result["bare_p99_ms"]
    return result


# --- 2. 200 tools ----------------------------------------------------------------------------


async def connect_ms(config: McpServerConfig, tools: int) -> float:
    """From `Servers.start()` until every server is connected, its tools built."""
    registry = Registry()
    servers = Servers(McpConfig(servers={"bench": config}), registry)
    started = time.perf_counter()
    servers.start()
    try:
        connected = await servers.ready()
        elapsed = (time.perf_counter() - started) * 1000
    finally:
        await servers.close()
    count = servers.connections["bench"].tool_count
    if not connected or count != tools:
        raise RuntimeError(f"expected {tools} tools, got {count}: {servers.status()}")
    return elapsed


async def listing(rounds: int) -> dict[str, float]:
    many, few = stdio_config(EXTRA), stdio_config()
    # The fake's 12 tools: one has a schema Tandem leaves out.
    plain, extended = 11, 11 + EXTRA
    await connect_ms(many, extended)  # warms the disk cache and the SDK imports
    with_many: list[float] = []
    with_few: list[float] = []
    for i in range(rounds):  # in turn, each first every other round: the same load for both
        pair = [(many, extended, with_many), (few, plain, with_few)]
        for config, tools, times in pair if i % 2 else reversed(pair):
            times.append(await connect_ms(config, tools))
    list_times, build_times = [], []
    async with bare(many) as session:
        for _ in range(rounds * 10 + 5):
            started = time.perf_counter()
            listed = (await session.list_tools()).tools
            list_times.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            built = build_tools("bench", many, listed, _never_called)
            build_times.append((time.perf_counter() - started) * 1000)
    assert len(listed) == 12 + EXTRA and len(built) == extended
    return {"connect_list_build_ms": statistics.median(with_many),
            "connect_list_build_12_ms": statistics.median(with_few),
            "list_ms": statistics.median(list_times[5:]),
            "build_ms": statistics.median(build_times[5:])}


async def _never_called(_tool: str, _args: dict[str, Any]) -> str:
    raise AssertionError("the benchmark does not call the built tools")


# --- 3. start-up -----------------------------------------------------------------------------


def mcp_config(tmp: str, tg: FakeTelegram, model: FakeModelServer, servers: int) -> Path:
    command, args = stdio_command()
    mcp = {f"srv{i}": {"command": command, "args": args, "cwd": str(REPO)}
           for i in range(servers)}
    return run_config(tmp, tg, model, mcp={"servers": mcp})


async def watch_log(stream: asyncio.StreamReader, began: float, servers: int,
                    connected: dict[str, float], all_up: asyncio.Event) -> None:
    """Note when each "mcp: <name> connected" line comes; read stderr to its end."""
    async for raw in stream:
        line = raw.decode(errors="replace")
        if "mcp: " in line and " connected" in line:
            name = line.split("mcp: ", 1)[1].split()[0]
            connected.setdefault(name, time.perf_counter() - began)
            if len(connected) == servers:
                all_up.set()


async def startup_once(servers: int) -> dict[str, float]:
    """`tandem run` with Telegram enabled and `servers` stdio MCP servers: seconds from
    process start to the first getUpdates, and to the last server connected."""
    async with FakeTelegram(flood=False) as tg, FakeModelServer() as model:
        model.responder = lambda _m: Reply(text="pong")
        with tempfile.TemporaryDirectory() as tmp:
            config = mcp_config(tmp, tg, model, servers)
            env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
            env["PYTHONPATH"] = str(REPO)
            connected: dict[str, float] = {}
            all_up = asyncio.Event()
            began = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "--config", str(config), "run", env=env, cwd=tmp,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            assert proc.stderr is not None
            reader = asyncio.create_task(
                watch_log(proc.stderr, began, servers, connected, all_up))
            try:
                await tg.wait_for(lambda: bool(tg.calls_to("getUpdates")), timeout=60)
                ready = time.perf_counter() - began
                if servers:
                    await asyncio.wait_for(all_up.wait(), 60)
            finally:
                proc.terminate()
                await proc.wait()
                await reader
    result = {"ready_s": ready}
    if servers:
        result["all_connected_s"] = max(connected.values())
    return result


async def startup(starts: int) -> dict[str, float]:
    await startup_once(0)  # warms the disk cache
    none: list[dict[str, float]] = []
    three: list[dict[str, float]] = []
    for i in range(starts):
        pair = [(0, none), (3, three)]
        for servers, runs in pair if i % 2 else reversed(pair):
            runs.append(await startup_once(servers))
    return {"none_ready_s": statistics.median(r["ready_s"] for r in none),
            "three_ready_s": statistics.median(r["ready_s"] for r in three),
            "three_all_connected_s": statistics.median(r["all_connected_s"] for r in three)}


# --- report ----------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def print_overhead(name: str, r: dict[str, float]) -> None:
    print(f"  {name:6} Tandem p50 {r['tandem_p50_ms']:.3f} ms  p99 {r['tandem_p99_ms']:.3f} ms"
          f"   bare SDK p50 {r['bare_p50_ms']:.3f} ms  p99 {r['bare_p99_ms']:.3f} ms")
    print(f"  {'':6} overhead p50 {r['overhead_p50_ms']:+.3f} ms  p99 {r['overhead_p99_ms']:+.3f}"
          f" ms   target ≤ {OVERHEAD_TARGET_MS:g} ms p50: "
          f"{verdict(r['overhead_p50_ms'] <= OVERHEAD_TARGET_MS)}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    print(f"1. an MCP call, `echo` with {{\"text\": \"x\"}}, {args.calls} calls each way: "
          "Tandem's Connection.call (timeout, errors, result to text) vs the bare SDK's "
          "ClientSession.call_tool on an identical connection (the server's own time); "
          "overhead = Tandem's percentile minus the bare one", flush=True)
    results: dict[str, Any] = {"stdio": await overhead(stdio_config(), args.calls)}
    print_overhead("stdio", results["stdio"])
    async with http_server() as url:
        results["http"] = await overhead(McpServerConfig(url=url), args.calls)
    print_overhead("http", results["http"])

    print(f"2. a stdio server with {12 + EXTRA} tools ({EXTRA} extra), median of "
          f"{args.rounds}", flush=True)
    t = results["tools_200"] = await listing(args.rounds)
    print(f"  connect + list + build_tools (spawns the server)  {t['connect_list_build_ms']:.0f}"
          f" ms   (same with the server's 12 tools: {t['connect_list_build_12_ms']:.0f} ms)")
    print(f"  list_tools alone on an open session               {t['list_ms']:.1f} ms")
    print(f"  build_tools alone                                 {t['build_ms']:.1f} ms")

    print(f"3. `python -m bot run` (Telegram, fake) to the first getUpdates, median of "
          f"{args.starts}", flush=True)
    s = results["startup"] = await startup(args.starts)
    print(f"  no MCP servers        {s['none_ready_s']:.2f} s")
    print(f"  three stdio servers   {s['three_ready_s']:.2f} s "
          f"({s['three_ready_s'] - s['none_ready_s']:+.2f} s)   target ≤ {STARTUP_TARGET_S:g} s:"
          f" {verdict(s['three_ready_s'] <= STARTUP_TARGET_S)}")
    print(f"  all three connected   {s['three_all_connected_s']:.2f} s after process start "
          "(in the background)")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    # The fake's `bad_schema` tool is left out on purpose, with a warning on every connect.
    logging.getLogger("bot.tools.mcp.tools").setLevel(logging.ERROR)
    results = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
