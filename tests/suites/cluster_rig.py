"""The cluster suite's rig: `tandem run` worker processes on one PostgreSQL database,
behind two load balancers.

Each `Worker` is one `python -m bot --config <file> run` process with a port of its own
for Telegram's webhook and for Slack's Events API (`TANDEM_TELEGRAM__WEBHOOK__PORT`,
`TANDEM_SLACK__HTTP__PORT` over the one config file). A restarted worker keeps its ports,
so the balancers' lists never change. Every start logs to a file of its own
(`w<index>.<start>.log`), which `Rig.dump_logs` prints when a test fails.

- Telegram: the fake Bot API's `webhook_targets` is the balancer (each delivery to the
  next worker; a failed one is retried on the next, with Telegram's backoff).
- Slack: `SlackBalancer` plays Slack's sender: each event to the next worker in turn;
  on a connection error or a non-2xx answer it tries the next worker after 0.2-0.5 s
  with `X-Slack-Retry-Num` set.

What ran where is read from the workers' logs: procrastinate logs every job it starts
and ends with its arguments (`Job`), and the leader logs its election.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import PERSONA
from tests.fakes.model_server import FakeModelServer
from tests.fakes.slack_server import FakeSlackServer, HttpDelivery
from tests.fakes.telegram_server import FakeTelegram
from tests.suites.harness import SECRET as SLACK_SECRET
from tests.test_cli import env
from tests.waiting import within

JSON = dict[str, Any]
HOST = "127.0.0.1"
TG_SECRET = "cluster-webhook-secret-0123456789abcdef"
READY_S = 120.0
"""How long a worker may take to start (litellm's import on a busy 2-core machine)."""
STOP_S = 30.0
SLACK_ATTEMPTS = 12
"""Slack itself retries an event 3 times (after about 1 s, 1 min and 5 min); the test's
sender retries more often and sooner, since Slack's retry policy is not under test: what
is, is that a worker that dies or refuses loses nothing another worker can take."""

_STARTED = re.compile(r"Starting job (tandem\.\w+)\[(\d+)\]\(item=(.*)\)\s*$")
_ENDED = re.compile(r"Job (tandem\.\w+)\[(\d+)\]\(.*\) ended with status: ([^,]+)")
_LEADS = re.compile(r"cluster: (\S+) leads")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def write_config(tmp: Path, pg_url: str, model: FakeModelServer, tg: FakeTelegram,
                 slack: FakeSlackServer, *, tg_users: list[int], slack_users: list[str],
                 public_url: str) -> Path:
    """One config file for every worker (ports come from each one's environment)."""
    (tmp / "persona").mkdir(exist_ok=True)
    for f in PERSONA.glob("*.md"):
        (tmp / "persona" / f.name).write_text(f.read_text())
    (tmp / "ws").mkdir(exist_ok=True)
    path = tmp / "config.json"
    path.write_text(json.dumps({
        "llm": {"model": "openai/fake", "api_base": model.api_base, "api_key": "sk-test",
                "context_window": 32000, "timeout_s": 20, "retries": 1},
        "store": {"url": pg_url, "pool_size": 4},
        "persona": {"dir": str(tmp / "persona")},
        "workspace": {"dir": str(tmp / "ws")},
        "limits": {"breakers": {"same_call": 1000}},
        # placeholders, not drafts: the suite checks that a slow turn streams by its edits
        "telegram": {"enabled": True, "token": tg.token, "base_url": f"{tg.url}/bot",
                     "allowed_users": tg_users, "mode": "webhook", "drafts": False,
                     "webhook": {"url": public_url, "host": HOST, "port": 0,
                                 "path": "/telegram", "secret_token": TG_SECRET}},
        "slack": {"enabled": True, "mode": "http", "bot_token": slack.bot_token,
                  "signing_secret": SLACK_SECRET, "base_url": slack.api_url,
                  "allowed_users": slack_users,
                  "http": {"host": HOST, "port": 0, "path": "/slack/events"}},
    }))
    return path


@dataclass
class Job:
    """One procrastinate job as a worker's log tells it."""

    worker: int
    start: int
    """Which start of the worker (0 for its first process)."""
    task: str
    id: int
    item: JSON
    ended: str | None
    """Its status once it ended ("Success", ...), None while it runs or if it died."""
    at: float = 0.0
    """When it started (epoch seconds, from the log line)."""

    @property
    def kind(self) -> str:
        return str(self.item.get("kind"))

    @property
    def text(self) -> str:
        return str(self.item.get("text") or self.item.get("prompt") or "")

    @property
    def conv(self) -> tuple[str, str, str | None]:
        c = self.item.get("conv") or {}
        return str(c.get("platform")), str(c.get("chat_id")), c.get("thread_id")


def _stamp(line: str) -> float:
    """The epoch time of a log line ("2026-01-02 03:04:05,678 ...", local time)."""
    try:
        return time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + \
            int(line[20:23]) / 1000
    except ValueError:
        return 0.0


def _item(raw: str) -> JSON:
    try:
        value = ast.literal_eval(raw)
        data = json.loads(value) if isinstance(value, str) else {}
    except (ValueError, SyntaxError):
        return {}
    return data if isinstance(data, dict) else {}


class Worker:
    """One `tandem run` process slot: its ports stay, its process may be killed and
    started again."""

    def __init__(self, rig: Rig, index: int) -> None:
        self.rig, self.index = rig, index
        self.tg_port, self.slack_port = free_port(), free_port()
        self.proc: asyncio.subprocess.Process | None = None
        self.logs: list[Path] = []
        self.spans: list[list[float]] = []
        """[started, exited] (time.monotonic()) of each start; exited is inf while it runs."""
        self.ready = False
        self._jobs: list[list[Job]] = []
        self._read: list[int] = []
        """How many bytes of each start's log were parsed."""

    def __repr__(self) -> str:
        return f"w{self.index}(pid {self.pid})"

    @property
    def tg_url(self) -> str:
        return f"http://{HOST}:{self.tg_port}/telegram"

    @property
    def slack_url(self) -> str:
        return f"http://{HOST}:{self.slack_port}/slack/events"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def start_no(self) -> int:
        """Which start runs now (or ran last)."""
        return len(self.logs) - 1

    def start_at(self, moment: float) -> int | None:
        """Which start was running at `moment` (time.monotonic())."""
        for n, (began, ended) in enumerate(self.spans):
            if began <= moment <= ended:
                return n
        return None

    async def start(self) -> None:
        assert not self.alive, f"{self} is running"
        log = self.rig.tmp / "logs" / f"w{self.index}.{len(self.logs)}.log"
        log.parent.mkdir(exist_ok=True)
        self.logs.append(log)
        self.spans.append([time.monotonic(), float("inf")])
        self._jobs.append([])
        self._read.append(0)
        self.ready = False
        extra = {"TANDEM_TELEGRAM__WEBHOOK__PORT": str(self.tg_port),
                 "TANDEM_SLACK__HTTP__PORT": str(self.slack_port)}
        with log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "--config", str(self.rig.config), "run",
                env={**env(), **extra}, cwd=self.rig.tmp, stdin=asyncio.subprocess.DEVNULL,
                stdout=out, stderr=out)

    def log_text(self, start: int = -1) -> str:
        if not self.logs:
            return ""
        try:
            return self.logs[start].read_text(errors="replace")
        except FileNotFoundError:
            return ""

    async def wait_ready(self, timeout: float = READY_S) -> None:
        """Until this start listens on both ports and runs the queue worker."""
        await within(lambda: "Tandem is running" in self.log_text() or not self.alive,
                     timeout, step=0.1)
        text = self.log_text()
        if "Tandem is running" not in text:
            if not self.alive:
                raise AssertionError(f"{self} exited with {self.proc and self.proc.returncode}"
                                     f" before it was ready:\n{text}")
            raise AssertionError(f"{self} not ready within {timeout:g} s:\n{text}")
        assert "Telegram: receiving updates on" in text and "slack: listening" in text, text
        self.ready = True

    def kill_now(self) -> float:
        """SIGKILL, without waiting (for hooks that must not yield); returns when."""
        assert self.proc is not None and self.alive, f"{self} is not running"
        self.ready = False
        self.proc.kill()
        at = time.monotonic()
        self.spans[-1][1] = at
        return at

    async def kill(self) -> float:
        """SIGKILL and reap; returns when it was sent (time.monotonic())."""
        at = self.kill_now()
        assert self.proc is not None
        await self.proc.wait()
        return at

    async def terminate(self, timeout: float = STOP_S) -> int:
        """SIGTERM and wait; the exit status (a worker that hangs fails the test)."""
        if self.proc is None:
            return 0
        if self.alive:
            self.ready = False
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"{self} did not stop within {timeout:g} s of SIGTERM"
                                 ) from None
        finally:
            self.spans[-1][1] = min(self.spans[-1][1], time.monotonic())
        return code

    def jobs(self) -> list[Job]:
        """Every job its starts logged, oldest first per start (read incrementally: a
        dead start's log is parsed once)."""
        for start, path in enumerate(self.logs):
            if self._read[start] < 0:
                continue
            gone = start < self.start_no or (self.proc is not None
                                             and self.proc.returncode is not None)
            try:
                with path.open("rb") as f:
                    f.seek(self._read[start])
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk[:chunk.rfind(b"\n") + 1]
            self._read[start] += len(complete)
            by_id = {job.id: job for job in self._jobs[start] if job.ended is None}
            for line in complete.decode(errors="replace").splitlines():
                if m := _STARTED.search(line):
                    job = Job(self.index, start, m[1], int(m[2]), _item(m[3]), None,
                              _stamp(line))
                    by_id[job.id] = job
                    self._jobs[start].append(job)
                elif (m := _ENDED.search(line)) and (job := by_id.get(int(m[2]))):
                    job.ended = m[3]
            if gone:  # read after that process ended: its log is complete
                self._read[start] = -1
        return [job for jobs in self._jobs for job in jobs]


