"""Guided decoding in the stand-in engine: NVIDIA's `guided_decoding_guide_type` / `guided_decoding_guide`
enforced where tokens are chosen, as TensorRT-LLM's guided decoder masks the logits before sampling.

It uses the grammar engine `runtime.guided_decoding_backend` names (the `guided_decoding_backend` parameter:
xgrammar, TensorRT-LLM's default, or llguidance, which its PyTorch path also offers), called as TensorRT-LLM
calls it and as the request path checks guides (`trtllm_truss.guides`), so a guide the API accepted is a
guide the engine enforces, and outputs take the shape the GPU engine gives them (xgrammar's strict mode:
no properties a schema does not list). One option may differ: `whitespace` (runtime.pytorch.guided_whitespace,
compact by default there) "compact" compiles JSON without free whitespace, since the embedded model, unlike a
real one, emits blanks until max_tokens when they are allowed; "flexible" (GuideCompiler's default) is
TensorRT-LLM's. Which guides compile does not depend on it (tests/unit/test_guided_whitespace.py).
- `GuideCompiler`: one `LLMatcher` built per distinct (type, guide) (`guides.guide.compile_matcher`) on a small thread pool, never on the
  decode loop, and kept pristine in an LRU bounded in bytes (`cache_bytes`, runtime.pytorch.guide_cache_bytes:
  xgrammar's `CompiledGrammar.memory_size_bytes`, llguidance's estimated from its grammar,
  `guides.verdict.llguidance_bytes`; xgrammar's own compiler cache is off, so an evicted guide is freed);
  each request gets a `deep_copy()` (it shares the compiled grammar and lexer). A guide that fails to
  compile, or is still compiling after the timeout, fails the requests waiting for it with the reason and
  leaves nothing cached.
- `TokenMasker`: one step's masks of every guided row computed at once (`LLExecutor`) and applied to the
  processed logits, the request's own end token standing in for the tokenizer's EOS.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.numpy
import numpy as np

from trtllm_truss.engine_standin.types import Guide
from trtllm_truss.guides.cache import BytesLRU
from trtllm_truss.guides.guide import (
    LLGUIDANCE,
    WHITESPACE_COMPACT,
    WHITESPACE_FLEXIBLE,
    XGRAMMAR,
    GuideError,
    grammar_of,
    load_guide_tokenizer,
    matcher_of,
)
from trtllm_truss.guides.verdict import llguidance_bytes

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# (matcher, None) when the guide is ready, (None, reason) when it cannot be enforced.
GuideReady = Callable[[llguidance.LLMatcher | None, str | None], None]

DEFAULT_CACHE_BYTES = 128 << 20  # runtime.pytorch.guide_cache_bytes's default
DEFAULT_COMPILE_THREADS = 2
DEFAULT_COMPILE_TIMEOUT_S = 30.0


@dataclass
class GuideCacheStats:
    hits: int = 0  # requests served by a cached (or already compiling) guide
    misses: int = 0  # compiles started
    compile_seconds: float = 0.0  # summed over compiles, timed out ones included
    failures: int = 0  # compiles that failed (the guide was refused)
    timeouts: int = 0  # compiles still running at the timeout (their requests were refused)
    cached: int = 0  # guides in the cache now
    cached_bytes: int = 0  # what they hold (module docstring)
    limit_bytes: int = 0  # the cache's bound
    evictions: int = 0  # guides dropped to stay within it


class _Pending:
    """A compile in flight and the requests waiting for it; `done` once they were answered."""

    __slots__ = ("done", "waiters")

    def __init__(self, ready: GuideReady) -> None:
        self.waiters = [ready]
        self.done = False


class GuideCompiler:
    def __init__(
        self,
        tokenizer_dir: Path | str | None,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        threads: int = DEFAULT_COMPILE_THREADS,
        timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
        limits: llguidance.LLParserLimits | None = None,
        engine: str = XGRAMMAR,
        whitespace: str = WHITESPACE_FLEXIBLE,
    ) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.engine = engine
        self.whitespace = whitespace  # runtime.pytorch.guided_whitespace (guides.guide.WHITESPACE_*)
        self.cache_bytes = cache_bytes
        self.timeout_s = timeout_s
        # llguidance's LLParserLimits bound compile and step work; short errors: they go to the client.
        self._limits = limits or llguidance.LLParserLimits(verbose_errors=False)
        self._lock = threading.Lock()
        self._cache: BytesLRU[tuple[str, str | None], Any] = BytesLRU(cache_bytes)
        self._pending: dict[tuple[str, str | None], _Pending] = {}
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="guide-compile")
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()
        self._stats = GuideCacheStats()
        self.compile_times: deque[float] = deque(maxlen=4096)  # seconds of the latest compiles (bench)

    @property
    def tokenizer(self) -> Any:
        """llguidance's LLTokenizer, or xgrammar's compiler over the tokenizer (`XGrammarGuides`); loaded
        on first use, on a compile thread (about a second for a large vocabulary)."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                if self.engine not in (XGRAMMAR, LLGUIDANCE):
                    raise GuideError("guided decoding is off in this engine (guided_decoding_backend: none)")
                if self.tokenizer_dir is None:
                    raise GuideError("guided decoding needs the model's tokenizer; the engine has none")
                if self.engine == XGRAMMAR:
                    from trtllm_truss.guides.xgrammar_guide import guides_for

                    self._tokenizer = guides_for(str(Path(self.tokenizer_dir).resolve()))
                else:
                    self._tokenizer = load_guide_tokenizer(self.tokenizer_dir)
            return self._tokenizer

    def masker(self) -> TokenMasker:
        """The masker of this engine's matchers (after a matcher exists: the tokenizer is loaded)."""
        if self.engine == XGRAMMAR:
            return XGrammarMasker(self.tokenizer)
        return TokenMasker(self.tokenizer)

    def stats(self) -> GuideCacheStats:
        with self._lock:
            cache = self._cache.stats()
            return GuideCacheStats(**{**self._stats.__dict__, "cached": cache.entries, "cached_bytes": cache.bytes,
                                      "limit_bytes": cache.limit_bytes, "evictions": cache.evictions})

    def is_cached(self, guide: Guide) -> bool:
        with self._lock:
            return (guide.guide_type, guide.guide) in self._cache

    def prepare(self, guide: Guide, ready: GuideReady) -> None:
        """`ready` gets a fresh matcher at once on a cache hit; otherwise later, from a compile thread
        (or the timeout's timer thread, with the reason)."""
        key = (guide.guide_type, guide.guide)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._stats.hits += 1
                matcher = cached.deep_copy()
            else:
                pending = self._pending.get(key)
                if pending is not None:  # another request's compile of the same guide serves this one too
                    self._stats.hits += 1
                    pending.waiters.append(ready)
                    return
                self._stats.misses += 1
                pending = self._pending[key] = _Pending(ready)
        if cached is not None:
            ready(matcher, None)
            return
        timer = threading.Timer(self.timeout_s, self._expire, (key, pending))
        timer.daemon = True
        timer.start()
        self._pool.submit(self._compile, key, pending, timer)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _build(self, guide_type: str, guide: str | None) -> tuple[Any, int]:
        """The pristine matcher and the bytes its compiled guide holds."""
        if self.engine == XGRAMMAR:
            try:
                matcher = self.tokenizer.compile(guide_type, guide, any_whitespace=self.whitespace != WHITESPACE_COMPACT)
            except ValueError as exc:
                raise GuideError(str(exc)) from None
            return matcher, int(matcher.compiled.memory_size_bytes)
        grammar = grammar_of(guide_type, guide, self.whitespace)
        return matcher_of(grammar, self.tokenizer, self._limits), llguidance_bytes(grammar)

    def _compile(self, key: tuple[str, str | None], pending: _Pending, timer: threading.Timer) -> None:
        start = time.perf_counter()
        matcher: llguidance.LLMatcher | None = None
        error: str | None = None
        size = 0
        try:
            matcher, size = self._build(*key)
        except GuideError as exc:
            error = str(exc)
        except Exception as exc:  # llguidance misuse or a tokenizer problem: still only these requests fail
            log.exception("compiling a %s guide failed", key[0])
            error = f"compiling the guide failed: {exc}"
        elapsed = time.perf_counter() - start
        timer.cancel()
        with self._lock:
            self._stats.compile_seconds += elapsed
            self.compile_times.append(elapsed)
            if self._pending.get(key) is pending:
                del self._pending[key]
            if pending.done:  # timed out: its requests were refused already; nothing is cached
                return
            pending.done = True
            waiters = pending.waiters
            if matcher is None:
                self._stats.failures += 1
                copies: list = [None] * len(waiters)
            else:
                evicted = self._cache.evictions
                self._cache.put(key, matcher, size)  # one over the bound serves its waiters, uncached
                trim = self._cache.evictions > evicted
                copies = [matcher.deep_copy() for _ in waiters]
        for ready, copy in zip(waiters, copies):
            ready(copy, error)
        if matcher is not None and trim:
            release_freed_memory()

    def _expire(self, key: tuple[str, str | None], pending: _Pending) -> None:
        with self._lock:
            if pending.done:
                return
            pending.done = True
            self._stats.timeouts += 1
            if self._pending.get(key) is pending:
                del self._pending[key]
            waiters = pending.waiters
        # The compile itself cannot be interrupted: it keeps its thread until llguidance's limits end it.
        reason = f"compiling the guide took longer than {self.timeout_s:g} s"
        for ready in waiters:
            ready(None, reason)


