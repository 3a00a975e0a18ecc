"""The PostgreSQL store's choices a chat made: the model a conversation uses (`/model`)."""

from __future__ import annotations

import time

from bot.store.postgres_base import PostgresBase


class PostgresChoices(PostgresBase):
    async def chat_model(self, conv_id: int) -> str | None:
        found = await self._row("SELECT model FROM chat_models WHERE conv_id=%s", (conv_id,))
        return None if found is None else str(found[0])

    async def set_chat_model(self, conv_id: int, model: str | None, by: str) -> None:
        if model is None:
            await self._count("DELETE FROM chat_models WHERE conv_id=%s", (conv_id,))
            return
        await self._count(
            "INSERT INTO chat_models (conv_id, model, chosen_by, at) VALUES (%s,%s,%s,%s)"
            " ON CONFLICT (conv_id) DO UPDATE SET model = excluded.model,"
            " chosen_by = excluded.chosen_by, at = excluded.at",
            (conv_id, model, by, time.time()))
