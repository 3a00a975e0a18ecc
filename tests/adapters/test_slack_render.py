"""Slack rendering and payload normalization: pure functions, literal inputs."""

from __future__ import annotations

import re
from typing import Any

import pytest

from adapters import slack_inbound
from adapters import slack_render as render
from adapters.slack_inbound import extract_message, parse_command, slack_text
from bot.core.buttons import ApprovalButton, CancelButton, unpack
from bot.core.events import Button, ConvKey, Phase, Progress, User, Verdict

BOT = "UBOT"


@pytest.mark.parametrize(("markdown", "mrkdwn"), [
    ("**bold** and __also bold__", "*bold* and *also bold*"),
    ("__init__ and __pycache__/ stay", "__init__ and __pycache__/ stay"),
    ("*italic* and _italic_", "_italic_ and _italic_"),
    ("~~gone~~", "~gone~"),
    ("a & b < c > d", "a &amp; b &lt; c &gt; d"),
    ("[the docs](https://x.test/a_b?q=1&r=2)", "<https://x.test/a_b?q=1&amp;r=2|the docs>"),
    ("# Title\n## **Sub**", "*Title*\n*Sub*"),
    ("- one\n* two\n  + three", "• one\n• two\n  • three"),
    ("> quoted <b>", "> quoted &lt;b&gt;"),
    ("`a**b** <x>`", "`a**b** &lt;x&gt;`"),
    ("```python\nif a < b:\n    print(**kw)\n```", "```\nif a &lt; b:\n    print(**kw)\n```"),
    ("never <@U123> nor <!here>", "never &lt;@U123&gt; nor &lt;!here&gt;"),
    ("[write](mailto:a@b.test)", "<mailto:a@b.test|write>"),
    ("[x](HTTPS://x.test)", "<HTTPS://x.test|x>"),
    ("2 * 3 * 4", "2 * 3 * 4"),
    ("snake_case_name", "snake_case_name"),
])
def test_markdown_to_mrkdwn(markdown: str, mrkdwn: str) -> None:
    assert render.to_mrkdwn(markdown) == mrkdwn


# Model output that tries to make Slack ping or link where it should only show text.
INJECTIONS = [
    "[everyone](!channel)",
    "[x](!here)",
    "[x](!everyone)",
    "[x](!subteam^S123)",
    "[x](!subteam^S123|@team)",
    "[b](@U0BOSS)",
    "[b](@W0BOSS)",
    "[c](#C0GENERAL)",
    "[d](<!here>)",
    "[e](<@U0BOSS>)",
    "[f](javascript:alert(1))",
    "[g](slack://channel?team=T1&id=C1)",
    "![img](!here)",
    "<!here> <!channel> <!everyone> <!subteam^S123|@team>",
    "<@U0BOSS> <@W0BOSS|boss> <#C0GENERAL> <#C0GENERAL|general>",
    "<!date^1392734382^{date}|Feb 18>",
    "[x](https://ok.test|<!here>)",
    "[x](https://ok.test/<!here>)",
    "[<!here>](https://ok.test)",
    "[a|<!channel>](https://ok.test)",
    "[a>b](https://ok.test)",
    "**<!here>** _<@U1>_ ~~<#C1>~~",
    "# <!channel>\n- <@U1>\n> <!here>",
    "`<!here>` and ```\n<@U1>\n```",
    "&lt;!here&gt; and &#60;!here&#62;",
]


@pytest.mark.parametrize("markdown", INJECTIONS)
def test_model_text_never_pings_or_forges_a_link(markdown: str) -> None:
    mrkdwn = render.to_mrkdwn(markdown)
    for sequence in ("<!", "<@", "<#"):
        assert sequence not in mrkdwn, mrkdwn
    [out] = render.messages(markdown)
    assert not any(s in out.text or s in str(out.blocks) for s in ("<!", "<@", "<#"))
    links = re.findall(r"<([^<>|]*)\|?[^<>]*>", mrkdwn)
    assert all(re.match(r"(?i)(https?://|mailto:)", target) for target in links), mrkdwn


