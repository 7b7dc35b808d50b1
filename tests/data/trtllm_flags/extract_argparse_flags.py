"""Extract the argparse flags of one of NVIDIA's scripts into the JSON format of this directory.

    python extract_argparse_flags.py SOURCE.py --tool NAME --version X.Y.Z --path REPO_PATH --commit SHA > out.json

Reads the file as text and walks its AST (nothing is imported or executed): every
`<parser>.add_argument('--flag', ...)` call with literal option strings becomes an entry with
`takes_value` (False for store_true/store_false/store_const/count actions), literal `choices`
(stringified, None dropped since argparse never receives it from a command line), and `required`.
Choices built from names (e.g. `[None] + GLM_VERSIONS`) are recorded as `choices_unresolved` and must
be filled in by hand from the module that defines them. Use it on a file fetched from
NVIDIA/TensorRT-LLM at the release you target; the script itself contains no NVIDIA code.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

_NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError):
        return _Unresolved(ast.unparse(node))


class _Unresolved(str):
    pass


def extract_flags(source: str) -> tuple[dict[str, dict], list[str]]:
    flags: dict[str, dict] = {}
    required: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        names = [n for n in names if n.startswith("-")]
        if not names:
            continue  # positional argument or computed name (e.g. plugin options built in a loop)
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        action = _literal(keywords["action"]) if "action" in keywords else None
        nargs = _literal(keywords["nargs"]) if "nargs" in keywords else None
        entry: dict = {"takes_value": not (action in _NO_VALUE_ACTIONS or nargs == 0), "choices": None}
        if "choices" in keywords:
            choices = _literal(keywords["choices"])
            if isinstance(choices, _Unresolved):
                entry["choices_unresolved"] = str(choices)
            else:
                entry["choices"] = [str(c) for c in choices if c is not None]
        if "required" in keywords and _literal(keywords["required"]) is True:
            required.append(names[0])
        for name in names:
            flags[name] = dict(entry)
    return flags, required


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--tool", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--path", required=True, help="the file's path inside NVIDIA/TensorRT-LLM")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--basis", default="", help="how the version was established")
    args = parser.parse_args(argv)
    flags, required = extract_flags(args.source.read_text(encoding="utf-8"))
    doc = {
        "tool": args.tool,
        "trtllm_version": args.version,
        "version_basis": args.basis,
        "source": {"repository": "NVIDIA/TensorRT-LLM", "path": args.path, "commit": args.commit},
        "extracted": "extract_argparse_flags.py (AST of the add_argument calls)",
        "flags": flags,
        "required": required,
    }
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
