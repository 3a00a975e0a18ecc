"""Prometheus metrics: a `Watcher` that counts what Tandem did, and its `/metrics` endpoint.

`Metrics.see` takes the facts of `bot.core.watch` and moves counters and histograms; it does
no I/O and allocates next to nothing (each label set's child is looked up once, then
kept), so a fact costs a few microseconds. Every `Metrics` has its own registry: two in
one process (tests, two hubs) never clash, and nothing lands in the library's global one.

With several workers on PostgreSQL, the task queue's depth and the live workers are read
when Prometheus scrapes (`stats`), never in between. `serve` starts the endpoint on
`metrics.listen` (an aiohttp server in the running loop; worker k of `tandem run --workers
N` on the port plus k − 1: `for_worker`); `close` stops it.

Names and labels (no user ids, no message text, no arguments: nothing secret):

    tandem_turns_total{reason}                 turns ended, by exit reason
    tandem_turn_seconds                        a turn's length, histogram
    tandem_model_call_seconds{ok}              model calls, histogram (ok: true | false)
    tandem_model_calls_total{model,ok}         model calls by the model that answered
                                               (a failed one: the conversation's model)
    tandem_failovers_total{model}              answers another model gave while this one was out
    tandem_tokens_total{kind}                  prompt | completion | cache_read | cache_write
                                               (cached tokens are part of prompt)
    tandem_cost_usd_total                      from litellm's prices
    tandem_tool_runs_total{tool,outcome}       and tandem_tool_seconds{tool}
    tandem_approvals_asked_total               approval cards posted
    tandem_approvals_total{status}             approved, denied, always, expired, …
    tandem_approval_wait_seconds               from card to decision, histogram
    tandem_rule_changes_total{change}          standing rules added | revoked
    tandem_refusals_total{platform,what}       access | press
    tandem_platform_errors_total{platform,method,status}   failed API calls (429: rate limited)
    tandem_budget_refusals_total{scope}        user | conversation
    tandem_queue_depth, tandem_workers_alive   several workers only, read at scrape time
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from bot.core.errors import ConfigError
from bot.core.watch import (
    Asked,
    BudgetReached,
    Decided,
    Fact,
    FailedOver,
    ModelCalled,
    PlatformCall,
    Refused,
    RuleChanged,
    ToolRan,
    TurnDone,
)
from bot.turn.state import ExitReason

log = logging.getLogger(__name__)
Stats = Callable[[], Awaitable[tuple[int, int]]]
"""(workers alive, items waiting or running) across the workers (`Lanes.queue_stats`)."""
STATS_TIMEOUT_S = 5.0
TURN_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, math.inf)
MODEL_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, math.inf)
TOOL_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, math.inf)
WAIT_BUCKETS = (5, 15, 30, 60, 120, 300, 600, 1800, 3600, math.inf)


def parse_listen(listen: str) -> tuple[str, int]:
    """`host:port` (IPv6 as `[::1]:9100`) → (host, port); ConfigError names the key."""
    host, sep, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:  # a bare IPv6 address: where would its port be?
        host = ""
    if not (sep and host and port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ConfigError("metrics.listen", f"{listen!r} is not host:port "
                          "(e.g. 127.0.0.1:9464, or [::1]:9464)")
    return host, int(port)


def for_worker(listen: str, slot: str | None) -> str:
    """Where this worker serves: under `tandem run --workers N` (`slot` 1…N, from
    `TANDEM_WORKER`) the port plus slot − 1, so the workers of one machine do not clash
    (9464, 9465, …); port 0 (any free port) stays 0."""
    host, port = parse_listen(listen)
    if not (port and slot and slot.isascii() and slot.isdigit() and int(slot) > 1):
        return listen
    port += int(slot) - 1
    if port > 65535:
        raise ConfigError("metrics.listen", f"worker {slot} would serve on port {port}")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Scraped(Collector):
    """The queue's gauges, as read for the scrape under way (none when unread)."""

    def __init__(self) -> None:
        self.stats: tuple[int, int] | None = None

    def collect(self) -> Iterable[Metric]:
        if self.stats is None:
            return []  # one worker: no gauges, rather than a misleading zero
        workers, depth = self.stats
        return [GaugeMetricFamily("tandem_workers_alive", "Workers whose heartbeat is recent",
                                  value=workers),
                GaugeMetricFamily("tandem_queue_depth", "Work items waiting or running",
                                  value=depth)]


