"""A whole benchmark: every target at every load level on the same requests, into one report.

With a comparison (`--compare`) the direct engine stream and the full path run one after the other
at each level (never at the same time: on a small machine they would compete for the CPU and each
would measure the other). With several rounds the targets alternate within a level and each target's
figures pool its rounds (throughput = all its tokens / the sum of its rounds' wall times), which keeps
slow drift of a shared machine out of the ratio; each round's own figures are kept too, so a
comparison reports the spread of its per-round ratios. With a CPU probe the servers' processes'
CPU is read before and after every round (bench.cpu).
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Sequence

from trtllm_truss.bench.cpu import CpuProbe, cpu_between
from trtllm_truss.bench.load import ClosedLoop, LoadLevel
from trtllm_truss.bench.report import BenchReport, GroupCpu, RoundResult, RunResult
from trtllm_truss.bench.runner import ProgressCallback, TargetSpec, TokenCounting, count_output_tokens, run_level, run_level_in_processes
from trtllm_truss.bench.stats import RequestRecord, summarize
from trtllm_truss.bench.targets.base import BenchTarget
from trtllm_truss.bench.workload import BenchRequest, TokenizerLike


@dataclass
class BenchPlan:
    targets: Sequence[BenchTarget]
    levels: Sequence[LoadLevel]
    requests: Sequence[BenchRequest]
    workload: dict[str, Any]
    compare: tuple[str, str] | None = None  # (direct, full): target names (RunLabel); sets the report's ratio
    also_compare: Sequence[tuple[str, str]] = ()  # more (direct, full) pairs (bench --with-llm)
    warmup_requests: int = 4
    timeout_s: float = 600.0
    seed: int = 0
    token_counting: TokenCounting = "auto"
    fixed_length: bool = True  # requests ask the engine to ignore its end token (see targets.base.IgnoreEos)
    # Rounds per level, alternating the targets: on a noisy machine drift then hits both targets alike.
    rounds: int = 1
    settings: dict[str, Any] = field(default_factory=dict)
    # Client processes per target (closed loop only); each needs the target's spec to build its own.
    client_processes: int = 1
    target_specs: dict[str, TargetSpec] = field(default_factory=dict)
    # Reads the servers' processes' CPU around each round (bench.cpu); None: not measured.
    cpu_probe: CpuProbe | None = None
    # Per target name, where targets run on different stacks (--compare-backends); else cpu_probe.
    cpu_probes: dict[str, CpuProbe] = field(default_factory=dict)
    # A target whose output lengths the others ask for (bench --match-guided-lengths): at each level an
    # unmeasured pass of it first, then every other target's request i asks for the tokens its request
    # i produced. Guided requests end where their schema completes; unguided ones asking the same
    # lengths leave and join the batch at the same points, so a comparison measures the guide's cost
    # per step rather than a different batch.
    lengths_from: str | None = None


class ProgressSink:
    """What the session reports while it runs; the CLI's implementation draws a rich progress bar."""

    def level_started(self, target: str, level: LoadLevel, total: int) -> None: ...

    def request_done(self) -> None: ...

    def level_finished(self, result: RunResult) -> None: ...


