"""`bot.run.logs.setup`: text or JSON lines on stderr, secrets redacted either way. The tests
log on a logger of their own: the Slack adapter's bolt app sets the level of the one
named "tandem" (to the root's at the time), which other tests leave behind."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from bot.core.errors import ModelStreamCut, StoreConflict
from bot.run import logs

SECRET = "sk-live-9f8e7d6c5b4a39281706"


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    """The root logger, given back as it was (`setup` replaces its handlers)."""
    logger = logging.getLogger()
    handlers, level = logger.handlers[:], logger.level
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_json_lines_carry_time_level_logger_message_and_exception(
        root: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(logging.INFO, [SECRET], format="json")
    log = logging.getLogger("test_logs")
    log.debug("not shown at INFO")
    log.info("the key is %s", SECRET)
    log.warning("three\nlines\nhere, naïve ✓ \u2028 and a separator")
    try:
        raise ValueError(f"bad key {SECRET}")
    except ValueError:
        log.exception("it failed")
    written = lines(capsys)
    assert len(written) == 3
    entries = [json.loads(line) for line in written]
    assert all(line.isascii() for line in written)
    assert SECRET not in "\n".join(written) and SECRET not in json.dumps(entries)
    info, warning, error = entries
    assert set(info) == {"time", "level", "logger", "message"}
    assert (info["level"], info["logger"]) == ("INFO", "test_logs")
    assert info["message"].startswith("the key is ") and SECRET[:8] not in info["message"]
    assert warning["message"] == "three\nlines\nhere, naïve ✓ \u2028 and a separator"
    assert error["level"] == "ERROR" and error["message"] == "it failed"
    assert error["exception"].startswith("Traceback") and "ValueError: bad key" in \
        error["exception"]
    stamp = datetime.fromisoformat(info["time"])
    assert info["time"].endswith("Z") and stamp.tzinfo is not None
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 3600


def test_json_keeps_an_expected_failure_on_one_line(root: logging.Logger,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(logging.INFO, [SECRET], format="json")
    try:
        raise ModelStreamCut(f"the model server refused {SECRET}\nmore detail")
    except ModelStreamCut:
        logging.getLogger("test_logs").warning("a turn failed", exc_info=True)
    [entry] = [json.loads(line) for line in lines(capsys)]
    assert "exception" not in entry
    assert entry["message"].startswith("a turn failed (ModelStreamCut: the model server")
    assert SECRET not in entry["message"]


def test_a_write_conflict_is_one_line_and_its_traceback_only_with_v(
        root: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    for level in (logging.INFO, logging.DEBUG):  # DEBUG: `tandem -v`
        logs.setup(level, [SECRET])
        try:
            raise StoreConflict('write conflict: duplicate key value violates unique '
                                'constraint "turns_pkey"\nDETAIL:  Key (conv_id)=(1)')
        except StoreConflict:
            logging.getLogger("test_logs").error("failed to handle it", exc_info=True)
        written = lines(capsys)
        if level == logging.INFO:
            assert written == [written[0]] and written[0].endswith(
                'failed to handle it (StoreConflict: write conflict: duplicate key value '
                'violates unique constraint "turns_pkey")')
        else:
            assert "Traceback" in "\n".join(written) and "DETAIL" in "\n".join(written)


def test_text_stays_the_default(root: logging.Logger,
                                capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(logging.INFO, [SECRET])
    logging.getLogger("test_logs").info("token %s", SECRET)
    [line] = lines(capsys)
    assert " INFO test_logs: token " in line and SECRET not in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)
