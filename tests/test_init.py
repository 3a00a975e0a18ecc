"""`tandem init` as a person runs it: a real process on a pseudo-terminal, answering its
questions, against the fake Telegram, the fake Slack and the fake model; then the files it
wrote, loaded the way `tandem run` loads them, and its own `tandem doctor` run.
Also with flags, as a script runs it."""

from __future__ import annotations

import asyncio
import io
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pexpect
import pytest

from adapters.telegram_webhook import check
from bot.core.config import Config, load_config
from tests.fakes.model_server import FakeModelServer
from tests.fakes.slack_server import FakeSlackServer
from tests.fakes.telegram_server import FakeTelegram

REPO = Path(__file__).resolve().parent.parent
SECRETS = ("LLM_API_KEY", "TELEGRAM_BOT_TOKEN", "TELEGRAM_WEBHOOK_SECRET", "SLACK_BOT_TOKEN",
           "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET")
TOKEN = "123456:RIGHT-token_x"


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items()
           if not k.startswith("TANDEM_") and k not in SECRETS}
    out["PYTHONPATH"] = str(REPO)
    return out


class Wizard:
    """`tandem init` on a pseudo-terminal; `transcript` is everything it showed."""

    def __init__(self, folder: Path, *args: str) -> None:
        self.log = io.StringIO()
        self.child = pexpect.spawn(sys.executable, ["-m", "bot", "init", *args],
                                   cwd=str(folder), env=env(), encoding="utf-8", timeout=90,
                                   dimensions=(40, 200))
        self.child.logfile_read = self.log

    async def answer(self, prompt: str, text: str) -> None:
        """Wait for `prompt`, then type `text` and Enter."""
        await asyncio.to_thread(self.child.expect_exact, prompt)
        self.child.sendline(text)

    async def shows(self, text: str) -> None:
        await asyncio.to_thread(self.child.expect_exact, text)

    async def end(self) -> int:
        await asyncio.to_thread(self.child.expect_exact, pexpect.EOF)
        self.child.close()
        assert self.child.exitstatus is not None
        return self.child.exitstatus

    @property
    def transcript(self) -> str:
        return self.log.getvalue()


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN) as fake:
        yield fake


