"""The store in an SQLite file (Python's own sqlite3): the embedded default, one file that every front
process of the host opens. WAL mode lets readers go on beside a writer; a write takes the file's lock
with `BEGIN IMMEDIATE` and waits up to the busy timeout for another process's."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trtllm_truss.store.base import SqlStore

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS store_objects (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL, id TEXT NOT NULL, owner TEXT NOT NULL, status TEXT NOT NULL,
        created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL NOT NULL,
        size INTEGER NOT NULL, body BLOB NOT NULL,
        UNIQUE (kind, id))""",
    "CREATE INDEX IF NOT EXISTS store_objects_written ON store_objects (updated_at, seq)",
    "CREATE INDEX IF NOT EXISTS store_objects_expiry ON store_objects (expires_at)",
    """CREATE TABLE IF NOT EXISTS store_totals (
        one INTEGER PRIMARY KEY CHECK (one = 1), bytes INTEGER NOT NULL, objects INTEGER NOT NULL,
        evictions INTEGER NOT NULL, expirations INTEGER NOT NULL)""",
    "INSERT OR IGNORE INTO store_totals VALUES (1, 0, 0, 0, 0)",
)


class SqliteStore(SqlStore):
    def __init__(self, path: str | Path, *, ttl_s: float, max_bytes: int, busy_timeout_s: float = 10.0) -> None:
        super().__init__(ttl_s=ttl_s, max_bytes=max_bytes)
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        with self._guarded(), self._write() as cur:
            for statement in SCHEMA:
                cur.execute(statement)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            # isolation_level None: transactions are ours (BEGIN IMMEDIATE); used under the store's lock
            # from whichever thread asyncio.to_thread picks.
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")  # durable at each checkpoint; WAL keeps the file consistent
            self._conn = conn
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[Any]:
        conn = self._connection()
        cur = conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            conn.rollback()
            raise
        else:
            conn.commit()
        finally:
            cur.close()

    @contextmanager
    def _read(self) -> Iterator[Any]:
        cur = self._connection().cursor()
        try:
            yield cur
        finally:
            cur.close()

    def _reset(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._reset()
