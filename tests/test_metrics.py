"""Metrics: `Metrics` counting facts into its own registry; the `/metrics` endpoint scraped
over HTTP while real turns run through the Telegram adapter (the fake Telegram, the fake
model, a real store); failed platform calls of both platforms; the queue's gauges with
several workers on PostgreSQL; and `tandem run` starting and stopping the endpoint."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import collections
import contextlib
import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import litellm
import pytest
from prometheus_client.parser import text_string_to_metric_families
from telegram import Bot
from telegram.error import BadRequest, RetryAfter

from adapters.telegram import create
from adapters.telegram_api import AiohttpRequest
from bot.core.config import Config
from bot.core.errors import ConfigError
from bot.core.events import ConvKey, Verdict
from bot.core.watch import (
    Asked,
    BudgetLifted,
    BudgetReached,
    Decided,
    ModelCalled,
    PlatformCall,
    Refused,
    RuleChanged,
    ToolRan,
    TurnDone,
    Watch,
)
from bot.ops import metrics
from bot.ops.metrics import Metrics, parse_listen
from bot.run.app import build
from bot.serve.cluster import Cluster
from tests.adapters.test_telegram import ANN, ECHO, FAST, STRANGER, Rig
from tests.conftest import make_config
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.slack_server import FakeSlackServer
from tests.fakes.telegram_server import FakeTelegram
from tests.pg import database
from tests.suites.harness import SlackRig
from tests.test_cli import env, write_config
from tests.waiting import eventually

CONV = ConvKey("telegram", "42")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when it is not there."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every sample of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def scrape(url: str) -> Samples:
    async with aiohttp.ClientSession() as session, session.get(url) as reply:
        assert reply.status == 200, reply.status
        assert reply.headers["Content-Type"].startswith("text/plain")
        return parse(await reply.text())


async def rendered(watcher: Metrics) -> Samples:
    body, _ = await watcher.render()
    return parse(body.decode())


# -- Metrics.see, read from its registry ----------------------------------------------


async def test_each_fact_moves_its_counters() -> None:
    watcher = Metrics()
    facts = [
        TurnDone(CONV, "completed", 1.5), TurnDone(CONV, "completed", 0.5),
        TurnDone(CONV, "cancelled", 0.25),
        ModelCalled("openai/x", 0.75, 100, 20, 0.01, True),
        ModelCalled("openai/x", 2.0, 0, 0, 0.0, False),
        ToolRan(CONV, "shell", "rm -rf the-secret-call", "ok", 0.02, "U-SECRET-ID"),
        ToolRan(CONV, "shell", "false", "error", 0.01, "U-SECRET-ID"),
        Asked(CONV, "a1", "shell", "rm -rf the-secret-call", "U-SECRET-ID", 0.0),
        Decided(CONV, "a1", "shell", "rm -rf the-secret-call", "approved", "U-SECRET-ID", 12.0),
        RuleChanged(CONV, "shell", "k", "added", "U-SECRET-ID"),
        Refused("telegram", "U-SECRET-ID", "access", "not on the list"),
        Refused("telegram", "U-SECRET-ID", "press", "not the requester", CONV),
        PlatformCall("telegram", "sendMessage", 429), PlatformCall("telegram", "sendMessage", 429),
        PlatformCall("slack", "chat.update", 500),
        BudgetReached(CONV, "U-SECRET-ID", "user"),
        BudgetLifted(CONV, "user U-SECRET-ID", "U-ADMIN"),  # not counted: no error either
    ]
    for fact in facts:
        await watcher.see(fact)
    body, content_type = await watcher.render()
    text = body.decode()
    assert "U-SECRET-ID" not in text and "the-secret-call" not in text
    assert content_type.startswith("text/plain")
    s = parse(text)
    assert value(s, "tandem_turns_total", reason="completed") == 2
    assert value(s, "tandem_turns_total", reason="cancelled") == 1
    assert ("tandem_turns_total", frozenset({("reason", "max_steps")})) in s  # known: at 0
    assert value(s, "tandem_turn_seconds_count") == 3
    assert value(s, "tandem_turn_seconds_sum") == 2.25
    assert value(s, "tandem_turn_seconds_bucket", le="1.0") == 2
    assert value(s, "tandem_model_call_seconds_count", ok="true") == 1
    assert value(s, "tandem_model_call_seconds_count", ok="false") == 1
    assert value(s, "tandem_tokens_total", kind="prompt") == 100
    assert value(s, "tandem_tokens_total", kind="completion") == 20
    assert value(s, "tandem_cost_usd_total") == 0.01
    assert value(s, "tandem_tool_runs_total", tool="shell", outcome="ok") == 1
    assert value(s, "tandem_tool_runs_total", tool="shell", outcome="error") == 1
    assert value(s, "tandem_tool_seconds_count", tool="shell") == 2
    assert value(s, "tandem_approvals_asked_total") == 1
    assert value(s, "tandem_approvals_total", status="approved") == 1
    assert value(s, "tandem_approval_wait_seconds_sum") == 12
    assert value(s, "tandem_rule_changes_total", change="added") == 1
    assert value(s, "tandem_refusals_total", platform="telegram", what="access") == 1
    assert value(s, "tandem_refusals_total", platform="telegram", what="press") == 1
    assert value(s, "tandem_platform_errors_total", platform="telegram", method="sendMessage",
                 status="429") == 2
    assert total(s, "tandem_platform_errors_total", status="429") == 2
    assert value(s, "tandem_platform_errors_total", platform="slack", method="chat.update",
                 status="500") == 1
    assert value(s, "tandem_budget_refusals_total", scope="user") == 1
    assert not any(name.startswith(("tandem_workers", "tandem_queue")) for name, _ in s)


async def test_two_metrics_in_one_process_count_apart() -> None:
    one, two = Metrics(), Metrics()
    await Watch([one]).see(TurnDone(CONV, "completed", 1.0))
    assert value(await rendered(one), "tandem_turns_total", reason="completed") == 1
    assert value(await rendered(two), "tandem_turns_total", reason="completed") == 0


async def test_the_queue_gauges_come_from_stats_at_each_scrape() -> None:
    reads: list[tuple[int, int]] = [(2, 5), (3, 0)]

    async def stats() -> tuple[int, int]:
        return reads.pop(0)

    watcher = Metrics(stats)
    first, second = await rendered(watcher), await rendered(watcher)
    assert value(first, "tandem_workers_alive") == 2 and value(first, "tandem_queue_depth") == 5
    assert value(second, "tandem_workers_alive") == 3 and value(second, "tandem_queue_depth") == 0


async def test_a_queue_that_cannot_be_read_leaves_the_counters_served(
        caplog: pytest.LogCaptureFixture) -> None:
    async def stats() -> tuple[int, int]:
        raise OSError("the database is down")

    watcher = Metrics(stats)
    await watcher.see(TurnDone(CONV, "completed", 1.0))
    s = await rendered(watcher)
    assert value(s, "tandem_turns_total", reason="completed") == 1
    assert ("tandem_workers_alive", frozenset()) not in s
    assert "could not read the task queue" in caplog.text


@pytest.mark.parametrize("listen", ["9464", "localhost", ":9464", "::1:9464", "host:port",
                                    "127.0.0.1:70000", "127.0.0.1:", "127.0.0.1:٣"])
def test_a_bad_listen_is_a_config_error_naming_the_key(listen: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_listen(listen)
    assert err.value.key == "metrics.listen"


def test_listen_takes_a_host_and_port() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    assert parse_listen("0.0.0.0:0") == ("0.0.0.0", 0)


def test_each_worker_of_one_machine_serves_on_a_port_of_its_own() -> None:
    assert metrics.for_worker("127.0.0.1:9464", None) == "127.0.0.1:9464"
    assert metrics.for_worker("127.0.0.1:9464", "1") == "127.0.0.1:9464"
    assert metrics.for_worker("127.0.0.1:9464", "3") == "127.0.0.1:9466"
    assert metrics.for_worker("[::1]:9464", "2") == "[::1]:9465"
    assert metrics.for_worker("127.0.0.1:0", "2") == "127.0.0.1:0"
    assert metrics.for_worker("127.0.0.1:9464", "host-a") == "127.0.0.1:9464"
    with pytest.raises(ConfigError) as err:
        metrics.for_worker("127.0.0.1:65535", "2")
    assert err.value.key == "metrics.listen"


async def test_a_taken_port_is_a_config_error_naming_the_key() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        watcher = Metrics()
        with pytest.raises(ConfigError) as err:
            await watcher.serve(f"127.0.0.1:{taken.getsockname()[1]}")
    assert err.value.key == "metrics.listen" and watcher.url is None


async def test_the_endpoint_serves_metrics_only_and_stops() -> None:
    watcher = Metrics()
    await watcher.serve("127.0.0.1:0")
    assert watcher.url is not None
    url = watcher.url
    await watcher.see(TurnDone(CONV, "completed", 1.0))
    assert value(await scrape(url), "tandem_turns_total", reason="completed") == 1
    async with aiohttp.ClientSession() as session:
        async with session.get(url.replace("/metrics", "/")) as reply:
            assert reply.status == 404
        async with session.get(url, headers={"Accept": "application/openmetrics-text"}) as reply:
            assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
    await watcher.close()
    with pytest.raises(aiohttp.ClientConnectionError):
        await scrape(url)


# -- off by default ------------------------------------------------------------------


def test_build_adds_no_metrics_watcher_by_default(tmp_path: Path,
                                                  model: FakeModelServer) -> None:
    config = make_config(tmp_path, model)
    assert config.metrics.listen is None
    hub, _ = build(config)
    assert metrics.of(hub.d.watch.watchers) is None
    on, _ = build(make_config(tmp_path, model, metrics__listen="127.0.0.1:0"))
    assert metrics.of(on.d.watch.watchers) is not None


# -- end to end: turns through the Telegram adapter, scraped over HTTP ----------------


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(flood=False) as server:
        yield server
        assert server.internal_errors == []


@asynccontextmanager
async def telegram_rig(config: Config, fake: FakeTelegram) -> AsyncIterator[tuple[Rig, Metrics]]:
    hub, dispatch = build(config)
    watcher = metrics.of(hub.d.watch.watchers)
    assert watcher is not None and config.metrics.listen is not None
    await watcher.serve(config.metrics.listen)  # as `tandem run` does
    await hub.d.store.open()
    adapter = create(config, hub, dispatch)
    for key, setting in FAST.items():
        setattr(adapter, key, setting)
    try:
        await adapter.start()
        await hub.recover()
        yield Rig(hub, adapter, fake, Path(config.workspace.dir)), watcher
    finally:
        await adapter.stop()
        await hub.close()
        await hub.d.store.close()
        await watcher.close()


async def test_turns_through_telegram_move_the_counters(tmp_path: Path, model: FakeModelServer,
                                                        fake: FakeTelegram) -> None:
    usage = (1000, 100)
    model.script(Reply(text="Hello.", usage=usage), Reply(tool_calls=[ECHO], usage=usage),
                 Reply(text="Wrote out.txt.", usage=usage))
    port = free_port()
    config = make_config(tmp_path, model, llm__model="openai/gpt-4o-mini",
                         telegram={"enabled": True, "token": fake.token,
                                   "base_url": f"{fake.url}/bot", "allowed_users": [ANN],
                                   "drafts": False},
                         metrics__listen=f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"
    async with telegram_rig(config, fake) as (r, _):
        before = await scrape(url)
        fake.push_message(ANN, ANN, "hi")
        await r.answered(ANN, "Hello.")
        await r.hub.idle()
        fake.push_message(ANN, ANN, "write hi to out.txt")
        card, approval_id = await r.card(ANN)
        r.press(ANN, ANN, card, approval_id, Verdict.APPROVE)
        await r.answered(ANN, "Wrote out.txt.")
        await r.hub.idle()
        fake.push_message(STRANGER, STRANGER, "let me in", first_name="Eve")
        await r.until(lambda: len(r.bot(STRANGER)) == 1)
        await r.settle()
        after = await scrape(url)
    assert (r.workspace / "out.txt").read_text() == "hi\n"

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    prompt, completion = litellm.cost_per_token(model="openai/gpt-4o-mini",
                                                prompt_tokens=usage[0],
                                                completion_tokens=usage[1])
    assert moved("tandem_turns_total", reason="completed") == 2
    assert moved("tandem_turn_seconds_count") == 2
    assert moved("tandem_model_call_seconds_count", ok="true") == 3
    assert moved("tandem_model_call_seconds_count", ok="false") == 0
    assert moved("tandem_tokens_total", kind="prompt") == 3 * usage[0]
    assert moved("tandem_tokens_total", kind="completion") == 3 * usage[1]
    assert moved("tandem_cost_usd_total") == pytest.approx(3 * (prompt + completion))
    assert moved("tandem_tool_runs_total", tool="shell", outcome="ok") == 1
    assert moved("tandem_tool_seconds_count", tool="shell") == 1
    assert moved("tandem_approvals_asked_total") == 1
    assert moved("tandem_approvals_total", status="approved") == 1
    assert moved("tandem_approval_wait_seconds_count") == 1
    assert moved("tandem_refusals_total", platform="telegram", what="access") == 1
    assert total(after, "tandem_platform_errors_total") == 0  # the fake refused nothing
    assert total(after, "tandem_budget_refusals_total") == 0
    assert ("tandem_queue_depth", frozenset()) not in after  # one process: no queue
    assert model.violations == []


# -- failed platform calls -------------------------------------------------------------


async def test_failed_telegram_calls_are_counted_with_their_status() -> None:
    watcher = Metrics()
    async with FakeTelegram(edit_interval=10.0, burst=1) as fake:
        bot = Bot(fake.token, base_url=f"{fake.url}/bot",
                  request=AiohttpRequest(watch=Watch([watcher])),
                  get_updates_request=AiohttpRequest())
        async with bot:
            with pytest.raises(BadRequest):
                await bot.send_message(12345, "to a chat that does not exist")
            fake.add_chat(ANN)
            sent = await bot.send_message(ANN, "one")
            with pytest.raises(BadRequest, match="not modified"):  # Tandem takes it as done
                await bot.edit_message_text("one", ANN, sent.message_id)
            with contextlib.suppress(RetryAfter):  # past the burst of one
                for n in range(3):
                    await bot.edit_message_text(f"edit {n}", ANN, sent.message_id)
        limited = len(fake.rate_limited)
    s = await rendered(watcher)
    assert value(s, "tandem_platform_errors_total", platform="telegram",
                 method="sendMessage", status="400") == 1
    assert limited >= 1
    assert value(s, "tandem_platform_errors_total", platform="telegram",
                 method="editMessageText", status="429") == limited
    assert value(s, "tandem_platform_errors_total", platform="telegram",
                 method="editMessageText", status="400") == 0
    text = (await watcher.render())[0].decode()
    assert fake.token not in text and fake.token.split(":")[1] not in text


async def test_slack_rate_limits_are_counted_as_429s(model: FakeModelServer,
                                                     tmp_path: Path) -> None:
    async with FakeSlackServer(rate_limit=True, burst=1) as fake:
        rig = SlackRig(fake, model, tmp_path, "socket", metrics__listen="127.0.0.1:0")
        await rig.start()
        try:
            model.script(Reply(text="tick " * 200, chunk_size=10, chunk_delay=0.01))
            await rig.say("D1", "U1", "stream")
            await rig.wait_text("D1", "tick " * 199)
            await rig.settle()
        finally:
            await rig.stop()
        watcher = metrics.of(rig.hub.d.watch.watchers)
        assert watcher is not None
        s = await rendered(watcher)
        limited = collections.Counter(method for _, method in fake.rate_limited)
    assert limited  # the scenario did hit Slack's limits
    counted = {dict(labels)["method"]: v for (name, labels), v in s.items()
               if name == "tandem_platform_errors_total" and ("status", "429") in labels}
    assert counted == dict(limited)
    assert total(s, "tandem_platform_errors_total") == sum(limited.values())


# -- several workers: the queue's gauges -------------------------------------------------


async def test_with_several_workers_the_queue_gauges_are_read_at_scrape(
        config_factory: Callable[..., Config]) -> None:
    with database() as url:
        config = config_factory(store__url=url, metrics__listen="127.0.0.1:0")
        cluster = Cluster(url, concurrency=2)
        hub, _ = build(config, cluster=cluster)
        watcher = metrics.of(hub.d.watch.watchers)
        assert watcher is not None
        await hub.d.store.open()
        await cluster.start()
        try:
            async def alive() -> Samples | None:
                samples = await rendered(watcher)
                return samples if value(samples, "tandem_workers_alive") >= 1 else None

            s = await eventually(alive, 20, what="the worker's heartbeat", step=0.1)
        finally:
            await hub.close()
            await cluster.close()
            await hub.d.store.close()
    assert value(s, "tandem_workers_alive") == 1 and value(s, "tandem_queue_depth") == 0


# -- `tandem run`: the endpoint starts and stops with it; JSON logs ------------------------


def listening(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (Linux: its sockets, in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def run_until_ready(config: Path, model: FakeModelServer) -> tuple[Any, list[str]]:
    """`tandem run`, once it says it is running; the lines it wrote to stderr so far."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", "--config", str(config),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(model), cwd=config.parent)
    assert proc.stderr is not None
    lines: list[str] = []
    while not any("Tandem is running" in line for line in lines):
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        assert line, f"tandem run ended early: {lines}"
        lines.append(line)
    return proc, lines


