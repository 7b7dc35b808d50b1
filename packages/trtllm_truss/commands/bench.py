"""`trtllm-truss bench [TRUSS_DIR]`: load-test the engine model, the ensemble or truss's HTTP endpoint.

By default it brings the stack up itself (tritonserver for the gRPC targets; truss's own model server,
which starts tritonserver inside it, for the http target) and stops it at the end; with URLs it
measures servers that are already running. `--compare` measures the engine model streamed directly and
the full path one after the other at each load, on the same requests, and reports their ratio of
output tokens/s (docs/performance.md). `--compare-backends A,B` measures the same target (--target) on two
stacks of the truss, one per `runtime.backend`, alternating rounds, and reports B's CPU per token against A's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HELP = "benchmark the engine model, the ensemble or the truss HTTP endpoint (TTFT, ITL, tokens/s)"

DEFAULT_CONCURRENCY = "1,8,32,64"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("truss_dir", nargs="?", default=".", type=Path, help="truss directory (default: .)")
    what = parser.add_argument_group("what to measure")
    what.add_argument("--target", choices=("engine", "ensemble", "http", "llm"), default="ensemble",
                      help="engine: the tensorrt_llm model, token ids over gRPC; ensemble: text over gRPC; "
                           "http: truss's POST /v1/models/model:predict; llm: the LLM API driven directly in one"
                           " process (backend llmapi; no Triton) (default: ensemble)")
    what.add_argument("--compare", action="store_true",
                      help="measure the engine model directly AND the full path (--full-target) at each load, "
                           "on the same requests; the JSON gets their output tokens/s ratio as \"ratio\"")
    what.add_argument("--with-llm", action="store_true",
                      help="with --compare on backend llmapi: also measure the LLM API driven directly in one process"
                           " (generate_async, the shape of trtllm-serve) and compare the engine model and the full"
                           " path against it (the report's ratio: full / llm)")
    what.add_argument("--full-target", choices=("ensemble", "http"), default="http",
                      help="the full path of --compare (default: http, i.e. truss server -> ensemble -> engine)")
    what.add_argument("--compare-backends", metavar="A,B",
                      help="start one stack per runtime.backend (e.g. pytorch,llmapi: the tensor stand-in and the"
                           " LLM-API path), measure --target on both in alternating rounds, and report B/A of output"
                           " tokens/s and of CPU per token (cpu_ratios: ours, tritonserver + stubs, total)")
    what.add_argument("--front", choices=("truss", "direct"), default="truss",
                      help="what serves HTTP when this command starts it: truss's model server (default) or the"
                           " direct front (`trtllm-truss serve --front direct`, runtime.direct_front.processes)")
    what.add_argument("--url", help="URL of the measured target (with --compare: of the full path); "
                                    "host:port for gRPC targets, http://host:port for http")
    what.add_argument("--grpc-url", help="Triton gRPC address (host:port) for the engine/ensemble targets")
    what.add_argument("--guide-schema", type=Path,
                      help="structured output: a JSON Schema file (or JSONL, one per line); measures the engine model"
                           " without and with the schema as guided_decoding_guide (engine vs engine_guided, same"
                           " requests) and reports schema compile times and the engine's guide cache hit rate")
    what.add_argument("--match-guided-lengths", action="store_true",
                      help="with --guide-schema: at each level an unmeasured guided pass first, then each unguided"
                           " request asks for the tokens its guided twin produced (guided requests end where their"
                           " schema completes), so the comparison measures the guide's cost per step, not a batch"
                           " whose requests end at other points")
    what.add_argument("--tokenizer", type=Path,
                      help="tokenizer directory for prompts and token counting (default: the truss's own)")

    load = parser.add_argument_group("load")
    load.add_argument("--concurrency", default=None,
                      help=f"closed loop: comma-separated stream counts (default: {DEFAULT_CONCURRENCY})")
    load.add_argument("--request-rate", default=None,
                      help="open loop: comma-separated Poisson arrival rates in requests/s (instead of --concurrency)")
    load.add_argument("--max-concurrency", type=int, default=None,
                      help="open loop: cap on requests in flight (default: none)")
    load.add_argument("--num-requests", type=int, default=None,
                      help="requests per load level (default: 4 x the highest concurrency, at least 32)")
    load.add_argument("--rounds", type=int, default=1,
                      help="rounds per level, alternating the targets; figures pool the rounds (default: 1)")
    load.add_argument("--warmup", type=int, default=4, help="unmeasured requests per target first (default: 4)")
    load.add_argument("--client-processes", type=int, default=1,
                      help="closed loop: split the streams over this many client processes (one Python process"
                           " reads ~30-40k responses/s; a large host's engine sends more) (default: 1)")
    load.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take (default: 600)")

    work = parser.add_argument_group("workload (lengths in tokens)")
    work.add_argument("--input-mean", type=int, default=128)
    work.add_argument("--input-stddev", type=float, default=0.0)
    work.add_argument("--output-mean", type=int, default=128)
    work.add_argument("--output-stddev", type=float, default=0.0)
    work.add_argument("--dataset", type=Path, help="JSONL: {\"prompt\" or \"text\": ..., \"output_len\": N (optional)}")
    work.add_argument("--seed", type=int, default=0)
    work.add_argument("--ignore-eos", choices=("min_length", "end_id", "none"), default="min_length",
                      help="keep generating to the requested length so all targets emit equal token counts: "
                           "min_length = output length (default), or end_id = -1, or none")
    work.add_argument("--token-counting", choices=("auto", "retokenize", "requested"), default="auto",
                      help="auto: exact where the target reports tokens; for text, the requested length of "
                           "fixed-length requests (--ignore-eos), else the re-tokenized text")

    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, dest="json_path", help="write the report as JSON")
    out.add_argument("--plot", type=Path, help="write a PNG plot (default: next to --json, same name .png)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    out.add_argument("--startup-timeout", type=float, default=900.0,
                     help="seconds to wait for a stack this command starts (default: 900)")

    from trtllm_truss.commands.bench_replay import add_replay_arguments

    add_replay_arguments(parser)


class _RichProgress:
    """Progress bar: one task per (target, load level)."""

    def __init__(self, progress: Any):
        self._progress = progress
        self._task: Any = None

    def level_started(self, target, level, total) -> None:
        self._task = self._progress.add_task(f"{target:>8} @ {level.label}", total=total)

    def request_done(self) -> None:
        self._progress.advance(self._task)

    def level_finished(self, result) -> None:
        m = result.metrics
        description = f"{result.target:>8} @ {result.level.label}: {m.output_tokens_per_s:,.0f} tok/s"
        if m.failed:
            description += f" ({m.failed} failed)"
        self._progress.update(self._task, description=description)


def _levels(args: argparse.Namespace) -> list:
    from trtllm_truss.bench.load import ClosedLoop, OpenLoop, parse_float_list, parse_int_list

    if args.rounds < 1:
        raise ValueError(f"--rounds: expected a positive integer, got {args.rounds}")
    if args.request_rate is not None and args.concurrency is not None:
        raise ValueError("--concurrency and --request-rate: give one of them (closed or open loop)")
    if args.client_processes < 1:
        raise ValueError(f"--client-processes: expected a positive integer, got {args.client_processes}")
    if args.client_processes > 1 and args.request_rate is not None:
        raise ValueError("--client-processes > 1 works with closed-loop levels (--concurrency) only")
    if args.compare_backends is not None:
        _backend_pair(args)  # raises on a bad value
        if args.compare or args.guide_schema is not None or args.url or args.grpc_url:
            raise ValueError("--compare-backends starts its own stacks and compares them: leave out --compare,"
                             " --guide-schema, --url and --grpc-url")
    if args.match_guided_lengths and (args.guide_schema is None or args.ignore_eos == "none"):
        raise ValueError("--match-guided-lengths makes each unguided request run as long as its guided twin: give"
                         " --guide-schema, and an --ignore-eos other than none")
    if args.with_llm and (not args.compare or args.compare_backends is not None):
        raise ValueError("--with-llm adds the LLM API driven directly to --compare: give --compare (not --compare-backends)")
    if args.guide_schema is not None and (args.compare or args.client_processes > 1):
        raise ValueError("--guide-schema compares the engine without and with the schema: leave out --compare"
                         " and --client-processes")
    if args.request_rate is not None:
        return [OpenLoop(request_rate=r, max_concurrency=args.max_concurrency)
                for r in parse_float_list(args.request_rate, "--request-rate")]
    return [ClosedLoop(concurrency=c) for c in parse_int_list(args.concurrency or DEFAULT_CONCURRENCY, "--concurrency")]


BACKENDS = ("pytorch", "llmapi", "tensorrtllm")


def _backend_pair(args: argparse.Namespace) -> tuple[str, str]:
    pair = tuple(b.strip() for b in args.compare_backends.split(","))
    if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(BACKENDS):
        raise ValueError(f"--compare-backends: expected two different backends of {', '.join(BACKENDS)}"
                         f" (A,B), got {args.compare_backends!r}")
    return pair  # type: ignore[return-value]


def _labelled(target: str, backend: str) -> str:
    return f"{target}@{backend}"


def _targets_needed(args: argparse.Namespace) -> list[str]:
    if args.guide_schema is not None:
        return ["engine", "engine_guided"]
    if args.compare:
        return (["llm"] if args.with_llm else []) + ["engine", args.full_target]
    return [args.target]


def _comparison(args: argparse.Namespace) -> tuple[str, str] | None:
    if args.compare_backends is not None:
        first, second = _backend_pair(args)
        return (_labelled(args.target, first), _labelled(args.target, second))
    if args.guide_schema is not None:
        return ("engine", "engine_guided")
    if args.compare and args.with_llm:
        return ("llm", args.full_target)
    return ("engine", args.full_target) if args.compare else None


def _also_compared(args: argparse.Namespace) -> list[tuple[str, str]]:
    """--with-llm: the engine model against the LLM alone, and the full path against the engine model."""
    return [("llm", "engine"), ("engine", args.full_target)] if args.compare and args.with_llm else []


def _load_tokenizer(path: Path):
    from trtllm_truss.bench.tokenizer import BenchTokenizer

    return BenchTokenizer.from_dir(path)


def _plan_tokenizer_dir(truss_dir: Path) -> Path:
    """The tokenizer directory the truss's plan names (exists once the stack has fetched it)."""
    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan
    from trtllm_truss.planning.probe import probe_facts

    plan = make_plan(load_config(truss_dir), probe_facts())
    return plan.tokenizer_dir


