"""The environment every child process starts with: the parent's, minus every credential.

One function for every launch (tritonserver and, through it, each python-backend stub and MPI rank; the
engine build steps; stream workers): a child's environment is readable by anyone who can read
`/proc/<pid>/environ`, and none of these children downloads anything, so none gets a token. The parent
keeps its credentials for the downloads it does itself (artifacts/fetch.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from trtllm_truss.config.errors import known_secret_values
from trtllm_truss.config.secrets import (
    CREDENTIAL_VARIABLES,
    SECRET_ENV_PREFIX,
    is_credential_variable,
)

__all__ = ["CREDENTIAL_VARIABLES", "SECRET_ENV_PREFIX", "child_environment", "is_credential_variable"]


def child_environment(base: Mapping[str, str] | None = None, *, secrets: Iterable[str] = ()) -> dict[str, str]:
    """`base` (default: os.environ) without credentials, for a child process.

    Dropped: the credential variables by name (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, HF_HUB_TOKEN, AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_SECURITY_TOKEN), every TRUSS_SECRET_*, and any variable
    whose value (surrounding whitespace aside) is a secret's value: `secrets` plus every value this process
    has remembered (load_config remembers the declared secrets' values; see config/secrets.py). Everything
    else (PATH, PYTHONPATH, LD_LIBRARY_PATH, HF_HOME, CUDA_*, ...) is kept; callers add what they need.
    """
    if isinstance(secrets, Mapping):  # truss's mapping iterates names (or raises), never values
        raise TypeError("child_environment(secrets=...) takes secret values; use config.secrets.secret_values()")
    env = os.environ if base is None else base
    values = known_secret_values().union(secrets)
    stripped = {value.strip() for value in values if value and value.strip()}
    return {
        name: value
        for name, value in env.items()
        if not is_credential_variable(name) and value not in values and value.strip() not in stripped
    }
