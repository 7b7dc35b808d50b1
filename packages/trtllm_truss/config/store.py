"""`model_metadata.trt_llm.runtime.store`: where what outlives a request is kept (stored Responses,
and later batches), how long and how much of it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trtllm_truss.config.fields import NonEmptyStr, StrictModel, field_problem

DEFAULT_SQLITE_PATH = "~/.cache/trtllm-truss/store.sqlite3"
THIRTY_DAYS_S = 30 * 24 * 3600.0  # OpenAI keeps stored responses 30 days


class StoreConfig(StrictModel):
    """The store: an SQLite file every front process on the host shares (the default), or a PostgreSQL
    server every replica points at (several hosts)."""

    enabled: bool = Field(
        True,
        description="false: nothing is kept; Responses' store, previous_response_id and background are refused (400).",
    )
    backend: Literal["sqlite", "postgres"] = Field(
        "sqlite", description="sqlite: one file on this host (WAL mode); postgres: a PostgreSQL server (url_secret)."
    )
    path: NonEmptyStr = Field(
        DEFAULT_SQLITE_PATH,
        description="The SQLite file (backend sqlite); its folder is created. Every front process of the host opens it.",
    )
    url_secret: NonEmptyStr | None = Field(
        None,
        description="Name of the truss secret holding the PostgreSQL connection string (backend postgres), e.g."
        " postgresql://user:password@host:5432/db (a secret: it may carry a password).",
    )
    ttl_s: float = Field(
        THIRTY_DAYS_S, gt=0.0, le=10 * 365 * 24 * 3600.0,
        description="Seconds an object is kept after it was made; then it is gone (404) and its bytes are freed.",
    )
    max_bytes: int = Field(
        1 << 30, ge=1024, le=1 << 44,
        description="Bytes of stored objects (their JSON) kept at most; past it the least recently written go first.",
    )
    busy_timeout_s: float = Field(
        10.0, gt=0.0, le=600.0,
        description="How long a write waits for another process's (SQLite's busy timeout, PostgreSQL's lock_timeout).",
    )

    @model_validator(mode="after")
    def _postgres_needs_url(self) -> StoreConfig:
        if self.enabled and self.backend == "postgres" and self.url_secret is None:
            raise field_problem("url_secret", "backend postgres needs url_secret: the secret holding its connection string")
        return self