async def stop(proc: Any, lines: list[str]) -> int:
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    lines.extend(err.decode().splitlines(keepends=True))
    return int(proc.returncode)


async def test_tandem_run_serves_metrics_logs_json_and_stops(model: FakeModelServer,
                                                             tmp_path: Path) -> None:
    model.script(Reply(text="Hello there."))
    port = free_port()
    async with FakeTelegram(flood=False) as fake:
        config = write_config(tmp_path, model, telegram={
            "enabled": True, "token": fake.token, "base_url": f"{fake.url}/bot",
            "allowed_users": [ANN]}, metrics={"listen": f"127.0.0.1:{port}"},
            logging={"format": "json"})
        proc, lines = await run_until_ready(config, model)
        try:
            assert listening(proc.pid) == {port}
            fake.push_message(ANN, ANN, "hi")
            await fake.wait_for(lambda: "Hello there." in fake.bot_texts(ANN), 20)
            url = f"http://127.0.0.1:{port}/metrics"

            async def counted() -> Samples | None:  # the turn ends just after its answer
                samples = await scrape(url)
                return samples if value(samples, "tandem_turns_total",
                                        reason="completed") >= 1 else None

            s = await eventually(counted, 20, what="the turn counted", step=0.05)
        finally:
            code = await stop(proc, lines)
    assert code == 0, lines
    assert value(s, "tandem_model_call_seconds_count", ok="true") == 1
    with pytest.raises(aiohttp.ClientConnectionError):
        await scrape(url)  # stopped with the process
    entries = [json.loads(line) for line in lines if line.strip()]
    assert entries and all(set(e) >= {"time", "level", "logger", "message"} for e in entries)
    assert any(f"127.0.0.1:{port}/metrics" in e["message"] for e in entries)
    assert all(e["time"].endswith("Z") for e in entries)
    assert fake.token.split(":")[1] not in "".join(lines)


