"""`tandem doctor` as a person runs it: a real process against the fake Telegram, the fake
Slack and the fake model. Each platform's token is checked with the platform; a doctor
with nothing to talk to says so; `--quick` stays off the network and never loads litellm."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fakes.model_server import FakeModelServer
from tests.fakes.slack_server import FakeSlackServer
from tests.fakes.telegram_server import FakeTelegram
from tests.test_cli import env, write_config


async def doctor(tmp_path: Path, model: FakeModelServer, *args: str,
                 **config: Any) -> tuple[int, str]:
    path = write_config(tmp_path, model, **config)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "--config", str(path), "doctor", *args,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(model), cwd=tmp_path)
    out, _ = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def telegram(base_url: str, token: str) -> dict[str, Any]:
    return {"enabled": True, "token": token, "base_url": base_url, "allowed_users": [42]}


async def test_a_telegram_token_telegram_refuses_fails_and_the_right_one_names_the_bot(
        model: FakeModelServer, tmp_path: Path) -> None:
    async with FakeTelegram(token="123:RIGHT") as fake:
        code, text = await doctor(tmp_path, model,
                                  telegram=telegram(f"{fake.url}/bot", "123:WRONG"))
        assert code == 1, text
        assert "[FAIL] telegram: Telegram refused telegram.token (401 Unauthorized)" in text
        assert "123:WRONG" not in text and "1 check(s) failed." in text

        code, text = await doctor(tmp_path, model,
                                  telegram=telegram(f"{fake.url}/bot", "123:RIGHT"))
    assert code == 0, text
    assert "[ok  ] telegram: signed in as @tandem_bot (getMe)" in text
    assert "[ok  ] telegram access: 1 allowed user, 0 approvers" in text
    assert "All checks passed." in text and "123:RIGHT" not in text


async def test_group_context_with_privacy_mode_on_says_what_to_do_in_botfather(
        model: FakeModelServer, tmp_path: Path) -> None:
    async with FakeTelegram(token="123:RIGHT") as fake:
        settings = {**telegram(f"{fake.url}/bot", "123:RIGHT"), "groups": {"context": 20}}
        code, text = await doctor(tmp_path, model, telegram=settings)
        assert code == 0, text
        assert "[warn] telegram groups: telegram.groups.context is on, but Telegram shows " \
               "this bot only the group messages addressed to it (privacy mode). In " \
               "@BotFather: /setprivacy" in text
        fake.me["can_read_all_group_messages"] = True
        code, text = await doctor(tmp_path, model, telegram=settings)
    assert code == 0 and "privacy mode" not in text, text


async def test_telegram_out_of_reach_is_one_line_naming_the_url_and_the_cause(
        model: FakeModelServer, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, text = await doctor(tmp_path, model,
                              telegram=telegram(f"http://127.0.0.1:{port}/bot", "123:ABC"))
    assert code == 1, text
    assert (f"[FAIL] telegram: cannot reach http://127.0.0.1:{port}/bot (connection refused)"
            in text.splitlines())


async def test_slack_bot_and_app_tokens_are_checked_and_the_workspace_named(
        model: FakeModelServer, tmp_path: Path) -> None:
    async with FakeSlackServer() as fake:
        def slack(bot: str, app: str) -> dict[str, Any]:
            return {"enabled": True, "bot_token": bot, "app_token": app,
                    "base_url": fake.api_url, "allowed_users": ["*"], "approvers": ["U1"]}

        code, text = await doctor(tmp_path, model, slack=slack("xoxb-wrong", "xapp-wrong"))
        assert code == 1, text
        assert "[FAIL] slack: Slack refused slack.bot_token (invalid_auth)" in text
        assert "[FAIL] slack app token: Slack refused slack.app_token (invalid_auth)" in text

        code, text = await doctor(tmp_path, model, slack=slack(fake.bot_token, fake.app_token))
    assert code == 0, text
    assert ("[ok  ] slack: signed in to workspace Tandem (T1), bot user @tandem (auth.test)"
            in text)
    assert "[ok  ] slack app token: may open Socket Mode connections" in text
    assert "[ok  ] slack access: everyone may talk (\"*\"), 1 approver" in text


async def test_a_service_that_never_answers_is_a_fail_line_not_a_wait(
        model: FakeModelServer, tmp_path: Path) -> None:
    done = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await done.wait()  # takes the request, never answers
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        code, text = await doctor(
            tmp_path, model, telegram=telegram(f"{url}/bot", "123:ABC"),
            slack={"enabled": True, "bot_token": "xoxb-test", "app_token": "xapp-test",
                   "base_url": f"{url}/api/", "allowed_users": ["U1"]})
    finally:
        done.set()
        server.close()
        await server.wait_closed()
    assert code == 1, text
    lines = text.splitlines()
    assert f"[FAIL] telegram: cannot reach {url}/bot (no answer within 5 s)" in lines, text
    assert f"[FAIL] slack: cannot reach {url}/api/ (no answer within 5 s)" in lines, text
    assert f"[FAIL] slack app token: cannot reach {url}/api/ (no answer within 5 s)" in lines
    assert "[ok  ] model: openai/fake answered" in lines


async def test_no_platform_enabled_is_a_warning_that_says_what_run_would_do(
        model: FakeModelServer, tmp_path: Path) -> None:
    code, text = await doctor(tmp_path, model)
    assert code == 0, text
    assert ("[warn] platforms: no platform is enabled (telegram.enabled, slack.enabled): "
            "`tandem run` would talk in this terminal; `tandem init` sets one up") in text


def test_quick_checks_config_persona_and_database_without_network_or_litellm(
        tmp_path: Path) -> None:
    config = write_config(tmp_path, FakeModelServer(), telegram=telegram(
        "http://127.0.0.1:9/bot", "123:ABC"))
    nowhere = {**env(), "FAKE_API_BASE": "http://127.0.0.1:9/v1"}  # no model server
    script = ("import sys; from bot.cli.cli import main; code = main(sys.argv[1:]); "
              "print('litellm loaded' if 'litellm' in sys.modules else 'no litellm'); "
              "sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script, "--config", str(config), "doctor",
                           "--quick"], capture_output=True, text=True, cwd=tmp_path,
                          env=nowhere, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == ["[ok  ] config", "[ok  ] persona",
                                                          "[ok  ] database"], lines
    assert lines[3:] == ["All checks passed.", "no litellm"], lines

    (tmp_path / "persona" / "RULES.md").unlink()
    done = subprocess.run([sys.executable, "-m", "bot", "--config", str(config), "doctor",
                           "--quick"], capture_output=True, text=True, cwd=tmp_path,
                          env=nowhere, timeout=60)
    assert done.returncode == 1 and "[FAIL] persona: missing" in done.stdout, done.stdout
