"""The benchmark report: one typed object, written as JSON, shown as a rich table.

JSON layout (schema_version 1):
  {"schema_version": 1, "created_at", "machine": {...}, "workload": {...}, "settings": {...},
   "runs": [{"target", "url", "level": {"kind": "closed", "concurrency": 64} | {"kind": "open",
             "request_rate": 10.0, ...}, "token_counting", "client_cpu_s", "metrics": {...}}],
             "server_cpu": {"serving_path" | "tritonserver" | "python_stubs" | "truss_process": {"cpu_s", "cores",
                            "cores_per_10k_tok_s"}} | null,
             "rounds": [{"duration_s", "output_tokens_per_s", "ttft_p50_ms"}]}],
   "comparisons": [{"level", "direct", "full", "ratio", "added_ttft_p50_ms",
                    "round_ratios", "ratio_min", "ratio_max", "ratio_stddev", "cpu_ratios"}],
   "ratio": float | null,               # full/direct output tokens/s at the highest load compared
   "added_ttft_p50_ms": float | null,   # full minus direct TTFT p50 at that same load
   "warnings": [str],
   "structured_output": {"distinct_schemas", "compiled", "refused", "compile_ms_p50", "compile_ms_p99",
                         "compile_ms_max", "cache_hits", "cache_misses", "cache_hit_rate"} | null,
   "matched_lengths": {level label: {"mean", "min", "max", "unmatched"}}}   # --match-guided-lengths
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trtllm_truss.bench.load import ClosedLoop, LoadLevel, OpenLoop
from trtllm_truss.bench.stats import LevelMetrics
SCHEMA_VERSION = 1
# A run's target: a TargetName (bench.targets.base), or with --compare-backends "<target>@<backend>".
RunLabel = str
# Process groups summed into the CPU ratios of a comparison (truss_process is part of serving_path).
CPU_RATIO_GROUPS = {
    "serving_path": ("serving_path",),
    "triton_and_stubs": ("tritonserver", "python_stubs"),
    "total": ("serving_path", "tritonserver", "python_stubs"),
}


class MachineInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu_count: int | None
    platform: str
    python: str

    @classmethod
    def current(cls) -> "MachineInfo":
        return cls(cpu_count=os.cpu_count(), platform=platform.platform(), python=platform.python_version())


class GroupCpu(BaseModel):
    """CPU that one group of the servers' processes used in a run (bench.cpu)."""

    model_config = ConfigDict(extra="forbid")

    cpu_s: float = Field(description="user + system CPU seconds over the measured rounds")
    cores: float | None = Field(description="cpu_s / the run's wall time")
    cores_per_10k_tok_s: float | None = Field(
        description="cores per 10,000 streamed tokens/s: cpu_s x 10,000 / the run's output tokens"
    )

    @classmethod
    def of(cls, cpu_s: float, wall_s: float, tokens: int) -> GroupCpu:
        return cls(
            cpu_s=cpu_s,
            cores=cpu_s / wall_s if wall_s > 0 else None,
            cores_per_10k_tok_s=cpu_s * 10_000 / tokens if tokens > 0 else None,
        )


class RoundResult(BaseModel):
    """One round of a run (`--rounds`): its own throughput and TTFT."""

    model_config = ConfigDict(extra="forbid")

    duration_s: float
    output_tokens_per_s: float
    ttft_p50_ms: float | None


class RunResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: RunLabel
    url: str
    level: ClosedLoop | OpenLoop = Field(discriminator="kind")
    token_counting: str = Field(description="exact (token ids or counts from the server) | retokenized | requested")
    metrics: LevelMetrics
    client_cpu_s: float | None = Field(
        None, description="CPU seconds the benchmark client itself used in this level (it shares the machine)"
    )
    server_cpu: dict[str, GroupCpu] | None = Field(
        None, description="CPU of the measured servers' processes by group (bench.cpu.GROUPS); null when not read"
    )
    rounds: list[RoundResult] = Field(default_factory=list, description="each round's figures, in order")


