"""What a compiled llguidance matcher holds, against the estimate the caches count (`guides.verdict.llguidance_bytes`).

    .venv/bin/python scripts/llguidance_matcher_bytes.py

llguidance has no call that reports a matcher's memory (xgrammar has `CompiledGrammar.memory_size_bytes`), so
for each SchemaStore schema (best effort, as the stand-in compiles it: compact whitespace) this measures
glibc's allocated bytes (`mallinfo2`: uordblks + hblkhd; llguidance allocates through the C library) before
and after `compile_matcher` (the first mask computed), the matcher kept alive, and prints per size class the
median bytes, the bytes per byte of llguidance grammar, and how often the estimate is below the measure.
"""

from __future__ import annotations

import ctypes
import gc
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT / "packages"), str(REPO_ROOT / "tests")]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def main() -> None:
    import schemastore_corpus

    from trtllm_truss.guides import best_effort
    from trtllm_truss.guides.guide import grammar_of, load_guide_tokenizer, matcher_of
    from trtllm_truss.guides.verdict import llguidance_bytes

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2

    def allocated() -> int:
        info = libc.mallinfo2()
        return info.uordblks + info.hblkhd

    tokenizer = load_guide_tokenizer(REPO_ROOT / "data" / "embedded-llama")
    rows = []
    for item in schemastore_corpus.load_corpus():
        try:
            text = best_effort.prepare(item.schema, "llguidance", strict=False).text
            grammar = grammar_of("json_schema", text, "compact")
        except Exception:  # refused: nothing compiled
            continue
        gc.collect()
        before = allocated()
        try:
            matcher = matcher_of(grammar, tokenizer)
        except Exception:
            continue
        rows.append((len(grammar), allocated() - before, llguidance_bytes(grammar)))
        del matcher
    print(f"{len(rows)} compiled matchers")
    for low, high in ((0, 2_000), (2_000, 10_000), (10_000, 50_000), (50_000, 1 << 30)):
        sized = [row for row in rows if low <= row[0] < high]
        if not sized:
            continue
        print(f"  grammar {low:>6}-{high if high < 1 << 30 else '':<6} B: {len(sized):>3} matchers, median"
              f" {statistics.median(b for _, b, _ in sized) / 1024:8.0f} KiB, {statistics.median(b / g for g, b, _ in sized):5.1f}"
              f" B per grammar byte; estimate below the measure for {sum(e < b for _, b, e in sized)}")


if __name__ == "__main__":
    main()
