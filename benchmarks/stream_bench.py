"""One long answer streamed on each platform path: first text, calls, 429s, pace.

A model streams one answer of `--tokens` tokens (default 2,000; a token is 4 characters,
a space included) at `--rate` tokens/s (default 50: ~40 s), on a fixed schedule (token i
at start + i / rate, so the rate holds whatever the event loop does). Each path runs its
own Tandem (hub, SQLite, the real adapter at its production defaults: min_edit_interval
1.0 s, placeholder_delay 0.5 s, typing_delay 0.2 s) against its own strict loopback fake:

* telegram-draft: a private chat with message drafts (sendMessageDraft, then the final
  text as messages);
* telegram-group: a supergroup (a placeholder, edited);
  both against FakeTelegram(chat_interval=1.0, burst=0): every call to a chat less than
  a second after the previous accepted one is a 429, the strictest flood rule;
* slack-stream: a DM thread with a chat stream (chat.startStream/appendStream/stopStream);
* slack-update: the same thread where Slack refuses streams (a chat.postMessage
  placeholder, then chat.update);
* slack-assistant: the DM thread with Slack's assistant surface on (`slack.assistant`):
  the status shows as assistant.threads.setStatus, then the answer streams;
  all three against FakeSlackServer(rate_limit=True) (its per-channel buckets:
  postMessage, startStream and update 1/s with a burst of 3; appendStream 10/s).

The paths run concurrently in this process (`--sequential`: one after another); the
answer is the first in its chat (`--warm`: a short exchange comes first, so the answer is
a later one: Slack then already knows the channel refuses streams). Measured per path
from the fake's own records, against the moment the user's message was pushed: the first
answer text on screen (the first accepted call to the chat carrying answer words: a
draft, the placeholder or its edit, the stream's start, a post or update); the final text
after the model's last token; the longest the chat went without new words (stall);
platform calls by method (getUpdates, getMe, setMyCommands, auth.test and
apps.connections.open left out; sendChatAction counted apart); 429s; the shortest gap
between two calls to the chat and the most calls to it in any one second; how far behind
the model the screen is at each update (lag); and whether the chat ends up showing
exactly the answer.

And the one-tap ⏹ Cancel (`adapters.edge.turns`): when it first became reachable (the
first accepted call that put a message with a Cancel button on screen: a placeholder
with ⏹, or the "⏳ Working on it…" status message the edge posts beside a draft, a
stream or a status line once the turn has run `cancel_delay`); the share of the
streaming time (first answer text to final text) with a ⏹ on screen, and the longest
time without one after it first showed; how long after the final text the last ⏹ left;
the calls the offer cost (the status message's post and its delete, all outcomes) among
the chat's; and what is stale at the end (a ⏹, a status message, a stream not stopped,
an assistant status line or a draft still shown), which must be nothing.

    python benchmarks/stream_bench.py [--quick] [--tokens 2000] [--rate 50]
                                      [--paths telegram-draft,slack-assistant]
                                      [--sequential]
                                      [--warm] [--json [FILE]]
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import asyncio
import json
import logging
import math
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.edge.turns import WORKING  # noqa: E402
from adapters.slack import create as create_slack  # noqa: E402
from adapters.telegram import create as create_telegram  # noqa: E402
from benchmarks.running import running  # noqa: E402
from bot.core.config import Config  # noqa: E402
from bot.llm import Completion, Delta, StreamItem, warm  # noqa: E402
from bot.serve.hub import Hub  # noqa: E402
from tests.fakes.slack_server import FakeSlackServer  # noqa: E402
from tests.fakes.telegram_server import FakeTelegram  # noqa: E402

JSON = dict[str, Any]
PATHS = ("telegram-draft", "telegram-group", "slack-stream", "slack-update",
         "slack-assistant")
TG_USER, TG_GROUP = 4242, -1001234
SLACK_USER, SLACK_DM = "U0BENCH1", "D0BENCH1"
PROMPT = "Write me a long answer, please."
SETUP = frozenset({"getUpdates", "getMe", "setMyCommands", "deleteWebhook", "auth.test",
                   "apps.connections.open"})
"""Calls that belong to running, not to the answer: left out of the counts."""
TYPING = "sendChatAction"
SLACK_TEXT_METHODS = frozenset({"chat.startStream", "chat.appendStream", "chat.stopStream"})
SLACK_WRITES = ("chat.", "reactions.", "assistant.threads.")
"""Slack methods that write to a channel (reads such as conversations.replies do not
count in the chat's pace)."""
WARMUP_S = 1.0
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
TOKEN = re.compile(r"(?<![0-9a-z])[0-9a-z]{3}(?![0-9a-z])")
CANCEL_DATA = re.compile(r"cx(:\d+)?")
"""A ⏹ Cancel button's data (`bot.core.buttons.pack(CancelButton(turn))`)."""


def token_name(i: int) -> str:
    """The i-th token's word: three base-36 digits ("000", "001", … "1jj" for 1,999)."""
    return DIGITS[i // 1296 % 36] + DIGITS[i // 36 % 36] + DIGITS[i % 36]


def answer_tokens(n: int) -> list[str]:
    """n tokens of 4 characters (word and space; a paragraph break every 50)."""
    return [token_name(i) + ("\n\n" if i % 50 == 49 else " ") for i in range(n)]


class PacedModel:
    """An in-process model that streams its tokens on a fixed schedule, `rate` per
    second, noting when it handed out each one. With `warmups`, the first calls get a
    short answer streamed over `WARMUP_S` (long enough to start a stream)."""

    model = "bench/paced"

    def __init__(self, tokens: list[str], rate: float, warmups: int = 0) -> None:
        self.tokens, self.rate, self.warmups = tokens, rate, warmups
        self.text = "".join(tokens)
        self.index = {token_name(i): i for i in range(len(tokens))}
        self.times: list[float] = []
        self.done = asyncio.Event()
        self.calls = 0

    async def window(self) -> int:
        return 32_000

    async def stream(self, messages: Sequence[dict[str, Any]],
                     tools: Sequence[dict[str, Any]]) -> AsyncGenerator[StreamItem, None]:
        self.calls += 1
        if self.calls != self.warmups + 1:  # a warm-up (or, unexpected, a later call)
            yield Delta("Warming up.")
            await asyncio.sleep(WARMUP_S)
            yield Completion("Warming up.", (), 100, 3)
            return
        start = time.monotonic()
        for i, token in enumerate(self.tokens):
            if (delay := start + i / self.rate - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            self.times.append(time.monotonic())
            yield Delta(token)
        self.done.set()
        yield Completion(self.text, (), 100, len(self.tokens))

    def newest(self, text: str) -> int | None:
        """The index of the newest answer token in `text`, if any."""
        found = [self.index[w] for w in TOKEN.findall(text) if w in self.index]
        return max(found) if found else None


@dataclass(frozen=True, slots=True)
class Rec:
    """One platform call as the fake recorded it."""

    time: float
    method: str
    ok: bool
    limited: bool
    chat: bool
    """A call that writes to the answer's chat (counts in its pace)."""
    text: str
    """The answer text it carries (what it shows or adds), or ""."""
    effect: str = ""
    """What it does to a message of the chat: "post", "edit", "delete", or ""."""
    ref: str = ""
    """That message (its id or ts; a post's, once accepted)."""
    cancel: bool | None = None
    """The message shows ⏹ Cancel after it (None: its buttons are left as they were)."""
    working: bool = False
    """A post of the edge's status message ("⏳ Working on it…", with ⏹)."""


def has_cancel(markup: Any) -> bool:
    """A reply markup or Block Kit blocks holding a ⏹ Cancel button (its data packed as
    `CancelButton`'s)."""
    if isinstance(markup, str):
        try:
            markup = json.loads(markup)
        except ValueError:
            return False
    if isinstance(markup, dict):
        data = markup.get("callback_data", markup.get("value"))
        if isinstance(data, str) and CANCEL_DATA.fullmatch(data):
            return True
        return any(has_cancel(v) for v in markup.values() if isinstance(v, dict | list))
    if isinstance(markup, list):
        return any(has_cancel(v) for v in markup)
    return False


class Side:
    """One platform path: its fake, the chat the answer goes to, what the chat shows."""

    name = ""

    async def push(self, text: str) -> None:
        raise NotImplementedError

    def stale(self) -> Counter[str]:
        """What the chat still shows at the end that belongs to a running turn: messages
        with ⏹ ("cancel"), status messages ("working"), streams not stopped ("stream"),
        a status line ("status") or a draft ("draft")."""
        raise NotImplementedError

    def recs(self, start: int) -> list[Rec]:
        raise NotImplementedError

    def bot(self) -> list[tuple[str, bool]]:
        """The bot's messages in the chat: visible text, still live (a Cancel button, a
        stream not stopped)."""
        raise NotImplementedError

    def calls(self) -> int:
        raise NotImplementedError

    def limited(self) -> int:
        raise NotImplementedError


class TelegramSide(Side):
    def __init__(self, fake: FakeTelegram, group: bool) -> None:
        self.fake, self.group = fake, group
        self.chat = TG_GROUP if group else TG_USER

    async def push(self, text: str) -> None:
        if self.group:
            self.fake.push_message(TG_GROUP, TG_USER, f"@{self.fake.bot_username} {text}",
                                   chat_type="supergroup")
        else:
            self.fake.push_message(TG_USER, TG_USER, text)

    def recs(self, start: int) -> list[Rec]:
        recs = []
        for c in self.fake.calls[start:]:
            to_chat = c.params.get("chat_id") == self.chat and c.method != TYPING
            text = str(c.params.get("text") or "") if to_chat else ""
            recs.append(Rec(c.time, c.method, c.status == 200, c.status == 429, to_chat, text,
                            **(self._effect(c) if to_chat else {})))
        return recs

    @staticmethod
    def _effect(c: Any) -> JSON:
        markup = c.params.get("reply_markup")
        if c.method == "sendMessage":
            result = c.result if isinstance(c.result, dict) else {}
            return {"effect": "post", "ref": str(result.get("message_id") or ""),
                    "cancel": has_cancel(markup),
                    "working": WORKING in str(c.params.get("text") or "")}
        if c.method in ("editMessageText", "editMessageReplyMarkup"):  # no markup: none
            return {"effect": "edit", "ref": str(c.params.get("message_id") or ""),
                    "cancel": has_cancel(markup)}
        if c.method == "deleteMessage":
            return {"effect": "delete", "ref": str(c.params.get("message_id") or "")}
        return {}

    def bot(self) -> list[tuple[str, bool]]:
        return [(m.text, bool(m.reply_markup)) for m in self.fake.chat(self.chat)
                if m.from_bot]

    def stale(self) -> Counter[str]:
        mine = [m for m in self.fake.chat(self.chat) if m.from_bot]
        return Counter(cancel=sum(has_cancel(m.reply_markup) for m in mine),
                       working=sum(WORKING in m.text for m in mine),
                       draft=int(self.fake.draft_of(self.chat) is not None))

    def calls(self) -> int:
        return len(self.fake.calls)

    def limited(self) -> int:
        return len(self.fake.rate_limited)


def slack_text(method: str, params: JSON) -> str:
    if method in SLACK_TEXT_METHODS:
        return str(params.get("markdown_text") or "")
    blocks = params.get("blocks")
    if isinstance(blocks, list):
        return "\n".join(str(b["text"].get("text", "")) for b in blocks
                         if isinstance(b, dict) and b.get("type") == "section"
                         and isinstance(b.get("text"), dict))
    return str(params.get("text") or "")


class RecordingSlack(FakeSlackServer):
    """FakeSlackServer keeping each Web API answer too (a post's ts), in step with
    `calls` (each call is recorded right after its answer is made)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.answers: list[JSON] = []

    def _dispatch(self, method: str, params: JSON,
                  token: str | None) -> tuple[int, JSON, dict[str, str]]:
        status, body, headers = super()._dispatch(method, params, token)
        self.answers.append(body)
        return status, body, headers


def slack_effect(method: str, params: JSON, answer: JSON) -> JSON:
    blocks = params.get("blocks")
    if method in ("chat.postMessage", "chat.startStream"):
        return {"effect": "post", "ref": str(answer.get("ts") or ""),
                "cancel": has_cancel(blocks),
                "working": method == "chat.postMessage" and WORKING in slack_text(method, params)}
    if method in ("chat.update", "chat.stopStream"):  # no blocks: the buttons stay
        return {"effect": "edit", "ref": str(params.get("ts") or ""),
                "cancel": has_cancel(blocks) if "blocks" in params else None}
    if method == "chat.delete":
        return {"effect": "delete", "ref": str(params.get("ts") or "")}
    return {}


class SlackSide(Side):
    def __init__(self, fake: RecordingSlack) -> None:
        self.fake = fake
        root = fake.message_event(SLACK_DM, SLACK_USER, "An earlier message", channel_type="im")
        self.thread = str(root["ts"])

    async def push(self, text: str) -> None:
        event = self.fake.message_event(SLACK_DM, SLACK_USER, text, thread_ts=self.thread,
                                        channel_type="im")
        await self.fake.push_event(event)

    def recs(self, start: int) -> list[Rec]:
        recs = []
        for c, answer in zip(self.fake.calls[start:], self.fake.answers[start:], strict=True):
            channel = c.params.get("channel", c.params.get("channel_id"))  # setStatus: _id
            writes = c.method.startswith(SLACK_WRITES) and channel == SLACK_DM
            text = slack_text(c.method, c.params) if writes else ""
            recs.append(Rec(c.time, c.method, c.status == 200 and c.error is None,
                            c.status == 429, writes, text,
                            **(slack_effect(c.method, c.params, answer) if writes else {})))
        return recs

    def bot(self) -> list[tuple[str, bool]]:
        return [(m.visible_text, still_live(m))
                for m in self.fake.bot_messages(SLACK_DM, self.thread)]

    def stale(self) -> Counter[str]:
        mine = self.fake.bot_messages(SLACK_DM, self.thread)
        return Counter(cancel=sum(has_cancel(m.blocks) for m in mine),
                       working=sum(WORKING in m.visible_text for m in mine),
                       stream=sum(m.stream is not None and m.stream.streaming for m in mine),
                       status=int(bool(self.fake.status_of(SLACK_DM, self.thread))))

    def calls(self) -> int:
        return len(self.fake.calls)

    def limited(self) -> int:
        return len(self.fake.rate_limited)


def still_live(message: Any) -> bool:
    """A Slack message with its Cancel button, or a stream not stopped."""
    if message.stream is not None and message.stream.streaming:
        return True
    return any(b.get("type") == "actions" for b in message.blocks or [])


@dataclass
class Outcome:
    """What one path left behind: the calls since the push, the chat's final state."""

    t0: float
    recs: list[Rec]
    visible: list[str]
    live_left: int
    """The answer's messages still showing a button, or streams not stopped, at the end."""
    rate_limited: int
    stale: Counter[str]
    """What the chat still shows of a running turn at the end (`Side.stale`)."""


def words(text: str) -> str:
    return " ".join(text.split())


def window_max(times: list[float], span: float = 1.0) -> int:
    """Most of `times` (sorted) within any `span` seconds."""
    best = left = 0
    for right, moment in enumerate(times):
        while moment - times[left] >= span:
            left += 1
        best = max(best, right - left + 1)
    return best


def pace(recs: list[Rec]) -> JSON:
    """The chat's busiest moments: shortest gap (and between which calls), most per s."""
    chat = sorted((r for r in recs if r.chat), key=lambda r: r.time)
    gaps = [(b.time - a.time, f"{a.method}->{b.method}")
            for a, b in zip(chat, chat[1:], strict=False)]
    gap, pair = min(gaps) if gaps else (float("nan"), "")
    return {"chat_calls": len(chat), "min_gap_s": gap, "min_gap_between": pair,
            "max_calls_in_1s": window_max([r.time for r in chat])}


def lag(recs: list[Rec], model: PacedModel, t0: float) -> JSON:
    """At each call that shows newer answer words: how long ago the model gave the newest
    one shown (the screen's staleness); and the longest the chat went without new words,
    from the push to the last of them (the stall)."""
    newest, lags, moments = -1, [], [t0]
    for r in recs:
        if not (r.ok and r.chat and r.text):
            continue
        found = model.newest(r.text)
        if found is not None and found > newest:
            newest = found
            lags.append(r.time - model.times[found])
            moments.append(r.time)
    nan = float("nan")
    return {"updates": len(lags), "lag_p50_s": statistics.median(lags) if lags else nan,
            "lag_max_s": max(lags) if lags else nan,
            "stall_s": max(b - a for a, b in zip(moments, moments[1:], strict=False))
            if lags else nan}


def offer_calls(recs: list[Rec]) -> list[Rec]:
    """The Cancel offer's calls to the chat: its status message's posts (all outcomes)
    and the deletes (all outcomes) of the ones that landed."""
    posted = {r.ref for r in recs if r.working and r.ok and r.ref}
    return [r for r in recs
            if r.chat and (r.working or (r.effect == "delete" and r.ref in posted))]


def cancel_moments(recs: list[Rec]) -> list[tuple[float, bool]]:
    """Each time ⏹ came on screen or left it: (the accepted call's time, ⏹ shown after
    it). A message posted before `recs` began is left out."""
    showing: dict[str, bool] = {}
    moments: list[tuple[float, bool]] = []
    for r in sorted(recs, key=lambda r: r.time):
        if not (r.ok and r.chat and r.ref):
            continue
        if r.effect == "post":
            showing[r.ref] = bool(r.cancel)
        elif r.effect == "edit" and r.cancel is not None and r.ref in showing:
            showing[r.ref] = r.cancel
        elif r.effect == "delete":
            showing.pop(r.ref, None)
        on = any(showing.values())
        if (moments[-1][1] if moments else False) != on:
            moments.append((r.time, on))
    return moments


def within(moments: list[tuple[float, bool]], a: float, b: float) -> tuple[float, float]:
    """Within [a, b]: the seconds with ⏹ on screen, and the longest stretch without."""
    on_s = gap = 0.0
    starts = [(-math.inf, False), *moments]
    ends = [t for t, _ in moments] + [math.inf]
    for (start, on), end in zip(starts, ends, strict=True):
        lo, hi = max(start, a), min(end, b)
        if hi > lo:
            on_s += (hi - lo) * on
            gap = gap if on else max(gap, hi - lo)
    return on_s, gap


def cancel_figures(recs: list[Rec], t0: float, first_text: float, final: float) -> JSON:
    """When ⏹ was reachable (times absolute; the figures from t0 or from `final`), and
    what its offer cost."""
    moments = cancel_moments(recs)
    first = next((t for t, on in moments if on), math.nan)
    on_s, _ = within(moments, first_text, final)
    _, gap = within(moments, first, final) if first < final else (0.0, math.nan)
    offer = offer_calls(recs)
    return {
        "cancel_from_s": first - t0,
        "cancel_share": on_s / (final - first_text) if final > first_text else math.nan,
        "cancel_gap_s": gap,
        "cancel_gone_after_final_s": moments[-1][0] - final
        if moments and not moments[-1][1] else math.nan,
        "offer_calls": len(offer),
        "offer_posts": sum(r.effect == "post" for r in offer),
        "offer_deletes": sum(r.effect == "delete" for r in offer),
        "offer_rate_limited": sum(r.limited for r in offer),
        "offer_min_gap_s": offer_gap(recs, offer),
        "draft_hidden_s": draft_hidden(recs),
    }


def draft_hidden(recs: list[Rec]) -> float:
    """A message sent replaces a Telegram draft: the seconds from each status message
    landing to the next draft (the answer so far hidden), summed; nan without drafts."""
    chat = sorted((r for r in recs if r.chat and r.ok), key=lambda r: r.time)
    if not any(r.method == "sendMessageDraft" for r in chat):
        return math.nan
    hidden = 0.0
    for i, r in enumerate(chat):
        if r.working:
            later = next((d.time for d in chat[i + 1:] if d.method == "sendMessageDraft"
                          or (d.effect == "post" and not d.working)), r.time)
            hidden += later - r.time
    return hidden


def offer_gap(recs: list[Rec], offer: list[Rec]) -> float:
    """The shortest gap between an offer's call and the chat's call next to it."""
    chat = sorted((r for r in recs if r.chat), key=lambda r: r.time)
    mine = {id(r) for r in offer}
    return min((b.time - a.time for a, b in zip(chat, chat[1:], strict=False)
                if id(a) in mine or id(b) in mine), default=math.nan)


def analyse(out: Outcome, model: PacedModel) -> JSON:
    recs = out.recs
    offer = {id(r) for r in offer_calls(recs)}
    shown = [r for r in recs if r.ok and r.chat]
    answered = [r for r in shown if r.text and model.newest(r.text) is not None]
    counted = Counter(r.method for r in recs if r.method not in SETUP and r.method != TYPING)
    # the answer is final at the chat's last call, the Cancel offer's clean-up left out
    last = max((r.time for r in shown if id(r) not in offer), default=float("nan"))
    nan = float("nan")
    first_text = answered[0].time if answered else nan
    stale = sum(out.stale.values())
    return {
        "tokens": len(model.tokens),
        "model_tokens_per_s": (len(model.times) - 1) / (model.times[-1] - model.times[0])
        if len(model.times) > 1 else nan,
        "model_start_s": model.times[0] - out.t0 if model.times else nan,
        "first_call_s": shown[0].time - out.t0 if shown else nan,
        "first_text_s": first_text - out.t0,
        "final_after_model_s": last - model.times[-1] if model.times else nan,
        "total_s": last - out.t0,
        "calls": dict(sorted(counted.items())),
        "calls_total": sum(counted.values()),
        "typing": sum(r.method == TYPING for r in recs),
        "rate_limited": out.rate_limited,
        **pace(recs),
        **lag(recs, model, out.t0),
        "complete": words("\n".join(out.visible)) == words(model.text)
        and not out.live_left and not stale,
        "messages": len(out.visible),
        "live_left": out.live_left,
        **cancel_figures(recs, out.t0, first_text, last),
        "stale": stale,
        "stale_what": {k: n for k, n in out.stale.items() if n},
        "model_calls": model.calls,
    }


# ---- running one answer ----------------------------------------------------------------


async def settle(hub: Hub, ended: Callable[[], bool], seconds: float = 1.5) -> None:
    """The turn over, its last call made (or 15 s passed), then `seconds` more."""
    await asyncio.wait_for(hub.idle(), 60)
    deadline = time.monotonic() + 15
    while not ended() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(seconds)


async def measure(side: Side, hub: Hub, model: PacedModel) -> JSON:
    """Optionally a short warm-up exchange, then the answer: pushed, waited for, read."""
    for n in range(model.warmups):
        await side.push(f"Warm-up {n + 1}.")
        await asyncio.wait_for(_called(model, n + 1), 30)
        await settle(hub, lambda: not any(live for _, live in side.bot()))
    start, limited, before = side.calls(), side.limited(), len(side.bot())

    def ended() -> bool:
        mine = side.bot()[before:]
        return words(" ".join(t for t, _ in mine)) == words(model.text) \
            and not any(live for _, live in mine)

    t0 = time.monotonic()
    await side.push(PROMPT)
    await asyncio.wait_for(model.done.wait(), len(model.tokens) / model.rate + 60)
    await settle(hub, ended)  # any call still to come (a late draft, a clean-up) counts
    mine = side.bot()[before:]
    out = Outcome(t0, side.recs(start), [t for t, _ in mine], sum(live for _, live in mine),
                  side.limited() - limited, side.stale())
    return analyse(out, model)


async def _called(model: PacedModel, calls: int) -> None:
    while model.calls < calls:
        await asyncio.sleep(0.02)


def base_config(tmp: str) -> JSON:
    return {"llm": {"model": "bench/paced", "context_window": 32000},
            "store": {"path": f"{tmp}/bench.db"}, "persona": {"dir": str(ROOT / "persona")},
            "workspace": {"dir": f"{tmp}/ws"}}


async def run_telegram(path: str, model: PacedModel) -> JSON:
    async with FakeTelegram(chat_interval=1.0, burst=0) as fake:
        with tempfile.TemporaryDirectory() as tmp:
            config = Config.model_validate({**base_config(tmp), "telegram": {
                "enabled": True, "token": fake.token, "base_url": f"{fake.url}/bot",
                "allowed_users": [TG_USER]}})
            async with running(config, model, create_telegram) as hub:
                await fake.wait_for(lambda: bool(fake.calls_to("getUpdates")), 30)
                return await measure(TelegramSide(fake, path == "telegram-group"), hub, model)


async def run_slack(path: str, model: PacedModel) -> JSON:
    assistant = path == "slack-assistant"
    fake = RecordingSlack(rate_limit=True, assistant=assistant)
    await fake.start()
    fake.refuse_streams = path == "slack-update"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = Config.model_validate({**base_config(tmp), "slack": {
                "enabled": True, "mode": "socket", "bot_token": fake.bot_token,
                "app_token": fake.app_token, "base_url": fake.api_url,
                "allowed_users": ["*"], "assistant": {"enabled": assistant}}})
            async with running(config, model, create_slack) as hub:
                await fake.wait_connections(1, timeout=30)
                return await measure(SlackSide(fake), hub, model)
    finally:
        await fake.close()


async def run_path(path: str, tokens: list[str], rate: float, warm: bool) -> JSON:
    model = PacedModel(tokens, rate, warmups=int(warm))
    runner = run_telegram if path.startswith("telegram") else run_slack
    return await runner(path, model)


async def run_all(paths: list[str], tokens: list[str], rate: float, *, warm: bool,
                  sequential: bool) -> dict[str, JSON]:
    if sequential:
        return {p: await run_path(p, tokens, rate, warm) for p in paths}
    results = await asyncio.gather(*(run_path(p, tokens, rate, warm) for p in paths))
    return dict(zip(paths, results, strict=True))


# ---- the report ------------------------------------------------------------------------


def report(results: dict[str, JSON], tokens: int, rate: float, *, warm: bool) -> None:
    which = "a second answer (after a short one)" if warm else "the first answer"
    print(f"{which} in each chat: {tokens:,} tokens at {rate:g} tokens/s; strict fakes; "
          "adapters at production pace")
    head = (f"{'path':<16}{'first text':>11}{'final':>9}{'chat calls':>11}{'429s':>6}"
            f"{'min gap':>9}{'max/1s':>7}{'updates':>8}{'lag p50/max':>13}{'stall':>8}"
            f"{'ok':>4}")
    print(head)
    print("-" * len(head))
    for path, r in results.items():
        print(f"{path:<16}{r['first_text_s']:>9.2f} s{r['final_after_model_s']:>+7.2f} s"
              f"{r['chat_calls']:>11}{r['rate_limited']:>6}{r['min_gap_s']:>7.3f} s"
              f"{r['max_calls_in_1s']:>7}{r['updates']:>8}"
              f"{r['lag_p50_s']:>6.2f}/{r['lag_max_s']:5.2f} s{r['stall_s']:>6.2f} s"
              f"{'yes' if r['complete'] else 'NO':>4}")
    print("first text: from the user's message being pushed; final: the chat's last call "
          "after the model's last token (the Cancel offer's own calls left out); chat "
          "calls: writes to the chat (all outcomes); lag: how old the newest words on "
          "screen are at each update; stall: the longest the chat went without new words; "
          "ok: the chat shows exactly the answer, nothing live or stale left")
    report_cancel(results)
    for path, r in results.items():
        calls = ", ".join(f"{m} {n}" for m, n in r["calls"].items())
        extra = "; ".join([f"typing {r['typing']}", f"closest {r['min_gap_between']}",
                           f"offer's closest {seconds(r['offer_min_gap_s'], '.3f')}",
                           *([f"draft hidden by the offer {seconds(r['draft_hidden_s'])}"]
                             if not math.isnan(r["draft_hidden_s"]) else []),
                           f"stale {r['stale_what'] or 'none'}",
                           f"model {r['model_tokens_per_s']:.1f} tok/s from "
                           f"+{r['model_start_s'] * 1000:.0f} ms"])
        print(f"  {path}: {calls}; {extra}")


def seconds(value: float, spec: str = ".2f", sign: str = "") -> str:
    return "–" if math.isnan(value) else f"{value:{sign}{spec}} s"


def report_cancel(results: dict[str, JSON]) -> None:
    print()
    head = (f"{'⏹ Cancel':<16}{'from':>8}{'share':>8}{'no-⏹ gap':>10}{'gone':>9}"
            f"{'offer calls':>13}{'offer 429s':>11}{'⏹ left':>8}{'stale':>7}")
    print(head)
    print("-" * len(head))
    for path, r in results.items():
        share = "–" if math.isnan(r["cancel_share"]) else f"{r['cancel_share']:.1%}"
        gone = seconds(r["cancel_gone_after_final_s"], sign="+")
        offer = f"{r['offer_calls']} of {r['chat_calls']}"
        print(f"{path:<16}{seconds(r['cancel_from_s']):>8}{share:>8}"
              f"{seconds(r['cancel_gap_s']):>10}{gone:>9}{offer:>13}"
              f"{r['offer_rate_limited']:>11}{r['stale_what'].get('cancel', 0):>8}"
              f"{r['stale'] - r['stale_what'].get('cancel', 0):>7}")
    print("from: the first accepted call that put a message with ⏹ on screen (a placeholder "
          "with ⏹, or the status message), from the user's message; share: of the time from "
          "the first text to the final text, with a ⏹ on screen; no-⏹ gap: the longest "
          "time without one between its first showing and the final text; gone: when the "
          "last ⏹ left, after the final text; offer calls: the status message's post and "
          "delete (all outcomes), of the chat calls; ⏹ left: messages still showing ⏹ "
          "at the end; stale: status messages, open streams, status lines or drafts left "
          "(both must be 0)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=50.0, help="tokens per second")
    parser.add_argument("--quick", action="store_true", help="200 tokens (a smoke run)")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"comma-separated, of: {', '.join(PATHS)}")
    parser.add_argument("--sequential", action="store_true",
                        help="one path after another rather than all at once")
    parser.add_argument("--warm", action="store_true",
                        help="a short exchange in the same chat first (Slack then knows "
                             "the channel refuses streams): a later answer, not the first")
    parser.add_argument("--json", nargs="?", const="-", metavar="FILE",
                        help="also write the figures as JSON (to stdout without FILE)")
    args = parser.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if unknown := set(paths) - set(PATHS):
        parser.error(f"unknown paths: {', '.join(sorted(unknown))}")
    tokens = 200 if args.quick else args.tokens
    logging.basicConfig(level=logging.WARNING)
    warm()  # litellm imported once, up front: each Tandem's start would block the loop on it
    results = asyncio.run(run_all(paths, answer_tokens(tokens), args.rate, warm=args.warm,
                                  sequential=args.sequential))
    report(results, tokens, args.rate, warm=args.warm)
    if args.json == "-":
        print(json.dumps(results, indent=1, default=str))
    elif args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    bad = [p for p, r in results.items() if r["rate_limited"] or not r["complete"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
