"""`tandem chat` on a PostgreSQL database that another `tandem chat` uses too: real
processes, the fake model, a fresh database of the machine's PostgreSQL (`tests.pg`).

Two terminals in one conversation take turns: each message is answered exactly once, in
the order the terminals got hold of the conversation, each answer in the light of the
other terminal's messages; neither begins a turn the other began (that was a write
conflict, told as "the database is unavailable", and the message was lost)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

from bot.core.events import ConvKey
from bot.store.postgres import PostgresStore
from tests.conftest import said
from tests.fakes.model_server import FakeModelServer, Reply
from tests.pg import database
from tests.test_cli import env, spawn_chat, write_config

ROUNDS = 6
WAITED = "[received; I will answer it after the current reply]"
"""What a terminal says when the other one holds the conversation."""


def echo(messages: list[dict[str, Any]]) -> Reply:
    return Reply(text=f"echo {said(messages)[-1]}")


async def read_until(proc: asyncio.subprocess.Process, needle: str, seen: list[str],
                     timeout: float = 30) -> None:
    """Read `proc`'s stdout into `seen`, line by line, until a line holds `needle`."""
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(timeout):
            while True:
                line = (await proc.stdout.readline()).decode()
                assert line, f"the output ended before {needle!r}: {''.join(seen)[-500:]}"
                seen.append(line)
                if needle in line:
                    return
    except TimeoutError:
        raise AssertionError(f"no {needle!r} after {timeout} s (a message lost?); shown: "
                             f"{''.join(seen)[-500:]}") from None


async def test_two_terminals_answer_each_message_once_taking_turns(
        model: FakeModelServer, tmp_path: Any) -> None:
    model.responder = echo
    with database() as url:
        config = write_config(tmp_path, model, store={"url": url})
        terminals = {"A": await spawn_chat(config, model), "B": await spawn_chat(config, model)}
        shown: dict[str, list[str]] = {name: [] for name in terminals}
        try:
            for name, proc in terminals.items():  # both are up before the first message
                assert proc.stdin is not None
                proc.stdin.write(b"/status\n")
                await proc.stdin.drain()
                await read_until(proc, "Store: PostgreSQL", shown[name])
            for r in range(ROUNDS):  # one message each, written at the same moment
                for name, proc in terminals.items():
                    assert proc.stdin is not None
                    proc.stdin.write(f"{name}{r}\n".encode())
                await asyncio.gather(*(p.stdin.drain() for p in terminals.values()
                                       if p.stdin is not None))
                for name, proc in terminals.items():
                    await read_until(proc, f"echo [you] {name}{r}", shown[name])
            ends: dict[str, tuple[int | None, str, str]] = {}
            for name, proc in terminals.items():
                assert proc.stdin is not None
                proc.stdin.close()
                rest, errors = await asyncio.wait_for(proc.communicate(), 60)
                ends[name] = (proc.returncode, "".join(shown[name]) + rest.decode(),
                              errors.decode())
        finally:
            for proc in terminals.values():
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        for name, (code, out, err) in ends.items():
            assert code == 0, err
            assert "Traceback" not in err and "unavailable" not in out + err, err
            assert "conflict" not in out + err and "Another Tandem process" not in out, err
            for r in range(ROUNDS):
                assert out.count(f"echo [you] {name}{r}\n") == 1, out
            other = "B" if name == "A" else "A"
            assert f"echo [you] {other}" not in out  # each answer where it was asked
        waits = sum(err.count(WAITED) for _, _, err in ends.values())
        assert waits >= 1, "the terminals never contended: the race was not exercised"

        # the store: one turn per message, each done, its message and its answer in it
        store = PostgresStore(url)
        await store.open()
        try:
            row = await store.conversation(ConvKey("console", "you"))
            history = await store.history(row.id, row.session)
            last = await store.last_turn(row.id, row.session)
        finally:
            await store.close()
        assert last is not None and (last.turn, last.status) == (2 * ROUNDS, "done")
        turns = [[(m.role, m.content) for m in history if m.turn == n]
                 for n in range(1, 2 * ROUNDS + 1)]
        asked = []
        for turn in turns:
            [(role, text), answer] = turn
            assert role == "user" and answer == ("assistant", f"echo {text}"), turn
            asked.append(text.removeprefix("[you] "))
        assert sorted(asked) == sorted(f"{n}{r}" for n in "AB" for r in range(ROUNDS))
        for r in range(ROUNDS):  # a round's two messages both come before the next round's
            assert {*asked[2 * r:2 * r + 2]} == {f"A{r}", f"B{r}"}, asked
        # each turn saw every message before it, the other terminal's too
        assert [len(said(request["messages"])) for request in model.requests] == \
            list(range(1, 2 * ROUNDS + 1))


async def test_tandem_run_with_no_platform_talks_in_the_terminal_on_postgresql(
        model: FakeModelServer, tmp_path: Any) -> None:
    """It is a terminal like `tandem chat` (it crashed at the first message: it made
    lanes for the workers' queue, which it never started)."""
    model.script(Reply(text="Hello from the terminal."))
    with database() as url:
        config = write_config(tmp_path, model, store={"url": url})
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--config", str(config), "run",
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env(model), cwd=config.parent)
        out, err = await asyncio.wait_for(proc.communicate(b"hi\n"), 60)
    assert proc.returncode == 0, err.decode()
    assert "no platform is enabled" in err.decode() and "Traceback" not in err.decode()
    assert out.decode().count("Hello from the terminal.") == 1
