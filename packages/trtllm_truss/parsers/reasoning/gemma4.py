"""Gemma 4 reasoning: the thought channel, `<|channel>thought\\n...<channel|>`, which the answer
opens itself when thinking is on (the label `thought` is no text of the reasoning)."""

from __future__ import annotations

from trtllm_truss.parsers.base import ReasoningParser, register_reasoning_parser


@register_reasoning_parser("gemma4")
class Gemma4ReasoningParser(ReasoningParser):
    start, end, label = "<|channel>", "<channel|>", "thought\n"
    keep_tokens = ("<|channel>", "<channel|>")
