"""The fake Slack driven by the real slack-sdk / slack-bolt (no mocks)."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
import zlib
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncRespond, AsyncSay
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from tests.waiting import eventually

from .slack_server import BOT_USER_ID, DEFAULT_SCOPES, FakeSlackServer

SECRET = "s"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer() as server:
        yield server


def web_client(fake: FakeSlackServer, token: str = "xoxb-test") -> AsyncWebClient:
    return AsyncWebClient(token=token, base_url=fake.api_url)


def build_app(fake: FakeSlackServer, pressed: list[dict[str, Any]],
              finished: list[str] | None = None) -> AsyncApp:
    """A bolt app: a mention is echoed, a press on `x` is kept in `pressed`; each listener
    that returned is named in `finished` (bolt runs them after its ack)."""
    app = AsyncApp(client=web_client(fake), signing_secret=SECRET)
    done = finished if finished is not None else []

    @app.event("app_mention")
    async def on_mention(event: dict[str, Any], say: AsyncSay) -> None:
        try:
            await say(text=f"echo: {event['text']}",
                      thread_ts=event.get("thread_ts") or event["ts"])
        finally:
            done.append("app_mention")

    @app.action("x")
    async def on_x(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        try:
            await ack()
            pressed.append(body)
            await respond(text="pressed", replace_original=True)
        finally:
            done.append("x")

    return app


async def post_buttons(fake: FakeSlackServer, channel: str) -> str:
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": "Run `rm -rf build`?"}},
        {
            "type": "actions",
            "block_id": "approve",
            "elements": [
                {
                    "type": "button",
                    "action_id": "x",
                    "value": "yes",
                    "text": {"type": "plain_text", "text": "Yes"},
                }
            ],
        },
    ]
    resp = await web_client(fake).chat_postMessage(channel=channel, text="Approve?", blocks=blocks)
    return str(resp["ts"])


# ---------------------------------------------------------------------- Web API


async def test_web_api_basics(fake: FakeSlackServer) -> None:
    client = web_client(fake)
    auth = await client.auth_test()
    assert auth["user_id"] == "UBOT" and auth["bot_id"] == "BBOT" and auth["team_id"] == "T1"

    with pytest.raises(SlackApiError) as bad:
        await web_client(fake, "xoxb-wrong").auth_test()
    assert bad.value.response["error"] == "invalid_auth"

    parent = await client.chat_postMessage(channel="C1", text="root")
    assert parent["message"]["bot_id"] == "BBOT" and parent["message"]["user"] == "UBOT"
    reply1 = await client.chat_postMessage(channel="C1", text="one", thread_ts=parent["ts"])
    user_event = fake.message_event("C1", "U1", "two", thread_ts=parent["ts"])
    # A reply to a reply lands in the root's thread.
    await client.chat_postMessage(channel="C1", text="three", thread_ts=reply1["ts"])
    assert parent["ts"] < reply1["ts"] < user_event["ts"]

    replies = await client.conversations_replies(channel="C1", ts=parent["ts"])
    assert [m["text"] for m in replies["messages"]] == ["root", "one", "two", "three"]
    assert replies["messages"][0]["reply_count"] == 3 and replies["has_more"] is False
    assert fake.bot_texts("C1", parent["ts"]) == ["root", "one", "three"]

    with pytest.raises(SlackApiError) as missing:
        await client.conversations_replies(channel="C1", ts="1.000000")
    assert missing.value.response["error"] == "thread_not_found"

    updated = await client.chat_update(channel="C1", ts=reply1["ts"], text="one!")
    assert updated["text"] == "one!"
    assert fake.channel("C1", parent["ts"])[1].edits == ["one!"]
    with pytest.raises(SlackApiError) as unknown:
        await client.chat_update(channel="C1", ts="1.000000", text="x")
    assert unknown.value.response["error"] == "message_not_found"

    info = await client.users_info(user="U1")
    assert info["user"]["id"] == "U1" and info["user"]["tz"] == "UTC"
    await client.reactions_add(channel="C1", timestamp=parent["ts"], name="eyes")
    assert fake.reactions == [("C1", parent["ts"], "eyes")]

    eph = await client.chat_postEphemeral(channel="C1", user="U1", text="psst")
    assert fake.ephemerals_for("U1")[0]["message_ts"] == eph["message_ts"]

    with pytest.raises(SlackApiError) as too_long:
        await client.chat_postMessage(channel="C2", text="a" * 40_001)
    assert too_long.value.response["error"] == "msg_too_long"
    # slack-sdk itself warns (an error under filterwarnings=error) when `text` is missing.
    with pytest.warns(UserWarning, match="text"), pytest.raises(SlackApiError) as no_text:
        await client.chat_postMessage(channel="C2", text="")
    assert no_text.value.response["error"] == "no_text"
    assert [c.status for c in fake.calls_to("auth.test")] == [200, 200]
    assert fake.calls_to("auth.test")[1].error == "invalid_auth"


async def test_workspaces_are_chosen_per_payload(fake: FakeSlackServer) -> None:
    event = fake.message_event("D1", "U1", "hi")
    assert event["team"] == "T1"
    assert "team" not in fake.message_event("D1", "U1", "hi", team=None)
    body = fake.event_body(event, team_id="T2")
    assert body["team_id"] == body["context_team_id"] == "T2"
    assert body["authorizations"][0]["team_id"] == "T2" and body["event"] is event
    assert fake.event_body(event)["team_id"] == "T1"
    ts = await post_buttons(fake, "C1")
    press = fake.block_actions("C1", "U1", ts, "x", "yes", team_id="T2")
    assert press["team"]["id"] == press["user"]["team_id"] == "T2"
    fake.team_id = "T3"
    assert (await web_client(fake).auth_test())["team_id"] == "T3"
    fake.team_id = None
    assert "team_id" not in (await web_client(fake).auth_test()).data


@pytest.mark.refused_calls
async def test_block_limits(fake: FakeSlackServer) -> None:
    client = web_client(fake)
    section = {"type": "section", "text": {"type": "mrkdwn", "text": "a" * 3001}}
    with pytest.raises(SlackApiError) as err:
        await client.chat_postMessage(channel="C1", text="t", blocks=[section])
    assert err.value.response["error"] == "invalid_blocks"
    assert err.value.response["errors"] == [
        "failed to match all allowed schemas [json-pointer:/blocks/0/text]",
        "must be less than 3001 characters [json-pointer:/blocks/0/text/text]",
    ]
    ok = {"type": "section", "text": {"type": "mrkdwn", "text": "a" * 3000}}
    await client.chat_postMessage(channel="C1", text="t", blocks=[ok])

    with pytest.raises(SlackApiError) as many:
        await client.chat_postMessage(channel="C1", text="t", blocks=[ok] * 51)
    assert many.value.response["error"] == "invalid_blocks"

    def button(action_id: str, value: str) -> dict[str, Any]:
        element = {
            "type": "button",
            "action_id": action_id,
            "value": value,
            "text": {"type": "plain_text", "text": "b"},
        }
        return {"type": "actions", "elements": [element]}

    for bad in (button("x", "v" * 2001), button("x" * 256, "v")):
        with pytest.raises(SlackApiError) as btn:
            await client.chat_postMessage(channel="C1", text="t", blocks=[bad])
        assert btn.value.response["error"] == "invalid_blocks"

    await client.chat_postMessage(channel="C1", text="t", blocks=[button("x" * 255, "v" * 2000)])
    md = {"type": "markdown", "text": "**hi**"}
    await client.chat_postMessage(channel="C1", text="fallback", blocks=[ok, md])
    assert fake.bot_texts("C1")[-1] == "a" * 3000 + "\n**hi**"


async def test_rate_limits(fake: FakeSlackServer) -> None:
    client = web_client(fake)
    ts = (await client.chat_postMessage(channel="C1", text="0"))["ts"]
    for i in range(3):
        await client.chat_update(channel="C1", ts=ts, text=str(i))
    with pytest.raises(SlackApiError) as err:
        await client.chat_update(channel="C1", ts=ts, text="too fast")
    assert err.value.response.status_code == 429
    assert err.value.response.headers["Retry-After"] == "1"
    assert err.value.response["error"] == "ratelimited"
    assert fake.rate_limited == [("C1", "chat.update")]
    assert fake.max_update_rate("C1") == 4
    assert fake.channel("C1")[0].text == "2"

    # Another channel has its own budget; posting also has one.
    for _ in range(2):  # 1 post already spent on C1
        await client.chat_postMessage(channel="C1", text="p")
    with pytest.raises(SlackApiError) as post_err:
        await client.chat_postMessage(channel="C1", text="p")
    assert post_err.value.response.status_code == 429
    await client.chat_postMessage(channel="C2", text="other channel is fine")

    fake.rate_limit = False
    await client.chat_postMessage(channel="C1", text="limits off")


# ---------------------------------------------------------------------- Socket Mode


async def test_socket_mode_mention_action_and_reconnect(fake: FakeSlackServer) -> None:
    pressed: list[dict[str, Any]] = []
    app = build_app(fake, pressed)
    handler = AsyncSocketModeHandler(app, app_token="xapp-test")
    try:
        await handler.connect_async()  # type: ignore[no-untyped-call]
        await fake.wait_connections(1)

        event = fake.message_event("C1", "U1", "hello", channel_type="channel", mention=True)
        body = fake.event_body(event)
        envelope_id = await fake.push("events_api", body)
        latency = await fake.wait_ack(envelope_id)
        assert 0 <= latency < 3
        texts = await fake.wait_for(lambda: fake.bot_texts("C1", event["ts"]))
        assert texts == [f"echo: <@{BOT_USER_ID}> hello"]

        # Redelivery of the same event id (as Slack does after a missed ack).
        retry_id = await fake.push("events_api", body, retry_attempt=1)
        await fake.wait_ack(retry_id)
        assert fake.pushed[retry_id]["retry_attempt"] == 1
        assert fake.pushed[retry_id]["payload"]["event_id"] == body["event_id"]

        # A button press arrives as an interactive envelope.
        ts = await post_buttons(fake, "C1")
        action_env = await fake.push("interactive", fake.block_actions("C1", "U2", ts, "x", "yes"))
        await fake.wait_ack(action_env)
        await fake.wait_for(lambda: fake.responses)
        assert pressed[0]["actions"][0]["value"] == "yes"
        assert pressed[0]["actions"][0]["block_id"] == "approve"
        assert fake.channel("C1")[-1].text == "pressed"

        # Slack asks the client to reconnect; it opens a new connection and keeps working.
        await fake.send_disconnect()
        await fake.wait_connections(2)
        assert len(fake.calls_to("apps.connections.open")) == 2
        again = await fake.push_event(
            fake.message_event("C2", "U1", "again", channel_type="channel", mention=True)
        )
        await fake.wait_ack(again)
        await fake.wait_for(lambda: fake.bot_texts("C2"))

        # An abrupt server-side close: the client reconnects on its own.
        await fake.drop_connections()
        await fake.wait_connections(3)
        third = await fake.push_event(
            fake.message_event("C3", "U1", "still there?", channel_type="channel", mention=True)
        )
        await fake.wait_ack(third)

        # Bolt never acks an event no listener handles (its 404 sends nothing back).
        unhandled = await fake.push_event(fake.message_event("D1", "U1", "no listener"))
        with pytest.raises(AssertionError, match="condition not met"):
            await fake.wait_ack(unhandled, timeout=0.3)
        assert not fake.duplicate_acks and not fake.unexpected_socket_messages
    finally:
        await handler.close_async()  # type: ignore[no-untyped-call]
    await fake.wait_for(lambda: fake.open_connections == 0)


async def test_apps_connections_open_requires_app_token(fake: FakeSlackServer) -> None:
    with pytest.raises(SlackApiError) as err:
        await web_client(fake).apps_connections_open(app_token="xoxb-test")
    assert err.value.response["error"] == "not_allowed_token_type"
    resp = await web_client(fake).apps_connections_open(app_token="xapp-test")
    assert str(resp["url"]).startswith(
        f"ws://127.0.0.1:{fake.url.rsplit(':', 1)[1]}/socket?ticket="
    )


# ---------------------------------------------------------------------- HTTP mode


HttpBot = tuple[str, list[dict[str, Any]], list[str]]
"""The bolt app's URL, the presses it got, the listeners that returned."""


