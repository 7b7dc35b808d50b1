"""Reasoning and tool-call parsers (one module per model family, registered by name) and what a
stream worker runs per request: `OutputParser`, the reasoning parser then the tool-call parser on
the answer part only.

Which parsers a deployment uses: `runtime.tool_call_parser` / `runtime.reasoning_parser`; `auto`
(the default) detects the family from the chat template's own markers (`detect_*`)."""

from __future__ import annotations

from trtllm_truss.parsers.base import (
    PART_TEXT,
    REASONING_PARSERS,
    TOOL_PARSERS,
    Part,
    ReasoningParser,
    ToolCallParser,
)
from trtllm_truss.parsers.reasoning import gpt_oss, think  # noqa: F401 - registers the families
from trtllm_truss.parsers.tool_calls import deepseek_v3, guided, hermes, llama3_json, mistral  # noqa: F401

AUTO, NONE = "auto", "none"


def detect_tool_parser(template: str | None) -> str | None:
    """The tool-call format a chat template teaches its model, from the markers it writes."""
    if not template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "<|channel|>" in template:
        return "gpt_oss"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "tool▁calls▁begin" in template:
        return "deepseek_v3"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return None


def detect_reasoning_parser(template: str | None) -> str | None:
    if not template:
        return None
    if "<|channel|>" in template:
        return "gpt_oss"
    if "<think>" in template:
        return "deepseek_r1" if "｜Assistant｜" in template else "qwen3"
    return None


def resolve(setting: str, detected: str | None) -> str | None:
    """A configured parser name: `auto` -> what the template says, `none` -> None."""
    if setting == AUTO:
        return detected
    return None if setting == NONE else setting


def keep_tokens(tool_parser: str | None, reasoning_parser: str | None) -> set[str]:
    """Special tokens a decoder must keep as text for these parsers' markers to be seen."""
    keep: set[str] = set()
    if tool_parser in TOOL_PARSERS:
        keep.update(TOOL_PARSERS[tool_parser].keep_tokens)
    if reasoning_parser in REASONING_PARSERS:
        keep.update(REASONING_PARSERS[reasoning_parser].keep_tokens)
    return keep


class OutputParser:
    """One answer's parsers: reasoning first, tool calls on the answer's text only."""

    __slots__ = ("_reasoning", "_tools")

    def __init__(self, reasoning: ReasoningParser | None, tools: ToolCallParser | None) -> None:
        self._reasoning = reasoning
        self._tools = tools

    @classmethod
    def create(
        cls, reasoning_parser: str | None, tool_parser: str | None, tool_parser_arg: str | None, prompt_tail: str
    ) -> OutputParser | None:
        if reasoning_parser is None and tool_parser is None:
            return None
        reasoning = REASONING_PARSERS[reasoning_parser](prompt_tail) if reasoning_parser else None
        tools = TOOL_PARSERS[tool_parser](tool_parser_arg) if tool_parser else None
        return cls(reasoning, tools)

    @property
    def tool_calls(self) -> int:
        """Calls reported so far (gpt-oss reports its calls from the reasoning parser)."""
        return (self._tools.calls if self._tools is not None else 0) + getattr(self._reasoning, "calls", 0)

    def feed(self, text: str) -> list[Part]:
        parts = self._reasoning.feed(text) if self._reasoning is not None else [(PART_TEXT, text)]
        return self._answer(parts) if self._tools is not None else parts

    def finish(self, cut: bool = False) -> list[Part]:
        """The rest; `cut`: the token limit ended the answer (a call it cut short is dropped)."""
        parts = self._reasoning.finish(cut) if self._reasoning is not None else []
        if self._tools is None:
            return parts
        return self._answer(parts) + self._tools.finish(cut)

    def _answer(self, parts: list[Part]) -> list[Part]:
        assert self._tools is not None
        out: list[Part] = []
        for part in parts:
            out += self._tools.feed(part[1]) if part[0] == PART_TEXT else [part]
        return out


__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "OutputParser",
    "ReasoningParser",
    "ToolCallParser",
    "detect_reasoning_parser",
    "detect_tool_parser",
    "keep_tokens",
    "resolve",
]
