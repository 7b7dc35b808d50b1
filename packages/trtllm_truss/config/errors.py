"""Configuration errors: one line per problem, each naming the full dotted key path.

A user must be able to act on a line alone, so every line carries the key path
(`model_metadata.trt_llm.build.quantization_type`), what was wrong, the allowed values and, when
the value came from the environment, the variable that set it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

SECTION_PATH = "model_metadata.trt_llm"

# Values that must never be echoed back: a URL's user-info and Hugging Face tokens.
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}\b")


class ConfigError(ValueError):
    """The configuration is invalid; `problems` holds one self-contained line per problem."""

    def __init__(self, problems: Iterable[str]):
        # redacted here so that no caller can log a credential by printing the error
        self.problems: list[str] = [redact(p) for p in problems]
        if not self.problems:
            raise ValueError("ConfigError needs at least one problem")
        super().__init__("\n".join(self.problems))


def redact(text: str) -> str:
    """Remove credentials a value may carry (URL user-info, `hf_...` tokens) before it is shown."""
    text = _URL_USERINFO.sub(r"\g<scheme>***@", text)
    return _HF_TOKEN.sub("hf_***", text)


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
