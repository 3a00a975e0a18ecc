"""The long-running process: open the store, start the platforms, recover, serve."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import os
import signal
from typing import Any, Protocol

from bot import llm
from bot.core import redact
from bot.core.config import Config
from bot.core.errors import ConfigError, StoreError, StoreUnusable, TandemError
from bot.run import hidden, logs
from bot.run.app import Dispatch, build
from bot.serve.cluster import Cluster, ensure_queue_schema, owner_id
from bot.serve.hub import Hub
from bot.store import Store

log = logging.getLogger("tandem")
SCHEDULE_SYNC_S = 2.0
"""How often the leading worker reads tasks other workers scheduled or cancelled."""
_background: set[asyncio.Task[None]] = set()


class Platform(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def serve(config: Config, *, chat: bool, verbose: bool) -> int:
    level = logging.DEBUG if verbose else (logging.WARNING if chat else logging.INFO)
    logs.setup(level, [*config.secrets(), *redact.environment_secrets()],
               format=config.logging.format)
    hidden.hide()  # before any tool runs: no command may read this process's environment
    try:
        return asyncio.run(_serve(config, chat))
    except StoreUnusable as exc:
        raise ConfigError("store.path", str(exc)) from None
    except StoreError as exc:  # one line, never silent (a worker's log is all there is)
        log.error("%s", exc)
        return 1


def migrate(config: Config) -> int:
    """`tandem migrate`: the store's schema (and the task queue's, with PostgreSQL)."""
    logs.setup(logging.INFO, config.secrets(), format=config.logging.format)
    from bot.store.backends import open_store

    async def run() -> None:
        store = open_store(config.store.target)
        await store.open()  # applies what is missing, under a lock
        await store.close()
        url = cluster_url(config)
        if url is not None:
            await ensure_queue_schema(url)

    try:
        asyncio.run(run())
    except StoreUnusable as exc:
        raise ConfigError("store.path", str(exc)) from None
    except StoreError as exc:
        log.error("%s", exc)
        return 1
    log.info("the database schema is up to date")
    return 0


def cluster_url(config: Config) -> str | None:
    """The PostgreSQL URL when Tandem runs as one of several workers."""
    target = config.store.target
    return target if target.startswith(("postgresql://", "postgres://")) else None


async def _serve(config: Config, chat: bool) -> int:
    url = cluster_url(config)
    names = [n for n in ("telegram", "slack") if getattr(config, n).enabled and not chat]
    # a worker serves platforms; the terminal keeps its own lanes (it is no worker: the
    # queue's jobs are not its to take), holding each conversation while it answers
    cluster = None if url is None or not names else Cluster(url)
    hub, dispatch = build(config, cluster=cluster)
    await hub.d.store.open()
    platforms: list[Platform] = []
    try:
        await _serve_metrics(config, hub, chat)
        await _kill_orphans(hub.d.store, owner_id(cluster is not None))
        platforms = [load_platform(n).create(config, hub, dispatch) for n in names]
        # litellm takes seconds to import: it loads in a thread from here on, while the
        # platforms connect and the core recovers (a turn that comes first waits for it,
        # nothing else does). Not earlier: the start-up work before this point is Python,
        # which the GIL would share with the import, delaying readiness for no gain.
        llm.preload()
        for platform in platforms:
            if cluster is not None and hasattr(platform, "poll"):
                platform.poll = False  # a platform that polls: only the leader does
            await platform.start()
        if not names:
            if not chat:  # `tandem run` with nothing to run: say so, then the terminal
                log.warning("no platform is enabled (telegram.enabled, slack.enabled in "
                            "the config): talking in this terminal instead")
            console = load_platform("console").create(config, hub, dispatch)
            await hub.recover()
            await hub.scheduler.start()
            hub.d.mcp.start()  # in the background: its tools join when each server is up
            await console.run()
        elif cluster is not None:
            cluster.on_leader = functools.partial(_lead, hub, platforms)
            await cluster.start()
            hub.d.mcp.start()
            await _wait_for_signal()
        else:
            await hub.recover()
            await hub.scheduler.start()
            hub.d.mcp.start()  # in the background: its tools join when each server is up
            await _wait_for_signal()
        return 0
    except ConfigError as exc:  # a token the platform rejected: a config problem
        log.error("%s", exc)
        return 2
    except TandemError as exc:
        log.error("%s", exc)
        return 1
    finally:
        await _close(hub, cluster, platforms)


async def _serve_metrics(config: Config, hub: Hub, chat: bool) -> None:
    """The `/metrics` endpoint on `metrics.listen` (`build` added its watcher, and
    `hub.close` stops it); not for `tandem chat`, which may run beside the service with
    the same config."""
    if chat or not config.metrics.listen:
        return
    from bot.ops import metrics

    watcher = metrics.of(hub.d.watch.watchers)
    if watcher is not None:  # one port per worker of `tandem run --workers N`
        await watcher.serve(metrics.for_worker(config.metrics.listen,
                                               os.environ.get("TANDEM_WORKER")))


async def _close(hub: Hub, cluster: Cluster | None, platforms: list[Platform]) -> None:
    await hub.close()
    if cluster is not None:
        await cluster.close()
    await hub.d.mcp.close()
    for platform in reversed(platforms):
        with contextlib.suppress(Exception):
            await platform.stop()
    if hub.scheduler is not None:
        hub.scheduler.shutdown()
    await hub.d.store.close()
    await llm.close()  # litellm's HTTP clients, while this loop still runs


class PlatformModule(Protocol):
    def create(self, config: Config, hub: Hub, dispatch: Dispatch) -> Any: ...


def load_platform(name: str) -> PlatformModule:
    """Platforms are plugins: `adapters.<name>` with a `create(config, hub, dispatch)`.
    The core names them only by string and never imports a platform library."""
    module: PlatformModule = importlib.import_module(f"adapters.{name}")  # type: ignore[assignment]
    return module


async def _lead(hub: Hub, platforms: list[Platform]) -> None:
    """This worker leads: it polls the platforms that poll (Telegram allows one poller)
    and computes the schedule, taking up others' changes."""
    for platform in platforms:
        start_polling = getattr(platform, "start_polling", None)
        if start_polling is not None and getattr(platform, "poll", True) is False:
            await start_polling()
    await hub.scheduler.start()

    async def keep_in_step() -> None:
        while True:
            await asyncio.sleep(SCHEDULE_SYNC_S)
            try:
                await hub.scheduler.sync()
            except Exception:
                log.warning("could not read the schedule", exc_info=True)

    _background.add(asyncio.create_task(keep_in_step(), name="schedule-sync"))


async def _kill_orphans(store: Store, owner: str) -> None:
    """Tool processes this worker left behind when it was killed die now (another
    worker's are its own business)."""
    from bot.tools.shell import kill_group

    pids = await store.tracked_processes(owner)
    for pid in pids:
        kill_group(pid)
    await store.forget_processes(owner)


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("Tandem is running; Ctrl-C stops it")
    await stop.wait()