class Rig:
    def __init__(self, tmp: Path, config: Path, count: int) -> None:
        self.tmp, self.config = tmp, config
        self.workers = [Worker(self, i) for i in range(count)]

    async def start_all(self) -> None:
        for w in self.workers:
            await w.start()
        await asyncio.gather(*(w.wait_ready() for w in self.workers))

    async def stop_all(self) -> list[int]:
        return list(await asyncio.gather(*(w.terminate() for w in self.workers)))

    def kill_all_now(self) -> None:
        """Teardown after a failure: no worker outlives the test."""
        for w in self.workers:
            if w.alive and w.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()

    def by_url(self, url: str) -> Worker | None:
        return next((w for w in self.workers if url in (w.tg_url, w.slack_url)), None)

    def jobs(self) -> list[Job]:
        return [job for w in self.workers for job in w.jobs()]

    def leader(self) -> Worker | None:
        """The live worker that last logged its election."""
        for w in self.workers:
            if w.alive and _LEADS.search(w.log_text()):
                return w
        return None

    def dump_logs(self, tail: int = 400) -> str:
        out = []
        for w in self.workers:
            for path in w.logs:
                lines = path.read_text(errors="replace").splitlines() if path.exists() else []
                out.append(f"===== {path.name} ({len(lines)} lines, last {tail}) =====")
                out.extend(lines[-tail:])
        return "\n".join(out)


