"""MiniMax-M3 reasoning: `<mm:think>...</mm:think>`. In a conversation the template closes earlier
turns' thinking with a bare `</mm:think>`, so an answer without thinking may open with one: it is
no text."""

from __future__ import annotations

from trtllm_truss.parsers.base import ReasoningParser, register_reasoning_parser


@register_reasoning_parser("minimax_m3")
class MiniMaxM3ReasoningParser(ReasoningParser):
    start, end = "<mm:think>", "</mm:think>"
    stray_end = True
    keep_tokens = ("<mm:think>", "</mm:think>")
