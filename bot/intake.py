"""What a user message becomes before it enters the history.

Control characters are removed, an empty message gets a clear answer, and a message
too long for the context is kept whole in the workspace: the model sees its start and
where the rest is, so nothing is lost.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from bot.config import Config

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b\ufeff]")
PREVIEW_CHARS = 4000


def intake(text: str, config: Config) -> tuple[str, str | None]:
    """(text for the model, note for the user or None)."""
    text = _CONTROL.sub("", text.replace("\r\n", "\n")).strip()
    if not text:
        return "", "Your message was empty, so there is nothing to answer. Send some text."
    limit = config.limits.max_message_chars
    if len(text) <= limit:
        return text, None
    folder = Path(config.workspace.dir) / "inbox"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"message-{time.time_ns()}.txt"
    (folder / name).write_text(text, encoding="utf-8")
    note = (f"Your message has {len(text):,} characters, more than the {limit:,} Tandem "
            f"passes to the model at once. It is saved whole as inbox/{name} in the "
            "workspace; the model sees the start and can read the rest from that file.")
    model_text = (f"{text[:PREVIEW_CHARS]}\n\n[The message continues: {len(text):,} characters "
                  f"in all, saved as inbox/{name} in the workspace; use read_file to read it.]")
    return model_text, note
