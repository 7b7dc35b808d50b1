"""Kimi K2 Thinking reasoning: `<think>...</think>`, which the model opens itself; its calls
may follow the thinking without `</think>`: `<|tool_calls_section_begin|>` (or a call's own
`<|tool_call_begin|>`) ends it too."""

from __future__ import annotations

from trtllm_truss.parsers.base import ReasoningParser, register_reasoning_parser
from trtllm_truss.parsers.reasoning.think import THINK


@register_reasoning_parser("kimi_k2")
class KimiK2ReasoningParser(ReasoningParser):
    keep_tokens = (*THINK, "<|tool_calls_section_begin|>", "<|tool_call_begin|>")
    ends_at = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")
