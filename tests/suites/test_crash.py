"""Crash suite: `kill -9` Tandem at random points, restart, and check nothing is lost.

Short mode (CI): 20 kills. Long mode: `TANDEM_CRASH_KILLS=200 pytest tests/suites/test_crash.py`.
Kill points: while the model streams, between a tool call being recorded and its result,
while a tool runs, while an approval waits, while a scheduled job's turn runs.
After every restart: the database passes `PRAGMA integrity_check`, every committed user
message is still there, the model receives a valid history (the fake counts pairing
violations), every interrupted call has a result, no message is answered twice, a
pending approval is answerable or expired, and no tool process outlives the kill.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import said
from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec
from tests.test_cli import env, write_config
from tests.waiting import within

# Tests that look for their tool processes by command line (pgrep) run on one xdist worker.
pytestmark = pytest.mark.xdist_group("tool-processes")

KILLS = int(os.environ.get("TANDEM_CRASH_KILLS", "20"))
SCENARIOS = ("stream", "tool", "approval", "job", "record")


def without_note(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request's messages without Tandem's per-request state note (always the last)."""
    return messages[:-1] if messages and said(messages[-1:]) == [] else messages


def respond(messages: list[dict[str, Any]]) -> Reply:
    """The fake model's behaviour, chosen by the scenario word in the user's message."""
    last = without_note(messages)[-1]
    if last["role"] == "tool":
        return Reply(text="Noted the tool result.")
    text = str(last.get("content") or "")
    words = " ".join(f"w{i}" for i in range(200))
    if "stream" in text or "Scheduled task" in text:
        return Reply(text=words, chunk_delay=0.01)
    if "tool" in text:
        return Reply(tool_calls=[ToolCallSpec("shell", {"command": "sleep 37.25"})])
    if "approval" in text:
        return Reply(tool_calls=[ToolCallSpec("write_file", {"path": "a.txt", "content": "x"})])
    if "job" in text:
        return Reply(tool_calls=[ToolCallSpec("schedule_task", {"when": "in 1 seconds",
                                                                "prompt": "stream the report"})])
    if "record" in text:  # many quick calls: kills land between a call and its result
        return Reply(tool_calls=[ToolCallSpec("list_dir", {"path": "."}, id=None)
                                 for _ in range(3)])
    return Reply(text="ok")


def db_state(path: Path) -> dict[str, Any]:
    db = sqlite3.connect(path)
    try:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        users = [r[0] for r in db.execute("SELECT content FROM messages WHERE role='user'")]
        # only a turn that waits for a human may hold unfinished calls, and never one that
        # was handed to its tool
        unfinished = db.execute(
            "SELECT COUNT(*) FROM tool_calls t WHERE state <> 'finished' AND (state ="
            " 'submitted' OR NOT EXISTS (SELECT 1 FROM turns u WHERE u.conv_id=t.conv_id AND"
            " u.session=t.session AND u.turn=t.turn AND u.status<>'done'))").fetchone()[0]
        missing_results = db.execute(
            "SELECT COUNT(*) FROM tool_calls t WHERE state='finished' AND (SELECT COUNT(*)"
            " FROM messages m WHERE m.conv_id=t.conv_id AND m.session=t.session AND"
            " m.role='tool' AND m.tool_call_id=t.call_id) <> 1").fetchone()[0]
        asking = db.execute(
            "SELECT COUNT(*) FROM tool_calls t WHERE state='asking' AND NOT EXISTS"
            " (SELECT 1 FROM approvals a WHERE a.conv_id=t.conv_id AND a.session=t.session"
            " AND a.call_id=t.call_id AND a.status='pending')").fetchone()[0]
        return {"integrity": integrity, "users": users, "unfinished": unfinished,
                "missing_results": missing_results, "asking_without_card": asking}
    finally:
        db.close()


def tool_alive() -> bool:
    found = subprocess.run(["pgrep", "-f", "sleep 37.25"], capture_output=True, text=True)
    return bool(found.stdout.strip())


async def start(config: Path, model: FakeModelServer, tmp: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "--config", str(config), "chat", stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(model), cwd=tmp)


async def test_kill_9_at_random_points_loses_nothing(model: FakeModelServer,
                                                     tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("TANDEM_CRASH_SEED", "7")))
    config = write_config(tmp_path, model, approvals={"tools": {"shell": "allow"}},
                          limits={"breakers": {"same_call": 1000}})
    model.responder = respond
    db = tmp_path / "t.db"
    seen_users: list[str] = []
    for kill in range(KILLS):
        proc = await start(config, model, tmp_path)
        assert proc.stdin is not None
        scenario = rng.choice(SCENARIOS)
        before = len(model.requests)
        proc.stdin.write(f"{scenario} {kill}\n".encode())
        await proc.stdin.drain()
        await model.wait_requests(before + 1, timeout=60)
        await asyncio.sleep(rng.uniform(0.0, 1.5 if scenario != "job" else 2.5))
        proc.kill()
        await proc.wait()
        # its tool's supervisor is told of the death and kills the group, within 0.3 s
        await within(lambda: not tool_alive(), 0.3)
        assert not tool_alive(), f"kill {kill} ({scenario}): a tool process outlived Tandem"
        state = db_state(db)
        assert state["integrity"] == "ok"
        assert set(seen_users) <= set(state["users"]), "a committed user message was lost"
        seen_users = state["users"]
        assert len(seen_users) == len(set(seen_users)), "a message was recorded twice"
    # a last, clean run: everything the crashes interrupted is repaired and answered
    proc = await start(config, model, tmp_path)
    assert proc.stdin is not None
    before = len(model.requests)
    proc.stdin.write(b"final check\n")
    proc.stdin.close()
    await asyncio.wait_for(proc.wait(), 120)
    assert proc.returncode == 0
    assert len(model.requests) > before
    state = db_state(db)
    assert state["integrity"] == "ok"
    assert state["unfinished"] == 0 and state["missing_results"] == 0
    assert state["asking_without_card"] == 0
    assert not tool_alive()
    answers: dict[str, int] = {}
    for request in model.requests:
        users = said(request["messages"])
        answers[users[-1]] = answers.get(users[-1], 0) + 1
    # a user message is sent to the model once per step of its own turn, never re-run later
    assert all(n <= 4 for n in answers.values()), answers