@pytest.fixture
async def http_bot(fake: FakeSlackServer) -> AsyncIterator[HttpBot]:
    pressed: list[dict[str, Any]] = []
    finished: list[str] = []
    app = build_app(fake, pressed, finished)
    runner = web.AppRunner(app.web_app(path="/slack/events"), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/slack/events", pressed, finished
    finally:
        await runner.cleanup()


async def test_http_mode(fake: FakeSlackServer, http_bot: HttpBot) -> None:
    url, pressed, finished = http_bot
    event = fake.message_event("C1", "U1", "hi", channel_type="channel", mention=True)
    body = fake.event_body(event)
    delivery = await fake.post_event(url, body, signing_secret=SECRET)
    assert delivery.status == 200 and delivery.latency < 3
    await fake.wait_for(lambda: fake.bot_texts("C1", event["ts"]))

    bad = await fake.post_event(url, body, signing_secret=SECRET, bad_signature=True)
    assert bad.status == 401
    stale = await fake.post_event(
        url, body, signing_secret=SECRET, timestamp=int(time.time()) - 400
    )
    assert stale.status == 401
    retried = await fake.post_event(url, body, signing_secret=SECRET, retry_num=1)
    assert retried.status == 200
    other = fake.event_body(fake.message_event("C3", "U1", "raw", mention=True))
    raw = await fake.post_raw(url, json.dumps(other).encode(),
                              content_type="application/json", signing_secret=SECRET)
    assert raw.status == 200  # the bytes as given, signed like the others

    ts = await post_buttons(fake, "C1")
    pressed_resp = await fake.post_action(
        url, fake.block_actions("C1", "U2", ts, "x", "yes"), signing_secret=SECRET
    )
    assert pressed_resp.status == 200
    await fake.wait_for(lambda: pressed and fake.responses)
    assert pressed[0]["user"]["id"] == "U2"
    message = fake.message("C1", ts)
    assert message is not None and message.text == "pressed"
    # bolt's listeners run in tasks of their own: all of them returned before the app is
    # torn down (the mention, its retry, the raw one, the press)
    await fake.wait_for(lambda: sorted(finished) == ["app_mention"] * 3 + ["x"])


async def test_wait_for_times_out_with_dump(fake: FakeSlackServer) -> None:
    with pytest.raises(AssertionError, match="last calls"):
        await fake.wait_for(lambda: False, timeout=0.1)


# ---------------------------------------------------------------------- files


def tiny_png(width: int = 2, height: int = 2) -> bytes:
    """A valid RGB PNG built with the standard library."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    rows = b"".join(b"\x00" + os.urandom(3 * width) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


async def fetch(url: str, token: str | None = None) -> tuple[int, str, bytes, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as resp:
        return resp.status, resp.content_type, await resp.read(), resp.headers


async def test_shared_file_is_served_only_with_the_bot_token(fake: FakeSlackServer) -> None:
    png = tiny_png()
    obj = fake.add_file(png, name="pixel.png", mimetype="image/png", user="U1")
    file_id = obj["id"]
    assert file_id.startswith("F") and obj["size"] == len(png) and obj["filetype"] == "png"
    assert obj["mode"] == "hosted" and obj["is_external"] is False and obj["user"] == "U1"
    assert obj["url_private"] == f"{fake.url}/files-pri/T1-{file_id}/pixel.png"
    assert obj["url_private_download"] == f"{fake.url}/files-pri/T1-{file_id}/download/pixel.png"

    event = fake.message_event("D1", "U1", "", files=[obj])
    assert event["subtype"] == "file_share" and event["files"] == [obj] and event["text"] == ""
    assert "blocks" not in event and event["channel_type"] == "im"
    with_text = fake.message_event("C1", "U1", "look", files=[obj], mention=True)
    assert with_text["type"] == "app_mention" and "subtype" not in with_text
    assert with_text["files"] == [obj] and with_text["blocks"][0]["type"] == "rich_text"
    stored = fake.message("D1", event["ts"])
    assert stored is not None and stored.files == [obj]

    for url in (obj["url_private"], obj["url_private_download"]):
        status, ctype, body, headers = await fetch(url, "xoxb-test")
        assert (status, ctype, body) == (200, "image/png", png)
        assert headers["Content-Length"] == str(len(png))
    assert fake.downloads(file_id) == 2

    # Without the header, with a wrong token or an app token: Slack's sign-in page, HTTP 200.
    for token in (None, "xoxb-wrong", "xapp-test"):
        status, ctype, body, _ = await fetch(obj["url_private_download"], token)
        assert (status, ctype) == (200, "text/html") and b"Sign in" in body
    fake.scopes.discard("files:read")
    status, ctype, _, _ = await fetch(obj["url_private_download"], "xoxb-test")
    assert (status, ctype) == (200, "text/html")
    assert fake.downloads(file_id) == 2 and fake.refused_downloads == [file_id] * 4

    missing = f"{fake.url}/files-pri/T1-F404/download/pixel.png"
    assert (await fetch(missing, "xoxb-test"))[0] == 404
    wrong_name = obj["url_private"].replace("pixel.png", "other.png")
    assert (await fetch(wrong_name, "xoxb-test"))[0] == 404

    # A test may claim a big file without allocating it.
    big = fake.add_file(b"x", name="huge.mp4", mimetype="video/mp4", declared_size=50_000_000)
    assert big["size"] == 50_000_000 and big["filetype"] == "mp4"


async def test_files_upload_v2_lands_once_in_the_thread(
    fake: FakeSlackServer, tmp_path: Path
) -> None:
    client = web_client(fake)
    root = (await client.chat_postMessage(channel="C1", text="root"))["ts"]
    data = os.urandom(4096)
    resp = await client.files_upload_v2(
        channel="C1", thread_ts=root, file=data, filename="blob.bin", initial_comment="here"
    )
    file_id = resp["file"]["id"]
    assert resp["files"] == [{"id": file_id, "title": "blob.bin"}]
    [upload] = fake.uploads("C1", root)
    assert (upload.id, upload.name, upload.title, upload.data) == (
        file_id,
        "blob.bin",
        "blob.bin",
        data,
    )
    assert upload.initial_comment == "here" and upload.filetype == "binary"
    file_messages = [m for m in fake.channel("C1") if m.files]
    assert len(file_messages) == 1
    msg = file_messages[0]
    assert msg.bot and msg.text == "here" and msg.thread_ts == root and msg.is_reply
    assert msg.files is not None and msg.files[0]["id"] == file_id
    assert upload.shares == [msg]

    png = tiny_png()
    path = tmp_path / "pixel.png"
    path.write_bytes(png)
    second = await client.files_upload_v2(
        channel="C1", thread_ts=root, file=str(path), title="A pixel"
    )
    assert second["files"][0]["title"] == "A pixel"
    uploads = fake.uploads("C1", root)
    assert [u.name for u in uploads] == ["blob.bin", "pixel.png"]
    assert uploads[1].mimetype == "image/png" and uploads[1].initial_comment is None
    assert fake.bot_texts("C1", root) == ["root", "here", ""]
    assert fake.uploads("C2") == [] and len(fake.uploads("C1")) == 2

    status, ctype, body, _ = await fetch(uploads[1].url_private, "xoxb-test")
    assert (status, ctype, body) == (200, "image/png", png)
    info = await client.files_info(file=second["file"]["id"])
    assert info["file"]["size"] == len(png) and info["file"]["channels"] == ["C1"]
    assert info["file"]["shares"]["public"]["C1"][0]["thread_ts"] == root
    replies = await client.conversations_replies(channel="C1", ts=root)
    assert replies["messages"][1]["files"][0]["id"] == file_id

    # Into a channel without a thread, and private (no channel): no message.
    await client.files_upload_v2(channel="C2", content="text", filename="notes.txt")
    [note] = fake.uploads("C2")
    assert note.data == b"text" and note.filetype == "text" and note.shares[0].thread_ts is None
    await client.files_upload_v2(content="secret", filename="private.txt")
    assert sum(1 for m in fake.channel("C1") + fake.channel("C2") if m.files) == 3


async def test_upload_needs_files_write(fake: FakeSlackServer) -> None:
    fake.scopes.discard("files:write")
    client = web_client(fake)
    with pytest.raises(SlackApiError) as err:
        await client.files_upload_v2(channel="C1", content="hi", filename="a.txt")
    assert err.value.response["error"] == "missing_scope"
    assert err.value.response["needed"] == "files:write"
    provided = err.value.response["provided"].split(",")
    assert "files:write" not in provided and "files:read" in provided
    assert err.value.response.headers["x-accepted-oauth-scopes"] == "files:write"
    assert "files:write" not in err.value.response.headers["x-oauth-scopes"].split(",")
    assert not fake.files and not fake.uploads("C1")
    assert fake.calls_to("files.getUploadURLExternal")[0].error == "missing_scope"

    fake.scopes.discard("files:read")
    with pytest.raises(SlackApiError) as info:
        await client.files_info(file="F1")
    assert info.value.response["needed"] == "files:read"


async def test_upload_length_and_completion_rules(fake: FakeSlackServer) -> None:
    client = web_client(fake)
    ticket = await client.files_getUploadURLExternal(filename="a.bin", length=10)
    file_id, upload_url = ticket["file_id"], ticket["upload_url"]
    assert upload_url.startswith(f"{fake.url}/upload/v1/")
    data = os.urandom(10)
    async with aiohttp.ClientSession() as session:
        async with session.post(upload_url, data=data[:5]) as short:
            assert short.status == 400
        with pytest.raises(SlackApiError) as incomplete:
            await client.files_completeUploadExternal(
                files=[{"id": file_id, "title": "a"}], channel_id="C1"
            )
        assert incomplete.value.response["error"] == "file_not_found"
        async with session.post(upload_url, data=data + b"!") as long:
            assert long.status == 400
        async with session.post(upload_url, data=data) as ok:
            assert ok.status == 200 and await ok.text() == "OK - 10"

        done = await client.files_completeUploadExternal(
            files=[{"id": file_id, "title": "a"}], channel_id="C1"
        )
        assert done["files"] == [{"id": file_id, "title": "a"}]
        with pytest.raises(SlackApiError) as twice:
            await client.files_completeUploadExternal(files=[{"id": file_id}], channel_id="C1")
        assert twice.value.response["error"] == "file_not_found"
        async with session.post(upload_url, data=data) as spent:
            assert spent.status == 404
    [upload] = fake.uploads("C1")
    assert upload.data == data and upload.title == "a" and len(fake.channel("C1")) == 1

    # A multipart form (curl -F file=@...) works as well as raw bytes.
    form_ticket = await client.files_getUploadURLExternal(filename="b.txt", length=3)
    form = aiohttp.FormData()
    form.add_field("file", b"abc", filename="b.txt")
    async with (
        aiohttp.ClientSession() as session,
        session.post(form_ticket["upload_url"], data=form) as resp,
    ):
        assert resp.status == 200

    async def error_of(method: str, **params: Any) -> str:
        with pytest.raises(SlackApiError) as e:
            await client.api_call(method, params=params)
        return str(e.value.response["error"])

    get_url = "files.getUploadURLExternal"
    assert await error_of(get_url, filename="x", length=-1) == "invalid_arguments"
    assert await error_of(get_url, filename="x", length="1.5") == "invalid_arguments"
    assert await error_of(get_url, filename="x") == "invalid_arguments"
    assert await error_of(get_url, length=4) == "invalid_arguments"
    assert await error_of(get_url, filename="x", length=0) == "missing_argument"
    assert await error_of(get_url, filename="x", length=1, alt_txt="a" * 1001) == (
        "alt_txt_too_large"
    )
    complete = "files.completeUploadExternal"
    assert await error_of(complete, files='[{"id": "F404"}]') == "file_not_found"
    assert await error_of(complete, files="not json") == "invalid_arguments"
    assert await error_of(complete, files="[]") == "invalid_arguments"
    pending = json.dumps([{"id": form_ticket["file_id"]}])
    assert await error_of(complete, files=pending, channel_id="") == "invalid_channel"
    assert await error_of("files.info", file="F404") == "file_not_found"
    assert await error_of("files.info", file=form_ticket["file_id"]) == "file_not_found"


async def test_a_refused_upload_post_fails_files_upload_v2(fake: FakeSlackServer) -> None:
    # files_upload_v2's step 2 (slack-sdk's _upload_file) reads the refusal as text; on a
    # status other than 200 files_upload_v2 raises SlackRequestError and never completes.
    client = web_client(fake)
    ticket = await client.files_getUploadURLExternal(filename="a.bin", length=3)
    result = await client._upload_file(
        url=ticket["upload_url"],
        data=b"four",
        logger=client._logger,
        timeout=5,
        proxy=None,
        ssl=None,
    )
    assert result.status == 400 and "expected 3 bytes, got 4" in str(result.body)
    assert not fake.uploads("C1") and fake.file(ticket["file_id"]) is not None


async def test_large_upload(fake: FakeSlackServer) -> None:
    data = os.urandom(60 * 1024 * 1024)
    # aiohttp (under slack-sdk) warns about any raw-bytes body over 1 MiB; the fake takes it.
    with pytest.warns(ResourceWarning, match="large body"):
        resp = await web_client(fake).files_upload_v2(channel="C1", file=data, filename="big.bin")
    [upload] = fake.uploads("C1")
    assert upload.id == resp["file"]["id"] and upload.size == len(data) and upload.data == data


async def test_oauth_scopes_header(fake: FakeSlackServer) -> None:
    client = web_client(fake)
    auth = await client.auth_test()
    assert auth.headers["x-oauth-scopes"] == ",".join(sorted(DEFAULT_SCOPES))
    assert "x-accepted-oauth-scopes" not in auth.headers
    posted = await client.chat_postMessage(channel="C1", text="hi")
    assert "files:write" in posted.headers["X-OAuth-Scopes"].split(",")
    fake.scopes = {"chat:write"}
    assert (await client.auth_test()).headers["x-oauth-scopes"] == "chat:write"
    with pytest.raises(SlackApiError) as bad:
        await web_client(fake, "xoxb-wrong").auth_test()
    assert "x-oauth-scopes" not in bad.value.response.headers
    opened = await client.apps_connections_open(app_token="xapp-test")
    assert opened.headers["x-oauth-scopes"] == "connections:write"
    assert FakeSlackServer(scopes=["chat:write"]).scopes == {"chat:write"}


# ---------------------------------------------------------------------- streaming


async def api_error(call: Awaitable[Any]) -> str:
    """The Slack error code a Web API call fails with."""
    with pytest.raises(SlackApiError) as e:
        await call
    return str(e.value.response["error"])


async def test_chat_stream_helper_end_to_end(fake: FakeSlackServer) -> None:
    client = web_client(fake)
    root = fake.message_event("C1", "U1", "question?", channel_type="channel")["ts"]
    streamer = await client.chat_stream(
        channel="C1",
        thread_ts=root,
        recipient_team_id="T1",
        recipient_user_id="U1",
        buffer_size=5,
    )
    assert await streamer.append(markdown_text="Hi") is None  # buffered, nothing sent
    assert not fake.calls_to("chat.startStream")
    started = await streamer.append(markdown_text=" there")  # buffer full: the stream starts
    assert started is not None and started["ts"] == streamer.ts and started["channel"] == "C1"
    assert fake.bot_texts("C1", root) == ["Hi there"]
    await streamer.append(markdown_text=", **world**")
    await streamer.append(markdown_text="!")  # buffered until the stop
    feedback = {"type": "section", "text": {"type": "mrkdwn", "text": "Helpful?"}}
    stopped = await streamer.stop(markdown_text=" Done.", blocks=[feedback])
    assert stopped["message"]["text"] == "Hi there, **world**! Done."

    start = fake.calls_to("chat.startStream")[0].params  # what slack-sdk sends, as JSON
    assert start["chunks"] == [{"type": "markdown_text", "text": "Hi there"}]
    assert (start["recipient_team_id"], start["recipient_user_id"]) == ("T1", "U1")
    assert fake.calls_to("chat.stopStream")[0].params["chunks"] == [
        {"type": "markdown_text", "text": "! Done."}
    ]
    [msg] = fake.streams("C1", root)
    assert msg.thread_ts == root and msg.bot and msg.is_reply
    assert msg.appends == [", **world**"]
    assert msg.stream is not None and msg.stream.state == "stopped"
    assert msg.stream.mode == "chunks" and msg.stream.final_text == "! Done."
    assert fake.bot_texts("C1", root) == ["Hi there, **world**! Done.\nHelpful?"]
    assert len(fake.calls_to("chat.appendStream")) == 1

    ts = str(streamer.ts)
    more = client.chat_appendStream(channel="C1", ts=ts, markdown_text="more")
    assert await api_error(more) == "message_not_in_streaming_state"
    assert await api_error(client.chat_stopStream(channel="C1", ts=ts)) == (
        "message_not_in_streaming_state"
    )
    # An ordinary message now (chat.update keeps blocks it is not given, as Slack does).
    await client.chat_update(channel="C1", ts=ts, text="rewritten", blocks=[])
    assert fake.bot_texts("C1", root) == ["rewritten"] and msg.edits == ["rewritten"]


@pytest.mark.refused_calls
async def test_stream_recipients_and_content_rules(fake: FakeSlackServer) -> None:
    fake.rate_limit = False
    client = web_client(fake)
    root = fake.message_event("C1", "U1", "q", channel_type="channel")["ts"]

    def start(**params: Any) -> Awaitable[Any]:
        return client.api_call("chat.startStream", json=params)

    assert await api_error(start(channel="C1", thread_ts=root)) == "missing_recipient_team_id"
    assert await api_error(start(channel="C1", thread_ts=root, recipient_team_id="T1")) == (
        "missing_recipient_user_id"
    )
    nobody = start(channel="C1", thread_ts=root, recipient_team_id="T1", recipient_user_id="U9")
    assert await api_error(nobody) == "user_not_found"
    assert await api_error(start(channel="D1", markdown_text="x")) == "invalid_arguments"
    # In a DM the recipient is implied.
    dm_root = fake.message_event("D1", "U1", "hi")["ts"]
    dm = await client.chat_startStream(channel="D1", thread_ts=dm_root, markdown_text="A")
    chunk = {"type": "markdown_text", "text": "x"}
    both = start(channel="D1", thread_ts=dm_root, markdown_text="x", chunks=[chunk])
    assert await api_error(both) == "cannot_provide_both_markdown_text_and_chunks"
    long_md = start(channel="D1", thread_ts=dm_root, markdown_text="m" * 12_001)
    assert await api_error(long_md) == "invalid_arguments"
    bad_chunk = start(channel="D1", thread_ts=dm_root, chunks=[{"type": "shout", "text": "x"}])
    assert await api_error(bad_chunk) == "invalid_chunks"
    task = {"type": "task_update", "id": "1", "title": "t", "status": "maybe"}
    assert await api_error(start(channel="D1", thread_ts=dm_root, chunks=[task])) == (
        "invalid_chunks"
    )
    # Form-encoded, chunks come as a JSON string.
    form = await client.api_call(
        "chat.startStream",
        params={"channel": "D1", "thread_ts": dm_root, "chunks": json.dumps([chunk])},
    )
    assert fake.message("D1", form["ts"]).text == "x"  # type: ignore[union-attr]

    ts = dm["ts"]
    assert await api_error(client.chat_update(channel="D1", ts=ts, text="no")) == (
        "cant_update_message"
    )
    assert await api_error(client.chat_appendStream(channel="D1", ts=ts)) == (
        "markdown_text_or_chunks_required"
    )
    mixed = client.chat_appendStream(channel="D1", ts=ts, chunks=[chunk])
    assert await api_error(mixed) == "streaming_mode_mismatch"  # it started with markdown_text
    plain = await client.chat_postMessage(channel="D1", text="plain")
    not_stream = client.chat_appendStream(channel="D1", ts=plain["ts"], markdown_text="x")
    assert await api_error(not_stream) == "message_not_in_streaming_state"
    users = client.chat_appendStream(channel="D1", ts=dm_root, markdown_text="x")
    assert await api_error(users) == "message_not_owned_by_app"
    missing = client.chat_appendStream(channel="D1", ts="1.000000", markdown_text="x")
    assert await api_error(missing) == "message_not_found"

    for _ in range(3):  # 1 + 3 * 12,000 characters would pass 40,000
        await client.chat_appendStream(channel="D1", ts=ts, markdown_text="m" * 12_000)
    over = client.chat_appendStream(channel="D1", ts=ts, markdown_text="m" * 12_000)
    assert await api_error(over) == "msg_too_long"
    bad_blocks = client.chat_stopStream(channel="D1", ts=ts, blocks=[{"type": "section"}])
    assert await api_error(bad_blocks) == "invalid_blocks"
    bad_meta = client.chat_stopStream(channel="D1", ts=ts, metadata={"event_payload": {}})
    assert await api_error(bad_meta) == "invalid_metadata_format"
    meta = {"event_type": "turn", "event_payload": {"id": "7"}}
    await client.chat_stopStream(channel="D1", ts=ts, markdown_text="!", metadata=meta)
    msg = fake.message("D1", ts)
    assert msg is not None and msg.stream is not None and msg.stream.metadata == meta
    assert len(msg.text) == 1 + 36_000 + 1 and len(msg.appends) == 3


async def test_stream_rate_limits_timeout_and_user_stop() -> None:
    async with FakeSlackServer(stream_timeout=0.3, append_interval=0.1) as fake:
        client = web_client(fake)
        root = fake.message_event("D1", "U1", "hi")["ts"]
        ts = (await client.chat_startStream(channel="D1", thread_ts=root, markdown_text="0"))["ts"]
        for i in range(3):  # the burst
            await client.chat_appendStream(channel="D1", ts=ts, markdown_text=str(i))
        with pytest.raises(SlackApiError) as err:
            await client.chat_appendStream(channel="D1", ts=ts, markdown_text="too fast")
        assert err.value.response.status_code == 429
        assert err.value.response.headers["Retry-After"] == "1"
        # a fixed wait: the fake's bucket earns a token by the clock (append_interval), and
        # an early try would be one more 429 in `rate_limited`
        await asyncio.sleep(0.12)
        await client.chat_appendStream(channel="D1", ts=ts, markdown_text="3")
        assert fake.rate_limited == [("D1", "chat.appendStream")]
        [open_stream] = fake.streams("D1")
        assert open_stream.stream is not None
        stream = open_stream.stream
        await eventually(lambda: stream.state == "timed_out", 5,
                         what="the fake's stream_timeout")  # then the fake stops it
        late = client.chat_appendStream(channel="D1", ts=ts, markdown_text="late")
        assert await api_error(late) == "message_not_in_streaming_state"
        [msg] = fake.streams("D1")
        assert msg.stream is not None and msg.stream.state == "timed_out"
        assert msg.text == "00123" and msg.appends == ["0", "1", "2", "3"]
        await client.chat_update(channel="D1", ts=ts, text="final")

        # chat.startStream has chat.postMessage's limit, in its own bucket.
        for _ in range(3):
            await client.chat_postMessage(channel="D2", text="p")
        started = [
            await client.chat_startStream(channel="D2", thread_ts=root, markdown_text="s")
            for _ in range(3)
        ]
        with pytest.raises(SlackApiError) as start_err:
            await client.chat_startStream(channel="D2", thread_ts=root, markdown_text="s")
        assert start_err.value.response.status_code == 429
        assert fake.rate_limited[-1] == ("D2", "chat.startStream")

        fake.stop_stream_by_user("D2", started[0]["ts"])
        stopped = client.chat_appendStream(channel="D2", ts=started[0]["ts"], markdown_text="x")
        assert await api_error(stopped) == "stopped_by_user"
        final = client.chat_stopStream(channel="D2", ts=started[0]["ts"])
        assert await api_error(final) == "message_not_in_streaming_state"
        assert fake.streams("D2")[0].stream.state == "stopped_by_user"  # type: ignore[union-attr]


async def test_refused_streams_leave_post_and_update(fake: FakeSlackServer) -> None:
    client = web_client(fake)
    root = fake.message_event("D1", "U1", "hi")["ts"]
    fake.refuse_streams = True
    refused = client.chat_startStream(channel="D1", thread_ts=root, markdown_text="x")
    assert await api_error(refused) == "channel_type_not_supported"
    streamer = await client.chat_stream(channel="D1", thread_ts=root)
    await streamer.append(markdown_text="short")  # buffered
    assert await api_error(streamer.stop()) == "channel_type_not_supported"
    fake.refuse_streams = "not_allowed"
    assert await api_error(client.chat_startStream(channel="D1", thread_ts=root)) == "not_allowed"
    # The fallback: post, then update.
    posted = await client.chat_postMessage(channel="D1", thread_ts=root, text="partial")
    await client.chat_update(channel="D1", ts=posted["ts"], text="partial and more")
    assert fake.bot_texts("D1", root) == ["partial and more"] and not fake.streams("D1")


# ---------------------------------------------------------------------- assistant threads


async def test_assistant_methods_need_the_scope_and_the_surface(fake: FakeSlackServer) -> None:
    client = web_client(fake)
    root = fake.message_event("D1", "U1", "hi")["ts"]
    assert "assistant:write" not in DEFAULT_SCOPES and "assistant:write" not in fake.scopes
    with pytest.raises(SlackApiError) as err:
        await client.assistant_threads_setStatus(channel_id="D1", thread_ts=root, status="...")
    assert err.value.response["error"] == "missing_scope"
    assert err.value.response["needed"] == "assistant:write"
    assert err.value.response.headers["x-accepted-oauth-scopes"] == "assistant:write"
    prompts = [{"title": "Summarise", "message": "Summarise this thread"}]
    no_scope = client.assistant_threads_setSuggestedPrompts(channel_id="D1", prompts=prompts)
    assert await api_error(no_scope) == "missing_scope"
    fake.scopes.add("assistant:write")  # the scope, but no assistant surface
    no_surface = client.assistant_threads_setStatus(channel_id="D1", thread_ts=root, status="x")
    assert await api_error(no_surface) == "not_agent_app"
    no_surface = client.assistant_threads_setSuggestedPrompts(channel_id="D1", prompts=prompts)
    assert await api_error(no_surface) == "not_agent_app"
    assert fake.statuses == [] and fake.suggested_prompts == []


async def test_assistant_status_and_suggested_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeSlackServer(assistant=True) as fake:
        assert "assistant:write" in fake.scopes
        client = web_client(fake)
        root = fake.message_event("D1", "U1", "hi")["ts"]
        await client.assistant_threads_setStatus(
            channel_id="D1", thread_ts=root, status="is thinking...", loading_messages=["Hmm"]
        )
        assert fake.status_of("D1", root) == "is thinking..."
        await client.assistant_threads_setStatus(channel_id="D1", thread_ts=root, status="")
        assert fake.status_of("D1", root) is None
        await client.assistant_threads_setStatus(channel_id="D1", thread_ts=root, status="again")
        await client.chat_postMessage(channel="D1", thread_ts=root, text="the answer")
        assert fake.status_of("D1", root) is None  # the reply replaces the status
        await client.assistant_threads_setStatus(channel_id="D1", thread_ts=root, status="late")
        now = time.monotonic()
        with monkeypatch.context() as later:
            later.setattr(time, "monotonic", lambda: now + 120)
            assert fake.status_of("D1", root) is None  # two minutes without a message
        assert fake.statuses == [
            ("D1", root, "is thinking..."),
            ("D1", root, ""),
            ("D1", root, "again"),
            ("D1", root, "late"),
        ]

        def status(**params: Any) -> Awaitable[Any]:
            return client.api_call("assistant.threads.setStatus", json=params)

        assert await api_error(status(channel_id="D1", thread_ts=root)) == "invalid_arguments"
        assert await api_error(status(channel_id="D1", status="x")) == "invalid_arguments"
        assert await api_error(status(channel_id="D1", thread_ts="nope", status="x")) == (
            "invalid_thread_ts"
        )
        assert await api_error(status(thread_ts=root, status="x")) == "channel_not_found"
        eleven = status(channel_id="D1", thread_ts=root, status="x", loading_messages=["m"] * 11)
        assert await api_error(eleven) == "invalid_arguments"

        four = [{"title": f"t{i}", "message": f"m{i}"} for i in range(4)]
        await client.assistant_threads_setSuggestedPrompts(
            channel_id="D1", thread_ts=root, title="Try", prompts=four
        )
        await client.assistant_threads_setSuggestedPrompts(channel_id="D1", prompts=four[:1])
        assert fake.suggested_prompts == [
            {"channel": "D1", "thread_ts": root, "title": "Try", "prompts": four},
            {"channel": "D1", "thread_ts": None, "title": None, "prompts": four[:1]},
        ]
        for bad in ([], [*four, four[0]], [{"title": "no message"}], "not a list"):
            call = client.api_call(
                "assistant.threads.setSuggestedPrompts", json={"channel_id": "D1", "prompts": bad}
            )
            assert await api_error(call) == "invalid_arguments"
        bad_ts = client.assistant_threads_setSuggestedPrompts(
            channel_id="D1", thread_ts="x", prompts=four
        )
        assert await api_error(bad_ts) == "invalid_thread_ts"
        fake.scopes.discard("assistant:write")
        dropped = client.assistant_threads_setStatus(channel_id="D1", thread_ts=root, status="x")
        assert await api_error(dropped) == "missing_scope"


# -- Block Kit, as slack_sdk's models and Slack's documented limits read it -------------


async def refused_blocks(fake: FakeSlackServer, blocks: list[Any]) -> list[str]:
    """The errors chat.postMessage gives these blocks (it must refuse them)."""
    with pytest.raises(SlackApiError) as err:
        await web_client(fake).chat_postMessage(channel="C1", text="t", blocks=blocks)
    assert err.value.response["error"] == "invalid_blocks"
    errors: list[str] = err.value.response["errors"]
    return errors


def text_object(text: str, kind: str = "mrkdwn") -> dict[str, Any]:
    return {"type": kind, "text": text}


def button_element(action_id: str, label: str = "b", **extra: Any) -> dict[str, Any]:
    return {"type": "button", "action_id": action_id,
            "text": text_object(label, "plain_text"), **extra}


@pytest.mark.refused_calls
async def test_blocks_are_read_by_the_sdk_models(fake: FakeSlackServer) -> None:
    assert await refused_blocks(fake, [{"type": "sparkle", "text": "x"}]) == [
        "unsupported type: 'sparkle' [json-pointer:/blocks/0/type]"
    ]
    header = {"type": "header", "text": text_object("h" * 151, "plain_text")}
    assert await refused_blocks(fake, [header]) == [
        "text attribute cannot exceed 150 characters [json-pointer:/blocks/0]"
    ]
    long_label = {"type": "actions", "elements": [button_element("a", "l" * 76)]}
    assert await refused_blocks(fake, [long_label]) == [
        "text attribute cannot exceed 75 characters [json-pointer:/blocks/0]"
    ]
    style = {"type": "actions", "elements": [button_element("a", style="loud")]}
    assert (await refused_blocks(fake, [style]))[0].startswith("style attribute must be one of")
    fields = {"type": "section", "fields": [text_object("f")] * 11}
    assert await refused_blocks(fake, [fields]) == [
        "fields attribute cannot exceed 10 items [json-pointer:/blocks/0]"
    ]
    context = {"type": "context", "elements": [text_object("c")] * 11}
    assert await refused_blocks(fake, [context]) == [
        "elements attribute cannot exceed 10 elements [json-pointer:/blocks/0]"
    ]
    long_id = {"type": "divider", "block_id": "i" * 256}
    assert await refused_blocks(fake, [long_id]) == [
        "block_id cannot exceed 255 characters [json-pointer:/blocks/0]"
    ]
    # what the models would drop or coerce is refused, not silently changed
    unknown = {"type": "section", "text": text_object("s"), "colour": "red"}
    assert await refused_blocks(fake, [unknown]) == [
        "unsupported or malformed field [json-pointer:/blocks/0/colour]"
    ]
    bare = {"type": "section", "text": "not a text object"}
    assert await refused_blocks(fake, [bare]) == [
        "unsupported or malformed field [json-pointer:/blocks/0/text]"
    ]
    assert fake.bot_messages("C1") == []
    ok = [{"type": "header", "text": text_object("h" * 150, "plain_text")},
          {"type": "section", "fields": [text_object("f")] * 10, "block_id": "i" * 255},
          {"type": "actions", "elements": [button_element("a", "l" * 75, style="danger")]}]
    await web_client(fake).chat_postMessage(channel="C1", text="t", blocks=ok)
    assert len(fake.bot_messages("C1")) == 1


@pytest.mark.refused_calls
async def test_text_objects_and_ids_keep_the_documented_limits(fake: FakeSlackServer) -> None:
    empty = {"type": "section", "text": text_object("")}
    assert "must be between 1 and 3000 characters [json-pointer:/blocks/0/text/text]" in (
        await refused_blocks(fake, [empty])
    )
    context = {"type": "context", "elements": [text_object("c" * 3001)]}
    assert await refused_blocks(fake, [context]) == [
        "must be between 1 and 3000 characters [json-pointer:/blocks/0/elements/0/text]"
    ]
    twice = [{"type": "divider", "block_id": "same"}, {"type": "divider", "block_id": "same"}]
    assert await refused_blocks(fake, twice) == [
        "duplicate block_id [json-pointer:/blocks/1/block_id]"
    ]
    pair = {"type": "actions", "elements": [button_element("go"), button_element("go")]}
    assert await refused_blocks(fake, [pair]) == [
        "duplicate action_id [json-pointer:/blocks/0/elements/1/action_id]"
    ]
    client = web_client(fake)
    # the same action_id in two blocks is allowed; the same block_id in two messages too
    apart = [{"type": "actions", "block_id": "one", "elements": [button_element("go")]},
             {"type": "actions", "block_id": "two", "elements": [button_element("go")]}]
    await client.chat_postMessage(channel="C1", text="t", blocks=apart)
    await client.chat_postMessage(channel="C1", text="t", blocks=apart[:1])
    context_ok = {"type": "context", "elements": [text_object("c" * 3000)]}
    await client.chat_postMessage(channel="C1", text="t", blocks=[context_ok])
    assert len(fake.bot_messages("C1")) == 3


@pytest.mark.refused_calls
async def test_every_method_with_blocks_checks_them(fake: FakeSlackServer) -> None:
    client = web_client(fake)
    ts = (await client.chat_postMessage(channel="C1", text="t"))["ts"]
    bad = [{"type": "section", "text": text_object("s"), "colour": "red"}]
    calls = [
        client.chat_update(channel="C1", ts=ts, text="t", blocks=bad),
        client.chat_postEphemeral(channel="C1", user="U1", text="t", blocks=bad),
    ]
    for call in calls:
        with pytest.raises(SlackApiError) as err:
            await call
        assert err.value.response["error"] == "invalid_blocks"
    many = [{"type": "markdown", "text": "m" * 6_000}, {"type": "markdown", "text": "m" * 6_001}]
    with pytest.raises(SlackApiError) as err:
        await client.chat_postMessage(channel="C1", text="t", blocks=many)
    assert err.value.response["errors"] == ["markdown text must be less than 12001 characters"]
    assert fake.bot_texts("C1") == ["t"] and fake.ephemerals_for("U1") == []
