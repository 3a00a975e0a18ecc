"""The SQLite store's talk around conversations: messages Tandem saw, group talk not
addressed to it, and edits and deletions waiting for the next turn."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

from bot.store import TalkRow
from bot.store.sqlite_base import SQLiteBase

_COLUMNS = "place, message_id, kind, author_id, author, outside, text, at, before"


def _row(r: Sequence[object]) -> TalkRow:
    return TalkRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), bool(r[5]),
                   str(r[6]), float(r[7]), str(r[8]))  # type: ignore[arg-type]


class SQLiteTalk(SQLiteBase):
    async def keep_talk(self, row: TalkRow, keep: int) -> None:
        def fn(db: sqlite3.Connection) -> None:
            db.execute(f"INSERT INTO talk ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)",
                       (row.place, row.message_id, row.kind, row.author_id, row.author,
                        int(row.outside), row.text, row.at or time.time(), row.before))
            db.execute("DELETE FROM talk WHERE place=? AND kind=? AND seq NOT IN (SELECT seq"
                       " FROM talk WHERE place=? AND kind=? ORDER BY seq DESC LIMIT ?)",
                       (row.place, row.kind, row.place, row.kind, keep))

        await self._tx(fn)

    async def talk_of(self, place: str, message_id: str) -> TalkRow | None:
        def fn(db: sqlite3.Connection) -> TalkRow | None:
            found = db.execute(
                f"SELECT {_COLUMNS} FROM talk WHERE place=? AND message_id=?"
                " AND kind IN ('said', 'aside') ORDER BY seq DESC LIMIT 1",
                (place, message_id)).fetchone()
            return None if found is None else _row(found)

        return await self._run(fn)

    async def edit_talk(self, place: str, message_id: str, text: str) -> bool:
        def fn(db: sqlite3.Connection) -> bool:
            db.execute("UPDATE talk SET text=? WHERE place=? AND message_id=? AND kind='said'",
                       (text, place, message_id))
            return db.execute("UPDATE talk SET text=? WHERE place=? AND message_id=?"
                              " AND kind='aside' AND taken=0",
                              (text, place, message_id)).rowcount > 0

        return await self._tx(fn)

    async def take_talk(self, places: Sequence[str]) -> list[TalkRow]:
        marks = ",".join("?" * len(places))

        def fn(db: sqlite3.Connection) -> list[TalkRow]:
            rows = db.execute(
                f"SELECT seq, {_COLUMNS} FROM talk WHERE place IN ({marks}) AND taken=0"
                " AND kind <> 'said' ORDER BY seq", tuple(places)).fetchall()
            db.executemany("UPDATE talk SET taken=1 WHERE seq=?", [(r[0],) for r in rows])
            return [_row(r[1:]) for r in rows]

        return await self._tx(fn) if places else []

    async def forget_talk(self, places: Sequence[str]) -> None:
        await self._tx(lambda db: db.executemany(
            "DELETE FROM talk WHERE place=?", [(p,) for p in places]))

    async def talk_authors(self, place: str) -> list[str]:
        return await self._run(lambda db: [str(r[0]) for r in db.execute(
            "SELECT author FROM talk WHERE place=? AND kind='said' GROUP BY author_id"
            " ORDER BY MIN(seq)", (place,))])