def _triton_grpc_url_under(pid: int) -> str | None:
    """The gRPC address of the tritonserver that truss's server started (its model.py owns it): read
    from that child's command line, which our supervisor writes as `--grpc-port=N`."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            for arg in child.cmdline():
                if arg.startswith("--grpc-port="):
                    return f"127.0.0.1:{arg.split('=', 1)[1]}"
        except psutil.Error:
            continue
    return None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    err = Console(stderr=True, highlight=False)
    if getattr(args, "trace", None) is not None:
        from trtllm_truss.commands.bench_replay import run_replay

        return run_replay(args, err)
    try:
        levels = _levels(args)
    except ValueError as exc:
        err.print(str(exc), style="red", markup=False)
        return 2
    # SIGTERM (`timeout`, a CI runner) ends the run like Ctrl-C, so the servers it started are stopped
    # rather than left running without their parent.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run(args, levels, err)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@dataclass
class _Endpoints:
    """Where the measured targets are, and the tokenizer of the deployment behind them."""

    grpc_url: str | None
    http_url: str | None
    tokenizer_dir: Path | None
    metrics_url: str | None = None  # Triton's /metrics, when this command started the stack
    truss_pid: int | None = None  # truss's server, when this command started it
    stack: Any = None  # the stack (runtime.stack) this command started for the gRPC targets: its tritonserver's pid


class _SetupError(Exception):
    """A problem found before any request is sent; the message is shown as is."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def _bring_up(args: argparse.Namespace, names: list[str], cleanup: contextlib.ExitStack, err: Any) -> _Endpoints:
    """Use the given URLs, or start what is missing (stopped by `cleanup`)."""
    grpc_needed = any(n in ("engine", "ensemble") for n in names)
    http_needed = "http" in names
    found = _Endpoints(
        grpc_url=args.grpc_url or (args.url if not http_needed else None),
        http_url=args.url if http_needed else None,
        tokenizer_dir=args.tokenizer,
    )
    if http_needed and found.http_url is None:
        found.http_url, truss_pid = _start_truss_server(args, cleanup, err)
        found.truss_pid = truss_pid
        if grpc_needed and found.grpc_url is None:
            found.grpc_url = _triton_grpc_url_under(truss_pid)
            if found.grpc_url is None:
                raise _SetupError("no tritonserver found under truss's server; pass --grpc-url", 2)
    elif http_needed and grpc_needed and found.grpc_url is None:
        # Starting a second stack here would compare against a different tritonserver.
        raise _SetupError("--compare with --url: also give --grpc-url, the Triton behind that truss server", 2)
    elif grpc_needed and found.grpc_url is None:
        stack = _start_stack(args, cleanup, err)
        found.stack = stack
        found.grpc_url = stack.server.grpc_url
        found.metrics_url = stack.server.metrics_url
        found.tokenizer_dir = found.tokenizer_dir or stack.plan.tokenizer_dir
    if found.tokenizer_dir is None:
        found.tokenizer_dir = _plan_tokenizer_dir(args.truss_dir)
    if not Path(found.tokenizer_dir).is_dir():
        raise _SetupError(f"--tokenizer: {found.tokenizer_dir} is not a directory", 2)
    return found


