"""The deployment's store as each front opens it (`runtime.store`): the PostgreSQL connection string read
from its truss secret, the store opened, its size put on `/metrics`. Truss's server opens it in
`LLMService.load`; the direct front's launcher opens it once (a bad path or an unreachable server fails
the start, not the first request) and hands the connection string to each frontend, which opens its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtllm_truss.config import ConfigError
from trtllm_truss.config.store import StoreConfig
from trtllm_truss.store import Store, StoreError, open_store


def store_url(config: StoreConfig, secrets: Mapping[str, Any] | None, environ: Mapping[str, str]) -> str | None:
    """The value of `config.url_secret` as truss resolves a secret (the `secrets` mapping, then
    TRUSS_SECRET_<name>, then /secrets/<name>); None for the SQLite backend."""
    if not config.enabled or config.backend != "postgres" or config.url_secret is None:
        return None
    from trtllm_truss.config.errors import remember_secret_values
    from trtllm_truss.config.secrets import SECRET_ENV_PREFIX, SECRETS_MOUNT_DIR

    name = config.url_secret
    value = None
    if secrets is not None:
        try:
            value = secrets[name]
        except Exception:  # noqa: BLE001 - truss's mapping raises SecretNotFound
            value = None
    value = value or environ.get(SECRET_ENV_PREFIX + name)
    path = SECRETS_MOUNT_DIR / name
    if not value and path.is_file():
        value = path.read_text(errors="replace")
    if not value or not str(value).strip():
        raise ConfigError([
            f"model_metadata.trt_llm.runtime.store.url_secret: the secret {name!r} has no value"
            f" (set it in the deployment's secrets, or {SECRET_ENV_PREFIX}{name} locally)"
        ])
    url = str(value).strip()
    remember_secret_values(_secret_parts(url))
    return url


def _secret_parts(url: str) -> set[str]:
    """The connection string and its password (URL or key=value form): redacted wherever they would show."""
    import re
    from urllib.parse import urlsplit

    parts = {url}
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        parts.add(password)
    for quoted, bare in re.findall(r"password\s*=\s*(?:'([^']*)'|(\S+))", url):
        parts.add(quoted or bare)
    return parts


def open_deployment_store(config: StoreConfig, url: str | None, *, metrics: bool = True) -> Store | None:
    """The store (None when disabled), its series on `/metrics` when `metrics`; a store that cannot be
    opened is a configuration error naming the key."""
    try:
        store = open_store(config, url)
    except StoreError as exc:
        raise ConfigError([f"model_metadata.trt_llm.runtime.store: {exc}"]) from None
    except OSError as exc:
        raise ConfigError([f"model_metadata.trt_llm.runtime.store.path: {exc}"]) from None
    if store is not None and metrics:
        from trtllm_truss.serving.core import SERVED_MODEL_NAME
        from trtllm_truss.store.metrics import register_store_metrics

        register_store_metrics(store, SERVED_MODEL_NAME)
    return store
