"""The SQLite store's choices a chat made: the model a conversation uses (`/model`)."""

from __future__ import annotations

import sqlite3
import time

from bot.store.sqlite_base import SQLiteBase


class SQLiteChoices(SQLiteBase):
    async def chat_model(self, conv_id: int) -> str | None:
        def fn(db: sqlite3.Connection) -> str | None:
            found = db.execute("SELECT model FROM chat_models WHERE conv_id=?",
                               (conv_id,)).fetchone()
            return None if found is None else str(found[0])

        return await self._run(fn)

    async def set_chat_model(self, conv_id: int, model: str | None, by: str) -> None:
        def fn(db: sqlite3.Connection) -> None:
            if model is None:
                db.execute("DELETE FROM chat_models WHERE conv_id=?", (conv_id,))
                return
            db.execute("INSERT INTO chat_models (conv_id, model, chosen_by, at) VALUES (?,?,?,?)"
                       " ON CONFLICT (conv_id) DO UPDATE SET model = excluded.model,"
                       " chosen_by = excluded.chosen_by, at = excluded.at",
                       (conv_id, model, by, time.time()))

        await self._tx(fn)
