"""The streamed Slack path keeps mentions as quiet as the posted one, through the real
slack-bolt and slack_sdk against the fake Slack."""

from __future__ import annotations

from pathlib import Path

from adapters.slack_mrkdwn import quiet_mentions
from tests.fakes.model_server import FakeModelServer, Reply
from tests.fakes.slack_server import FakeSlackServer
from tests.suites.harness import SlackRig


async def test_a_streamed_answer_pings_nobody(model: FakeModelServer, tmp_path: Path) -> None:
    # The posted path escapes `<`; the stream sends Markdown that Slack renders itself, so
    # its mentions are made inert there, even when `<` and `!here>` arrive apart.
    pings = "Heads up <!here>, <!channel> and <!everyone>: ask <@U2> or <!subteam^S1>. "
    answer = pings * 3 + "Done."
    model.script(Reply(text="First."), Reply(text=answer, chunk_size=3, chunk_delay=0.01))
    async with FakeSlackServer() as fake, \
            SlackRig(fake, model, tmp_path, "socket", edit_interval=0.2) as rig:
        await rig.say("D1", "U1", "start", channel_type="im")
        await rig.wait_text("D1", "First.")
        await rig.settle()
        thread = fake.bot_messages("D1")[0].ts
        await rig.say("D1", "U1", "tell everyone", channel_type="im", thread_ts=thread)
        await rig.wait_text("D1", "Done.", thread=thread)
        await rig.settle()
    [streamed] = [m for m in fake.bot_messages("D1") if m.stream is not None]
    sent = [str(c.params.get("markdown_text") or "") for c in fake.calls
            if c.method in ("chat.startStream", "chat.appendStream", "chat.stopStream")]
    assert len(sent) >= 3 and "".join(sent) == streamed.text
    assert "<!" not in streamed.text and "<@" not in streamed.text
    assert streamed.text == answer.replace("<!", "<\u200b!").replace("<@", "<\u200b@")


def test_quiet_mentions_keep_a_prefix_a_prefix() -> None:
    text = "a <!here> b <@U1> c <#C1> d <https://x.example|x> e <"
    quiet = quiet_mentions(text)
    assert quiet == text.replace("<!", "<\u200b!").replace("<@", "<\u200b@")
    assert all(quiet.startswith(quiet_mentions(text[:i])) for i in range(len(text) + 1))
