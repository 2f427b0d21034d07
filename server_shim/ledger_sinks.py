"""Where usage records end up: a SQLite file (one server) or a Redis stream (workers and replicas).

Both writes are idempotent on the record id (the response id): SQLite by primary key, Redis by a
`SET NX` marker checked in the same Lua script as the `XADD`. Both run in a worker thread.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import orjson

from .ledger import UsageRecord

COLUMNS = list(UsageRecord._fields)
STREAM = "responses-ws:usage"
SEEN_PREFIX = "responses-ws:usage:seen:"
SEEN_TTL_S = 2 * 86400
"""How long a record id is remembered for deduplication (one small key per record, so not forever).

A record is written twice only by a retried batch or a replayed journal, both within seconds or
at the next start of a crashed server; a journal replayed more than two days after its crash
could count the few records flushed in the instant before the crash twice."""

_ROW = f"({', '.join('?' for _ in COLUMNS)})"
_INSERT = f"INSERT OR IGNORE INTO usage VALUES {_ROW}"
"""Takes a row as a plain tuple in column order, `estimated` (the last column) as 0 or 1: what SQLite stores for the
record itself, at about a quarter less of the writer's work per row. `sqlite3` reads a tuple subclass's values one
by one through its `__getitem__` slot (~700 instructions each), and "adapts" a bool before binding it as the
integer it stores (~3,300 instructions: a lookup that raises and clears an AttributeError)."""
ROWS_PER_INSERT = 50
_INSERT_ROWS = f"INSERT OR IGNORE INTO usage VALUES {', '.join([_ROW] * ROWS_PER_INSERT)}"
"""A batch is written `ROWS_PER_INSERT` rows a statement (the rest row by row): SQLite runs and resets a statement
once for them all, ~25% less of the writer's work per row than `executemany` of the one-row statement. Each row
is still ignored on its own when its id is there (`OR IGNORE`); 50 rows bind 700 values, under SQLite's oldest
default limit (999)."""

_NOTHING: dict[None, None] = {}
sqlite3.register_adapter(type(None), _NOTHING.get)
"""`None` "adapted" to itself (what an empty dict's `get` gives back for it, in C), found in `sqlite3`'s adapter
table: without an adapter registered for it, `sqlite3` asks its protocol for `__adapt__` and `None` for `__conform__`
before binding NULL, two failed attribute lookups, each an AttributeError made and cleared (~3,000 instructions per
NULL column of a row, with the writer thread holding the GIL). Process-wide, and what `sqlite3` binds for `None`
either way."""

_ADD_ONCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return redis.call('XADD', KEYS[2], '*', 'record', ARGV[2])
end
return false
"""


class SqliteSink:
    """One table, `usage`, keyed by response id; WAL mode so several workers can write one file.

    Calls come from worker threads (`asyncio.to_thread`), and a write abandoned by a cancelled
    flush may still be running when `close` comes: one lock serializes every use of the
    connection, so `close` waits for that write instead of freeing the connection under it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        columns = ", ".join(f"{name} {'TEXT PRIMARY KEY' if name == 'id' else ''}" for name in COLUMNS)
        self._db.execute(f"CREATE TABLE IF NOT EXISTS usage ({columns})")
        if "estimated" not in {row[1] for row in self._db.execute("PRAGMA table_info(usage)")}:
            self._db.execute("ALTER TABLE usage ADD COLUMN estimated DEFAULT 0")  # a file from before the column
        self._db.execute("CREATE INDEX IF NOT EXISTS usage_created ON usage (created_at)")
        self._db.commit()
        self._cursor = self._db.cursor()
        """Every write's cursor: the connection keeps a weak reference to each cursor made from it, dropped only
        every 200 cursors, so a cursor per write left up to 200 dead references allocated during a burst."""

    def write(self, records: list[UsageRecord]) -> None:
        rows = [(*record[:-1], 1 if record.estimated else 0) for record in records]
        whole = len(rows) - len(rows) % ROWS_PER_INSERT
        with self._lock, self._db:
            for start in range(0, whole, ROWS_PER_INSERT):
                self._cursor.execute(_INSERT_ROWS, list(chain.from_iterable(rows[start : start + ROWS_PER_INSERT])))
            if whole < len(rows):
                self._cursor.executemany(_INSERT, rows[whole:])

    def read(self, since: float | None = None, tenant: str | None = None) -> Iterator[UsageRecord]:
        query = f"SELECT {', '.join(COLUMNS)} FROM usage WHERE created_at >= ?"
        args: list[Any] = [since or 0.0]
        if tenant is not None:
            query += " AND tenant = ?"
            args.append(tenant)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created_at", args).fetchall()
        for row in rows:
            record = UsageRecord(*row)
            yield record._replace(estimated=bool(record.estimated))  # SQLite keeps a boolean as 0 or 1

    def close(self) -> None:
        with self._lock:
            self._db.close()


class RedisStreamSink:
    """`XADD responses-ws:usage * record <json>`, once per id; readers use `XRANGE`."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._add_once = self._redis.register_script(_ADD_ONCE)

    def write(self, records: list[UsageRecord]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for record in records:
            payload = orjson.dumps(record._asdict())  # an object by field name, as readers of the stream expect
            self._add_once(keys=[SEEN_PREFIX + record.id, STREAM], args=[SEEN_TTL_S, payload], client=pipe)
        pipe.execute()

    def read(self, since: float | None = None, tenant: str | None = None) -> Iterator[UsageRecord]:
        """Stream ids are the time of the write, never before `created_at`: a range from `since`, then a filter."""
        start = f"{int((since or 0) * 1000)}-0"
        while True:
            entries: list[Any] = self._redis.xrange(STREAM, min=start, count=1000) or []
            for _, fields_ in entries:
                record = UsageRecord.from_json(orjson.loads(fields_[b"record"]))
                if record.created_at >= (since or 0) and (tenant is None or record.tenant == tenant):
                    yield record
            if len(entries) < 1000:
                return
            start = "(" + entries[-1][0].decode()

    def close(self) -> None:
        self._redis.close()
