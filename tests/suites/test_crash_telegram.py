"""Crash suite, Telegram: `tandem run` as a real process against the fake Bot API.

Each round sends a message, kills Tandem with SIGKILL at a random moment (while the model
streams, while a tool runs, while an approval waits, between a call and its result),
sends another message while it is down, and restarts it. Checked every round: the
database is intact; the message sent while down is answered after the restart; nothing
is answered twice (Telegram redelivers every update the bot had not confirmed); a chat
that did not ask gets no message; no tool process outlives the kill.
Short mode: 10 rounds; `TANDEM_CRASH_KILLS=200` for the long mode.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapters.edge.turns import WORKING
from tests.conftest import PERSONA
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.telegram_server import FakeTelegram
from tests.suites.harness import integrity
from tests.suites.test_crash import respond, tool_alive, without_note
from tests.test_cli import env
from tests.waiting import within

# Tests that look for their tool processes by command line (pgrep) run on one xdist worker.
pytestmark = pytest.mark.xdist_group("tool-processes")

ROUNDS = max(1, int(os.environ.get("TANDEM_CRASH_KILLS", "20")) // 2)
ANN, BOB, CAROL = 42, 43, 44


def echo_or_scenario(messages: list[dict[str, Any]]) -> Reply:
    last = without_note(messages)[-1]
    text = str(last.get("content") or "")
    if last["role"] == "user" and "down " in text:
        word = text.split("down ", 1)[1].split()[0]
        return Reply(text=f"echo down {word}")
    return respond(messages)


def write_config(tmp: Path, model: FakeModelServer, tg: FakeTelegram) -> Path:
    (tmp / "persona").mkdir(exist_ok=True)
    for f in PERSONA.glob("*.md"):
        (tmp / "persona" / f.name).write_text(f.read_text())
    path = tmp / "config.json"
    path.write_text(json.dumps({
        "llm": {"model": "openai/fake", "api_base": model.api_base, "api_key": "sk-test",
                "context_window": 32000, "timeout_s": 10},
        "store": {"path": str(tmp / "t.db")}, "persona": {"dir": str(tmp / "persona")},
        "workspace": {"dir": str(tmp / "ws")},
        "approvals": {"tools": {"shell": "allow"}},
        "limits": {"breakers": {"same_call": 1000}},
        "telegram": {"enabled": True, "token": tg.token, "base_url": f"{tg.url}/bot",
                     "allowed_users": [ANN, BOB, CAROL]}}))
    return path


async def start(config: Path, tg: FakeTelegram, tmp: Path) -> asyncio.subprocess.Process:
    polls = len(tg.calls_to("getUpdates"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "--config", str(config), "run", env=env(), cwd=tmp,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    await tg.wait_for(lambda: len(tg.calls_to("getUpdates")) > polls, timeout=60)
    return proc


def answers(texts: list[str]) -> list[str]:
    """What the bot said, without the ⏹ status message a slow turn shows for a while."""
    return [t for t in texts if t != WORKING]


async def test_kill_9_with_telegram_loses_nothing_and_answers_once(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("TANDEM_CRASH_SEED", "11")))
    async with FakeTelegram(flood=False) as tg, FakeModelServer() as model:
        model.responder = echo_or_scenario
        config = write_config(tmp_path, model, tg)
        proc = await start(config, tg, tmp_path)
        tg.push_message(CAROL, CAROL, "down hello")  # Carol asks once, then stays quiet
        await tg.wait_for(lambda: "echo down hello" in tg.bot_texts(CAROL), timeout=60)
        carol_seen = answers(tg.bot_texts(CAROL))
        for n in range(ROUNDS):
            scenario = rng.choice(("stream", "tool", "approval", "record"))
            before = len(model.requests)
            tg.push_message(ANN, ANN, f"{scenario} {n}")
            await model.wait_requests(before + 1, timeout=60)
            await asyncio.sleep(rng.uniform(0.0, 1.2))
            proc.kill()
            await proc.wait()
            # its tool's supervisor is told of the death and kills the group, within 0.3 s
            await within(lambda: not tool_alive(), 0.3)
            assert not tool_alive(), f"round {n}: a tool process outlived Tandem"
            assert integrity(tmp_path / "t.db") == "ok"
            tg.push_message(BOB, BOB, f"down {n}")  # sent while Tandem is down
            proc = await start(config, tg, tmp_path)
            await tg.wait_for(lambda n=n: f"echo down {n}" in tg.bot_texts(BOB), timeout=60)
        # a fixed wait: time for any duplicate answer to show up; Tandem runs in another
        # process, and nothing tells when it is idle
        await asyncio.sleep(1.5)
        proc.terminate()
        await proc.wait()
        bob = tg.bot_texts(BOB)
        for n in range(ROUNDS):
            assert sum(1 for t in bob if t == f"echo down {n}") == 1, bob
        assert answers(tg.bot_texts(CAROL)) == carol_seen, "an unprompted message reached Carol"
        assert model.violations == []
        assert not tool_alive()
