"""The values of declared secrets, found where truss finds them, so they can be kept out of output.

truss resolves a secret declared under config.yaml `secrets:` from (later wins) its config.yaml default,
the variable `TRUSS_SECRET_<name>` and the file `/secrets/<name>` (truss's `SecretsResolver`); a model gets
them as the `secrets` mapping, which can be looked up but not iterated. Credentials can also arrive as
well-known variables (`HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`, ...). Every such value, whatever its shape, is
redacted from what validate/build/serve print or log (`config.errors.redact`) and stripped from the
environment of child processes (`trtllm_truss.config.child_env`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SECRET_ENV_PREFIX = "TRUSS_SECRET_"
SECRETS_MOUNT_DIR = Path("/secrets")  # where truss mounts deployment secrets, one file per name

# Variables that carry credentials by name (huggingface_hub's and AWS's); no child process needs them.
CREDENTIAL_VARIABLES = frozenset(
    {
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
    }
)


def is_credential_variable(name: str) -> bool:
    """A variable that holds a credential by its name: a well-known token variable or a truss secret."""
    return name in CREDENTIAL_VARIABLES or name.startswith(SECRET_ENV_PREFIX)


def declared_secret_names(truss_config: Mapping[str, Any]) -> dict[str, Any]:
    """config.yaml's `secrets:` section as name -> default value (None when not a mapping)."""
    section = truss_config.get("secrets") or {}
    return {str(name): value for name, value in section.items()} if isinstance(section, dict) else {}


def _lookup(mapping: Mapping[str, Any], name: str) -> Any:
    try:
        return mapping[name]
    except Exception:  # noqa: BLE001 - truss's mapping raises SecretNotFound for a missing value
        return None


def secret_value(name: str, secrets: Mapping[str, Any] | None, environ: Mapping[str, str]) -> str | None:
    """The value of the secret `name` as truss resolves it for a model (the `secrets` mapping, then
    TRUSS_SECRET_<name>, then /secrets/<name>), surrounding whitespace stripped; None when it has none."""
    value = _lookup(secrets, name) if secrets is not None else None
    value = value or environ.get(SECRET_ENV_PREFIX + name)
    path = SECRETS_MOUNT_DIR / name
    if not value and path.is_file():
        value = path.read_text(errors="replace")
    return str(value).strip() if value and str(value).strip() else None


def secret_values(
    declared: Mapping[str, Any] | Iterable[str] = (),
    *,
    secrets: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    mount_dir: Path | None = None,
) -> frozenset[str]:
    """Every value a secret can have in this process, as truss would resolve it, plus credential variables.

    `declared` is config.yaml's `secrets:` (name -> default, or just the names); `secrets` is truss's
    mapping; `environ` defaults to os.environ; `mount_dir` to /secrets. Each value is kept as found and
    with surrounding whitespace stripped (a mounted file often ends with a newline); empty values are dropped.
    """
    environ = os.environ if environ is None else environ
    mount_dir = SECRETS_MOUNT_DIR if mount_dir is None else mount_dir
    defaults = dict(declared) if isinstance(declared, Mapping) else {str(name): None for name in declared}
    found: list[Any] = []
    for name, default in defaults.items():
        found.append(default)
        found.append(environ.get(SECRET_ENV_PREFIX + name))
        if secrets is not None:
            found.append(_lookup(secrets, name))
        path = mount_dir / name
        try:
            if path.is_file():
                found.append(path.read_text(errors="replace"))
        except OSError:  # unreadable: nothing to redact that this process could have read
            pass
    found += [value for name, value in environ.items() if is_credential_variable(name)]
    values: set[str] = set()
    for value in found:
        if value is None or isinstance(value, bool):
            continue
        text = str(value)
        for candidate in (text, text.strip()):
            if candidate.strip():
                values.add(candidate)
    return frozenset(values)