def _bring_up_backends(args: argparse.Namespace, cleanup: contextlib.ExitStack, err: Any) -> dict[str, _Endpoints]:
    """--compare-backends: one stack of the truss per backend (`TRTLLM_RUNTIME__BACKEND`), all up at once
    (the one not measured idles), each for --target: tritonserver for the gRPC targets, truss's server or the
    direct front (--front) for http."""
    import os

    stacks = {}
    for backend in _backend_pair(args):
        override = {"TRTLLM_RUNTIME__BACKEND": backend}
        if args.target == "http":
            url, pid = _start_truss_server(args, cleanup, err, env=override)
            found = _Endpoints(grpc_url=None, http_url=url, tokenizer_dir=args.tokenizer, truss_pid=pid)
        else:
            stack = _start_stack(args, cleanup, err, environ={**os.environ, **override})
            found = _Endpoints(grpc_url=stack.server.grpc_url, http_url=None,
                               tokenizer_dir=args.tokenizer or stack.plan.tokenizer_dir,
                               metrics_url=stack.server.metrics_url, stack=stack)
        if found.tokenizer_dir is None:
            found.tokenizer_dir = _plan_tokenizer_dir(args.truss_dir)
        if not Path(found.tokenizer_dir).is_dir():
            raise _SetupError(f"--tokenizer: {found.tokenizer_dir} is not a directory", 2)
        stacks[backend] = found
    return stacks


