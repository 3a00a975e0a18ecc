"""The README's examples are real: the several-workers `compose.yaml` parses as Compose
(checked by `docker compose config` where Compose is installed) and its config snippet
loads as Tandem's configuration."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from bot.core.config import Config

README = Path(__file__).resolve().parent.parent / "README.md"


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, re.S)


def compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    done = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    return done.returncode == 0


def test_the_workers_config_snippet_is_valid_tandem_config() -> None:
    snippet, _ = yaml_blocks(section("Running several workers"))
    data: dict[str, Any] = yaml.safe_load(snippet)
    data["store"]["url"] = data["store"]["url"].replace("${PGPASSWORD}", "secret")
    data["telegram"]["webhook"]["secret_token"] = "s3cret"
    config = Config.model_validate(data)
    assert config.store.target.startswith("postgresql://")
    assert config.telegram.mode == "webhook" and config.slack.mode == "http"


def test_the_compose_example_describes_db_workers_and_a_proxy(tmp_path: Path) -> None:
    _, compose = yaml_blocks(section("Running several workers"))
    data: dict[str, Any] = yaml.safe_load(compose)
    services = data["services"]
    assert set(services) == {"db", "worker", "proxy"}
    assert services["worker"]["deploy"]["replicas"] == 3
    assert services["worker"]["command"][:1] == ["run"]  # the image's entry point: tandem
    caddyfile = data["configs"]["caddyfile"]["content"]
    assert "/telegram worker:8443" in caddyfile and "/slack/events worker:3000" in caddyfile
    if compose_available():  # the real parser, offline
        path = tmp_path / "compose.yaml"
        path.write_text(compose)
        (tmp_path / "config.yaml").write_text("{}\n")
        done = subprocess.run(["docker", "compose", "-f", str(path), "config", "-q"],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin:/usr/local/bin", "PGPASSWORD": "x"})
        assert done.returncode == 0, done.stderr
