"""Mistral reasoning (Magistral, Mistral Small 4, Devstral with thinking): `[THINK]...[/THINK]`,
control tokens the answer opens itself."""

from __future__ import annotations

from trtllm_truss.parsers.base import ReasoningParser, register_reasoning_parser


@register_reasoning_parser("mistral")
class MistralReasoningParser(ReasoningParser):
    start, end = "[THINK]", "[/THINK]"
    keep_tokens = ("[THINK]", "[/THINK]")
