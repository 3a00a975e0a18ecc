"""Private files on a real SQLite store: the database, its -wal and -shm, its folder, and
what `tandem doctor` says about files other users of the machine could read."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.cli.doctor import WARN, privacy
from bot.core.config import Config
from bot.core.events import ConvKey
from bot.core.file_modes import private_dir, private_file, too_open
from bot.store.backends import open_store


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The common umask (022), under which a plain file would come out 0644."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def config(tmp_path: Path) -> Config:
    return Config.model_validate({
        "store": {"path": str(tmp_path / "data" / "tandem.db")},
        "persona": {"dir": str(tmp_path / "persona")},
        "workspace": {"dir": str(tmp_path)},
    })


async def make_store(path: Path) -> None:
    store = open_store(str(path))
    await store.open()
    try:
        await store.conversation(ConvKey("console", "alice"))
    finally:
        await store.close()


async def test_the_database_its_wal_shm_and_folder_are_private(tmp_path: Path) -> None:
    db = tmp_path / "data" / "tandem.db"
    store = open_store(str(db))
    await store.open()
    try:
        await store.conversation(ConvKey("console", "alice"))
        files = [db, db.with_name("tandem.db-wal"), db.with_name("tandem.db-shm")]
        assert [mode(p) for p in files] == [0o600, 0o600, 0o600]
    finally:
        await store.close()
    assert mode(db.parent) == 0o700


async def test_an_existing_database_keeps_its_mode(tmp_path: Path) -> None:
    db = tmp_path / "tandem.db"
    await make_store(db)
    db.chmod(0o644)
    await make_store(db)
    assert mode(db) == 0o644


def test_the_helpers_create_private_and_never_change_what_exists(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "a" / "memory")
    assert mode(folder) == 0o700 and not too_open(folder)
    assert private_file(folder / "notes.md") is True
    assert mode(folder / "notes.md") == 0o600 and not too_open(folder / "notes.md")
    (folder / "notes.md").chmod(0o644)
    assert private_file(folder / "notes.md") is False and mode(folder / "notes.md") == 0o644
    assert too_open(folder / "notes.md") and not too_open(tmp_path / "missing")
    (folder / "link.md").symlink_to(tmp_path / "elsewhere.md")
    assert private_file(folder / "link.md") is False
    assert not (tmp_path / "elsewhere.md").exists()


async def test_doctor_is_quiet_when_private_and_says_how_to_fix_otherwise(
        tmp_path: Path) -> None:
    cfg = config(tmp_path)
    db = tmp_path / "data" / "tandem.db"
    await make_store(db)
    persona = tmp_path / "persona"
    persona.mkdir()
    for name in ("USER.md", "MEMORY.md"):
        private_file(persona / name)
    assert not any(status == WARN for _, status, _ in privacy(cfg))

    db.chmod(0o644)
    (persona / "MEMORY.md").chmod(0o640)
    (persona / "memory").mkdir(mode=0o755)
    warnings = [text for _, status, text in privacy(cfg) if status == WARN]
    assert len(warnings) == 1
    assert "other users" in warnings[0]
    assert f"chmod 600 {db} {persona / 'MEMORY.md'}" in warnings[0]
    assert f"chmod 700 {persona / 'memory'}" in warnings[0]
    assert "USER.md" not in warnings[0] and "-wal" not in warnings[0]

    db.chmod(0o600)
    (persona / "MEMORY.md").chmod(0o600)
    (persona / "memory").chmod(0o700)
    db.parent.chmod(0o755)
    warnings = [text for _, status, text in privacy(cfg) if status == WARN]
    assert len(warnings) == 1 and f"chmod 700 {db.parent}" in warnings[0]
