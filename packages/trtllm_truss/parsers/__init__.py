"""Reasoning and tool-call parsers (one module per model family, registered by name) and what a
stream worker runs per request: `OutputParser`, the reasoning parser then the tool-call parser on
the answer part only.

Which parsers a deployment uses: `runtime.tool_call_parser` / `runtime.reasoning_parser`; `auto`
(the default) is the family `parsers.detect` finds in the chat template and special tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trtllm_truss.guides.tool_syntax import FamilySyntax
from trtllm_truss.parsers.base import (
    PART_TEXT,
    REASONING_PARSERS,
    TOOL_PARSERS,
    Part,
    ReasoningParser,
)
from trtllm_truss.parsers.detect import FAMILIES, Detection, Family, describe, detect
from trtllm_truss.parsers.section import ToolCallParser

# Each module registers its parser and the families that use it: a family is one line here.
import trtllm_truss.parsers.reasoning.gemma4  # noqa: F401, E402
import trtllm_truss.parsers.reasoning.glm45  # noqa: F401, E402
import trtllm_truss.parsers.reasoning.gpt_oss  # noqa: F401, E402
import trtllm_truss.parsers.reasoning.kimi_k2  # noqa: F401, E402
import trtllm_truss.parsers.reasoning.kimi_k3  # noqa: F401, E402
import trtllm_truss.parsers.reasoning.minimax_m3  # noqa: F401, E402
import trtllm_truss.parsers.reasoning.mistral  # noqa: F401, E402
import trtllm_truss.parsers.reasoning.think  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.deepseek_v3  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.deepseek_v31  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.deepseek_v32  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.deepseek_v4  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.deepseek_v41  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.gemma4  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.glm45  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.guided  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.hermes  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.kimi_k2  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.kimi_k3  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.llama3_json  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.minimax_m2  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.minimax_m3  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.mistral  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.poolside_v1  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.pythonic  # noqa: F401, E402
import trtllm_truss.parsers.tool_calls.qwen3_coder  # noqa: F401, E402

AUTO, NONE = "auto", "none"


def detect_tool_parser(template: str | None, tokens: Iterable[str] = ()) -> str | None:
    """The tool-call format a chat template teaches its model (`detect`'s family)."""
    return detect(template, tokens).tool_parser


def detect_reasoning_parser(template: str | None, tokens: Iterable[str] = ()) -> str | None:
    return detect(template, tokens).reasoning_parser


def resolve(setting: str, detected: str | None) -> str | None:
    """A configured parser name: `auto` -> what the template says, `none` -> None."""
    if setting == AUTO:
        return detected
    return None if setting == NONE else setting


def setting_problems(tool_call_parser: str, reasoning_parser: str) -> list[str]:
    """One line per `runtime.*_parser` that names no registered parser, with the names that would."""
    problems = []
    for key, setting, registry in (
        ("tool_call_parser", tool_call_parser, TOOL_PARSERS),
        ("reasoning_parser", reasoning_parser, REASONING_PARSERS),
    ):
        if setting not in (AUTO, NONE) and (setting not in registry or setting.startswith("guided_")):
            names = ", ".join(sorted(n for n in registry if not n.startswith("guided_")))
            problems.append(f"model_metadata.trt_llm.runtime.{key}: {setting!r} is no parser; one of auto, none, {names}")
    return problems


def template_turns(tool_parser: str | None, turns: Sequence[Any]) -> Sequence[Any]:
    """A conversation as the deployment's family's template should see it (`ToolCallParser.template_turns`)."""
    cls = TOOL_PARSERS.get(tool_parser) if tool_parser else None
    return cls.template_turns(turns) if cls is not None else turns


def forced_syntax(tool_parser: str | None) -> FamilySyntax | None:
    """How the family forces a call in its own syntax (`ToolCallParser.forced`); None: the JSON guide."""
    cls = TOOL_PARSERS.get(tool_parser) if tool_parser else None
    return cls.forced if cls is not None and isinstance(cls.forced, FamilySyntax) else None


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
        cls,
        reasoning_parser: str | None,
        tool_parser: str | None,
        tool_parser_arg: str | None,
        prompt_tail: str,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> OutputParser | None:
        if reasoning_parser is None and tool_parser is None:
            return None
        reasoning = REASONING_PARSERS[reasoning_parser](prompt_tail) if reasoning_parser else None
        parser = TOOL_PARSERS[tool_parser](tool_parser_arg, tools) if tool_parser else None
        return cls(reasoning, parser)

    @property
    def tool_calls(self) -> int:
        """Calls reported so far (gpt-oss reports its calls from the reasoning parser)."""
        return (self._tools.calls if self._tools is not None else 0) + getattr(self._reasoning, "calls", 0)

    def feed(self, text: str) -> list[Part]:
        parts = self._reasoning.feed(text) if self._reasoning is not None else [(PART_TEXT, text)]
        return self._answer(parts) if self._tools is not None else parts

    def finish(self, cut: bool = False) -> list[Part]:
        """The rest; `cut`: the token limit ended the answer (section.py says what becomes of a call it cut)."""
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
    "FAMILIES",
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "Detection",
    "Family",
    "OutputParser",
    "ReasoningParser",
    "ToolCallParser",
    "describe",
    "detect",
    "detect_reasoning_parser",
    "forced_syntax",
    "detect_tool_parser",
    "keep_tokens",
    "resolve",
    "setting_problems",
    "template_turns",
]
