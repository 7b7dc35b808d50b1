"""`<think>...</think>` reasoning (DeepSeek-R1, Qwen3, QwQ).

- `deepseek_r1`: R1's template opens `<think>` in the prompt, so the answer starts inside the
  reasoning (whether or not it repeats the tag) until `</think>`; an answer that never closes it is
  all reasoning.
- `qwen3`: reasoning only where the answer opens `<think>` itself, or the prompt ends with it
  (Qwen3 thinking-2507 templates); `chat_template_kwargs: {"enable_thinking": false}` makes
  Qwen3's template close an empty think block in the prompt, and the whole answer is text.
"""

from __future__ import annotations

from trtllm_truss.parsers.base import ReasoningParser, register_reasoning_parser


@register_reasoning_parser("deepseek_r1")
class DeepSeekR1ReasoningParser(ReasoningParser):
    def starts_in_reasoning(self, prompt_tail: str) -> bool:
        return True


@register_reasoning_parser("qwen3")
class Qwen3ReasoningParser(ReasoningParser):
    pass
