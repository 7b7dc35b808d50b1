"""`<think>...</think>` reasoning (DeepSeek-R1, Qwen3, QwQ, and the families whose templates write
it the same way: DeepSeek V3.1, MiniMax-M2, Kimi K2 Thinking, Poolside).

- `deepseek_r1`: R1's template opens `<think>` in the prompt, so the answer starts inside the
  reasoning (whether or not it repeats the tag) until `</think>` (or its calls, which it cannot
  make while thinking); an answer that never closes it is all reasoning.
- `qwen3`: reasoning only where the answer opens `<think>` itself, or the prompt ends with it
  (Qwen3 thinking-2507, DeepSeek V3.1 with `thinking`, MiniMax-M2 templates);
  `chat_template_kwargs: {"enable_thinking": false}` makes Qwen3's template close an empty think
  block in the prompt, and the whole answer is text.
"""

from __future__ import annotations

from trtllm_truss.parsers.base import ReasoningParser, register_reasoning_parser

THINK = ("<think>", "</think>")
CALLS_BEGIN = "<｜tool▁calls▁begin｜>"


@register_reasoning_parser("deepseek_r1")
class DeepSeekR1ReasoningParser(ReasoningParser):
    keep_tokens = (*THINK, CALLS_BEGIN)
    ends_at = (CALLS_BEGIN,)  # no call is made inside the thinking: calls after it end it

    def starts_in_reasoning(self, prompt_tail: str) -> bool:
        return True


@register_reasoning_parser("qwen3")
class Qwen3ReasoningParser(ReasoningParser):
    keep_tokens = THINK