@pytest.mark.parametrize(("markdown", "mrkdwn"), [
    ("[everyone](!channel)", "[everyone](!channel)"),
    ("[b](@U0BOSS)", "[b](@U0BOSS)"),
    ("[d](<!here>)", "[d](&lt;!here&gt;)"),
    ("[x](https://ok.test|<!here>)", "[x](https://ok.test|&lt;!here&gt;)"),
    ("[x](https://ok.test/a|b)", "<https://ok.test/a%7Cb|x>"),
    ("[a|b>c](https://ok.test)", "<https://ok.test|a¦b&gt;c>"),
    ("[`a<b`](https://ok.test)", "<https://ok.test|`a&lt;b`>"),
    ("`\x021\x02` `\x020\x02` \x01x\x01", "`1` `0` x"),
])
def test_only_web_and_mail_links_become_links(markdown: str, mrkdwn: str) -> None:
    assert render.to_mrkdwn(markdown) == mrkdwn


def test_the_workspaces_a_payload_names() -> None:
    envelope = {"type": "event_callback", "team_id": "T1",
                "event": {"type": "message", "team": "T2", "user_team": "T3"}}
    assert slack_inbound.teams(envelope) == {"T1", "T2", "T3"}
    press = {"type": "block_actions", "team": {"id": "T1"}, "user": {"id": "U1", "team_id": "T4"}}
    assert slack_inbound.teams(press) == {"T1", "T4"}
    assert slack_inbound.teams({"command": "/tandem", "team_id": "T1"}) == {"T1"}
    assert slack_inbound.teams(
        {"type": "event_callback", "event": "x", "team": 5, "user": None}) == set()


SLACK_SENDS: list[dict[str, Any]] = [  # trimmed from Slack's documented payloads
    {"type": "event_callback", "team_id": "T1", "enterprise_id": "E1", "event": {
        "type": "message", "channel": "C1", "user": "U1", "ts": "1.2", "team": "T1"},
     "authorizations": [{"enterprise_id": None, "team_id": "T1", "user_id": "UBOT",
                         "is_bot": True, "is_enterprise_install": False}]},
    {"type": "event_callback", "event": {"type": "message", "subtype": "message_changed",
                                         "message": {"user": "U1", "team": "T1"},
                                         "previous_message": {"user": "U1"}}},
    {"type": "event_callback", "event": {"type": "user_change", "user": {
        "id": "U1", "team_id": "T1", "profile": {}}}},
    {"type": "event_callback", "event": {"type": "channel_created", "channel": {
        "id": "C1", "name": "x", "creator": "U1"}}},
    {"type": "event_callback", "event": {"type": "reaction_added", "user": "U1",
                                         "item": {"type": "message", "channel": "C1"}}},
    {"type": "event_callback", "event": {"type": "assistant_thread_started",
                                         "assistant_thread": {"user_id": "U1",
                                                              "channel_id": "D1"}}},
    {"type": "block_actions", "user": {"id": "U1", "username": "ann", "team_id": "T1"},
     "team": {"id": "T1", "domain": "x", "enterprise_id": "E1"}, "enterprise": None,
     "channel": {"id": "C1", "name": "general"}, "message": {"user": "UBOT", "ts": "1.2"},
     "actions": [{"action_id": "tandem_cancel", "block_id": "b", "value": "c"}],
     "response_url": "https://hooks.example/1"},
    {"type": "view_submission", "team": {"id": "T1"}, "user": {"id": "U1"},
     "view": {"type": "modal", "callback_id": "v", "team_id": "T1",
              "app_installed_team_id": "T1"}, "response_urls": []},
    {"type": "url_verification", "challenge": "abc", "token": "t"},
    {"command": "/tandem", "team_id": "T1", "user_id": "U1", "channel_id": "C1"},
]


@pytest.mark.parametrize("body", SLACK_SENDS)
def test_what_slack_sends_has_the_shapes_bolt_reads(body: dict[str, Any]) -> None:
    assert slack_inbound.odd_shape(body) is None


