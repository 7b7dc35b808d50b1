"""What `validate` says of the output parsers: the family found in the model's chat template and
special tokens (`trtllm_truss.parsers.detect`), the parsers the deployment will use and why, the
warnings (a family not told apart from another, a template that takes tools in an unknown format)
and the problems (a configured parser that does not exist)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

_FILES = ("chat_template.jinja", "tokenizer_config.json")


def tokenizer_source(resolved: Any) -> tuple[str, str | None]:
    trt = resolved.trt_llm
    if trt.build is not None:
        return trt.build.huggingface_ckpt_repository, trt.build.huggingface_ckpt_revision
    return trt.serve.tokenizer_repository, trt.serve.tokenizer_revision


def _hub_files(repo_id: str, revision: str | None, into: Path) -> None:
    """The template and tokenizer_config.json of a hub repository (a few KB to a few MB), one GET each."""
    import httpx
    from huggingface_hub import hf_hub_url

    from trtllm_truss.artifacts.hub import hub_endpoint, resolve_hf_token

    token = resolve_hf_token(None)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    for name in _FILES:
        url = hf_hub_url(repo_id, name, revision=revision, endpoint=hub_endpoint())
        response = httpx.get(url, headers=headers, timeout=5.0, follow_redirects=True)
        if response.status_code == 404:
            continue
        response.raise_for_status()
        (into / name).write_bytes(response.content)


def parser_report(resolved: Any, forced_syntax_off: str | None = "not planned") -> tuple[list[str], list[str], list[str]]:
    """(lines, warnings, problems) for `validate`; `forced_syntax_off` the plan's (`ServingPlan.forced_syntax_off`)."""
    from trtllm_truss import parsers
    from trtllm_truss.engine.tokenizer import read_added_tokens, read_chat_template

    runtime = resolved.trt_llm.runtime
    problems = parsers.setting_problems(runtime.tool_call_parser, runtime.reasoning_parser)
    source, revision = tokenizer_source(resolved)
    try:
        location = resolved.resolve_repository(source)
        if location.kind == "local":
            folder = Path(location.local_path)
            detection = parsers.detect(read_chat_template(folder), read_added_tokens(folder))
        elif location.kind == "hub":
            with tempfile.TemporaryDirectory() as scratch:
                _hub_files(location.repo_id, revision, Path(scratch))
                detection = parsers.detect(read_chat_template(scratch), read_added_tokens(scratch))
        else:
            return [f"# output parsers: {source}'s chat template is not read by validate (local folders and hub repositories are)"], [], problems
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        return [f"# output parsers: the chat template of {source} could not be read ({type(exc).__name__})"], [], problems
    except Exception as exc:  # noqa: BLE001 - the hub unreachable: say so, the rest of validate stands
        return [f"# output parsers: the chat template of {source} could not be read ({type(exc).__name__})"], [], problems
    lines = ["# " + line for line in parsers.describe(detection, runtime.tool_call_parser, runtime.reasoning_parser)]
    tool_parser = detection.tool_parser if runtime.tool_call_parser == "auto" else runtime.tool_call_parser
    family = parsers.TOOL_PARSERS.get(tool_parser or "")
    if family is not None:
        syntax = parsers.forced_syntax(tool_parser)
        if syntax is not None and forced_syntax_off is None:
            forced = f"in the family's own syntax (xgrammar's {syntax.xgrammar!r} structural tag)"
        else:
            forced = f"JSON guide ({forced_syntax_off if syntax is not None else family.forced})"
        lines.append(f"# forced tool calls (tool_choice required / named): {forced}")
    return lines, list(detection.warnings), problems
