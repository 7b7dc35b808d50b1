"""`trtllm-truss bench --trace FILE --url URL`: replay a multi-turn trace (Mooncake's format) against a
running OpenAI-compatible server (one truss, a fleet's frontend) and report cached tokens against the
trace's own bound, TTFT, tokens/s and the load per replica (bench.replay)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "trace replay (with --trace; measures the server at --url through POST /v1/completions with token ids)"
    )
    group.add_argument("--trace", type=Path,
                       help="a Mooncake-format JSONL trace (timestamp ms, input_length, output_length, hash_ids):"
                            " replay it at its timestamps (or with --concurrency, back to back) and report cached"
                            " tokens against the trace's bound")
    group.add_argument("--trace-limit", type=int, default=None, help="replay only the trace's first N requests")
    group.add_argument("--trace-block-tokens", type=int, default=512,
                       help="tokens per hash id in the replayed prompts; the trace's lengths scale by this / 512 (its"
                            " blocks' size, --trace-source-block-tokens); a multiple of the engine's tokens per KV"
                            " block (default: 512)")
    group.add_argument("--trace-source-block-tokens", type=int, default=512,
                       help="tokens per hash id in the trace itself (default: 512, Mooncake's)")
    group.add_argument("--trace-time-scale", type=float, default=1.0,
                       help="multiply the trace's arrival times (0.5: twice the rate) (default: 1)")
    group.add_argument("--trace-max-input", type=int, default=None,
                       help="cut longer prompts to the whole blocks that fit, e.g. the engine's max_input_len")
    group.add_argument("--trace-max-output", type=int, default=None, help="cap each request's output_length")
    group.add_argument("--kv-block-tokens", type=int, default=None,
                       help="the engine's tokens per KV block, for the bounds (default: --trace-block-tokens)")
    group.add_argument("--lru-pool-blocks", type=int, default=None,
                       help="also report the reuse of one LRU pool of this many blocks (e.g. replicas x blocks each)")
    group.add_argument("--model", default=None, help="the served model name to ask for (default: the first of /v1/models)")
    group.add_argument("--dynamo-worker-id", action="store_true",
                       help="ask a Dynamo frontend which worker served each request (nvext.extra_fields worker_id)")


def _plan_tokenizer_dir(truss_dir: Path) -> Path:
    """The tokenizer directory the truss's plan names."""
    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan
    from trtllm_truss.planning.probe import probe_facts

    return make_plan(load_config(truss_dir), probe_facts()).tokenizer_dir


def run_replay(args: argparse.Namespace, err: Any) -> int:
    from trtllm_truss.bench.replay import ReplayPlan, replay, replay_report, summary_lines, warmup_requests, write_report
    from trtllm_truss.bench.runner import count_output_tokens, run_level
    from trtllm_truss.bench.load import ClosedLoop, parse_int_list
    from trtllm_truss.bench.targets import TargetError
    from trtllm_truss.bench.targets.openai import OpenAiTarget
    from trtllm_truss.bench.trace import TraceSynthesis, read_trace, synthesize, word_vocabulary
    from trtllm_truss.bench.workload import WorkloadError
    from trtllm_truss.bench.tokenizer import BenchTokenizer

    try:
        if not args.url:
            raise WorkloadError("--trace measures a running server: give --url http://host:port")
        if args.compare or args.compare_backends or args.guide_schema is not None or args.dataset is not None:
            raise WorkloadError("--trace replays the trace against --url alone: leave out --compare, --compare-backends,"
                                " --guide-schema and --dataset")
        if args.request_rate is not None:
            raise WorkloadError("--trace: arrivals come from the trace (--trace-time-scale), not --request-rate")
        concurrency = None
        if args.concurrency is not None:
            levels = parse_int_list(args.concurrency, "--concurrency")
            if len(levels) != 1:
                raise WorkloadError("--trace: one --concurrency (the streams of a back-to-back replay)")
            concurrency = levels[0]
        synthesis = TraceSynthesis(
            block_tokens=args.trace_block_tokens, trace_block_tokens=args.trace_source_block_tokens,
            max_input_tokens=args.trace_max_input, max_output_tokens=args.trace_max_output, seed=args.seed,
        )
        tokenizer_dir = args.tokenizer or _plan_tokenizer_dir(args.truss_dir)
        tokenizer = BenchTokenizer.from_dir(Path(tokenizer_dir))
        vocabulary = word_vocabulary(tokenizer)
        trace = read_trace(args.trace, args.trace_limit)
        prompts = synthesize(trace, synthesis, vocabulary, time_scale=args.trace_time_scale)
    except (WorkloadError, ValueError, OSError) as exc:
        err.print(str(exc), style="red", markup=False)
        return 2
    plan = ReplayPlan(
        prompts=prompts, concurrency=concurrency, max_concurrency=args.max_concurrency, timeout_s=args.timeout,
        kv_block_tokens=args.kv_block_tokens or args.trace_block_tokens, lru_pool_blocks=args.lru_pool_blocks,
    )
    target = OpenAiTarget(args.url, args.ignore_eos, args.timeout, model=args.model, dynamo_worker_id=args.dynamo_worker_id)

    async def measure():
        await target.open()
        try:
            if args.warmup:
                warm = warmup_requests(vocabulary, synthesis.block_tokens, args.warmup, args.seed)
                await run_level(target, warm, ClosedLoop(concurrency=len(warm)), timeout_s=args.timeout)
            return await replay(target, plan)
        finally:
            await target.close()

    pace = f"{concurrency} streams back to back" if concurrency else f"its timestamps x{args.trace_time_scale:g}"
    try:
        with err.status(f"replaying {len(prompts)} requests of {args.trace} at {pace}..."):
            records = asyncio.run(measure())
    except TargetError as exc:
        err.print(str(exc), style="red", markup=False)
        return 1
    count_output_tokens(records, args.token_counting, tokenizer, fixed_length=args.ignore_eos != "none")
    report = replay_report(
        plan, records,
        trace={
            "path": str(args.trace), "requests": len(prompts), "limit": args.trace_limit,
            "truncated": sum(1 for p in prompts if p.truncated), "time_scale": args.trace_time_scale,
            "synthesis": {"block_tokens": synthesis.block_tokens, "trace_block_tokens": synthesis.trace_block_tokens,
                          "max_input_tokens": synthesis.max_input_tokens, "max_output_tokens": synthesis.max_output_tokens,
                          "seed": synthesis.seed, "tokenizer": str(tokenizer_dir)},
        },
        settings={
            "url": args.url, "model": target.model, "pace": "concurrency" if concurrency else "timestamps",
            "concurrency": concurrency, "max_concurrency": args.max_concurrency, "ignore_eos": args.ignore_eos,
            "timeout_s": args.timeout, "warmup_requests": args.warmup, "kv_block_tokens": plan.kv_block_tokens,
            "dynamo_worker_id": args.dynamo_worker_id,
        },
    )
    for line in summary_lines(report):
        print(line)
    for warning in report["warnings"]:
        err.print(f"warning: {warning}", style="yellow", markup=False)
    if args.json_path is not None:
        write_report(report, args.json_path)
        print(f"JSON: {args.json_path}")
    return 1 if report["metrics"]["failed"] else 0