@pytest.mark.parametrize(("body", "problem"), [
    ({"type": "event_callback", "event": "x"}, "`event` is not an object"),
    ({"type": "block_actions", "event": None}, "`event` is not an object"),
    ({"type": "event_callback", "event": {}}, "`event.type` is not a string"),
    ({"type": "event_callback", "event": {"type": "message", "message": {"user": 5}}},
     "`event.message.user` is neither an id nor an object"),
    ({"authorizations": [{"team": {"id": 5}}]}, "`authorizations[0].team.id` is not a string"),
    ({"authorizations": "x"}, "`authorizations` is not a list of objects"),
    ({"team_id": 5}, "`team_id` is not a string"),
    ({"user": {"team_id": []}}, "`user.team_id` is not a string"),
    ({"view": "x"}, "`view` is not an object"),
    ({"type": "block_actions", "actions": [{"value": "x"}]},
     "`actions` does not start with an action that has an `action_id`"),
    ({"type": "interactive_message", "callback_id": "c", "actions": []},
     "`actions` is not a list of actions"),
    ({"type": "workflow_step_edit", "callback_id": "c"}, "`workflow_step` is missing"),
    ({"type": "view_submission", "view": {"callback_id": "v"}}, "`view.type` is missing"),
    ({"response_urls": None}, "`response_urls` is not a list of objects"),
])
def test_what_bolt_would_misread_is_named(body: dict[str, Any], problem: str) -> None:
    assert slack_inbound.odd_shape(body) == problem


def test_fields_bolt_never_reads_may_hold_anything() -> None:
    assert slack_inbound.odd_shape({"type": "block_actions", "team": "T1",
                                    "is_enterprise_install": 5,
                             "thread_ts": [], "response_url": 5, "response_urls": 5,
                             "actions": [{"action_id": "a", "value": 5, "block_id": {}}],
                             "event": {"type": "x", "message": "not looked into"}}) is None


def test_an_unclosed_code_block_while_streaming_stays_code() -> None:
    assert render.to_mrkdwn("see:\n```\nx = **1** <") == "see:\n```\nx = **1** &lt;\n```"


def test_live_messages_have_a_cancel_button_and_a_fallback_text() -> None:
    out = render.live("**Hi**", cancel=True)
    assert out.text == "*Hi*"
    assert out.blocks[0] == render.section("*Hi*")
    [element] = out.blocks[1]["elements"]
    assert element["action_id"] == render.CANCEL_ACTION
    assert unpack(element["value"]) == CancelButton()
    assert render.live("done", cancel=False).blocks == [render.section("done")]
    assert render.live("", cancel=False).text == "…"


def test_long_texts_become_sections_and_messages_within_limits() -> None:
    text = "\n\n".join(f"paragraph {i} " + "&" * 900 for i in range(30))
    outs = render.messages(text, (Button("Revoke 1", "rr:abc"),))
    assert len(outs) > 1
    for out in outs:
        sections = [b for b in out.blocks if b["type"] == "section"]
        assert 0 < len(sections) <= render.SECTIONS_PER_MESSAGE
        assert all(len(b["text"]["text"]) <= 3000 for b in sections)
        assert len(out.text) <= 3000
    assert [b["type"] for b in outs[-1].blocks][-1] == "actions"
    assert all(b["type"] != "actions" for o in outs[:-1] for b in o.blocks)
    joined = "".join(b["text"]["text"] for o in outs for b in o.blocks if b["type"] == "section")
    assert joined.count("&amp;") == 30 * 900


def test_the_approval_card() -> None:
    card = render.approval_card("abc123", "shell", "rm -rf build/ && echo <done>",
                                User("U1", "Ann"), 1800)
    assert card.preamble == []
    assert [b["type"] for b in card.blocks] == ["section", "section", "context"]
    assert card.blocks[0]["text"]["text"] == "🔐 Tandem wants to run `shell`"
    assert card.blocks[1]["text"]["text"] == "```\nrm -rf build/ &amp;&amp; echo &lt;done&gt;\n```"
    assert card.blocks[2]["elements"][0]["text"] == \
        "Requested by <@U1> · expires in 30 min"
    elements = card.buttons[0]["elements"]
    assert [e["action_id"] for e in elements] == ["tandem_approve", "tandem_deny",
                                                 "tandem_session", "tandem_always"]
    assert [unpack(e["value"]) for e in elements] == [
        ApprovalButton("abc123", v)
        for v in (Verdict.APPROVE, Verdict.DENY, Verdict.SESSION, Verdict.ALWAYS)]
    assert "scheduled" not in card.text


