"""Guided decoding guides in NVIDIA's terms, turned into llguidance grammars and checked.

One vocabulary on every path: a guide is NVIDIA's `guided_decoding_guide_type` (tensorrtllm_backend
v0.19.0 `tensorrt_llm` input; `GuidedDecodingParams.GuideType` in the executor) with its
`guided_decoding_guide` text. The API dialects turn their own fields (`response_format`,
`tool_choice`, vLLM's and trtllm-serve's extensions) into one; the stand-in engine compiles it with
llguidance and masks the logits at every step; the TensorRT-LLM paths pass it on unchanged.

No torch here: the request path (every supported Python) checks guides with the same compiler the
stand-in decodes with, so a guide the stand-in cannot enforce is refused before it is queued.
llguidance is imported on first use and only its 1.x releases (the pin) are used: NVIDIA's images
from TensorRT-LLM 0.19 carry TensorRT-LLM's own, older llguidance (1.0 pins 0.7.29), which our
examples for those images do not replace. There `check_guide` checks only the guide's size and type
and the engine (xgrammar) is the judge of the rest (its refusal reaches the client as a 400).
"""

from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import llguidance

# NVIDIA's guide types: "json" is a JSON object (OpenAI's json_object; no guide text), "json_schema" a JSON Schema's
# text, "regex" a regular expression, "ebnf_grammar" an EBNF (GBNF) grammar, "structural_tag"
# xgrammar's structural tag JSON (TensorRT-LLM's executor has it; tensorrtllm_backend v0.19.0 does not).
GUIDE_TYPES: tuple[str, ...] = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")


# JSON without free whitespace, as TensorRT-LLM's guided decoder compiles schemas (xgrammar
# CompileJSONSchema(guide, any_whitespace=false)): a model cannot stall in blanks. Defaults, so a
# schema's own "x-guidance" options still win.
_JSON_OPTIONS = {"whitespace_flexible": False}
# Guide text above this is refused before anything compiles it (a bound on work per request).
MAX_GUIDE_BYTES = 1 << 20


class GuideError(ValueError):
    """The guide cannot be enforced: the message says why (the keyword, the position, the limit)."""


@functools.lru_cache(maxsize=1)
def compiler() -> ModuleType | None:
    """llguidance where this environment has a 1.x release, else None (see the module docstring)."""
    try:
        module = importlib.import_module("llguidance")
        from importlib.metadata import version

        major = int(version("llguidance").split(".")[0])
    except (ImportError, ValueError):
        return None
    return module if major >= 1 else None


def _llguidance() -> ModuleType:
    module = compiler()
    if module is None:
        raise GuideError("guided decoding on this engine path needs llguidance 1.x, which this environment lacks")
    return module


def grammar_of(guide_type: str, guide: str | None) -> str:
    """The llguidance grammar of a guide; raises GuideError for an unknown type or malformed text
    (a grammar that parses here may still fail to compile: `check_guide` compiles it)."""
    if guide_type not in GUIDE_TYPES:
        raise GuideError(f"unknown guide type {guide_type!r}; one of {', '.join(GUIDE_TYPES)}")
    llguidance = _llguidance()
    if guide_type == "json":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
    if not guide:
        raise GuideError(f"guide type {guide_type!r} needs a guide")
    if len(guide) > MAX_GUIDE_BYTES // 4 and len(guide.encode("utf-8")) > MAX_GUIDE_BYTES:
        raise GuideError(f"the guide has more than {MAX_GUIDE_BYTES} bytes")
    try:
        if guide_type == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(guide, defaults=_JSON_OPTIONS)
        if guide_type == "regex":
            return llguidance.LLMatcher.grammar_from_regex(guide)
        if guide_type == "ebnf_grammar":
            return llguidance.grammar_from("grammar", guide)
    except ValueError as exc:
        raise GuideError(str(exc)) from None
    return _structural_tag_grammar(guide)


