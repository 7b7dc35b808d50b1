"""The store's one interface and the SQL both database dialects share.

A stored object is JSON of one `kind` ("response"; "file", "batch" and a batch's inputs and answers) with an id, an owner
(the hash of the API key that made it: `owner_of`), a status and its body. Every read and write names
the owner: another owner's object is as absent as a missing one. The store is bounded: an object
lives `ttl_s` after it was made, and past `max_bytes` of bodies the least recently written objects go
first (for responses, written when made and when they end: the oldest), evicted within the write that
needed the room. Totals (bytes, objects, evictions, expirations) are kept in the
database beside the objects, so every process and replica reports the same numbers.

`SqlStore` is the algorithm over a DB-API connection; `store.sqlite` and `store.postgres` give it
their connection, their schema and how a write takes the store's lock.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

ANONYMOUS = ""  # the owner of what a request without any key stored


def owner_of(credential: str | None) -> str:
    """The owner id of a credential (an API key, a caller's token): its sha256, never the key itself;
    `ANONYMOUS` for none."""
    if not credential:
        return ANONYMOUS
    return hashlib.sha256(credential.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class StoredObject:
    kind: str
    id: str
    owner: str
    status: str
    body: dict[str, Any]
    created_at: float = field(default_factory=time.time)
    updated_at: float = 0.0  # set by the store on each write


@dataclass(frozen=True)
class StoreStats:
    bytes: int
    objects: int
    evictions: int  # objects dropped to stay within max_bytes
    expirations: int  # objects dropped at the end of their time to live
    max_bytes: int


class StoreError(RuntimeError):
    """The database could not be reached or refused a write."""


class TooLarge(StoreError):
    """A change would make one object larger than the whole bound."""


class Store(ABC):
    """What serving keeps between requests. Blocking calls (callers on an event loop run them in a thread)."""

    max_bytes: int
    ttl_s: float

    @abstractmethod
    def put(self, obj: StoredObject) -> bool:
        """Insert or replace `obj`; evicts the oldest objects past `max_bytes`. False (nothing kept)
        for an object larger than the whole bound."""

    @abstractmethod
    def get(self, kind: str, id: str, owner: str) -> StoredObject | None:
        """The owner's live object, or None (missing, expired or another owner's)."""

    @abstractmethod
    def add(self, obj: StoredObject) -> bool:
        """Insert `obj` only if no live object of its kind and id exists (whoever's); False if one does
        (or `obj` is larger than the whole bound). The write that records a batch line's answer is also its
        done mark: of two runs of one line, one answer is kept."""

    @abstractmethod
    def update(self, obj: StoredObject, *, if_status: Sequence[str] | None = None,
               if_updated_at: float | None = None) -> bool:
        """Replace an existing object's status and body; with `if_status`, only while its status is one
        of those (a cancel and the end of a run race: the first wins); with `if_updated_at`, only if no
        one wrote it since the read that saw that `updated_at` (a lease taken by one runner of several).
        False if nothing was changed."""

    @abstractmethod
    def modify(self, kind: str, id: str, owner: str, change: Callable[[StoredObject], StoredObject | None]) -> StoredObject | None:
        """Read, change and write one object atomically (no other write between): `change` gets the owner's
        object and returns it changed (written) or None (left as it is). The object as it is now; None if
        there is none."""

    @abstractmethod
    def find(self, kind: str, *, owner: str | None = None, statuses: Sequence[str] | None = None,
             limit: int = 100, id_prefix: str | None = None) -> list[StoredObject]:
        """Live objects of `kind`, oldest first: one owner's (a list route) or every owner's (None: what a
        restarted server resumes), with one of `statuses` if given, ids starting with `id_prefix` if given
        (a batch's answers)."""

    @abstractmethod
    def delete(self, kind: str, id: str, owner: str) -> bool:
        """Remove the owner's object; False if there was none."""

    @abstractmethod
    def stats(self) -> StoreStats: ...

    @abstractmethod
    def close(self) -> None: ...


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


class SqlStore(Store):
    """The store over one DB-API connection (used by one thread at a time, under `_lock`). Statements
    are written with `?` placeholders; a dialect with another style sets `placeholder`."""

    placeholder = "?"
    integrity_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, *, ttl_s: float, max_bytes: int) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    # --- the dialect ----------------------------------------------------------------------------

    @abstractmethod
    @contextmanager
    def _write(self) -> Iterator[Any]:
        """A cursor in a transaction that holds the store's write lock; committed at the end."""

    @abstractmethod
    @contextmanager
    def _read(self) -> Iterator[Any]:
        """A cursor for reads (no write lock); its transaction, if any, ended at the end."""

    @abstractmethod
    def _reset(self) -> None:
        """Drop the connection after an error (the next call reconnects)."""

    # --- helpers --------------------------------------------------------------------------------

    def _sql(self, statement: str) -> str:
        return statement if self.placeholder == "?" else statement.replace("?", self.placeholder)

    def _run(self, cursor: Any, statement: str, params: Sequence[Any] = ()) -> Any:
        cursor.execute(self._sql(statement), tuple(params))
        return cursor

    @contextmanager
    def _guarded(self) -> Iterator[None]:
        with self._lock:
            try:
                yield
            except StoreError:
                raise
            except Exception as exc:  # the driver's errors: a database gone, a full disk, a lock held too long
                self._reset()
                raise StoreError(f"the store failed: {type(exc).__name__}: {exc}") from exc

    def _insert(self, cur: Any, obj: StoredObject, data: bytes, now: float) -> None:
        """One new row for `obj` (none of its kind and id is left), counted, then the bound kept."""
        self._run(
            cur,
            "INSERT INTO store_objects (kind, id, owner, status, created_at, updated_at, expires_at, size, body)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (obj.kind, obj.id, obj.owner, obj.status, obj.created_at, now, obj.created_at + self.ttl_s, len(data), data),
        )
        self._add(cur, len(data), 1)
        self._evict(cur)

    # --- the interface --------------------------------------------------------------------------

    def put(self, obj: StoredObject) -> bool:
        data = encode(obj.body)
        if len(data) > self.max_bytes:
            return False
        now = time.time()
        obj.updated_at = now
        with self._guarded(), self._write() as cur:
            self._expire(cur, now)
            old = self._run(cur, "SELECT size FROM store_objects WHERE kind = ? AND id = ?", (obj.kind, obj.id)).fetchone()
            if old is not None:
                self._run(cur, "DELETE FROM store_objects WHERE kind = ? AND id = ?", (obj.kind, obj.id))
                self._add(cur, -old[0], -1)
            self._insert(cur, obj, data, now)
        return True

    def add(self, obj: StoredObject) -> bool:
        data = encode(obj.body)
        if len(data) > self.max_bytes:
            return False
        now = time.time()
        with self._guarded(), self._write() as cur:
            self._expire(cur, now)
            if self._run(cur, "SELECT 1 FROM store_objects WHERE kind = ? AND id = ?", (obj.kind, obj.id)).fetchone():
                return False
            self._insert(cur, obj, data, now)
        obj.updated_at = now
        return True

    def get(self, kind: str, id: str, owner: str) -> StoredObject | None:
        with self._guarded(), self._read() as cur:
            row = self._run(
                cur,
                "SELECT status, created_at, updated_at, body FROM store_objects"
                " WHERE kind = ? AND id = ? AND owner = ? AND expires_at > ?",
                (kind, id, owner, time.time()),
            ).fetchone()
        if row is None:
            return None
        return StoredObject(kind, id, owner, row[0], json.loads(bytes(row[3])), row[1], row[2])

    def update(self, obj: StoredObject, *, if_status: Sequence[str] | None = None,
               if_updated_at: float | None = None) -> bool:
        data = encode(obj.body)
        now = time.time()
        with self._guarded(), self._write() as cur:
            row = self._run(
                cur,
                "SELECT status, size, updated_at FROM store_objects WHERE kind = ? AND id = ? AND owner = ? AND expires_at > ?",
                (obj.kind, obj.id, obj.owner, now),
            ).fetchone()
            if row is None or (if_status is not None and row[0] not in if_status):
                return False
            if if_updated_at is not None and float(row[2]) != if_updated_at:
                return False
            if len(data) > self.max_bytes:
                return False
            self._run(
                cur,
                "UPDATE store_objects SET status = ?, body = ?, size = ?, updated_at = ? WHERE kind = ? AND id = ?",
                (obj.status, data, len(data), now, obj.kind, obj.id),
            )
            self._add(cur, len(data) - row[1], 0)
            self._evict(cur)
        obj.updated_at = now
        return True

    def modify(self, kind: str, id: str, owner: str, change: Callable[[StoredObject], StoredObject | None]) -> StoredObject | None:
        now = time.time()
        with self._guarded(), self._write() as cur:
            row = self._run(
                cur,
                "SELECT status, created_at, updated_at, body, size FROM store_objects"
                " WHERE kind = ? AND id = ? AND owner = ? AND expires_at > ?",
                (kind, id, owner, now),
            ).fetchone()
            if row is None:
                return None
            current = StoredObject(kind, id, owner, row[0], json.loads(bytes(row[3])), row[1], row[2])
            changed = change(current)
            if changed is None:
                return current
            data = encode(changed.body)
            if len(data) > self.max_bytes:
                raise TooLarge(f"the {kind} would be {len(data)} bytes, more than runtime.store.max_bytes ({self.max_bytes})")
            self._run(
                cur,
                "UPDATE store_objects SET status = ?, body = ?, size = ?, updated_at = ? WHERE kind = ? AND id = ?",
                (changed.status, data, len(data), now, kind, id),
            )
            self._add(cur, len(data) - int(row[4]), 0)
            self._evict(cur)
        changed.updated_at = now
        return changed

    def find(self, kind: str, *, owner: str | None = None, statuses: Sequence[str] | None = None,
             limit: int = 100, id_prefix: str | None = None) -> list[StoredObject]:
        where, params = ["kind = ?", "expires_at > ?"], [kind, time.time()]
        if id_prefix:
            where.append("substr(id, 1, ?) = ?")  # not LIKE: an id's '_' is no wildcard
            params.extend((len(id_prefix), id_prefix))
        if owner is not None:
            where.append("owner = ?")
            params.append(owner)
        if statuses is not None:
            if not statuses:
                return []
            where.append(f"status IN ({', '.join('?' for _ in statuses)})")
            params.extend(statuses)
        statement = (f"SELECT id, owner, status, created_at, updated_at, body FROM store_objects WHERE {' AND '.join(where)}"
                     " ORDER BY created_at, seq LIMIT ?")
        with self._guarded(), self._read() as cur:
            rows = self._run(cur, statement, [*params, int(limit)]).fetchall()
        return [StoredObject(kind, row[0], row[1], row[2], json.loads(bytes(row[5])), row[3], row[4]) for row in rows]

    def delete(self, kind: str, id: str, owner: str) -> bool:
        with self._guarded(), self._write() as cur:
            row = self._run(
                cur, "SELECT size FROM store_objects WHERE kind = ? AND id = ? AND owner = ? AND expires_at > ?",
                (kind, id, owner, time.time()),
            ).fetchone()
            if row is None:
                return False
            self._run(cur, "DELETE FROM store_objects WHERE kind = ? AND id = ?", (kind, id))
            self._add(cur, -row[0], -1)
        return True

    def stats(self) -> StoreStats:
        with self._guarded(), self._read() as cur:
            row = self._run(cur, "SELECT bytes, objects, evictions, expirations FROM store_totals WHERE one = 1").fetchone()
        return StoreStats(*(int(v) for v in row), max_bytes=self.max_bytes)

    # --- bounds ---------------------------------------------------------------------------------

    def _add(self, cur: Any, size: int, count: int, evicted: int = 0, expired: int = 0) -> None:
        self._run(
            cur,
            "UPDATE store_totals SET bytes = bytes + ?, objects = objects + ?, evictions = evictions + ?,"
            " expirations = expirations + ? WHERE one = 1",
            (size, count, evicted, expired),
        )

    def _expire(self, cur: Any, now: float) -> None:
        row = self._run(cur, "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM store_objects WHERE expires_at <= ?", (now,)).fetchone()
        if row[1]:
            self._run(cur, "DELETE FROM store_objects WHERE expires_at <= ?", (now,))
            self._add(cur, -int(row[0]), -int(row[1]), expired=int(row[1]))

    def _evict(self, cur: Any) -> None:
        """The least recently written objects out (a response is written when made and when it ends: the
        oldest) until the bodies fit `max_bytes` (the write's lock is held)."""
        total = int(self._run(cur, "SELECT bytes FROM store_totals WHERE one = 1").fetchone()[0])
        while total > self.max_bytes:
            rows = self._run(
                cur, "SELECT kind, id, size FROM store_objects ORDER BY updated_at, seq LIMIT 64"
            ).fetchall()
            if not rows:
                break
            freed, dropped = 0, []
            for kind, id, size in rows:
                if total - freed <= self.max_bytes:
                    break
                freed += int(size)
                dropped.append((kind, id))
            for kind, id in dropped:
                self._run(cur, "DELETE FROM store_objects WHERE kind = ? AND id = ?", (kind, id))
            self._add(cur, -freed, -len(dropped), evicted=len(dropped))
            total -= freed
