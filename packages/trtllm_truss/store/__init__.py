"""What outlives a request (stored Responses; batches later), behind one interface (`store.base.Store`):
an SQLite file on one host (`store.sqlite`), a PostgreSQL server for several (`store.postgres`).
`open_store` picks the one `runtime.store` names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtllm_truss.store.base import ANONYMOUS, Store, StoredObject, StoreError, StoreStats, TooLarge, owner_of

if TYPE_CHECKING:
    from trtllm_truss.config.store import StoreConfig

__all__ = ["ANONYMOUS", "Store", "StoreError", "StoreStats", "StoredObject", "TooLarge", "open_store", "owner_of"]


def open_store(config: StoreConfig, url: str | None = None) -> Store | None:
    """The store `config` describes (None when disabled); `url`: the PostgreSQL connection string read
    from `config.url_secret` by the caller."""
    if not config.enabled:
        return None
    bounds = dict(ttl_s=config.ttl_s, max_bytes=config.max_bytes, busy_timeout_s=config.busy_timeout_s)
    if config.backend == "postgres":
        from trtllm_truss.store.postgres import PostgresStore

        if not url:
            raise StoreError("runtime.store.url_secret: the secret holds no connection string")
        return PostgresStore(url, **bounds)
    from trtllm_truss.store.sqlite import SqliteStore

    return SqliteStore(config.path, **bounds)