def _cpu_probe(endpoints: _Endpoints):
    """Reads the CPU of the servers measured when they run on this machine: truss's server and what
    runs under it (stream workers, tritonserver, its stubs), or the tritonserver behind the gRPC
    targets; found by the ports they listen on when this command did not start them. A tritonserver this
    command started is read through its supervisor: the one running at each round, a restart followed."""
    from trtllm_truss.bench.cpu import CpuProbe, listening_pid, probe_for

    truss = endpoints.truss_pid or (listening_pid(endpoints.http_url) if endpoints.http_url else None)
    if endpoints.stack is not None:
        server = endpoints.stack.server
        return CpuProbe((), current_roots=lambda: (truss, server.pid))
    return probe_for([truss, listening_pid(endpoints.grpc_url) if endpoints.grpc_url else None])


def _workload(args: argparse.Namespace, levels: list, tokenizer: Any):
    from trtllm_truss.bench.workload import LengthDistribution, WorkloadError, WorkloadSpec, generate_workload

    max_load = max(getattr(level, "concurrency", 0) or 0 for level in levels)
    try:
        spec = WorkloadSpec(
            num_requests=args.num_requests or max(32, 4 * max_load),
            input_length=LengthDistribution(mean=args.input_mean, stddev=args.input_stddev),
            output_length=LengthDistribution(mean=args.output_mean, stddev=args.output_stddev),
            dataset=args.dataset,
            seed=args.seed,
        )
        return spec, generate_workload(spec, tokenizer)
    except (WorkloadError, ValueError) as exc:
        raise _SetupError(str(exc), 2) from None


