"""Checking a printed command line against the flags recorded under tests/data/trtllm_flags/<version>/.

Shared by the tests that parse what `validate` / `build --dry-run` print. Each record names the
NVIDIA/TensorRT-LLM path and commit it was read from.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

FLAGS_DIR = Path(__file__).resolve().parent / "data" / "trtllm_flags"
# NVIDIA's examples/ directory of each architecture in the 0.9-0.17 layout -> the record of its convert script.
LEGACY_CONVERT_RECORDS = {"llama": "convert_checkpoint.llama"}


def load_flags(version: str, name: str) -> dict:
    doc = json.loads((FLAGS_DIR / version / f"{name}.json").read_text())
    assert doc["trtllm_version"] == version and doc["source"]["path"], f"{version}/{name}: provenance missing"
    return doc


def flag_problems(argv: list[str] | tuple[str, ...], accepted: dict, required: list[str]) -> list[str]:
    """Every way `argv` (flags and values, no program name) falls outside `accepted`; [] when it fits."""
    problems, seen, index = [], set(), 0
    while index < len(argv):
        token = argv[index]
        if not token.startswith("-"):
            problems.append(f"unexpected positional {token!r}")
            index += 1
            continue
        spec = accepted.get(token)
        if spec is None:
            problems.append(f"{token} is not a flag of this version")
            index += 1
            continue
        seen.add(token)
        if spec["takes_value"]:
            if index + 1 >= len(argv):
                problems.append(f"{token} needs a value")
                break
            values = [argv[index + 1]]
            index += 2
            while spec.get("nargs") == "+" and index < len(argv) and not argv[index].startswith("-"):
                values.append(argv[index])  # argparse nargs='+': one or more values
                index += 1
            for value in values:
                if spec["choices"] is not None and value not in spec["choices"]:
                    problems.append(f"{token} {value!r} not in {spec['choices']}")
        else:
            index += 1
    problems += [f"required {flag} missing" for flag in required if flag not in seen]
    return problems


def printed_commands(text: str) -> list[list[str]]:
    """The shell commands in printed plan output (`cd DIR && ENV=V prog ...` reduced to `prog ...`): every
    line that is not a comment and runs python or trtllm-build. Other lines are report lines."""
    commands = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if not any(word == "trtllm-build" or Path(word).name.startswith("python") for word in words[:4]):
            continue  # a report line ("cache key: ...", "would fetch ...")
        argv = shlex.split(line)
        if "&&" in argv:
            argv = argv[argv.index("&&") + 1 :]
        while argv and "=" in argv[0] and not argv[0].startswith("-"):
            argv = argv[1:]  # VAR=value prefixes
        if argv and (argv[0] == "trtllm-build" or Path(argv[0]).name.startswith("python")):
            commands.append(argv)
    return commands


def command_problems(argv: list[str], version: str) -> tuple[str, list[str]]:
    """(which NVIDIA tool `argv` runs, its problems against the `version` records)."""
    if argv[0] == "trtllm-build":
        core, plugins = load_flags(version, "trtllm-build"), load_flags(version, "trtllm-build.plugin_args")
        return "trtllm-build", flag_problems(argv[1:], {**core["flags"], **plugins["flags"]}, ["--checkpoint_dir", "--output_dir"])
    script = argv[1]
    if script.endswith("quantization/quantize.py"):
        record = load_flags(version, "quantize")
        return "quantize", flag_problems(argv[2:], record["flags"], record["required"])
    if script.endswith("/convert_checkpoint.py"):
        architecture_dir = Path(script).parent.name
        record = load_flags(version, LEGACY_CONVERT_RECORDS.get(architecture_dir, f"convert_checkpoint.{architecture_dir}"))
        assert script.endswith(record["source"]["path"].removeprefix("examples/")), (script, record["source"]["path"])
        return f"convert_checkpoint ({architecture_dir})", flag_problems(argv[2:], record["flags"], record["required"])
    raise AssertionError(f"not a command of NVIDIA's build flow: {shlex.join(argv)}")
