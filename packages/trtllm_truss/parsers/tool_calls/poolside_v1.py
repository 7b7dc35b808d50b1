"""Poolside's Laguna models (`poolside_v1`): GLM-4.5's call format, `<tool_call>NAME` then
`<arg_key>KEY</arg_key>` / `<arg_value>VALUE</arg_value>` pairs and `</tool_call>`, in a template of
its own (`<assistant>` turns)."""

from __future__ import annotations

from trtllm_truss.parsers.base import register_tool_parser
from trtllm_truss.parsers.detect import Family, register_family
from trtllm_truss.parsers.tool_calls.glm45 import NO_THINKING, KeyValueCalls


@register_tool_parser("poolside_v1")
class PoolsideV1ToolParser(KeyValueCalls):
    forced = NO_THINKING  # no recorded thinking to check GLM-4.7's shape against

# No Laguna template is public: a template with GLM's pairs but not GLM's `[gMASK]` is taken for it.
register_family(Family("poolside_v1", "Poolside Laguna", "poolside_v1", "qwen3", template=("<tool_call>", "<arg_key>", "<arg_value>"), thinks=("<think>",)))
