"""The store's contract, run against each backend: SQLite on a temporary file and a real PostgreSQL server
(Debian's, started once for the module on loopback; skipped where its binaries are absent). Owned (another
owner's object is absent), bounded (time to live; bytes, oldest first out), shared between processes, and
durable across a reopen."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_server import postgres_binaries, postgres_server
from trtllm_truss.config.store import StoreConfig
from trtllm_truss.store import Store, StoredObject, TooLarge, open_store, owner_of
from trtllm_truss.store.base import encode
from trtllm_truss.store.postgres import PostgresStore
from trtllm_truss.store.sqlite import SqliteStore

ALICE, BOB = owner_of("sk-alice"), owner_of("sk-bob")


@pytest.fixture(scope="module")
def postgres_url(tmp_path_factory) -> Iterator[str]:
    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (scripts/bootstrap.sh installs Debian's postgresql as root)")
    pytest.importorskip("psycopg")
    with postgres_server(tmp_path_factory.mktemp("postgres")) as url:
        yield url


_DATABASES = iter(range(1_000_000))


class Backend:
    """Opens stores of one backend, each test on its own database (file, or PostgreSQL database)."""

    def __init__(self, kind: str, tmp_path: Path, url: str | None) -> None:
        self.kind, self.tmp_path, self.url = kind, tmp_path, url
        if kind == "postgres":
            import psycopg

            name = f"t{next(_DATABASES)}_{int(time.time() * 1000) % 10**9}"
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            self.url = url.rsplit("/", 1)[0] + "/" + name

    def open(self, *, ttl_s: float = 3600.0, max_bytes: int = 1 << 20) -> Store:
        if self.kind == "sqlite":
            return SqliteStore(self.tmp_path / "store.sqlite3", ttl_s=ttl_s, max_bytes=max_bytes)
        return PostgresStore(self.url, ttl_s=ttl_s, max_bytes=max_bytes)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request, tmp_path) -> Backend:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    return Backend(request.param, tmp_path, url)


def _response(id: str, owner: str = ALICE, size: int = 100, status: str = "completed") -> StoredObject:
    return StoredObject("response", id, owner, status, {"id": id, "text": "x" * size})


def test_an_object_is_its_owners_alone(backend: Backend):
    store = backend.open()
    assert store.put(_response("resp_1"))
    assert store.get("response", "resp_1", ALICE).body["id"] == "resp_1"
    assert store.get("response", "resp_1", BOB) is None
    assert store.get("batch", "resp_1", ALICE) is None
    assert not store.delete("response", "resp_1", BOB)
    assert not store.update(_response("resp_1", owner=BOB, status="cancelled"))
    assert store.get("response", "resp_1", ALICE).status == "completed"
    assert store.delete("response", "resp_1", ALICE)
    assert store.get("response", "resp_1", ALICE) is None
    assert not store.delete("response", "resp_1", ALICE)
    stats = store.stats()
    assert (stats.objects, stats.bytes) == (0, 0)


def test_an_update_may_be_conditional_on_the_status(backend: Backend):
    store = backend.open()
    store.put(_response("resp_bg", status="in_progress"))
    assert store.update(_response("resp_bg", status="cancelled"), if_status=("queued", "in_progress"))
    assert not store.update(_response("resp_bg", status="completed"), if_status=("queued", "in_progress"))
    assert store.get("response", "resp_bg", ALICE).status == "cancelled"


@pytest.mark.one_python  # 10,000 writes: the bound is the store's, not the Python's
def test_ten_thousand_responses_at_a_1_mb_bound_keep_within_it_oldest_first_out(backend: Backend):
    bound = 1_000_000
    store = backend.open(max_bytes=bound)
    count = 10_000
    for i in range(count):
        assert store.put(_response(f"resp_{i:05d}", size=200 + i % 300))
        if i % 500 == 0:
            assert store.stats().bytes <= bound
    stats = store.stats()
    assert 0 < stats.bytes <= bound
    assert stats.evictions == count - stats.objects > 0
    kept = [i for i in range(count) if store.get("response", f"resp_{i:05d}", ALICE) is not None]
    assert len(kept) == stats.objects
    assert kept == list(range(count - len(kept), count))  # the newest, none missing: the oldest went first


def test_an_object_over_the_whole_bound_is_not_kept(backend: Backend):
    store = backend.open(max_bytes=2048)
    store.put(_response("small"))
    assert not store.put(_response("huge", size=4096))
    assert store.get("response", "huge", ALICE) is None
    assert store.get("response", "small", ALICE) is not None


def test_an_object_lives_its_time_to_live(backend: Backend):
    store = backend.open(ttl_s=0.5)
    store.put(_response("resp_short"))
    assert store.get("response", "resp_short", ALICE) is not None
    deadline = time.monotonic() + 10
    while store.get("response", "resp_short", ALICE) is not None:
        assert time.monotonic() < deadline, "never expired"
        time.sleep(0.05)
    store.put(_response("resp_next"))  # a write drops what expired and counts it
    stats = store.stats()
    assert (stats.objects, stats.expirations) == (1, 1)


def test_what_is_stored_outlives_the_store_object(backend: Backend):
    first = backend.open()
    first.put(_response("resp_durable"))
    first.close()
    again = backend.open()
    assert again.get("response", "resp_durable", ALICE).body["text"] == "x" * 100
    assert again.stats().objects == 1


def _writer(kind: str, where: str, worker: int, count: int) -> None:
    store = (SqliteStore(Path(where), ttl_s=3600, max_bytes=50_000) if kind == "sqlite"
             else PostgresStore(where, ttl_s=3600, max_bytes=50_000))
    for i in range(count):
        store.put(StoredObject("response", f"w{worker}_{i}", ALICE, "completed", {"text": "y" * 500}))


def test_processes_share_one_store_and_its_bound(backend: Backend):
    store = backend.open(max_bytes=50_000)
    where = str(backend.tmp_path / "store.sqlite3") if backend.kind == "sqlite" else backend.url
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_writer, args=(backend.kind, where, w, 100)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    stats = store.stats()
    assert stats.bytes <= 50_000
    assert stats.objects + stats.evictions == 400
    assert stats.objects == sum(
        store.get("response", f"w{w}_{i}", ALICE) is not None for w in range(4) for i in range(100)
    )


def _append(obj: StoredObject, item: str) -> StoredObject:
    obj.body["items"].append(item)
    return obj


def _appender(kind: str, where: str, worker: int, count: int) -> None:
    store = (SqliteStore(Path(where), ttl_s=3600, max_bytes=1 << 20) if kind == "sqlite"
             else PostgresStore(where, ttl_s=3600, max_bytes=1 << 20))
    for i in range(count):
        assert store.modify("conversation", "conv_1", ALICE, lambda obj: _append(obj, f"{worker}.{i}")) is not None


def test_modify_is_atomic_across_processes(backend: Backend):
    store = backend.open()
    store.put(StoredObject("conversation", "conv_1", ALICE, "active", {"items": []}))
    assert store.modify("conversation", "conv_1", BOB, lambda obj: _append(obj, "x")) is None  # not Bob's
    assert store.modify("conversation", "conv_1", ALICE, lambda obj: None).body == {"items": []}
    where = str(backend.tmp_path / "store.sqlite3") if backend.kind == "sqlite" else backend.url
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_appender, args=(backend.kind, where, w, 50)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    items = store.get("conversation", "conv_1", ALICE).body["items"]
    assert sorted(items) == sorted(f"{w}.{i}" for w in range(4) for i in range(50))  # none lost to a race
    assert store.stats().bytes == len(encode({"items": items}))


def test_a_change_past_the_whole_bound_is_refused_and_nothing_changes(backend: Backend):
    store = backend.open(max_bytes=2048)
    store.put(StoredObject("conversation", "conv_2", ALICE, "active", {"items": []}))
    with pytest.raises(TooLarge):
        store.modify("conversation", "conv_2", ALICE, lambda obj: _append(obj, "z" * 4096))
    assert store.get("conversation", "conv_2", ALICE).body == {"items": []}


def test_find_lists_by_kind_owner_and_status_oldest_first(backend: Backend):
    store = backend.open()
    for i, (owner, status) in enumerate([(ALICE, "in_progress"), (BOB, "in_progress"), (ALICE, "completed"), (ALICE, "in_progress")]):
        store.put(StoredObject("batch", f"batch_{i}", owner, status, {"i": i}, created_at=time.time() - 10 + i))
    store.put(_response("resp_other_kind", status="in_progress"))
    assert [o.id for o in store.find("batch", owner=ALICE)] == ["batch_0", "batch_2", "batch_3"]
    assert [o.id for o in store.find("batch", statuses=("in_progress",))] == ["batch_0", "batch_1", "batch_3"]
    assert [o.owner for o in store.find("batch", statuses=("in_progress",))] == [ALICE, BOB, ALICE]
    assert [o.id for o in store.find("batch", owner=BOB, statuses=("completed",))] == []
    assert [o.body["i"] for o in store.find("batch", limit=2)] == [0, 1]


def test_owner_is_a_hash_never_the_key():
    assert owner_of("sk-secret") != "sk-secret" and "sk-secret" not in owner_of("sk-secret")
    assert owner_of(None) == owner_of("") == ""


def test_config_picks_the_backend(tmp_path):
    assert open_store(StoreConfig(enabled=False)) is None
    store = open_store(StoreConfig(path=str(tmp_path / "a" / "s.sqlite3"), max_bytes=4096))
    assert isinstance(store, SqliteStore) and store.max_bytes == 4096 and (tmp_path / "a" / "s.sqlite3").is_file()
    with pytest.raises(ValueError, match="url_secret"):
        StoreConfig(backend="postgres")
