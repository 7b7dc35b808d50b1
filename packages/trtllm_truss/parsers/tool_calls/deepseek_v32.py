"""DeepSeek V3.2 tool calls: DSML in `<｜DSML｜function_calls>` (`parsers.tool_calls.dsml`)."""

from __future__ import annotations

from trtllm_truss.guides.tool_syntax import FamilySyntax
from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.tool_calls.dsml import DsmlToolParser


@register_tool_parser("deepseek_v32")
class DeepSeekV32ToolParser(DsmlToolParser):
    tag, section_name = "<｜DSML｜", "function_calls"
    forced = FamilySyntax(
        "deepseek_v3_2", differs="the calls block opens with a blank line (DeepSeek's encoder writes one after the content, empty or not)"
    )

register_family(Family("deepseek_v32", "DeepSeek V3.2", "deepseek_v32", "qwen3", template=("｜DSML｜", "function_calls")))