async def test_tandem_run_listens_nowhere_by_default(model: FakeModelServer,
                                                     tmp_path: Path) -> None:
    model.script(Reply(text="Hello there."))
    async with FakeTelegram(flood=False) as fake:
        config = write_config(tmp_path, model, telegram={
            "enabled": True, "token": fake.token, "base_url": f"{fake.url}/bot",
            "allowed_users": [ANN]})
        proc, lines = await run_until_ready(config, model)
        try:
            fake.push_message(ANN, ANN, "hi")  # a turn: litellm is loaded before the stop
            await fake.wait_for(lambda: "Hello there." in fake.bot_texts(ANN), 20)
            assert listening(proc.pid) == set()
        finally:
            code = await stop(proc, lines)
    assert code == 0, lines
    assert not any("metrics" in line for line in lines)


async def test_tandem_run_with_a_bad_listen_says_which_key_and_exits_2(
        model: FakeModelServer, tmp_path: Path) -> None:
    config = write_config(tmp_path, model, metrics={"listen": "localhost"})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", "--config", str(config), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(model), cwd=tmp_path)
    _, err = await asyncio.wait_for(proc.communicate(b""), 60)
    text = err.decode()
    assert proc.returncode == 2, text
    assert "metrics.listen" in text and "Traceback" not in text


