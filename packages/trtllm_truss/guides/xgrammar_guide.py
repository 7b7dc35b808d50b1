"""Guides compiled with xgrammar, as TensorRT-LLM compiles them (its default grammar engine).

TensorRT-LLM calls xgrammar with its defaults (`_torch/pyexecutor/grammar_matcher.py`
`XGrammarMatcherFactory.create`, v1.0-v1.2; the C++ runtime's `guidedDecoder.cpp` likewise):
"json" -> `compile_builtin_json_grammar()` (any JSON value), "json_schema" -> `compile_json_schema(guide)`
(any_whitespace=True, strict_mode=True: properties a schema does not list are not generated unless
`additionalProperties` allows them), "regex" -> `compile_regex`, "ebnf_grammar" -> `compile_grammar`
(xgrammar's EBNF), "structural_tag" -> `compile_structural_tag` ({"structures": [{begin, schema,
end}], "triggers"} as items and triggers). `check` converts the guide with exactly those options but
without a tokenizer (the conversion is where xgrammar refuses a guide); `XGrammarGuides` compiles
with the model's tokenizer for the stand-in.

xgrammar imports torch (its matcher module does, at import): on the Pythons without torch (3.10,
3.12, 3.13 here) `module()` is None and the request path checks only a guide's type and size there,
the engine being the judge of the rest (as on NVIDIA's images with an older xgrammar).
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from types import ModuleType
from typing import Any

MESSAGE_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")  # xgrammar's log prefix: "[16:30:11] path.cc:83: "


class XGrammarUnavailable(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def module() -> ModuleType | None:
    """xgrammar where it imports (it needs torch), else None."""
    try:
        return importlib.import_module("xgrammar")
    except ImportError:
        return None


def _xgrammar() -> ModuleType:
    xgr = module()
    if xgr is None:
        raise XGrammarUnavailable("xgrammar (which needs torch) is not installed in this environment")
    return xgr


def reason(exc: BaseException) -> str:
    """xgrammar's message without its log prefix (file and line): what the client is told."""
    text = str(exc).strip()
    return MESSAGE_PREFIX.sub("", text.splitlines()[0] if text else type(exc).__name__)


def structural_tag_parts(guide: str) -> tuple[list[Any], list[str]] | None:
    """The (items, triggers) of the {"structures", "triggers"} form TensorRT-LLM and vLLM send, else None."""
    tag = json.loads(guide)
    if not (isinstance(tag, dict) and "structures" in tag and "triggers" in tag):
        return None
    xgr = _xgrammar()
    items = [
        xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"]) for s in tag["structures"]
    ]
    return items, list(tag["triggers"])


def grammar(guide_type: str, guide: str | None) -> Any:
    """The guide as xgrammar's Grammar, with TensorRT-LLM's options; raises ValueError with xgrammar's
    reason when xgrammar refuses it."""
    xgr = _xgrammar()
    try:
        if guide_type == "json":
            return xgr.Grammar.builtin_json_grammar()
        if guide_type == "json_schema":
            return xgr.Grammar.from_json_schema(guide)
        if guide_type == "regex":
            return xgr.Grammar.from_regex(guide)
        if guide_type == "ebnf_grammar":
            return xgr.Grammar.from_ebnf(guide)
        parts = structural_tag_parts(guide or "")
        if parts is not None:
            return xgr.Grammar.from_structural_tag(*parts)
        return xgr.Grammar.from_structural_tag(guide)
    except (RuntimeError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(reason(exc)) from None


def check(guide_type: str, guide: str | None) -> None:
    """Raises ValueError with xgrammar's reason when TensorRT-LLM's xgrammar would refuse the guide."""
    grammar(guide_type, guide)


class XGrammarMatcher:
    """One request's xgrammar matcher, with the calls the stand-in's scheduler makes of a matcher."""

    __slots__ = ("compiled", "matcher", "_error")

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.matcher = _xgrammar().GrammarMatcher(compiled)
        self._error: str | None = None

    def deep_copy(self) -> XGrammarMatcher:
        return XGrammarMatcher(self.compiled)  # a fresh matcher of the same compiled grammar

    def consume_token(self, token: int) -> bool:
        if not self.matcher.accept_token(token):
            self._error = f"xgrammar refused token {token}"
            return False
        return True

    def is_accepting(self) -> bool:
        return self.matcher.is_completed()

    def is_stopped(self) -> bool:
        """The guide cannot go on: only a stop token may follow (or one was taken). The stand-in then ends
        the request as if its end token came, as llguidance's `is_stopped` lets it (a complete guide
        that could go on, e.g. a number, is not stopped)."""
        if self.matcher.is_terminated():
            return True
        if not self.matcher.is_completed():
            return False
        xgr = _xgrammar()
        info = self.compiled.tokenizer_info
        bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        self.matcher.fill_next_token_bitmask(bitmask)
        words = bitmask[0].clone()
        for token in info.stop_token_ids:  # clear the stop tokens' bits: is anything else allowed?
            words[token // 32] &= ~(1 << (token % 32))
        return not bool(words.any())

    def is_error(self) -> bool:
        return self._error is not None

    def get_error(self) -> str:
        return self._error or ""


@functools.lru_cache(maxsize=4)
def guides_for(tokenizer_dir: str) -> XGrammarGuides:
    """One XGrammarGuides per tokenizer folder in this process: building the TokenizerInfo takes seconds,
    and both it and the compiler are safe to share between threads and engines."""
    return XGrammarGuides(tokenizer_dir)


def tokenizer_info(tokenizer_dir: str) -> Any:
    """xgrammar's TokenizerInfo of the Hugging Face tokenizer, as TensorRT-LLM builds it (the end token as
    stop token); seconds for a large vocabulary."""
    from transformers import AutoTokenizer

    xgr = _xgrammar()
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None
    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer), stop_token_ids=stop)