def _run(args: argparse.Namespace, levels: list, err: Any) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trtllm_truss.bench.runner import TargetSpec
    from trtllm_truss.bench.session import BenchPlan, run_bench
    from trtllm_truss.bench.targets import TargetError, make_target

    names = _targets_needed(args)
    with contextlib.ExitStack() as cleanup:
        try:
            if args.compare_backends is not None:
                stacks: dict[str | None, _Endpoints] = dict(_bring_up_backends(args, cleanup, err))
            else:
                stacks = {None: _bring_up(args, names, cleanup, err)}
            endpoints = next(iter(stacks.values()))  # the tokenizer is the truss's whatever the backend
            tokenizer = _load_tokenizer(Path(endpoints.tokenizer_dir))
            spec, requests = _workload(args, levels, tokenizer)
            guides = _guides(args)
        except _SetupError as exc:
            err.print(str(exc), style="red", markup=False)
            return exc.exit_code
        except Exception as exc:  # every stage raises its own typed error with an actionable message
            err.print(f"starting the stack failed: {type(exc).__name__}: {exc}", style="red", markup=False)
            return 1

        targets, specs, probes = [], {}, {}
        for backend, found in stacks.items():  # one stack unless --compare-backends
            for n in names:
                url = found.http_url if n == "http" else found.grpc_url
                target = make_target(n, url, args.ignore_eos, args.timeout, guides, truss_dir=args.truss_dir)
                if backend is not None:
                    target.name = _labelled(n, backend)
                    probes[target.name] = _cpu_probe(found)
                targets.append(target)
                specs[target.name] = TargetSpec(n, url, args.ignore_eos, args.timeout)
        plan = BenchPlan(
            targets=targets,
            levels=levels,
            requests=requests,
            workload=spec.model_dump(mode="json") | {"tokenizer": str(endpoints.tokenizer_dir)},
            compare=_comparison(args),
            also_compare=_also_compared(args),
            warmup_requests=args.warmup,
            rounds=args.rounds,
            timeout_s=args.timeout,
            seed=args.seed,
            token_counting=args.token_counting,
            fixed_length=args.ignore_eos != "none",
            settings={
                "targets": names, "ignore_eos": args.ignore_eos, "token_counting": args.token_counting,
                "timeout_s": args.timeout, "warmup_requests": args.warmup, "rounds": args.rounds,
                "truss_dir": str(args.truss_dir), "client_processes": args.client_processes,
                "front": args.front, "compare_backends": args.compare_backends,
                "match_guided_lengths": args.match_guided_lengths, "with_llm": args.with_llm,
            },
            client_processes=args.client_processes,
            cpu_probe=_cpu_probe(endpoints) if args.compare_backends is None else None,
            cpu_probes={name: probe for name, probe in probes.items() if probe is not None},
            target_specs=specs,
            lengths_from="engine_guided" if args.match_guided_lengths else None,
        )
        progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=err, disable=args.no_progress, transient=False,
        )
        counters_before = _guide_counters(endpoints) if guides else None
        try:
            with progress:
                report = asyncio.run(run_bench(plan, tokenizer, _RichProgress(progress)))
        except TargetError as exc:
            err.print(str(exc), style="red", markup=False)
            return 1
        if guides:
            report.structured_output = _structured_output(guides, endpoints, counters_before)
    _write_outputs(report, args, err)
    return 1 if any(r.metrics.failed for r in report.runs) else 0


def _guides(args: argparse.Namespace) -> list[str] | None:
    from trtllm_truss.bench.guides import read_schemas

    if args.guide_schema is None:
        return None
    try:
        return read_schemas(args.guide_schema)
    except (OSError, ValueError) as exc:
        raise _SetupError(str(exc), 2) from None


def _guide_counters(endpoints: _Endpoints):
    from trtllm_truss.bench.guides import cache_counters

    return cache_counters(endpoints.metrics_url)


def _structured_output(guides: list[str], endpoints: _Endpoints, before) -> dict:
    """Compile times (this process, the engine's compiler) and the engine's cache hits over the run
    (warm-up included; the stand-in's counters, when this command started the stack)."""
    from trtllm_truss.bench.guides import compile_times

    summary = compile_times(guides, Path(endpoints.tokenizer_dir))
    after = _guide_counters(endpoints)
    if before is not None and after is not None:
        hits, misses = after[0] - before[0], after[1] - before[1]
        summary |= {"cache_hits": hits, "cache_misses": misses,
                    "cache_hit_rate": hits / (hits + misses) if hits + misses else None}
    return summary


