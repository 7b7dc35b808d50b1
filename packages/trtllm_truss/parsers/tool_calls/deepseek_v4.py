"""DeepSeek V4 tool calls: DSML in `<｜DSML｜tool_calls>` (`parsers.tool_calls.dsml`)."""

from __future__ import annotations

from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.tool_calls.dsml import DsmlToolParser


@register_tool_parser("deepseek_v4")
class DeepSeekV4ToolParser(DsmlToolParser):
    tag, section_name = "<｜DSML｜", "tool_calls"
    forced = "xgrammar's deepseek_v4 format opens the calls block with a blank line, which the one recorded V4 output (vLLM's test) does not have"

# No template of V4 is public: found by its section tag, should a template spell it out.
register_family(Family("deepseek_v4", "DeepSeek V4", "deepseek_v4", "qwen3", template=("｜DSML｜tool_calls",)))