class BalancerTelegram(FakeTelegram):
    """The fake Bot API (the Telegram load balancer, `webhook_targets`) with one hook:
    `on_ack[update_id](url)` runs the moment a worker answered that update's delivery
    with a 2xx, before the fake goes on (so a test can kill that worker right then)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_ack: dict[int, Callable[[str], None]] = {}

    async def _post_update(self, session: aiohttp.ClientSession, url: str,
                           update: JSON) -> bool:
        ok = await super()._post_update(session, url, update)
        hook = self.on_ack.pop(update["update_id"], None) if ok else None
        if hook is not None:
            hook(url)
        return ok


class SlackBalancer:
    """Slack's sender in front of the workers: each request to the next worker in turn;
    on a connection error or a non-2xx answer the next worker, 0.2-0.5 s later, with
    `X-Slack-Retry-Num` set (events; a button press is simply sent again)."""

    def __init__(self, fake: FakeSlackServer, rig: Rig, rng: random.Random) -> None:
        self.fake, self.rig, self.rng = fake, rig, rng
        self._turn = 0
        self.failed_attempts: list[tuple[int, str]] = []
        """(worker, why) of every attempt that did not get a 2xx."""
        self.took: list[tuple[str, int]] = []
        """(what, worker) of every request some worker accepted."""

    def _next(self) -> Worker:
        w = self.rig.workers[self._turn % len(self.rig.workers)]
        self._turn += 1
        return w

    async def _send(self, what: str, post: Callable[[str, int], Awaitable[HttpDelivery]],
                    first: Worker | None = None) -> Worker:
        for attempt in range(SLACK_ATTEMPTS):
            w = first if first is not None and attempt == 0 else self._next()
            try:
                got = await post(w.slack_url, attempt)
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.failed_attempts.append((w.index, type(exc).__name__))
            else:
                if 200 <= got.status < 300:
                    self.took.append((what, w.index))
                    return w
                self.failed_attempts.append((w.index, f"HTTP {got.status}"))
            await asyncio.sleep(self.rng.uniform(0.2, 0.5))
        raise AssertionError(f"no worker took {what} in {SLACK_ATTEMPTS} attempts: "
                             f"{self.failed_attempts[-SLACK_ATTEMPTS:]}")

    async def event(self, event: JSON, what: str = "event") -> Worker:
        body = self.fake.event_body(event)
        return await self._send(what, lambda url, n: self.fake.post_event(
            url, body, signing_secret=SLACK_SECRET, retry_num=n or None))

    async def action(self, payload: JSON, what: str = "action",
                     to: Worker | None = None) -> Worker:
        return await self._send(what, lambda url, _n: self.fake.post_action(
            url, payload, signing_secret=SLACK_SECRET), first=to)


def pgrep(pattern: str) -> list[int]:
    """Pids of processes whose command line contains `pattern` (not this one)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pattern in cmd:
            found.append(int(entry.name))
    return found