def _write_outputs(report: Any, args: argparse.Namespace, err: Any) -> None:
    from rich.console import Console

    from trtllm_truss.bench.plot import write_plot
    from trtllm_truss.bench.report import render_table

    out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    out.print(render_table(report))
    if args.compare_backends is not None:
        for c in report.comparisons:
            cpu = c.cpu_ratios or {}
            out.print(f"{c.full} / {c.direct} at {c.level.label}: output tokens/s x{c.ratio or 0:.3f}; CPU per token: "
                      + ", ".join(f"{group} x{value:.3f}" for group, value in cpu.items()))
    elif report.ratio is not None:
        added = "-" if report.added_ttft_p50_ms is None else f"{report.added_ttft_p50_ms:+.2f} ms"
        out.print(f"ratio (full / direct output tokens/s at the highest load): {report.ratio:.3f};"
                  f" added TTFT p50: {added}")
    if report.structured_output is not None:
        s = report.structured_output
        ms = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731 - one-line formatter
        rate = s.get("cache_hit_rate")
        out.print(f"schemas: {s['distinct_schemas']} distinct, compile p50 {ms(s['compile_ms_p50'])} ms,"
                  f" p99 {ms(s['compile_ms_p99'])} ms; engine guide cache hit rate: "
                  + ("-" if rate is None else f"{rate:.1%} ({s['cache_hits']:.0f} hits, {s['cache_misses']:.0f} misses)"))
    if args.json_path is not None:
        report.write_json(args.json_path)
        out.print(f"JSON: {args.json_path}")
    plot_path = args.plot or (args.json_path.with_suffix(".png") if args.json_path is not None else None)
    if plot_path is not None:
        write_plot(report, plot_path)
        out.print(f"plot: {plot_path}")
    for warning in report.warnings:
        err.print(f"warning: {warning}", style="yellow", markup=False)


def _start_stack(args: argparse.Namespace, cleanup: contextlib.ExitStack, err: Any, environ: Any = None):
    """tritonserver with the truss's rendered repository, as `serve` runs it (`environ`: the environment
    its configuration overrides are read from; default os.environ)."""
    from trtllm_truss.runtime.stack import start_stack

    with err.status("starting the stack...") as status:
        stack = start_stack(
            args.truss_dir,
            environ=environ,
            startup_timeout_s=args.startup_timeout,
            progress=lambda stage: status.update(f"starting the stack: {stage}..."),
        )
    cleanup.callback(stack.stop)
    if stack.is_worker_node:  # node > 0 of a multi-node group serves nothing: bench node 0
        group = stack.cluster.group
        raise _SetupError(
            f"this is node {group.node_rank} of {group.node_count}, which serves no requests; bench node 0 ({group.hosts[0]})",
            2,
        )
    return stack


def _start_truss_server(
    args: argparse.Namespace, cleanup: contextlib.ExitStack, err: Any, env: dict[str, str] | None = None
) -> tuple[str, int]:
    """truss's own model server on the truss directory (which starts tritonserver in model.load()), or with
    --front direct `trtllm-truss serve --front direct` (which starts tritonserver and the frontends); `env`:
    variables added to the server's environment (configuration overrides)."""
    if args.front == "direct":
        from trtllm_truss.fronts.direct import start_direct_server

        work_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="trtllm-bench-")))
        with err.status("starting the direct front (and tritonserver)..."):
            server = start_direct_server(args.truss_dir.resolve(), work_dir / "direct-front.log", env=env)
            cleanup.callback(server.stop)
            server.wait_ready(args.startup_timeout)
        return server.url, server.process.pid
    try:
        from trtllm_truss.fronts.truss_server import build_server_root, start_truss_server
    except ImportError:
        raise RuntimeError(
            "this installation cannot start truss's model server itself; start one and pass --url http://host:port"
            " (with --compare also --grpc-url host:port of its tritonserver)"
        ) from None
    work_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="trtllm-bench-")))
    with err.status("starting truss's model server (and tritonserver inside it)..."):
        fs_root = build_server_root(args.truss_dir.resolve(), work_dir)
        server = start_truss_server(fs_root, work_dir / "truss-server.log", env=env)
        cleanup.callback(server.stop)
        server.wait_ready(args.startup_timeout)
    return server.url, server.process.pid