def grammar_compiler(info: Any, *, cache_limit_bytes: int = 0) -> Any:
    """xgrammar's GrammarCompiler over `info`, one compile thread; its own cache off (0: our callers keep
    what they compiled, bounded in bytes) or bounded at `cache_limit_bytes` (TensorRT-LLM's is on, at
    XGRAMMAR_CACHE_LIMIT_GB, 1 GB by default)."""
    xgr = _xgrammar()
    if cache_limit_bytes > 0:
        return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True, cache_limit_bytes=cache_limit_bytes)
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def compile_guide(compiler: Any, guide_type: str, guide: str | None, *, any_whitespace: bool = True) -> Any:
    """The guide compiled (xgrammar's CompiledGrammar) with TensorRT-LLM's calls; raises ValueError with
    xgrammar's reason. `any_whitespace` False: JSON Schemas with no blank at all, separators "," and ":"
    as llguidance's compact JSON (the stand-in's compact option; TensorRT-LLM's is True, where xgrammar
    ignores separators)."""
    try:
        if guide_type == "json":
            return compiler.compile_builtin_json_grammar()
        if guide_type == "json_schema":
            return compiler.compile_json_schema(guide, any_whitespace=any_whitespace, separators=None if any_whitespace else (",", ":"))
        if guide_type == "regex":
            return compiler.compile_regex(guide)
        if guide_type == "ebnf_grammar":
            return compiler.compile_grammar(guide)
        parts = structural_tag_parts(guide or "")
        return compiler.compile_structural_tag(*parts) if parts is not None else compiler.compile_structural_tag(guide)
    except (RuntimeError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(reason(exc)) from None


class XGrammarGuides:
    """xgrammar's GrammarCompiler over the model's tokenizer, as TensorRT-LLM builds it (TokenizerInfo
    from the Hugging Face tokenizer, the end token as stop token), without its own cache: the stand-in
    keeps compiled guides in its LRU bounded in bytes (`engine_standin.guidance`). Get one with
    `guides_for` (shared per tokenizer)."""

    def __init__(self, tokenizer_dir: str) -> None:
        self.info = tokenizer_info(tokenizer_dir)
        self.vocab_size = self.info.vocab_size
        self.stop_token_ids = list(self.info.stop_token_ids)
        self.compiler = grammar_compiler(self.info)

    def compile(self, guide_type: str, guide: str | None, *, any_whitespace: bool = True) -> XGrammarMatcher:
        """A matcher for the guide; raises ValueError with xgrammar's reason (`compile_guide`)."""
        return XGrammarMatcher(compile_guide(self.compiler, guide_type, guide, any_whitespace=any_whitespace))

    def fill_bitmask(self, matchers: list[XGrammarMatcher], bitmask: Any) -> None:
        """Row k of `bitmask` (a numpy int32 [rows, words] array) gets matcher k's allowed tokens."""
        import torch

        view = torch.from_numpy(bitmask)
        for k, matcher in enumerate(matchers):
            matcher.matcher.fill_next_token_bitmask(view, k)