def test_the_card_says_why_it_asks_on_a_line_of_its_own() -> None:
    reason = "Asked because this conversation has read content from web_fetch of " \
             "https://x.example/?a=1&b=<@U2>."
    card = render.approval_card("abc", "shell", "ls", User("U1"), 60, reason=reason)
    shown = "Asked because this conversation has read content from web_fetch of " \
            "https://x.example/?a=1&amp;b=&lt;@U2&gt;."
    assert card.blocks[0]["text"]["text"] == f"🔐 Tandem wants to run `shell`\n⚠️ {shown}"
    assert card.text == f"🔐 Tandem wants to run `shell`: approve or deny. {shown}"
    long = render.approval_card("abc", "shell", "x\n" * 6000, User("U1"), 60, reason=reason)
    assert long.preamble and shown in long.blocks[0]["text"]["text"]
    for empty in (None, ""):
        plain = render.approval_card("abc", "shell", "ls", User("U1"), 60, reason=empty)
        assert plain.blocks[0]["text"]["text"] == "🔐 Tandem wants to run `shell`"
        assert plain.text == "🔐 Tandem wants to run `shell`: approve or deny"


def test_a_call_too_long_for_the_card_goes_in_messages_before_it() -> None:
    summary = "\n".join(f"line {i} " + "x" * 100 for i in range(400))  # ~43k characters
    card = render.approval_card("abc", "write_file", summary, User("job:j1"), 60)
    assert card.preamble and "shown in full" in card.blocks[0]["text"]["text"]
    code = [b["text"]["text"] for blocks in card.preamble for b in blocks]
    assert all(len(c) <= 3000 for c in code)
    assert all(len(blocks) <= render.SECTIONS_PER_MESSAGE for blocks in card.preamble)
    lines = "\n".join(c.removeprefix("```\n").removesuffix("\n```") for c in code)
    assert lines == summary
    assert "Requested by job:j1 · expires in 60 s" in str(card.blocks)


def test_a_fence_in_a_command_cannot_end_the_code_block() -> None:
    [code] = render.code_sections("echo ```; rm x")
    assert code["text"]["text"].count("```") == 2


def test_outcomes_and_progress() -> None:
    assert render.outcome_line("approved", User("U1", "Ann")) == "✅ Approved by <@U1>"
    assert render.outcome_line("expired", None) == "⌛ Expired — not run"
    assert render.outcome_line("superseded", None) == "↪️ Skipped — a new message came first"
    key = ConvKey("slack", "D1")
    assert render.progress_text(Progress(key, 1, Phase.TOOL, "", "shell", 3.2)) == \
        "⚙️ Running `shell`… (3 s)"
    assert render.progress_text(Progress(key, 1, Phase.THINKING)) == render.THINKING
    assert render.progress_text(Progress(key, 1, Phase.TOOL, "so far", "shell")) == "so far"


# ---- inbound ----------------------------------------------------------------------------


def event(**fields: Any) -> dict[str, Any]:
    base = {"type": "message", "user": "U1", "text": "hi", "ts": "1.000100", "channel": "D1",
            "channel_type": "im", "team": "T1"}
    return {k: v for k, v in {**base, **fields}.items() if v is not None}


def test_conversations_from_events() -> None:
    dm = extract_message(event(), BOT)
    assert dm is not None and dm.conv == ConvKey("slack", "D1", None) and dm.addressed
    dm_thread = extract_message(event(thread_ts="0.5"), BOT)
    assert dm_thread is not None and dm_thread.conv.thread_id == "0.5"
    mention = extract_message(event(type="app_mention", channel="C1", channel_type=None,
                                    text=f"<@{BOT}> look"), BOT)
    assert mention is not None and mention.conv == ConvKey("slack", "C1", "1.000100")
    assert mention.text == "look" and mention.addressed and mention.thread is None
    in_thread = extract_message(event(channel="C1", channel_type="channel", thread_ts="0.5"),
                                BOT)
    assert in_thread is not None and not in_thread.addressed
    assert in_thread.conv == ConvKey("slack", "C1", "0.5")
    talk = extract_message(event(channel="C1", channel_type="channel"), BOT)
    assert talk is not None and not talk.addressed and talk.thread is None  # group talk
    assert talk.conv == ConvKey("slack", "C1", None)
    assert extract_message(event(subtype="message_changed"), BOT) is None
    assert extract_message(event(bot_id="B2"), BOT) is None
    assert extract_message(event(user=BOT), BOT) is None


def test_slack_markup_to_text_and_commands() -> None:
    assert slack_text(f"<@{BOT}>  see <https://x.test|the site> &amp; <mailto:a@b.c>", BOT) \
        == "see the site (https://x.test) & mailto:a@b.c"
    assert parse_command("/status") == ("status", "")
    assert parse_command(" /new  please ") == ("new", "please")
    assert parse_command("/usr/bin is a path") is None
    assert parse_command("hello /new") is None
