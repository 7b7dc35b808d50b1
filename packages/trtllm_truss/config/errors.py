"""Configuration errors: one line per problem, each naming the full dotted key path.

A user must be able to act on a line alone, so every line carries the key path
(`model_metadata.trt_llm.build.quantization_type`), what was wrong, the allowed values and, when
the value came from the environment, the variable that set it.
"""

from __future__ import annotations

import difflib
import logging
import re
import threading
from collections.abc import Iterable

SECTION_PATH = "model_metadata.trt_llm"
REDACTED = "***"

# Values that must never be echoed back: a URL's user-info and Hugging Face tokens.
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}\b")

# The values of every secret this process has seen declared (config.secrets.secret_values), whatever
# their shape. Process-wide on purpose: an error or log line raised anywhere must not show one.
_secret_values: frozenset[str] = frozenset()
_secret_lock = threading.Lock()


def remember_secret_values(values: Iterable[str]) -> None:
    """Add secret values that `redact` (and so every ConfigError, validate, build, serve) hides."""
    global _secret_values
    with _secret_lock:
        _secret_values = _secret_values | {v for v in values if v and v.strip()}


def known_secret_values() -> frozenset[str]:
    return _secret_values


def forget_secret_values() -> None:
    """For tests: start from no remembered secret values."""
    global _secret_values
    with _secret_lock:
        _secret_values = frozenset()


class ConfigError(ValueError):
    """The configuration is invalid; `problems` holds one self-contained line per problem."""

    def __init__(self, problems: Iterable[str]):
        # redacted here so that no caller can log a credential by printing the error
        self.problems: list[str] = [redact(p) for p in problems]
        if not self.problems:
            raise ValueError("ConfigError needs at least one problem")
        super().__init__("\n".join(self.problems))


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Remove credentials before `text` is shown: every remembered secret value and `secrets` (longest
    first, so a value containing another is hidden whole), URL user-info and `hf_...` tokens."""
    for value in sorted(_secret_values.union(secrets), key=len, reverse=True):
        if value and value.strip():
            text = text.replace(value, REDACTED)
    text = _URL_USERINFO.sub(r"\g<scheme>***@", text)
    return _HF_TOKEN.sub("hf_***", text)


class RedactingFilter(logging.Filter):
    """A handler filter: the record's message and traceback with every secret value hidden (`redact`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Put a RedactingFilter on every handler of `logger` (default: the root logger), once each."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def show_value(value: object, limit: int = 80) -> str:
    """A short, credential-free rendering of a user-supplied value for messages."""
    text = redact(repr(value) if isinstance(value, str) else str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def closest(name: str, candidates: Iterable[str]) -> str | None:
    match = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=0.6)
    return match[0] if match else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """' did you mean X?' for the closest candidate, or '' when nothing is close."""
    match = closest(name, candidates)
    return f" did you mean {match!r}?" if match else ""


def dotted(*parts: object) -> str:
    return ".".join(str(p) for p in parts if p != "")
