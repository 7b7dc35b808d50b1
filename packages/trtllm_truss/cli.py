"""`trtllm-truss`: a thin dispatcher; each subcommand lives in `trtllm_truss.commands.<name>`.

A command module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.
Modules are imported only when their command runs, so `validate` never pays for torch or tritonclient.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("init", "validate", "build", "serve", "predict", "bench")


def _command_module(name: str):
    return importlib.import_module(f"trtllm_truss.commands.{name}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="trtllm-truss", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name in COMMANDS:
        if chosen == name:
            module = _command_module(name)
            module.add_arguments(sub.add_parser(name, help=module.HELP))
        else:  # listed for --help without importing the module
            sub.add_parser(name, help=f"see `trtllm-truss {name} --help`")
    args = parser.parse_args(argv)
    return int(_command_module(args.command).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
