"""Budgets count every model call: a transcription and a summary of trimmed turns as much
as a turn's own steps, and a message's files are not fetched (nor transcribed) once its
sender's budget is used up."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bot.core.config import Config
from bot.core.events import Attachment, Notice, TurnEnded, UserMessage
from bot.turn.compaction import SUMMARY_PROMPT
from tests.bot.test_media import started, wav
from tests.conftest import Core
from tests.fakes.model_server import FakeModelServer, Reply

WHISPER_2S = 0.0002
"""What litellm prices two seconds of whisper-1 at ($0.006 a minute)."""


async def test_a_transcription_counts_and_a_used_up_budget_fetches_nothing(
        config_factory: Callable[..., Config], model: FakeModelServer) -> None:
    """Each transcription costs $0.0002 against $0.0003 a day: the second goes over, so the
    third message's file is neither fetched nor transcribed, and no model is called."""
    core, port = started(config_factory(
        limits__budget={"per_user_day": {"cost": WHISPER_2S * 1.5}}))
    model.transcribe_script("water the plants", "and the roses")
    model.script(Reply(text="Will do.", usage=(10, 2)))

    async def voice(n: int) -> None:
        await core.hub.submit(UserMessage(core.key, core.user, "", attachments=(
            Attachment(f"v{n}.wav", "audio/wav", 0, "voice", port.add(f"s{n}", wav(2.0))),)))

    async with core:
        await voice(1)
        await core.sink.ended(1)
        assert core.hub.d.budget is not None
        row = await core.hub.d.store.conversation(core.key)
        status = await core.hub.d.budget.status(row, core.user.id)
        await voice(2)
        await core.sink.ended(2)
        await voice(3)  # nothing left to say: no turn, only the note
        await core.sink.wait(lambda: [n for n in core.sink.of(Notice)
                                      if n.text.startswith("v3.wav")])
        await core.hub.idle()
    assert any(f"${WHISPER_2S:.4f} of $" in line for line in status), status
    assert port.fetched == ["s1", "s2"] and len(model.transcriptions) == 2
    assert any(n.text == "v3.wav was not fetched: the daily budget is used up."
               for n in core.sink.of(Notice))
    assert [e.reason for e in core.sink.of(TurnEnded)] == ["completed", "budget"]
    assert len(model.requests) == 1


class Summarizing:
    """Answers at length, summarizes when asked; each reply reports its usage (a prompt
    about as long as the request) and adds it up."""

    def __init__(self) -> None:
        self.answers = self.summaries = 0

    def __call__(self, messages: list[dict[str, Any]]) -> Reply:
        prompt = len(json.dumps(messages)) // 4
        if SUMMARY_PROMPT.split(".")[0] in str(messages[0]["content"]):
            self.summaries += prompt + 5
            return Reply(text="Ann asked questions.", usage=(prompt, 5))
        self.answers += prompt + 300
        return Reply(text=" ".join(f"w{i}" for i in range(300)), usage=(prompt, 300))


async def test_a_summary_of_trimmed_turns_counts(
        config_factory: Callable[..., Config], model: FakeModelServer) -> None:
    model.responder = spent = Summarizing()
    config = config_factory(llm__context_window=6000, llm__max_output_tokens=500,
                            llm__retries=0, context__summary=True,
                            limits__budget={"per_conversation_day": {"tokens": 10**9}})
    async with Core(config) as core:
        for i in range(8):
            await core.say(f"question {i} " + "x" * 2000)
            await core.sink.ended(i + 1)
        assert core.hub.d.budget is not None
        row = await core.hub.d.store.conversation(core.key)
        status = await core.hub.d.budget.status(row, core.user.id)
    assert spent.summaries and [e.reason for e in core.sink.of(TurnEnded)] == ["completed"] * 8
    total = spent.summaries + spent.answers
    assert any(f"{total:,} of 1,000,000,000 tokens" in line for line in status), \
        (status, spent.summaries, spent.answers)
