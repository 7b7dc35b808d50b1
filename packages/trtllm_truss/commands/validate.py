"""`trtllm-truss validate [TRUSS_DIR]`: load the configuration, print each value and its origin, then plan.

The plan is the one the deployment's machine would make (`trtllm_truss.commands.build.plan_for_target`:
base_image's TensorRT-LLM version, resources.accelerator's GPUs), made without downloading or building
anything: settings the chosen backend would refuse at load are reported here, one line per key (exit 1),
and what that machine would run is printed (the engine build commands, the llmapi model.yaml, or the
serve-mode fetches).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "check config.yaml (+ environment overrides), show every resolved value and its source, and the plan"

# Options of a quantization recipe that is not selected are noise in the listing.
_ONLY_WITH_QUANTIZATION = {"build.smoothquant.": "smooth_quant", "build.awq.": "awq"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("truss_dir", nargs="?", default=".", type=Path, help="truss directory (default: .)")
    parser.add_argument("--all", action="store_true", help="also list options of unselected quantization recipes")
    parser.add_argument(
        "--trtllm-version",
        default=None,
        help="plan for this TensorRT-LLM version (default: the installed one, else base_image's, else the newest 0.x)",
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from trtllm_truss.config import ConfigError, load_config
    from trtllm_truss.config.errors import SECTION_PATH, redact

    err = Console(stderr=True, highlight=False, soft_wrap=True)  # one problem, one line, whatever the width
    try:
        resolved = load_config(args.truss_dir)
    except ConfigError as exc:
        err.print(f"[bold red]{args.truss_dir / 'config.yaml'}: {len(exc.problems)} problem(s)[/]")
        for problem in exc.problems:
            err.print(redact(problem), markup=False)
        return 1

    # piped output (CI logs, tests) gets room for the longest dotted keys instead of 80 columns
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    config = resolved.trt_llm
    quantization = config.build.quantization_type.value if config.build is not None else None
    table = Table(title=f"{SECTION_PATH} ({config.mode}) in {resolved.truss_dir}", title_justify="left")
    table.add_column("key", no_wrap=True)
    table.add_column("value")
    table.add_column("source")
    prefix = SECTION_PATH + "."
    for key, value in resolved.values().items():
        relative = key.removeprefix(prefix)
        needs = next((q for p, q in _ONLY_WITH_QUANTIZATION.items() if relative.startswith(p)), None)
        if needs is not None and needs != quantization and not args.all:
            continue
        source = resolved.sources[key]
        style = {"env": "bold", "file": "", "default": "dim"}[source.kind]
        table.add_row(relative, redact(str(value)), str(source), style=style)
    out.print(table)
    accelerator = resolved.accelerator or "none (CPU)"
    out.print(
        f"resources.accelerator: {accelerator}; world size {config.world_size};"
        f" secrets declared: {', '.join(resolved.secrets) or 'none'}",
        markup=False,
    )
    if resolved.node_count > 1 and resolved.accelerator is not None:
        from trtllm_truss.runtime.cluster import planned_cluster

        layout = planned_cluster(config.world_size, resolved.node_count, resolved.accelerator.count)
        for line in layout.describe():
            print(line, file=out.file)
        experts = config.build.expert_parallel_count if config.build is not None else None
        if experts:
            print(f"  MoE experts split {experts} ways over the {config.world_size} ranks", file=out.file)
    for warning in resolved.warnings:
        err.print(f"warning: {redact(warning)}", markup=False)
    return _check_plan(resolved, args, out, err)


def _check_plan(resolved, args: argparse.Namespace, out, err) -> int:
    return check_plan(resolved, args.trtllm_version, out, err)


def check_plan(resolved, trtllm_version: str | None, out, err) -> int:
    """Plan for the deployment's machine (no download, no build): refusals -> exit 1, else print the plan.
    `init` runs it on the truss it writes, so it writes only what validate accepts."""
    from trtllm_truss.artifacts.build_recipes import BuildPlanError
    from trtllm_truss.commands.build import describe_target_plan, plan_for_target
    from trtllm_truss.config.errors import redact
    from trtllm_truss.planning.plan import PlanError
    from trtllm_truss.planning.probe import probe_facts

    from trtllm_truss.artifacts.checkpoint_config import checkpoint_architecture
    from trtllm_truss.planning.architectures import describe as describe_architecture

    checkpoint = checkpoint_architecture(resolved)
    try:
        target = plan_for_target(resolved, probe_facts(), trtllm_version, checkpoint=checkpoint)
        lines = describe_target_plan(target, resolved)
    except PlanError as exc:
        err.print(f"plan: {len(exc.problems)} problem(s)", markup=False)
        for problem in exc.problems:
            err.print(f"error: {redact(problem)}", markup=False)
        return 1
    except BuildPlanError as exc:
        err.print(f"error: {redact(str(exc))}", markup=False)
        return 1
    lines += kv_estimate_lines(resolved)
    # the architecture, whether the deployment's TensorRT-LLM serves it, then the parsers its family gets
    lines += describe_architecture(checkpoint, target.plan.backend, target.version.version)
    from trtllm_truss.commands.parser_report import parser_report

    parser_lines, warnings, problems = parser_report(resolved, target.plan.forced_syntax_off)
    lines += parser_lines
    from trtllm_truss.planning.fleet import fleet_report

    fleet_lines, fleet_warnings, fleet_problems = fleet_report(resolved, target.plan)  # the fleet's plan, if any
    lines += fleet_lines
    warnings = [*warnings, *fleet_warnings]
    problems = [*problems, *fleet_problems]
    for line in lines:  # plain print: a command must stay on one line whatever the terminal width
        print(redact(line), file=out.file)
    for warning in warnings:
        err.print(f"warning: {redact(warning)}", markup=False)
    for problem in problems:
        err.print(f"error: {redact(problem)}", markup=False)
    return 1 if problems else 0


def _model_config(resolved) -> tuple[dict | None, int | None, str]:
    """(config.json, weights size, "") of the checkpoint (build) or engine (serve), or (None, None, why not)."""
    from trtllm_truss.artifacts.checkpoint_config import read_model_config

    return read_model_config(resolved)


def kv_estimate_lines(resolved) -> list[str]:
    """The KV-cache size the engine will have on resources.accelerator (trtllm_truss.planning.kv_capacity)."""
    from trtllm_truss.planning.kv_capacity import ModelShape, kv_capacity

    trt = resolved.trt_llm
    accelerator = resolved.accelerator
    if accelerator is None:
        return ["# KV cache: no estimate (resources.accelerator sets no GPU)"]
    if accelerator.memory_gib is None:
        return [f"# KV cache: no estimate (the memory of {accelerator.gpu} is not in the table)"]
    config, weights, why = _model_config(resolved)
    if config is None:
        return [f"# KV cache: no estimate: {why}"]
    build, runtime = trt.build, trt.runtime
    try:
        shape = ModelShape.from_config(config, weights)
        capacity = kv_capacity(
            shape,
            gpu=accelerator.gpu,
            gpu_memory_gib=accelerator.memory_gib,
            dtype=build.dtype.value if build is not None else str(config.get("pretrained_config", config).get("dtype")),
            quantization=build.quantization_type.value if build is not None else "no_quant",
            tensor_parallel=trt.tensor_parallel_count,
            pipeline_parallel=trt.pipeline_parallel_count,
            fraction=runtime.kv_cache_free_gpu_mem_fraction,
            tokens_per_block=build.plugin_configuration.tokens_per_block if build is not None else 64,
            max_tokens=runtime.max_tokens_in_paged_kv_cache,
            host_memory_bytes=runtime.kv_cache_host_memory_bytes,
            max_seq_len=build.max_seq_len if build is not None else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        return [f"# KV cache: no estimate: config.json lacks what it needs ({type(exc).__name__}: {exc})"]
    return ["# " + line for line in capacity.describe()]