def release_freed_memory() -> None:
    """Give what evicted guides freed back to the system (glibc's `malloc_trim`: its allocator keeps freed
    pages of every thread's arena otherwise, so a stub's memory would stay at its peak); on a compile
    thread, after an eviction, never on the decode loop. Nothing where the C library has no such call."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def matcher_error(matcher: llguidance.LLMatcher) -> str:
    """A matcher's error for the client: its first line (e.g. which LLParserLimits limit was hit)."""
    lines = matcher.get_error().splitlines()
    return lines[0] if lines else "the guide failed"


class TokenMasker:
    """Masks one step's logits rows to the tokens their guides allow."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, *, threads: int | None = None) -> None:
        self.tokenizer_vocab = tokenizer.vocab_size
        self.eos_ids = list(tokenizer.eos_tokens)
        self._words = llguidance.numpy.get_bitmask_shape(1, self.tokenizer_vocab)[1]
        self._executor = llguidance.LLExecutor(num_threads=threads or min(4, os.cpu_count() or 1))

    def _fill(self, rows: list, bitmask: np.ndarray) -> None:
        llguidance.numpy.fill_next_token_bitmask_par(self._executor, [(m, k) for k, (_, m, _) in enumerate(rows)], bitmask)

    def apply(self, logits: torch.Tensor, rows: list[tuple[int, llguidance.LLMatcher, int | None]]) -> dict[int, str]:
        """`logits`: processed [batch, vocab] float32 on CPU, masked in place; `rows`: (row, matcher,
        end_id) of the guided rows. Returns {row: reason} for rows that cannot go on (the matcher is in
        error, or nothing is allowed); those rows are left unmasked and must not use their token."""
        bitmask = np.empty((len(rows), self._words), dtype=np.int32)  # every row is written below
        self._fill(rows, bitmask)
        # llguidance.numpy rather than llguidance.torch: the torch variant's apply is torch.compile'd,
        # ~10 s on its first CPU call; the logits are on the CPU here and share memory with numpy.
        values = logits.numpy()
        index = np.array([row for row, _, _ in rows])
        original = values[index]  # a copy
        masked = original.copy()
        llguidance.numpy.apply_token_bitmask_inplace(masked, bitmask)
        vocab = masked.shape[1]
        masked[:, self.tokenizer_vocab :] = -np.inf  # ids past the tokenizer's vocabulary decode to nothing
        errors: dict[int, str] = {}
        for k, (row, matcher, end_id) in enumerate(rows):
            # The tokenizer's EOS bit means "the guide may end here": the request's end_id ends it.
            masked[k, [t for t in self.eos_ids if t < vocab]] = -np.inf
            if end_id is not None and 0 <= end_id < vocab:
                masked[k, end_id] = original[k, end_id] if matcher.is_accepting() else -np.inf
            if matcher.is_error():
                errors[row] = matcher_error(matcher)
            elif np.isneginf(masked[k]).all():
                errors[row] = "the guide allows no token here (end_id, bad_words or min_length excluded the rest)"
            if row in errors:
                masked[k] = original[k]
        values[index] = masked
        return errors


class XGrammarMasker(TokenMasker):
    """TokenMasker with xgrammar's matchers: xgrammar fills the bitmask (the same layout as
    llguidance's: bit i of the int32 words is token i), the rest is shared."""

    def __init__(self, guides: Any) -> None:
        self.tokenizer_vocab = guides.vocab_size
        self.eos_ids = guides.stop_token_ids
        self._words = llguidance.numpy.get_bitmask_shape(1, self.tokenizer_vocab)[1]
        self._guides = guides

    def _fill(self, rows: list, bitmask: np.ndarray) -> None:
        self._guides.fill_bitmask([m for _, m, _ in rows], bitmask)
