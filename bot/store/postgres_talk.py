"""The PostgreSQL store's talk around conversations: messages Tandem saw, group talk not
addressed to it, and edits and deletions waiting for the next turn."""

from __future__ import annotations

import time
from collections.abc import Sequence

from bot.store import TalkRow
from bot.store.postgres_base import PostgresBase

_COLUMNS = "place, message_id, kind, author_id, author, outside, text, at, before"


class PostgresTalk(PostgresBase):
    async def keep_talk(self, row: TalkRow, keep: int) -> None:
        async with self._tx() as conn:
            await conn.execute(
                f"INSERT INTO talk ({_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                (row.place, row.message_id, row.kind, row.author_id, row.author, row.outside,
                 row.text, row.at or time.time(), row.before))
            await conn.execute(
                "DELETE FROM talk WHERE place=%s AND kind=%s AND seq NOT IN (SELECT seq"
                " FROM talk WHERE place=%s AND kind=%s ORDER BY seq DESC LIMIT %s)",
                (row.place, row.kind, row.place, row.kind, keep))

    async def talk_of(self, place: str, message_id: str) -> TalkRow | None:
        found = await self._row(
            f"SELECT {_COLUMNS} FROM talk WHERE place=%s AND message_id=%s"
            " AND kind IN ('said', 'aside') ORDER BY seq DESC LIMIT 1", (place, message_id))
        return None if found is None else TalkRow(*found)

    async def edit_talk(self, place: str, message_id: str, text: str) -> bool:
        async with self._tx() as conn:
            await conn.execute("UPDATE talk SET text=%s WHERE place=%s AND message_id=%s"
                               " AND kind='said'", (text, place, message_id))
            cur = await conn.execute("UPDATE talk SET text=%s WHERE place=%s AND"
                                     " message_id=%s AND kind='aside' AND NOT taken",
                                     (text, place, message_id))
            return cur.rowcount > 0

    async def take_talk(self, places: Sequence[str]) -> list[TalkRow]:
        if not places:
            return []
        async with self._tx() as conn:
            cur = await conn.execute(
                f"UPDATE talk SET taken=TRUE WHERE seq IN (SELECT seq FROM talk WHERE"
                f" place = ANY(%s) AND NOT taken AND kind <> 'said' FOR UPDATE)"
                f" RETURNING seq, {_COLUMNS}", (list(places),))
            rows = sorted(await cur.fetchall())
        return [TalkRow(*r[1:]) for r in rows]

    async def forget_talk(self, places: Sequence[str]) -> None:
        await self._count("DELETE FROM talk WHERE place = ANY(%s)", (list(places),))

    async def talk_authors(self, place: str) -> list[str]:
        rows = await self._rows(
            "SELECT max(author) FROM talk WHERE place=%s AND kind='said' GROUP BY author_id"
            " ORDER BY min(seq)", (place,))
        return [str(r[0]) for r in rows]