async def test_tandem_run_workers_each_serve_the_cluster_gauges(model: FakeModelServer,
                                                                tmp_path: Path) -> None:
    port = free_port()
    while port + 1 > 65535 or not port_free(port + 1):
        port = free_port()
    with database() as url:
        async with FakeTelegram(flood=False) as fake:
            config = write_config(tmp_path, model, store={"url": url}, telegram={
                "enabled": True, "token": fake.token, "base_url": f"{fake.url}/bot",
                "allowed_users": [ANN]}, metrics={"listen": f"127.0.0.1:{port}"})
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "run", "--workers", "2", "--config", str(config),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(model), cwd=tmp_path)
            try:
                seen = []
                for worker_port in (port, port + 1):
                    async def both(worker_port: int = worker_port) -> Samples | None:
                        with contextlib.suppress(aiohttp.ClientConnectionError):
                            samples = await scrape(f"http://127.0.0.1:{worker_port}/metrics")
                            if value(samples, "tandem_workers_alive") == 2:
                                return samples
                        return None

                    # two litellm imports on 2 cores
                    seen.append(await eventually(both, 120, step=0.2,
                                                 what=f"port {worker_port} serving"))
            finally:
                proc.send_signal(signal.SIGTERM)
                await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    assert all(value(s, "tandem_queue_depth") == 0 for s in seen)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
