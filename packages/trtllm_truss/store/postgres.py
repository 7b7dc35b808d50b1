"""The store on a PostgreSQL server (psycopg 3): what several hosts share, every replica pointed at one
database. A write locks the one totals row (`SELECT ... FOR UPDATE`), so the bound is kept across
every process of every replica; reads take no lock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trtllm_truss.store.base import SqlStore

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS store_objects (
        seq BIGSERIAL PRIMARY KEY,
        kind TEXT NOT NULL, id TEXT NOT NULL, owner TEXT NOT NULL, status TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL, size BIGINT NOT NULL, body BYTEA NOT NULL,
        UNIQUE (kind, id))""",
    "CREATE INDEX IF NOT EXISTS store_objects_written ON store_objects (updated_at, seq)",
    "CREATE INDEX IF NOT EXISTS store_objects_expiry ON store_objects (expires_at)",
    """CREATE TABLE IF NOT EXISTS store_totals (
        one INTEGER PRIMARY KEY CHECK (one = 1), bytes BIGINT NOT NULL, objects BIGINT NOT NULL,
        evictions BIGINT NOT NULL, expirations BIGINT NOT NULL)""",
    "INSERT INTO store_totals VALUES (1, 0, 0, 0, 0) ON CONFLICT (one) DO NOTHING",
)
# Two replicas creating the schema at once: the second waits on this lock instead of failing.
_SCHEMA_LOCK_KEY = 0x7472746C6C6D


class PostgresStore(SqlStore):
    placeholder = "%s"

    def __init__(self, url: str, *, ttl_s: float, max_bytes: int, busy_timeout_s: float = 10.0) -> None:
        super().__init__(ttl_s=ttl_s, max_bytes=max_bytes)
        self._url = url
        self._busy_timeout_s = busy_timeout_s
        self._conn: Any = None
        with self._guarded(), self._write(totals=False) as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_KEY,))
            for statement in SCHEMA:
                cur.execute(statement)

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            import psycopg

            timeout_ms = int(self._busy_timeout_s * 1000)
            self._conn = psycopg.connect(
                self._url, connect_timeout=max(1, int(self._busy_timeout_s)),
                options=f"-c lock_timeout={timeout_ms} -c statement_timeout={4 * timeout_ms}",
            )
        return self._conn

    @contextmanager
    def _write(self, totals: bool = True) -> Iterator[Any]:
        conn = self._connection()
        with conn.transaction(), conn.cursor() as cur:
            if totals:
                cur.execute("SELECT bytes FROM store_totals WHERE one = 1 FOR UPDATE")
            yield cur

    @contextmanager
    def _read(self) -> Iterator[Any]:
        conn = self._connection()
        with conn.transaction(), conn.cursor() as cur:
            yield cur

    def _reset(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - a connection already broken
                pass
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._reset()
