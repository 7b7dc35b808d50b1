"""Which family a deployment's model belongs to, from its chat template (and its tokenizer's special
tokens): each family module registers what tells it apart (`register_family`), and the most
specific family that matches wins (the one with the most markers met). Two families that match
alike with different parsers cannot be told apart: that is a warning naming
`runtime.tool_call_parser`, as is a template that takes tools in a format no family knows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    """A model family: `tool_parser` / `reasoning_parser` (registered names), what its template
    holds (`template`: every one of these strings; `absent`: none of these), `tokens`: its special
    tokens, each among the tokenizer's special tokens or in the template (so a model whose template is
    missing is still found by them), and `thinks`: strings of which one in the template means the
    model reasons (None: it always may)."""

    name: str
    title: str
    tool_parser: str | None
    reasoning_parser: str | None = None
    template: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()
    thinks: tuple[str, ...] | None = None

    def matches(self, template: str, tokens: frozenset[str]) -> bool:
        if not self.template and not self.tokens:
            return False
        return (
            all(m in template for m in self.template)
            and not any(m in template for m in self.absent)
            and all(t in tokens or t in template for t in self.tokens)
        )

    @property
    def specificity(self) -> int:
        return len(self.template) + len(self.absent) + len(self.tokens)

    def reasoning_for(self, template: str) -> str | None:
        if self.reasoning_parser is None:
            return None
        if self.thinks is None or any(m in template for m in self.thinks):
            return self.reasoning_parser
        return None


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


@dataclass(frozen=True)
class Detection:
    """What `detect` found: the family (None: none), its parsers and why, and the warnings."""

    family: Family | None
    tool_parser: str | None
    reasoning_parser: str | None
    reason: str
    warnings: tuple[str, ...] = field(default=())


# Hugging Face templates that take tools test or loop over the `tools` variable.
_TAKES_TOOLS = ("tools", "tool_calls")


def detect(template: str | None, tokens: Iterable[str] = ()) -> Detection:
    """The family of a chat template (and special tokens), the most specific that matches."""
    text = template or ""
    special = frozenset(tokens)
    matched = [f for f in FAMILIES.values() if f.matches(text, special)]
    if not matched:
        warnings: tuple[str, ...] = ()
        reason = "no chat template" if not text else "the chat template matches no known family"
        if text and any(word in text for word in _TAKES_TOOLS):
            warnings = (
                "the chat template takes tools, but its tool-call format is none this deployment knows: tool_choice"
                " auto is refused; set runtime.tool_call_parser to the model's format (docs/api.md, the families'"
                " table) if it is one of them",
            )
        return Detection(None, None, None, reason, warnings)
    best = max(f.specificity for f in matched)
    top = [f for f in matched if f.specificity == best]
    family = top[0]
    reasoning = family.reasoning_for(text)
    markers = [*family.template, *(f"not {m}" for m in family.absent), *(f"token {t}" for t in family.tokens)]
    reason = f"{family.title}: the chat template has " + ", ".join(repr(m) for m in markers)
    others = [f for f in top[1:] if (f.tool_parser, f.reasoning_for(text)) != (family.tool_parser, reasoning)]
    warnings = ()
    if others:
        names = ", ".join(f"{f.title} ({f.tool_parser})" for f in [family, *others])
        warnings = (
            f"the chat template fits several families alike: {names}; {family.tool_parser} is used, set"
            " runtime.tool_call_parser (and runtime.reasoning_parser) to the model's own",
        )
    return Detection(family, family.tool_parser, reasoning, reason, warnings)


def describe(detection: Detection, tool_setting: str, reasoning_setting: str) -> list[str]:
    """`validate`'s lines: the parsers a deployment uses and why."""
    lines = []
    for what, setting, detected in (
        ("tool_call_parser", tool_setting, detection.tool_parser),
        ("reasoning_parser", reasoning_setting, detection.reasoning_parser),
    ):
        if setting == "auto":
            reason = detection.reason
            if detected is None and detection.family is not None:
                reason = f"{detection.family.title}: no reasoning in its chat template"
            lines.append(f"runtime.{what}: auto -> {detected or 'none'} ({reason})")
        else:
            lines.append(f"runtime.{what}: {setting} (configured; the template says {detected or 'none'})")
    return lines
