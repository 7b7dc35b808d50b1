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
        from trtllm_truss.cluster import planned_cluster

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
    """Plan for the deployment's machine (no download, no build): refusals -> exit 1, else print the plan."""
    from trtllm_truss.artifacts.build import BuildPlanError
    from trtllm_truss.commands.build import describe_target_plan, plan_for_target
    from trtllm_truss.config.errors import redact
    from trtllm_truss.plan import PlanError
    from trtllm_truss.probe import probe_facts

    try:
        target = plan_for_target(resolved, probe_facts(), args.trtllm_version)
        lines = describe_target_plan(target, resolved)
    except PlanError as exc:
        err.print(f"plan: {len(exc.problems)} problem(s)", markup=False)
        for problem in exc.problems:
            err.print(f"error: {redact(problem)}", markup=False)
        return 1
    except BuildPlanError as exc:
        err.print(f"error: {redact(str(exc))}", markup=False)
        return 1
    for line in lines:  # plain print: a command must stay on one line whatever the terminal width
        print(redact(line), file=out.file)
    return 0


if __name__ == "__main__":  # pragma: no cover
    from trtllm_truss.cli import main

    sys.exit(main(["validate", *sys.argv[1:]]))