class Metrics:
    """Counts the facts it sees into its own registry, served by `serve`."""

    def __init__(self, stats: Stats | None = None) -> None:
        self.stats = stats
        """Set with several workers: the queue's gauges are read at each scrape."""
        self.registry = CollectorRegistry()
        self.url: str | None = None
        """`http://host:port/metrics` once `serve` bound it (port 0 picks a free one)."""
        self._runner: Any = None
        self._scraped = _Scraped()
        self.registry.register(self._scraped)
        self._define()
        self._kids: dict[tuple[object, ...], Any] = {}
        self._see: dict[type, Callable[[Any], None]] = {
            TurnDone: self._turn, ModelCalled: self._model, ToolRan: self._tool,
            Asked: self._asked, Decided: self._decided, RuleChanged: self._rule,
            Refused: self._refused, PlatformCall: self._platform,
            BudgetReached: self._budget, FailedOver: self._failover}
        for reason in ExitReason:  # known from the start: a rate over them starts at 0
            self._child(self.turns, reason.value)
        self._prompt, self._completion = self.tokens.labels("prompt"), \
            self.tokens.labels("completion")
        self._cache_read, self._cache_write = self.tokens.labels("cache_read"), \
            self.tokens.labels("cache_write")
        self._ok = {True: self.model_seconds.labels("true"),
                    False: self.model_seconds.labels("false")}

    def _define(self) -> None:
        r = self.registry
        self.turns = Counter("tandem_turns", "Turns ended, by exit reason", ["reason"],
                             registry=r)
        self.turn_seconds = Histogram("tandem_turn_seconds", "How long a turn took",
                                      buckets=TURN_BUCKETS, registry=r)
        self.model_seconds = Histogram("tandem_model_call_seconds",
                                       "Model calls and how long each took", ["ok"],
                                       buckets=MODEL_BUCKETS, registry=r)
        self.tokens = Counter("tandem_tokens", "Tokens used", ["kind"], registry=r)
        self.cost = Counter("tandem_cost_usd", "Model cost in US dollars", registry=r)
        self.tool_runs = Counter("tandem_tool_runs", "Tool calls run, by outcome",
                                 ["tool", "outcome"], registry=r)
        self.tool_seconds = Histogram("tandem_tool_seconds", "How long a tool call ran",
                                      ["tool"], buckets=TOOL_BUCKETS, registry=r)
        self.asked = Counter("tandem_approvals_asked", "Approval cards posted", registry=r)
        self.approvals = Counter("tandem_approvals", "Approvals decided, by status",
                                 ["status"], registry=r)
        self.approval_wait = Histogram("tandem_approval_wait_seconds",
                                       "From approval card to decision",
                                       buckets=WAIT_BUCKETS, registry=r)
        self.rules = Counter("tandem_rule_changes", "Standing approval rules changed",
                             ["change"], registry=r)
        self.refusals = Counter("tandem_refusals", "Messages and presses turned away",
                                ["platform", "what"], registry=r)
        self.platform_errors = Counter("tandem_platform_errors",
                                       "Platform API calls that failed (status 429: rate "
                                       "limited; 0: no answer)",
                                       ["platform", "method", "status"], registry=r)
        self.budget = Counter("tandem_budget_refusals", "Turns refused by a daily budget",
                              ["scope"], registry=r)
        self.model_calls = Counter("tandem_model_calls", "Model calls, by the model that "
                                   "answered (a failed call: the conversation's model)",
                                   ["model", "ok"], registry=r)
        self.failovers = Counter("tandem_failovers", "Answers given by a fallback while this "
                                 "model was unavailable (once per outage and chat)", ["model"],
                                 registry=r)

    # -- the watcher ----------------------------------------------------------------------

    async def see(self, fact: Fact) -> None:
        handle = self._see.get(type(fact))
        if handle is not None:
            handle(fact)

    def _child(self, family: Any, *labels: str) -> Any:
        """`family.labels(*labels)`, made once and then kept (`labels` costs ~2 µs)."""
        key = (family, *labels)
        child = self._kids.get(key)
        if child is None:
            child = self._kids[key] = family.labels(*labels)
        return child

    def _turn(self, fact: TurnDone) -> None:
        self._child(self.turns, fact.reason).inc()
        self.turn_seconds.observe(fact.seconds)

    def _model(self, fact: ModelCalled) -> None:
        self._ok[fact.ok].observe(fact.seconds)
        self._child(self.model_calls, fact.model, "true" if fact.ok else "false").inc()
        if fact.prompt_tokens:
            self._prompt.inc(fact.prompt_tokens)
        if fact.completion_tokens:
            self._completion.inc(fact.completion_tokens)
        if fact.cache_read:
            self._cache_read.inc(fact.cache_read)
        if fact.cache_write:
            self._cache_write.inc(fact.cache_write)
        if fact.cost > 0:
            self.cost.inc(fact.cost)

    def _tool(self, fact: ToolRan) -> None:
        self._child(self.tool_runs, fact.tool, fact.outcome).inc()
        self._child(self.tool_seconds, fact.tool).observe(fact.seconds)

    def _asked(self, fact: Asked) -> None:
        self.asked.inc()

    def _decided(self, fact: Decided) -> None:
        self._child(self.approvals, fact.status).inc()
        self.approval_wait.observe(fact.waited_s)

    def _rule(self, fact: RuleChanged) -> None:
        self._child(self.rules, fact.change).inc()

    def _refused(self, fact: Refused) -> None:
        self._child(self.refusals, fact.platform, fact.what).inc()

    def _platform(self, fact: PlatformCall) -> None:
        self._child(self.platform_errors, fact.platform, fact.method, str(fact.status)).inc()

    def _budget(self, fact: BudgetReached) -> None:
        self._child(self.budget, fact.scope).inc()

    def _failover(self, fact: FailedOver) -> None:
        for model in fact.unavailable:
            self._child(self.failovers, model).inc()

    # -- the endpoint ---------------------------------------------------------------------

    async def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition for one scrape (and its content type), the queue read first."""
        stats = None
        if self.stats is not None:
            try:
                async with asyncio.timeout(STATS_TIMEOUT_S):
                    stats = await self.stats()
            except Exception:  # the counters are still worth serving
                log.warning("metrics: could not read the task queue", exc_info=True)
        self._scraped.stats = stats  # no await from here to the encoding
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type

    async def serve(self, listen: str) -> None:
        """Serve `/metrics` on `listen` (`host:port`); ConfigError if it cannot."""
        from aiohttp import web

        host, port = parse_listen(listen)

        async def scrape(request: web.Request) -> web.Response:
            body, content_type = await self.render(request.headers.get("Accept", ""))
            return web.Response(body=body, headers={"Content-Type": content_type})

        app = web.Application()
        app.router.add_get("/metrics", scrape)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError("metrics.listen", f"cannot listen on {listen} "
                              f"({exc.strerror or exc})") from None
        self._runner = runner
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"http://{shown}:{bound[1]}/metrics"
        log.info("metrics: serving %s", self.url)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner, self.url = None, None


def of(watchers: Iterable[object]) -> Metrics | None:
    """The `Metrics` among a watch's watchers, if `build` added one."""
    return next((w for w in watchers if isinstance(w, Metrics)), None)
