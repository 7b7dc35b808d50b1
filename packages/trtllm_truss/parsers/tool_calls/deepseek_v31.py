"""DeepSeek V3.1 (and V3.1-Terminus, V3.2-Exp) tool calls: `<｜tool▁calls▁begin｜>`, then per call
`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`, then `<｜tool▁calls▁end｜>`: V3's
tokens without V3's type and fence (`deepseek_v3` reads both shapes; this family differs in what it
forces)."""

from __future__ import annotations

from trtllm_truss.guides.tool_syntax import FamilySyntax
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.tool_calls.deepseek_v3 import CALLS_BEGIN, DeepSeekCalls


@register_tool_parser("deepseek_v31")
class DeepSeekV31ToolParser(DeepSeekCalls):
    forced = FamilySyntax("deepseek_v3_1")


register_family(
    Family("deepseek_v31", "DeepSeek V3.1", "deepseek_v31", "qwen3", template=(CALLS_BEGIN, "<｜Assistant｜></think>"), absent=("```json",))
)
