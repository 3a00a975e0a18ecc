"""Shared fixtures: the fake model server, a config in tmp_path, and a running core."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis.core
import litellm  # noqa: F401  (imported once up front: the first import takes seconds)
import pytest
from hypothesis import HealthCheck, settings

from bot.core.config import Config
from bot.core.events import ApprovalRequested, ConvKey, Event, TurnEnded, User, UserMessage
from bot.run.app import build
from bot.serve.hub import Hub
from tests.fakes import slack_blocks, telegram_spec
from tests.fakes.model_server import FakeModelServer

# CI draws the same examples on every run (a failure there is reproducible, never a fluke);
# local runs draw fresh ones, and what they find goes into the tests as @example. The deep
# profile explores: a random seed (printed, so a find can be replayed with
# --hypothesis-seed) and DEEP_FACTOR times each test's examples.
DEEP_FACTOR = 20
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("deep", derandomize=False, print_blob=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("TANDEM_HYPOTHESIS", "")
if PROFILE in ("ci", "deep"):
    settings.load_profile(PROFILE)


def pytest_configure(config: pytest.Config) -> None:
    """The deep profile's one seed for the run: --hypothesis-seed, else TANDEM_HYPOTHESIS_SEED
    (how xdist workers get the controller's), else a fresh random one."""
    if PROFILE != "deep":
        return
    given = config.getoption("hypothesis_seed", None) or os.environ.get("TANDEM_HYPOTHESIS_SEED")
    seed = int(given) if given else random.SystemRandom().randrange(2**32)
    os.environ["TANDEM_HYPOTHESIS_SEED"] = str(seed)
    hypothesis.core.global_force_seed = seed  # what --hypothesis-seed sets


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if PROFILE == "deep":
        seed = os.environ["TANDEM_HYPOTHESIS_SEED"]
        terminalreporter.write_line(
            f"hypothesis deep profile: {DEEP_FACTOR}x each test's examples, seed {seed} "
            f"(replay: TANDEM_HYPOTHESIS=deep pytest --hypothesis-seed={seed})")


@pytest.fixture(autouse=True)
def _deep_examples(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under the deep profile, each property test draws DEEP_FACTOR times its examples."""
    machine = getattr(request.node, "cls", None)  # a state machine's TestCase
    if PROFILE == "deep" and isinstance(getattr(machine, "settings", None), settings):
        steps = machine.settings  # type: ignore[union-attr]
        machine.settings = settings(steps, max_examples=steps.max_examples * DEEP_FACTOR)
        try:
            yield
        finally:
            machine.settings = steps
        return
    test = getattr(request.node, "obj", None)
    test = getattr(test, "__func__", test)
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if PROFILE != "deep" or own is None or not hasattr(test, "hypothesis"):
        yield
        return
    test._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
        own, max_examples=own.max_examples * DEEP_FACTOR)
    try:
        yield
    finally:
        test._hypothesis_internal_use_settings = own  # type: ignore[union-attr]


@pytest.fixture(autouse=True)
def _no_call_the_services_would_refuse(request: pytest.FixtureRequest) -> Iterator[None]:
    """A call the real Telegram or Slack would refuse for its shape (the fakes check the Bot
    API spec and Block Kit) fails the test that made it, unless it is marked
    ``refused_calls`` (the fakes' own tests of those refusals)."""
    telegram_spec.REFUSALS.clear()
    slack_blocks.REFUSALS.clear()
    yield
    if request.node.get_closest_marker("refused_calls") is None:
        refused = telegram_spec.REFUSALS + slack_blocks.REFUSALS
        assert not refused, f"calls the real service would refuse: {refused}"

REPO = Path(__file__).resolve().parent.parent
PERSONA = REPO / "persona"


STATE_NOTE = "[Current state"


def said(messages: list[dict[str, Any]]) -> list[str]:
    """The user messages of a model request, without Tandem's per-request state note."""
    return [str(m.get("content")) for m in messages
            if m.get("role") == "user" and not str(m.get("content")).startswith(STATE_NOTE)]


class Recorder:
    """A sink that keeps every event and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._changed = asyncio.Condition()

    async def emit(self, event: Event) -> None:
        async with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    async def wait(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        async def check() -> Any:
            async with self._changed:
                while not (found := predicate()):
                    await self._changed.wait()
                return found

        try:
            return await asyncio.wait_for(check(), timeout)
        except TimeoutError:
            raise AssertionError(f"timed out; events: {self.events[-10:]}") from None

    async def ended(self, count: int = 1, timeout: float = 10.0) -> list[TurnEnded]:
        await self.wait(lambda: len(self.of(TurnEnded)) >= count, timeout)
        return self.of(TurnEnded)


@pytest.fixture
async def model() -> AsyncIterator[FakeModelServer]:
    server = FakeModelServer()
    await server.start()
    try:
        yield server
    finally:
        await server.close()
    assert server.violations == [], server.violations


def make_config(tmp: Path, model: FakeModelServer, **overrides: Any) -> Config:
    data: dict[str, Any] = {
        "llm": {"model": "openai/fake", "api_base": model.api_base, "api_key": "sk-test",
                "context_window": 32000, "timeout_s": 5, "retries": 1},
        "store": {"path": str(tmp / "tandem.db")},
        "persona": {"dir": str(tmp / "persona")},
        "workspace": {"dir": str(tmp / "workspace")},
    }
    for dotted, value in overrides.items():
        node = data
        *path, last = dotted.split("__")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    persona = tmp / "persona"
    if not persona.exists():
        persona.mkdir()
        for f in PERSONA.glob("*.md"):
            (persona / f.name).write_text(f.read_text())
    (tmp / "workspace").mkdir(exist_ok=True)
    return Config.model_validate(data)


class Core:
    """A hub on a real SQLite store with a recording sink for the console platform."""

    def __init__(self, config: Config, **build_args: Any) -> None:
        self.config = config
        self.hub: Hub
        self.hub, self.dispatch = build(config, **build_args)
        self.sink = Recorder()
        self.dispatch.sinks["console"] = self.sink
        self.key = ConvKey("console", "c1")
        self.user = User("u1", "Ann")

    async def __aenter__(self) -> Core:
        await self.hub.d.store.open()
        await self.hub.recover()
        await self.hub.scheduler.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.hub.scheduler.shutdown()
        await self.hub.close()
        await self.hub.d.store.close()

    async def say(self, text: str, ref: str | None = None, user: User | None = None) -> None:
        await self.hub.submit(UserMessage(self.key, user or self.user, text, ref=ref))


@pytest.fixture
def config_factory(tmp_path: Path, model: FakeModelServer) -> Callable[..., Config]:
    def factory(**overrides: Any) -> Config:
        return make_config(tmp_path, model, **overrides)

    return factory


class HoldCards:
    """A sink that holds the next approval card until released (and forwards everything)."""

    def __init__(self, sink: Recorder) -> None:
        self.sink = sink
        self.posting = asyncio.Event()
        self.release = asyncio.Event()

    async def emit(self, event: Event) -> None:
        if (isinstance(event, ApprovalRequested) and not event.reminder
                and not self.posting.is_set()):
            self.posting.set()
            await self.release.wait()
        await self.sink.emit(event)
