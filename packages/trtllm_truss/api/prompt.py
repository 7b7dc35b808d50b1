"""The proxy's view of the tokenizer: chat templates and prompt token counts, loaded once.

The prompt is tokenized again inside Triton's preprocessing; counting it here as well is what lets
an over-long prompt be answered with a 400 instead of reaching the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_truss.api.errors import field_error
from trtllm_truss.api.native import ChatMessage


@dataclass
class PromptTokenizer:
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    # Must match the preprocessing model's `add_special_tokens` so that counts agree.
    add_special_tokens: bool = True

    @classmethod
    def load(cls, tokenizer_dir: Path, *, add_special_tokens: bool = True) -> PromptTokenizer:
        from transformers import AutoTokenizer  # seconds of import: only when the service loads

        return cls(AutoTokenizer.from_pretrained(str(tokenizer_dir)), add_special_tokens)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])

    def count_completion(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0

    def render_chat(self, messages: Sequence[ChatMessage], field: str = "messages") -> str:
        """The prompt text for chat turns, ending with the assistant's turn opened."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise field_error(field, "this model's tokenizer has no chat template; send a plain prompt instead")
        turns = [{"role": m.role, "content": m.text()} for m in messages]
        try:
            return self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja's raise_exception(): the template refuses these turns
            raise field_error(field, f"the chat template rejected these messages: {exc}") from exc
