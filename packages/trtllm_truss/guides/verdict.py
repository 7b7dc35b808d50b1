"""Whether the engine takes a guide, and what it costs: the work of one guide check, as the front's compile
processes (`guides.compile_worker`) and the in-process fallback (`api.structured`) do it.

`judge` is the check without a tokenizer: a schema checked against its meta-schema and prepared for the
engine (`guides.best_effort`: strict refuses what the engine does not enforce, best effort leaves it out),
any other guide converted by the engine (`guides.guide.check_guide`). `EngineCompiler` then compiles what
`judge` accepted with the engine's own compiler over the deployment's tokenizer, with TensorRT-LLM's options
(xgrammar `compile_json_schema(guide)`, any whitespace; llguidance `LLMatcher` with its default limits and
the first mask computed, as `guides.guide.compile_matcher`), because that compile is what TensorRT-LLM's
executor pays when the request joins a batch (`_torch/pyexecutor/guided_decoder.py`, `GuidedDecoder._build`
calls `grammar_matcher_factory.create` in the executor's step: every request of the batch waits for it).
A guide the compiler refuses there is refused like any other (the engine would refuse it at submit).

`compiled_bytes` estimates what a compiled guide holds in memory, for the caches bounded in bytes:
xgrammar reports it (`CompiledGrammar.memory_size_bytes`: its grammar and adaptive token masks);
llguidance has no such call, so it is `LLGUIDANCE_BASE_BYTES` + `LLGUIDANCE_BYTES_PER_GRAMMAR_BYTE` times
the grammar's text, fitted above the median of glibc's `mallinfo2` allocation deltas around
`compile_matcher` over the SchemaStore corpus (`scripts/llguidance_matcher_bytes.py`; docs/performance.md,
"Hostile guides").
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_truss.guides import best_effort, tool_syntax
from trtllm_truss.guides.guide import (
    LLGUIDANCE,
    WHITESPACE_FLEXIBLE,
    XGRAMMAR,
    GuideError,
    NotASchema,
    check_guide,
    compiler,
    grammar_of,
    load_guide_tokenizer,
    matcher_of,
)

LLGUIDANCE_BASE_BYTES = 160 << 10  # a compiled llguidance matcher of a tiny guide (median 152 KiB measured)
LLGUIDANCE_BYTES_PER_GRAMMAR_BYTE = 64  # medians measured: 30 (grammars > 50 KB) to 71 (2-10 KB)


@dataclass(frozen=True)
class Accepted:
    """The guide as the engine will enforce it: `text` to send (None: the guide as it was sent),
    `unenforced` what of a schema it does not enforce ("<place>: <keyword>"). `compile_s` and
    `compiled_bytes`: what compiling it over the tokenizer took (0 where it was not compiled)."""

    text: str | None = None
    unenforced: tuple[str, ...] = ()
    compile_s: float = 0.0
    compiled_bytes: int = 0


@dataclass(frozen=True)
class Refused:
    """Why the guide cannot be enforced: the 400's message, and `place`, where under the guide's field it
    points (a keyword strict mode refuses; "" for the guide itself)."""

    message: str
    place: str = ""


Verdict = Accepted | Refused


def judge(guide_type: str, guide: str | None, engine: str, strict: bool) -> tuple[Verdict, str | None]:
    """The check without a tokenizer, and the text the engine would compile (None when refused, or for
    a guide without text). A forced call's `tool_syntax.TOOL_SYNTAX` request is built into its structural
    tag here (`tool_syntax.build`), which is then checked as one: the verdict's text is the tag."""
    try:
        if guide_type == tool_syntax.TOOL_SYNTAX and guide is not None:
            try:
                tag, notes = tool_syntax.build(guide, engine)
            except (ValueError, KeyError, TypeError) as exc:  # xgrammar's pydantic errors are ValueErrors
                raise GuideError(str(exc).splitlines()[0]) from None
            check_guide(tool_syntax.STRUCTURAL_TAG, tag, engine)
            return Accepted(tag, notes), tag
        if guide_type == "json_schema" and guide is not None:
            prepared = best_effort.prepare(json.loads(guide), engine, strict=strict)
            text = None if prepared.text == guide else prepared.text
            return Accepted(text, prepared.unenforced), prepared.text
        check_guide(guide_type, guide, engine)
    except best_effort.KeywordRefused as exc:
        return Refused(f"{exc}; strict: true refuses it (without strict it is left out)", exc.place), None
    except NotASchema as exc:
        return Refused(not_a_schema(exc)), None
    except GuideError as exc:
        return Refused(f"cannot be enforced: {exc}"), None
    return Accepted(), guide