def _structural_tag_grammar(guide: str) -> str:
    """xgrammar's structural tag as TensorRT-LLM, vLLM and SGLang take it: `{"structures": [{"begin",
    "schema", "end"}], "triggers": [...]}`: free text, in which each `begin` (starting with one of the
    triggers) opens a segment whose content is `schema` JSON, closed by `end`. llguidance's StructTag
    builds it; triggers are matched as text (they need not be special tokens)."""
    try:
        tag = json.loads(guide)
    except ValueError as exc:
        raise GuideError(f"structural_tag: not JSON ({exc})") from None
    structures = tag.get("structures") if isinstance(tag, dict) else None
    triggers = tag.get("triggers") if isinstance(tag, dict) else None
    if not isinstance(structures, list) or not structures:
        raise GuideError("structural_tag.structures: a non-empty list of {begin, schema, end} is required")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise GuideError("structural_tag.triggers: a non-empty list of non-empty strings is required")
    llguidance = _llguidance()
    tags = []
    for index, structure in enumerate(structures):
        where = f"structural_tag.structures[{index}]"
        if not isinstance(structure, dict) or not all(isinstance(structure.get(k), str) for k in ("begin", "end")):
            raise GuideError(f"{where}: begin and end must be strings")
        schema = structure.get("schema")
        if not isinstance(schema, dict):
            raise GuideError(f"{where}.schema: must be a JSON Schema object")
        trigger = next((t for t in triggers if structure["begin"].startswith(t)), None)
        if trigger is None:
            raise GuideError(f"{where}.begin: {structure['begin']!r} starts with none of the triggers")
        schema = schema if "x-guidance" in schema else {**schema, "x-guidance": _JSON_OPTIONS}
        tags.append(llguidance.StructTag(trigger=trigger, begin=structure["begin"], grammar=schema, end=structure["end"]))
    return llguidance.LLMatcher.grammar_from_lark(llguidance.StructTag.to_grammar(tags, assume_special=False))


def check_guide(guide_type: str, guide: str | None) -> str | None:
    """Compile the guide without a tokenizer; returns its grammar or raises GuideError with
    llguidance's message (which names an unsupported keyword). Without llguidance 1.x only the type
    and size are checked (None: the engine checks the rest)."""
    if compiler() is None:
        if guide_type not in GUIDE_TYPES:
            raise GuideError(f"unknown guide type {guide_type!r}; one of {', '.join(GUIDE_TYPES)}")
        if guide is not None and len(guide.encode("utf-8")) > MAX_GUIDE_BYTES:
            raise GuideError(f"the guide has more than {MAX_GUIDE_BYTES} bytes")
        return None
    grammar = grammar_of(guide_type, guide)
    error = _llguidance().LLMatcher.validate_grammar(grammar)
    if error:
        raise GuideError(error)
    return grammar


def schema_text(schema: object) -> str:
    """A schema object as guide text (compact, key order kept)."""
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def load_guide_tokenizer(tokenizer_dir: Path | str) -> llguidance.LLTokenizer:
    """The model's tokenizer as llguidance needs it: transformers' fast tokenizer (it adds the tokens of
    tokenizer_config.json that tokenizer.json may lack), else tokenizer.json itself."""
    directory = Path(tokenizer_dir)
    llguidance = _llguidance()
    try:
        import llguidance.hf
        from transformers import AutoTokenizer

        return llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(str(directory)))
    except Exception as exc:  # no transformers, or a slow (sentencepiece-only) tokenizer
        if (directory / "tokenizer.json").is_file():
            return llguidance.LLTokenizer(str(directory / "tokenizer.json"))
        raise GuideError(f"guided decoding needs the model's tokenizer (tokenizer.json in {directory.name}): {exc}") from exc


def compile_matcher(
    guide_type: str, guide: str | None, tokenizer: llguidance.LLTokenizer, limits: llguidance.LLParserLimits | None = None
) -> llguidance.LLMatcher:
    """A matcher for the guide over the model's tokenizer, its first mask computed (a guide over the
    per-step limits there is refused now, not mid-generation); raises GuideError with the reason."""
    matcher = _llguidance().LLMatcher(tokenizer, grammar_of(guide_type, guide), log_level=0, limits=limits)
    if not matcher.is_error():
        matcher.compute_bitmask()
    if matcher.is_error():
        raise GuideError(matcher.get_error())
    return matcher