def load_written(config: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    """The written config as `tandem run` loads it (its .env fills the environment, undone
    after the test)."""
    for name in SECRETS:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return load_config(str(config))


def private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_the_wizard_asks_again_for_a_refused_token_then_writes_what_passes_doctor(
        tmp_path: Path, telegram: FakeTelegram, model: FakeModelServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    wizard = Wizard(tmp_path, "--telegram-base-url", f"{telegram.url}/bot")
    await wizard.answer("1) Telegram 2) Slack 3) both [1]: ", "")
    await wizard.answer("Model [openai/gpt-4o-mini]: ", "openai/fake")
    await wizard.answer("API key (hidden", "sk-test-key")
    await wizard.answer("API base URL", model.api_base)
    await wizard.answer("Bot token (hidden): ", "123456:WRONG")
    await wizard.shows("Telegram refused this token (401 Unauthorized).")
    await wizard.answer("Bot token (hidden): ", "not a token")
    await wizard.shows("That is not a bot token")
    await wizard.answer("Bot token (hidden): ", TOKEN)
    await wizard.shows("Telegram knows this token: it is @tandem_bot.")
    await wizard.answer("Allowed users (Enter: nobody yet): ", "@ann")
    await wizard.shows("must be a numeric Telegram user id")
    await wizard.answer("Allowed users (Enter: nobody yet): ", "42, 43")
    await wizard.answer("Approvers (Enter: none): ", "42")
    assert await wizard.end() == 0, wizard.transcript
    text = wizard.transcript
    assert "[ok  ] telegram: signed in as @tandem_bot (getMe)" in text
    assert "All checks passed." in text and "Start Tandem with:\r\n    tandem run" in text
    assert TOKEN not in text and "sk-test-key" not in text  # typed unseen, never shown

    config, dotenv = tmp_path / "config.yaml", tmp_path / ".env"
    assert private(config) and private(dotenv)
    assert TOKEN not in config.read_text() and "${TELEGRAM_BOT_TOKEN}" in config.read_text()
    loaded = load_written(config, monkeypatch)
    assert loaded.telegram.enabled and loaded.telegram.token == TOKEN
    assert loaded.telegram.base_url == f"{telegram.url}/bot"
    assert loaded.telegram.allowed_users == [42, 43] and loaded.telegram.approvers == [42]
    assert loaded.llm.model == "openai/fake" and loaded.llm.api_key == "sk-test-key"
    assert not loaded.slack.enabled


async def test_the_wizard_shows_the_slack_workspace_and_checks_both_tokens(
        tmp_path: Path, model: FakeModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeSlackServer() as slack:
        wizard = Wizard(tmp_path, "--slack-base-url", slack.api_url, "--model", "openai/fake",
                        "--api-base", model.api_base)
        await wizard.answer("3) both [1]: ", "2")
        await wizard.answer("API key (hidden", "sk-test-key")
        await wizard.answer("socket/http [socket]: ", "")
        await wizard.answer("Bot User OAuth Token", "xoxb-wrong")
        await wizard.shows("Slack refused this token (invalid_auth).")
        await wizard.answer("Bot User OAuth Token", slack.app_token)  # the other kind
        await wizard.shows("That is not a bot token")
        await wizard.answer("Bot User OAuth Token", slack.bot_token)
        await wizard.shows("Slack knows this token: workspace Tandem (T1), bot user @tandem.")
        await wizard.answer("App-Level Token", "xapp-wrong")
        await wizard.shows("Slack refused this token (invalid_auth).")
        await wizard.answer("App-Level Token", slack.app_token)
        await wizard.answer("Allowed users (Enter: nobody yet): ", "ann")
        await wizard.shows("ann is not a Slack member id")
        await wizard.answer("Allowed users (Enter: nobody yet): ", "U1 U2")
        await wizard.answer("Approvers (Enter: none): ", "")
        assert await wizard.end() == 0, wizard.transcript
    text = wizard.transcript
    assert "[ok  ] slack: signed in to workspace Tandem (T1)" in text, text
    assert "[ok  ] slack app token:" in text and "All checks passed." in text
    assert slack.bot_token not in text and slack.app_token not in text
    loaded = load_written(tmp_path / "config.yaml", monkeypatch)
    assert loaded.slack.enabled and loaded.slack.mode == "socket"
    assert (loaded.slack.bot_token, loaded.slack.app_token) == (slack.bot_token,
                                                                slack.app_token)
    assert loaded.slack.allowed_users == ["U1", "U2"] and loaded.slack.approvers == []
    assert not loaded.telegram.enabled
    assert private(tmp_path / "config.yaml") and private(tmp_path / ".env")


def flags(telegram: FakeTelegram, model: FakeModelServer) -> list[str]:
    """Every answer for a Telegram setup, as flags (the token comes separately)."""
    return ["--platform", "telegram", "--model", "openai/fake", "--api-key", "sk-test-key",
            "--api-base", model.api_base, "--telegram-base-url", f"{telegram.url}/bot",
            "--allowed-users", "42", "--approvers", "42"]


async def test_an_existing_config_is_kept_without_a_yes_and_replaced_after_one(
        tmp_path: Path, telegram: FakeTelegram, model: FakeModelServer) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("llm:\n  model: openai/mine\n")
    given = [*flags(telegram, model), "--telegram-token", TOKEN]
    wizard = Wizard(tmp_path, *given)
    await wizard.answer("config.yaml exists. Overwrite? [y/N]: ", "")
    assert await wizard.end() == 1
    assert "Left config.yaml as it is; nothing written." in wizard.transcript
    assert config.read_text() == "llm:\n  model: openai/mine\n"
    assert not (tmp_path / ".env").exists()

    wizard = Wizard(tmp_path, *given)  # every answer is a flag: only the file is asked
    await wizard.answer("config.yaml exists. Overwrite? [y/N]: ", "y")
    assert await wizard.end() == 0, wizard.transcript
    assert "openai/fake" in config.read_text() and private(config)
    assert "All checks passed." in wizard.transcript


def init(folder: Path, *args: str, extra_env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bot", "init", "--non-interactive",
                           "--dir", str(folder), *args],
                          capture_output=True, text=True, env={**env(), **(extra_env or {})},
                          stdin=subprocess.DEVNULL, timeout=120)


async def test_a_script_sets_up_with_flags_and_the_environment_and_never_asks(
        tmp_path: Path, telegram: FakeTelegram, model: FakeModelServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "bot-home"
    given = flags(telegram, model)
    done = await asyncio.to_thread(init, folder, *given)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--telegram-token: This needs a token" in done.stderr
    done = await asyncio.to_thread(init, folder, *given, "--telegram-token", "123456:WRONG")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "Telegram refused this token (401 Unauthorized)" in done.stderr
    assert not folder.exists() or not any(folder.iterdir())  # nothing written

    done = await asyncio.to_thread(init, folder, *given,
                                   extra_env={"TELEGRAM_BOT_TOKEN": TOKEN})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All checks passed." in done.stdout and TOKEN not in done.stdout
    assert f"Start Tandem with:\n    cd {folder} && tandem run\n" in done.stdout
    assert private(folder / "config.yaml") and private(folder / ".env")
    loaded = load_written(folder / "config.yaml", monkeypatch)
    assert loaded.telegram.token == TOKEN and loaded.telegram.approvers == [42]
    made = loaded.telegram.webhook.secret_token  # for webhook mode, made here
    assert made and len(made) >= 32 and f"TELEGRAM_WEBHOOK_SECRET={made}\n" in \
        (folder / ".env").read_text() and made not in (folder / "config.yaml").read_text()
    hook = loaded.telegram.webhook.model_copy(update={"url": "https://t.example/telegram"})
    assert check(hook) == ("https://t.example/telegram", made)

    before = (folder / ".env").read_text()
    done = await asyncio.to_thread(init, folder, *given, "--telegram-token", TOKEN)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "exists: nothing written (--force overwrites it)" in done.stderr
    done = await asyncio.to_thread(init, folder, *given, "--telegram-token", TOKEN,
                                   "--force", "--approvers", "43")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (folder / ".env").read_text() == before and private(folder / ".env")
    assert "approvers: [43]" in (folder / "config.yaml").read_text()