def not_a_schema(exc: NotASchema) -> str:
    return f"not a valid JSON Schema: {exc}" + (f" (at {exc.where})" if exc.where else "")


def check(guide_type: str, guide: str | None, engine: str, strict: bool, compiler_: EngineCompiler | None = None) -> Verdict:
    """`judge`, then (when it accepts and a compiler is given) the compile over the tokenizer."""
    verdict, text = judge(guide_type, guide, engine, strict)
    if compiler_ is None or not isinstance(verdict, Accepted):
        return verdict
    started = time.perf_counter()
    try:
        size = compiler_.compile(tool_syntax.STRUCTURAL_TAG if guide_type == tool_syntax.TOOL_SYNTAX else guide_type, text)
    except GuideError as exc:
        return Refused(f"cannot be enforced: {exc}")
    return Accepted(verdict.text, verdict.unenforced, time.perf_counter() - started, size)


def llguidance_bytes(grammar: str) -> int:
    """The estimated memory of a compiled llguidance matcher of this grammar (module docstring)."""
    return LLGUIDANCE_BASE_BYTES + LLGUIDANCE_BYTES_PER_GRAMMAR_BYTE * len(grammar)


class EngineCompiler:
    """The engine's compiler over the deployment's tokenizer, built as TensorRT-LLM builds it, with no
    cache of its own (a compile process keeps nothing: the front caches verdicts). `load()` does the slow
    part (the tokenizer, xgrammar's TokenizerInfo: seconds); `compile` is then safe in a forked child."""

    def __init__(self, engine: str, tokenizer_dir: Path | str) -> None:
        if engine not in (XGRAMMAR, LLGUIDANCE):
            raise GuideError(f"unknown grammar engine {engine!r}")
        self.engine = engine
        self.tokenizer_dir = str(tokenizer_dir)
        self._tokenizer: Any = None
        self._xgrammar_compiler: Any = None
        self._limits: Any = None

    @property
    def available(self) -> bool:
        """Whether this Python has the engine (xgrammar needs torch; llguidance 1.x is everywhere)."""
        if self.engine == LLGUIDANCE:
            return compiler() is not None
        from trtllm_truss.guides import xgrammar_guide

        return xgrammar_guide.module() is not None

    def load(self) -> None:
        """The tokenizer as the engine takes it; raises GuideError (or the library's error) if it cannot."""
        if self.engine == LLGUIDANCE:
            import llguidance

            self._limits = llguidance.LLParserLimits(verbose_errors=False)  # llguidance's defaults, short messages
            self._tokenizer = load_guide_tokenizer(self.tokenizer_dir)
            return
        from trtllm_truss.guides import xgrammar_guide

        self._tokenizer = xgrammar_guide.tokenizer_info(self.tokenizer_dir)

    def compile(self, guide_type: str, text: str | None) -> int:
        """Compile the guide; its compiled size in bytes (module docstring); raises GuideError with the
        engine's reason."""
        if self._tokenizer is None:
            self.load()
        if self.engine == LLGUIDANCE:
            grammar = grammar_of(guide_type, text, WHITESPACE_FLEXIBLE)
            matcher_of(grammar, self._tokenizer, self._limits)
            return llguidance_bytes(grammar)
        from trtllm_truss.guides import xgrammar_guide

        if self._xgrammar_compiler is None:  # made here, not in load(): its threads must not cross a fork
            self._xgrammar_compiler = xgrammar_guide.grammar_compiler(self._tokenizer, cache_limit_bytes=0)
        try:
            compiled = xgrammar_guide.compile_guide(self._xgrammar_compiler, guide_type, text)
        except ValueError as exc:
            raise GuideError(str(exc)) from None
        return int(compiled.memory_size_bytes)
