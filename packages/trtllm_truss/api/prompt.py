"""The proxy's view of the tokenizer: chat templates and token counts, loaded once.

Prompts are tokenized inside Triton's preprocessing, which also refuses prompts over max_input_len
(the proxy turns that error into a 400, service.py). Counting every prompt here as well was the
largest single cost of a request in the proxy (~0.4 ms on the event loop for a 128-token prompt,
docs/performance.md), so the proxy counts a prompt only when it is long enough in UTF-8 bytes to
possibly exceed max_input_len (then it is refused before reaching Triton) or when a response reports
usage (`PromptTokens`), and then with the `tokenizers` backend directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_truss.api.errors import field_error
from trtllm_truss.api.native import ChatMessage


@dataclass
class PromptTokenizer:
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    # Must match the preprocessing model's `add_special_tokens` so that counts agree.
    add_special_tokens: bool = True
    # The `tokenizers.Tokenizer` behind a fast transformers tokenizer: the same ids without
    # transformers' BatchEncoding per call. None (a slow tokenizer): transformers counts.
    backend: Any = field(default=None, repr=False)

    @classmethod
    def load(cls, tokenizer_dir: Path, *, add_special_tokens: bool = True) -> PromptTokenizer:
        from transformers import AutoTokenizer  # seconds of import: only when the service loads

        return cls.of(AutoTokenizer.from_pretrained(str(tokenizer_dir)), add_special_tokens=add_special_tokens)

    @classmethod
    def of(cls, tokenizer: Any, *, add_special_tokens: bool = True) -> PromptTokenizer:
        return cls(tokenizer, add_special_tokens, getattr(tokenizer, "backend_tokenizer", None))

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def count(self, text: str) -> int:
        if self.backend is not None:
            return len(self.backend.encode(text, add_special_tokens=self.add_special_tokens).ids)
        return len(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])

    def count_completion(self, text: str) -> int:
        if not text:
            return 0
        if self.backend is not None:
            return len(self.backend.encode(text, add_special_tokens=False).ids)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_tokens(self, text: str) -> PromptTokens:
        return PromptTokens(self, text)

    def render_chat(self, messages: Sequence[ChatMessage], field: str = "messages") -> str:
        """The prompt text for chat turns, ending with the assistant's turn opened."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise field_error(field, "this model's tokenizer has no chat template; send a plain prompt instead")
        turns = [{"role": m.role, "content": m.text()} for m in messages]
        try:
            return self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja's raise_exception(): the template refuses these turns
            raise field_error(field, f"the chat template rejected these messages: {exc}") from exc


class PromptTokens:
    """A prompt's token count, computed on first use: only responses that report usage need it."""

    __slots__ = ("_tokenizer", "_text", "_count")

    def __init__(self, tokenizer: PromptTokenizer, text: str) -> None:
        self._tokenizer = tokenizer
        self._text = text
        self._count: int | None = None

    @property
    def counted(self) -> bool:
        return self._count is not None

    @property
    def value(self) -> int:
        if self._count is None:
            self._count = self._tokenizer.count(self._text)
        return self._count