async def run_bench(
    plan: BenchPlan, tokenizer: TokenizerLike | None, progress: ProgressSink | None = None
) -> BenchReport:
    progress = progress or ProgressSink()
    report = BenchReport(workload=plan.workload, settings=plan.settings)
    async with AsyncExitStack() as stack:
        for target in plan.targets:
            stack.push_async_callback(target.close)  # also after a failed open (close is idempotent)
            await target.open()
            if getattr(target, "pid", None) is not None:  # a target with processes of its own (llm): their CPU
                plan.cpu_probes.setdefault(target.name, CpuProbe((target.pid,)))
        for target in plan.targets:
            await _warm_up(target, plan)
        for level in plan.levels:
            pooled = {t.name: _Pooled() for t in plan.targets}
            requests_of = {t.name: plan.requests for t in plan.targets}
            if plan.lengths_from is not None:
                source = _named(plan.targets, plan.lengths_from)
                progress.level_started(f"{source.name} (lengths, unmeasured)", level, len(plan.requests))
                matched, unmatched = await _lengths_of(source, plan, level, progress.request_done)
                report.matched_lengths[level.label] = _length_summary(matched) | {"unmatched": unmatched}
                if unmatched:
                    report.warnings.append(
                        f"{level.label}: {unmatched} request(s) failed in the {source.name} pass that sets the lengths;"
                        " the other targets ask their own length for them"
                    )
                requests_of.update({name: matched for name in requests_of if name != plan.lengths_from})
            for _ in range(plan.rounds):
                for target in plan.targets:
                    requests = requests_of[target.name]
                    progress.level_started(target.name, level, len(requests))
                    probe = plan.cpu_probes.get(target.name, plan.cpu_probe)
                    roots = probe.root_pids() if probe is not None else ()
                    cpu_before = probe.snapshot() if probe is not None else None
                    if plan.client_processes > 1 and not hasattr(target, "run_level"):
                        records, cpu_s = await run_level_in_processes(
                            plan.target_specs[target.name], requests, level, plan.client_processes,
                            timeout_s=plan.timeout_s,
                        )
                    else:
                        client_cpu_before = time.process_time()
                        records = await run_level(
                            target, requests, level, seed=plan.seed, timeout_s=plan.timeout_s,
                            on_done=progress.request_done,
                        )
                        # A target that runs levels in its own process (llm) reports that process's CPU.
                        cpu_s = getattr(target, "cpu_s", time.process_time() - client_cpu_before)
                    server_cpu = None
                    if probe is not None and cpu_before is not None:
                        cpu_after = probe.snapshot()
                        server_cpu = cpu_between(cpu_before, cpu_after)
                        if ended := [pid for pid in roots if pid not in cpu_after]:
                            report.warnings.append(
                                f"{target.name} @ {level.label}: the server process(es) {ended} measured for CPU"
                                " ended during a round (restarted or crashed); that round's server CPU misses them"
                            )
                    # The target that sets the lengths ends requests early on purpose (a guide completing).
                    fixed_length = plan.fixed_length and target.name != plan.lengths_from
                    method, warnings = count_output_tokens(records, plan.token_counting, tokenizer, fixed_length=fixed_length)
                    report.warnings.extend(f"{target.name} @ {level.label}: {w}" for w in warnings)
                    round_metrics = summarize(records)
                    round_wall_s = round_metrics.duration_s
                    pooled[target.name].add(records, round_wall_s, cpu_s, method, server_cpu)
                    pooled[target.name].rounds.append(RoundResult(
                        duration_s=round_wall_s, output_tokens_per_s=round_metrics.output_tokens_per_s,
                        ttft_p50_ms=round_metrics.ttft_ms.p50,
                    ))
                    progress.level_finished(_result(target, level, records, round_wall_s, method, cpu_s))
            for target in plan.targets:
                p = pooled[target.name]
                result = _result(target, level, p.records, p.wall_s, "+".join(sorted(p.methods)), p.cpu_s, p.server_cpu)
                result.rounds = p.rounds
                report.runs.append(result)
            if plan.compare is not None:
                report.add_comparison(level, *plan.compare)
            for direct, full in plan.also_compare:
                report.add_comparison(level, direct, full, primary=False)
    return report


@dataclass
class _Pooled:
    """One target's rounds at one level."""

    records: list[RequestRecord] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    methods: set[str] = field(default_factory=set)
    server_cpu: dict[str, float] | None = None  # CPU seconds per process group, summed over the rounds
    rounds: list[RoundResult] = field(default_factory=list)

    def add(
        self, records: list[RequestRecord], wall_s: float, cpu_s: float, method: str, server_cpu: dict[str, float] | None
    ) -> None:
        self.records.extend(records)
        self.wall_s += wall_s
        self.cpu_s += cpu_s
        self.methods.add(method)
        if server_cpu is not None:
            total = self.server_cpu or {}
            self.server_cpu = {group: total.get(group, 0.0) + used for group, used in server_cpu.items()}


def _result(
    target, level, records, wall_s: float, method: str, cpu_s: float, server_cpu: dict[str, float] | None = None
) -> RunResult:
    metrics = summarize(records, duration_s=wall_s)
    groups = None
    if server_cpu is not None:
        groups = {group: GroupCpu.of(used, wall_s, metrics.output_tokens_total) for group, used in server_cpu.items()}
    return RunResult(
        target=target.name, url=target.url, level=level, token_counting=method,
        metrics=metrics, client_cpu_s=cpu_s, server_cpu=groups,
    )


def _named(targets: Sequence[BenchTarget], name: str) -> BenchTarget:
    for target in targets:
        if target.name == name:
            return target
    raise ValueError(f"lengths_from: no target {name!r} among {[t.name for t in targets]}")


async def _lengths_of(
    target: BenchTarget, plan: BenchPlan, level: LoadLevel, on_done: ProgressCallback | None
) -> tuple[list[BenchRequest], int]:
    """The plan's requests, each asking for the tokens `target` produced for it at `level` (one
    unmeasured pass), and how many failed there (those keep their own length)."""
    records = await run_level(target, plan.requests, level, seed=plan.seed, timeout_s=plan.timeout_s, on_done=on_done)
    produced = {r.index: r.output_tokens for r in records if r.ok and r.output_tokens}
    matched = [dataclasses.replace(r, output_len=produced.get(r.index, r.output_len)) for r in plan.requests]
    return matched, len(plan.requests) - len(produced)


def _length_summary(requests: Sequence[BenchRequest]) -> dict[str, float]:
    lengths = sorted(r.output_len for r in requests)
    return {"mean": sum(lengths) / len(lengths), "min": lengths[0], "max": lengths[-1]} if lengths else {}


async def _warm_up(target: BenchTarget, plan: BenchPlan) -> None:
    """A few short requests first, so connection setup and first-call costs stay out of the figures.
    A warm-up failure is not fatal here; the same failure will show in the measured level."""
    if plan.warmup_requests <= 0 or not plan.requests:
        return
    count = min(plan.warmup_requests, len(plan.requests))
    await run_level(target, plan.requests[:count], ClosedLoop(concurrency=count), timeout_s=plan.timeout_s)
