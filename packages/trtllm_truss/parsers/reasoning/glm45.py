"""GLM-4.5 / 4.6 / 4.7 reasoning: `<think>...</think>` (the template closes an empty block in the
prompt when thinking is off, and GLM-4.7's opens `<think>` in it when on); a call may follow the
thinking without `</think>`: `<tool_call>` ends the reasoning too."""

from __future__ import annotations

from trtllm_truss.parsers.base import ReasoningParser, register_reasoning_parser
from trtllm_truss.parsers.reasoning.think import THINK


@register_reasoning_parser("glm45")
class Glm45ReasoningParser(ReasoningParser):
    keep_tokens = THINK
    ends_at = ("<tool_call>",)
