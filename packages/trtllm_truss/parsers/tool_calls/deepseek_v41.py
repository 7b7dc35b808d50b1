"""DeepSeek V4.1 tool calls: V4's DSML with a space after `｜DSML｜` in every tag (`<｜DSML｜ calls>`,
`<｜DSML｜ invoke`, `<｜DSML｜ parameter`: the spaces are tokens of the model's format)."""

from __future__ import annotations

from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.tool_calls.dsml import DsmlToolParser


@register_tool_parser("deepseek_v41")
class DeepSeekV41ToolParser(DsmlToolParser):
    tag, section_name = "<｜DSML｜ ", "calls"
    forced = "no recorded DeepSeek V4.1 output to check xgrammar's deepseek_v4_1 format against"

# No template of V4.1 is public: found by its section tag, should a template spell it out.
register_family(Family("deepseek_v41", "DeepSeek V4.1", "deepseek_v41", "qwen3", template=("｜DSML｜ calls",)))
