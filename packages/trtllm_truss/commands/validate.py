"""`trtllm-truss validate [TRUSS_DIR]`: load the configuration, print each value and its origin."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "check config.yaml (+ environment overrides) and show every resolved value and its source"

# Options of a quantization recipe that is not selected are noise in the listing.
_ONLY_WITH_QUANTIZATION = {"build.smoothquant.": "smooth_quant", "build.awq.": "awq"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("truss_dir", nargs="?", default=".", type=Path, help="truss directory (default: .)")
    parser.add_argument("--all", action="store_true", help="also list options of unselected quantization recipes")


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
    for warning in resolved.warnings:
        err.print(f"warning: {redact(warning)}", markup=False)
    return 0


if __name__ == "__main__":  # pragma: no cover
    from trtllm_truss.cli import main

    sys.exit(main(["validate", *sys.argv[1:]]))
