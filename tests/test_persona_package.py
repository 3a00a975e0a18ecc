"""The default persona ships inside Tandem: a built wheel holds persona/ byte for byte, and
a Persona whose `persona.dir` is missing uses it, says so once, and still keeps notes in
`persona.dir`."""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bot.cli.doctor import WARN, _persona
from bot.core.config import Config
from bot.core.events import ConvKey
from bot.tools import ToolContext
from bot.tools.memory import remember
from bot.turn.memory import scope_dir
from bot.turn.persona import DEFAULT, FILES, Persona
from tests.conftest import PERSONA, REPO

SHIPPED = sorted(p.name for p in PERSONA.glob("*.md"))
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "bot", "adapters", "persona")


def _source_copy(dest: Path) -> Path:
    """What a build reads, copied (links kept as links) so no build output lands in the
    repository."""
    dest.mkdir()
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def _can_build_wheels() -> bool:
    return any(importlib.util.find_spec(m) is not None
               for m in ("wheel", "setuptools.command.bdist_wheel"))


def test_the_repository_keeps_one_copy_of_the_persona() -> None:
    link = REPO / "bot" / "_persona"
    assert link.is_symlink() and link.readlink() == Path("../persona")
    assert Path(str(DEFAULT)).resolve() == PERSONA.resolve()
    assert {"AGENT.md", "RULES.md", "USER.md"} <= set(SHIPPED)


@pytest.mark.skipif(not _can_build_wheels(),
                    reason="building a wheel offline needs the `wheel` package here")
def test_a_wheel_holds_the_persona_files_byte_for_byte(tmp_path: Path) -> None:
    src = _source_copy(tmp_path / "src")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=300, cwd=src)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [wheel] = (tmp_path / "dist").glob("tandem-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        inside = {n.removeprefix("bot/_persona/"): zf.read(n) for n in zf.namelist()
                  if n.startswith("bot/_persona/")}
        assert "bot/turn/persona.py" in zf.namelist()
    assert sorted(inside) == SHIPPED
    for name in SHIPPED:
        assert inside[name] == (PERSONA / name).read_bytes(), name


def test_a_build_copies_the_persona_files_into_the_package(tmp_path: Path) -> None:
    """The step a wheel is made from (`build_py` collects package data), with nothing but
    setuptools: it runs wherever the tests do."""
    src = _source_copy(tmp_path / "src")
    out = tmp_path / "lib"
    proc = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "-q",
         "build_py", "--build-lib", str(out)],
        capture_output=True, text=True, timeout=300, cwd=src)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = out / "bot" / "_persona"
    assert not built.is_symlink()
    assert sorted(p.name for p in built.iterdir()) == SHIPPED
    for name in SHIPPED:
        assert (built / name).read_bytes() == (PERSONA / name).read_bytes(), name


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "bot.turn.persona" and r.levelno == logging.WARNING]


def test_a_missing_persona_dir_uses_the_packaged_persona_and_says_so_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="bot.turn.persona")
    missing = tmp_path / "nowhere"
    persona = Persona(missing)
    first = persona.system_prompt()
    second = persona.system_prompt()
    assert first is second
    assert first == Persona(PERSONA).system_prompt()
    for name in ("AGENT.md", "RULES.md"):
        assert (PERSONA / name).read_text().strip() in first
    [record] = _records(caplog)
    assert str(missing) in record.getMessage() and "default persona" in record.getMessage()
    assert persona.packaged() and not missing.exists()


def test_an_admins_persona_dir_wins_and_a_half_one_is_not_filled_in(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="bot.turn.persona")
    own = tmp_path / "own"
    own.mkdir()
    (own / "AGENT.md").write_text("You are Quill, the release clerk.\n")
    persona = Persona(own)
    prompt = persona.system_prompt()
    assert "Quill" in prompt and "## RULES.md" not in prompt
    assert "helpful teammate" not in prompt
    assert not persona.packaged() and persona.missing() == ["RULES.md", "USER.md"]
    assert _records(caplog) == []


def _context(persona_dir: Path, scope: str) -> ToolContext:
    conv = ConvKey("telegram", "42")
    return ToolContext(workspace=persona_dir.parent, protected=frozenset(), env={},
                       extras={"persona_dir": persona_dir,
                               "memory_dir": scope_dir(persona_dir, scope, conv, "7")})


async def test_notes_go_to_persona_dir_which_is_created_on_demand(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="bot.turn.persona")
    target = tmp_path / "persona"
    persona = Persona(target)
    before = persona.system_prompt()
    said = await remember(_context(target, "conversation"), {"fact": "Deploys are on Fridays"})
    assert said == "remembered in USER.md: Deploys are on Fridays"
    [note] = target.glob("memory/conversations/*/USER.md")
    assert "Deploys are on Fridays" in note.read_text() and not (target / "USER.md").exists()
    assert persona.system_prompt() == before  # a conversation's note is not the persona's
    await remember(_context(target, "global"), {"fact": "Ann is called Xiaoniu", "file": "USER"})
    prompt = persona.system_prompt()
    assert "Ann is called Xiaoniu" in (target / "USER.md").read_text()
    assert "Ann is called Xiaoniu" in prompt
    assert (PERSONA / "RULES.md").read_text().strip() in prompt
    assert persona.packaged() and len(_records(caplog)) == 1
    assert set(FILES) >= {p.name for p in target.glob("*.md")} == {"USER.md"}


def test_doctor_shows_the_packaged_persona_as_a_warning(tmp_path: Path) -> None:
    config = Config.model_validate({"persona": {"dir": str(tmp_path / "nowhere")}})
    [(name, status, text)] = _persona(config)
    assert (name, status) == ("persona", WARN)
    assert str(tmp_path / "nowhere") in text and "default persona" in text
