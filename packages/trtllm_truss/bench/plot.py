"""PNG plot of a report: output tokens/s and TTFT p50 per target against the load (concurrency or
request rate). matplotlib with the Agg backend: no display needed."""

from __future__ import annotations

from pathlib import Path

from trtllm_truss.bench.report import BenchReport


def write_plot(report: BenchReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator, ScalarFormatter

    fig, (throughput_ax, ttft_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    targets = list(dict.fromkeys(run.target for run in report.runs))
    x_label = "request rate (req/s)" if any(r.level.kind == "open" for r in report.runs) else "concurrent streams"
    for target in targets:
        runs = sorted((r for r in report.runs if r.target == target), key=lambda r: r.level.x_value)
        xs = [r.level.x_value for r in runs]
        throughput_ax.plot(xs, [r.metrics.output_tokens_per_s for r in runs], marker="o", label=target)
        ttft_ax.plot(xs, [r.metrics.ttft_ms.p50 or 0.0 for r in runs], marker="o", label=target)
    throughput_ax.set(title="output tokens/s", xlabel=x_label, ylabel="tokens/s")
    ttft_ax.set(title="time to first token, p50", xlabel=x_label, ylabel="ms")
    levels = sorted({r.level.x_value for r in report.runs})
    for ax in (throughput_ax, ttft_ax):
        ax.grid(True, alpha=0.3)
        ax.legend()
        if len(levels) > 2 and x_label == "concurrent streams":
            ax.set_xscale("log", base=2)  # sweeps are usually 1, 8, 32, 64: even spacing, plain labels
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticks(levels)
    if report.ratio is not None and report.comparisons:
        top = max(report.comparisons, key=lambda c: c.level.x_value)
        fig.suptitle(
            f"{top.full} / {top.direct}: {report.ratio:.3f} of output tokens/s at {top.level.label}"
        )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