class Comparison(BaseModel):
    """The full path against the engine streamed directly, at one load level."""

    model_config = ConfigDict(extra="forbid")

    level: ClosedLoop | OpenLoop = Field(discriminator="kind")
    direct: RunLabel
    full: RunLabel
    ratio: float | None = Field(description="full output tokens/s divided by direct output tokens/s")
    added_ttft_p50_ms: float | None = Field(description="full TTFT p50 minus direct TTFT p50")
    round_ratios: list[float] = Field(
        default_factory=list, description="the ratio of each round (round k of full / round k of direct)"
    )
    ratio_min: float | None = None
    ratio_max: float | None = None
    ratio_stddev: float | None = Field(None, description="sample standard deviation of round_ratios (2+ rounds)")
    cpu_ratios: dict[str, float] | None = Field(
        None,
        description="full / direct CPU per token (cores per 10k tok/s) of serving_path, triton_and_stubs"
        " (tritonserver + python_stubs) and total; null when the CPU was not read",
    )


class BenchReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    machine: MachineInfo = Field(default_factory=MachineInfo.current)
    workload: dict[str, Any] = Field(description="the workload specification (lengths, dataset, seed)")
    settings: dict[str, Any] = Field(default_factory=dict, description="targets, ignore-EOS mode, timeouts")
    runs: list[RunResult] = Field(default_factory=list)
    comparisons: list[Comparison] = Field(default_factory=list)
    ratio: float | None = None
    added_ttft_p50_ms: float | None = None
    warnings: list[str] = Field(default_factory=list)
    structured_output: dict[str, Any] | None = Field(
        default=None, description="--guide-schema: compile times per distinct schema, the engine's guide cache hit rate"
    )
    matched_lengths: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="--match-guided-lengths: per level, the output lengths (mean, min, max) the guided target"
        " produced and the unguided one then asked for; unmatched: requests whose guided twin failed (they keep"
        " their own length)",
    )

    def run_for(self, target: RunLabel, level: LoadLevel) -> RunResult | None:
        return next((r for r in self.runs if r.target == target and r.level == level), None)

    def add_comparison(self, level: LoadLevel, direct: RunLabel, full: RunLabel, *, primary: bool = True) -> Comparison:
        """Compare two runs already in the report at `level`; the top-level ratio follows the highest
        load of the primary pair compared so far (the goal is stated at 64 streams, the top of the default
        sweep); other pairs are listed beside it."""
        direct_run = self.run_for(direct, level)
        full_run = self.run_for(full, level)
        if direct_run is None or full_run is None:
            raise ValueError(f"comparison at {level.label}: runs of both '{direct}' and '{full}' are needed")
        d, f = direct_run.metrics, full_run.metrics
        ratio = f.output_tokens_per_s / d.output_tokens_per_s if d.output_tokens_per_s > 0 else None
        added = None
        if f.ttft_ms.p50 is not None and d.ttft_ms.p50 is not None:
            added = f.ttft_ms.p50 - d.ttft_ms.p50
        rounds = [
            f_round.output_tokens_per_s / d_round.output_tokens_per_s
            for d_round, f_round in zip(direct_run.rounds, full_run.rounds)
            if d_round.output_tokens_per_s > 0
        ]
        comparison = Comparison(
            level=level, direct=direct, full=full, ratio=ratio, added_ttft_p50_ms=added, round_ratios=rounds,
            ratio_min=min(rounds) if rounds else None, ratio_max=max(rounds) if rounds else None,
            ratio_stddev=statistics.stdev(rounds) if len(rounds) > 1 else None,
            cpu_ratios=_cpu_ratios(direct_run, full_run),
        )
        self.comparisons.append(comparison)
        if primary:
            top = max((c for c in self.comparisons if (c.direct, c.full) == (direct, full)), key=lambda c: c.level.x_value)
            self.ratio, self.added_ttft_p50_ms = top.ratio, top.added_ttft_p50_ms
        return comparison

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read_json(cls, path: Path) -> "BenchReport":
        return cls.model_validate_json(path.read_text(encoding="utf-8"))


def cpu_per_10k(run: RunResult, groups: tuple[str, ...]) -> float | None:
    """Cores per 10k tokens/s of these process groups together (None where the CPU was not read)."""
    if not run.server_cpu or not run.metrics.output_tokens_total:
        return None
    used = sum(run.server_cpu[g].cpu_s for g in groups if g in run.server_cpu)
    return used * 10_000 / run.metrics.output_tokens_total


def _cpu_ratios(direct: RunResult, full: RunResult) -> dict[str, float] | None:
    ratios = {}
    for name, groups in CPU_RATIO_GROUPS.items():
        d, f = cpu_per_10k(direct, groups), cpu_per_10k(full, groups)
        if d and f is not None:
            ratios[name] = f / d
    return ratios or None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render_table(report: BenchReport):
    """A rich Table of every run (and the comparison rows, if any)."""
    from rich.table import Table

    table = Table(title="trtllm-truss bench", header_style="bold")
    for column in ("target", "load", "ok/sent", "out tok/s", "req/s", "tok/req", "resp/req", "TTFT p50/p90/p99 ms",
                   "ITL p50/p90/p99 ms", "E2E p50/p90/p99 ms", "cores/10k tok/s ours (truss) / triton / stubs"):
        table.add_column(column, justify="left" if column in ("target", "load") else "right")
    for run in report.runs:
        m = run.metrics
        table.add_row(
            run.target,
            run.level.label,
            f"{m.succeeded}/{m.requests}",
            f"{m.output_tokens_per_s:,.0f}",
            f"{m.requests_per_s:.2f}",
            # Side by side: a faithful engine answers once per token (resp/req == tok/req); fewer
            # responses than tokens means something merged them.
            "-" if not m.succeeded else f"{m.output_tokens_total / m.succeeded:.1f}",
            "-" if m.responses_per_request_mean is None else f"{m.responses_per_request_mean:.1f}",
            " / ".join(_ms(v) for v in (m.ttft_ms.p50, m.ttft_ms.p90, m.ttft_ms.p99)),
            " / ".join(f"{v:.3f}" if v is not None else "-" for v in (m.itl_ms.p50, m.itl_ms.p90, m.itl_ms.p99)),
            " / ".join(_ms(v) for v in (m.e2e_ms.p50, m.e2e_ms.p90, m.e2e_ms.p99)),
            _cpu_cell(run.server_cpu),
        )
    for c in report.comparisons:
        ratio = "-" if c.ratio is None else f"ratio {c.ratio:.3f}"
        if len(c.round_ratios) > 1:  # the rounds' spread
            ratio += f" ({c.ratio_min:.3f}-{c.ratio_max:.3f}, sd {c.ratio_stddev:.3f})"
        added = "-" if c.added_ttft_p50_ms is None else f"{c.added_ttft_p50_ms:+.2f} ms"
        cpu = "-"
        if c.cpu_ratios:  # the CPU per token of the two runs, as the CPU column's groups
            cpu = " / ".join(f"x{c.cpu_ratios[g]:.3f}" if g in c.cpu_ratios else "-"
                             for g in ("total", "serving_path", "triton_and_stubs"))
            cpu += " (all / ours / triton+stubs)"
        table.add_row(f"{c.full}/{c.direct}", c.level.label, "", ratio, "", "", "", added, "", "", cpu, style="bold cyan")
    return table


def _cpu_cell(cpu: dict[str, GroupCpu] | None) -> str:
    if not cpu:
        return "-"
    def per_10k(group: str) -> str:
        value = cpu.get(group)
        return "-" if value is None or value.cores_per_10k_tok_s is None else f"{value.cores_per_10k_tok_s:.2f}"

    ours = per_10k("serving_path")
    if "truss_process" in cpu:
        ours += f" ({per_10k('truss_process')})"
    return " / ".join((ours, per_10k("tritonserver"), per_10k("python_stubs")))
