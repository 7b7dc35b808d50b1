"""`python -m trtllm_truss.commands.doc_tables [--check]`: the tables of the docs that the code decides.

Each table sits in its document between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->` and is
rewritten from the code here, never by hand: the NVIDIA images and their TensorRT-LLM versions
(`artifacts.target`, `tests/data/images/`), the shipped examples (their `config.yaml`, planned as `validate`
plans them), what each backend does with each feature (the plan the planner makes for a configuration
using it, per backend and TensorRT-LLM version) and the model families with their parsers (the parsers'
registry). `--check` rewrites nothing and exits 1 naming each region that differs
(tests/unit/test_doc_tables.py runs the same check in `make test`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
COMMAND = "python -m trtllm_truss.commands.doc_tables"


# --- regions -------------------------------------------------------------------------------------


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"


def _region(text: str, name: str) -> re.Match[str] | None:
    """The region's match: group 1 the start marker's indentation (a table inside a list item keeps it),
    group 2 the body."""
    start, end = _markers(name)
    return re.search(rf"^([ \t]*){re.escape(start)}\n(.*?)^[ \t]*{re.escape(end)}", text, flags=re.S | re.M)


def region_body(text: str, name: str) -> str | None:
    """The region's body without its indentation; None when the markers are missing."""
    match = _region(text, name)
    if match is None:
        return None
    indent = match.group(1)
    return "".join(line.removeprefix(indent) for line in match.group(2).splitlines(keepends=True))


def replace_region(text: str, name: str, body: str) -> str:
    """`text` with region `name`'s body replaced (the markers stay); ValueError when the markers are missing."""
    match = _region(text, name)
    if match is None:
        start, end = _markers(name)
        raise ValueError(f"no region {start} ... {end}")
    indent = match.group(1)
    lines = [f"{indent}{line}" if line else line for line in body.rstrip("\n").split("\n")]
    return text[: match.start(2)] + "\n".join(lines) + "\n" + text[match.end(2) :]


def _code(text: str) -> str:
    """`text` as a Markdown code span (a text holding a backtick gets double backticks and spaces)."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _table(header: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)]) + "\n"


# --- images --------------------------------------------------------------------------------------


def images_table(repo: Path = REPO) -> str:
    from trtllm_truss.artifacts.target import IMAGE_TRTLLM_VERSIONS
    from trtllm_truss.planning.plan import llmapi_version_ok

    recorded = {}
    for path in sorted((repo / "tests/data/images").glob("*.json")):
        data = json.loads(path.read_text())
        recorded[data["image"]] = (path.relative_to(repo).as_posix(), data)
    version_only = json.loads((repo / "tests/data/image_versions.json").read_text())["images"]
    named_by: dict[str, list[str]] = {}
    for config in sorted((repo / "examples").glob("*/config.yaml")):
        image = (yaml.safe_load(config.read_text()).get("base_image") or {}).get("image")
        named_by.setdefault(image, []).append(f"`{config.parent.name}`")
    rows = []
    for image, version in sorted(IMAGE_TRTLLM_VERSIONS.items(), key=lambda item: _version_key(item[1])):
        if image in recorded:
            where, data = recorded[image]
            python = data.get("python_executable", "/usr/bin/python3")  # recorded from 25.10 on; before, the system's
            record = f"`{where}` (environment and pins, checked by `tests/image_env/`)"
        else:
            data = version_only.get(image, {})
            python = "/usr/bin/python3"
            record = "`tests/data/image_versions.json` (version only)"
        backends = "`tensorrtllm`, `llmapi`" if llmapi_version_ok(version) else "`tensorrtllm`"
        used_by = ", ".join(named_by.get(image, ())) or "-"
        rows.append([f"`{image}`", version, f"{data.get('python', '?')} (`{python}`)", backends, used_by, record])
    header = ["`base_image.image`", "TensorRT-LLM", "Python (`python_executable_path`)", "backends", "examples", "recorded in"]
    return _table(header, rows)


def _version_key(version: str | None) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version or "")[:3])


# --- examples ------------------------------------------------------------------------------------


def examples_table(repo: Path = REPO) -> str:
    from trtllm_truss.artifacts.target import IMAGE_TRTLLM_VERSIONS
    from trtllm_truss.commands.build import plan_for_target
    from trtllm_truss.config import load_config
    from trtllm_truss.planning.probe import RuntimeFacts

    rows = []
    for folder in sorted((repo / "examples").iterdir(), key=lambda p: (p.name.startswith("legacy-"), p.name)):
        if not (folder / "config.yaml").is_file():
            continue
        truss = yaml.safe_load((folder / "config.yaml").read_text())
        description = truss.get("description")
        if not description:
            raise ValueError(f"{folder / 'config.yaml'}: no description (one line: what the example shows)")
        resolved = load_config(folder, environ={})
        trt = resolved.trt_llm
        model = f"`{trt.build.huggingface_ckpt_repository}`" if trt.build else f"`{trt.serve.engine_repository}` (engine)"
        image = (truss.get("base_image") or {}).get("image", "")
        version = IMAGE_TRTLLM_VERSIONS.get(image, "?")
        backend = plan_for_target(resolved, RuntimeFacts(), None).plan.backend
        gpus = str(resolved.accelerator) if resolved.accelerator is not None else "CPU"
        if resolved.node_count > 1:
            gpus = f"{resolved.node_count} nodes x {gpus}"
        tag = image.rsplit(":", 1)[-1].split("-", 1)[0]
        rows.append([f"`{folder.name}`", model, f"`{backend}`", f"{tag} ({version})", gpus, description.strip()])
    header = ["example (`init --from`)", "model", "backend", "image (TensorRT-LLM)", "GPUs", "what it shows"]
    return _table(header, rows)


# --- backends x features -------------------------------------------------------------------------

# Local folders of this repository (the embedded default's checkpoint and adapter), so that planning reads
# nothing from the network; the draft models are hub ids, which a plan only names.
_CHECKPOINT = "data/embedded-llama"
_ADAPTER = "data/embedded-lora/pirate"
_BASE: dict[str, Any] = {
    "build": {
        "base_model_architecture": "llama",
        "huggingface_ckpt_repository": str(REPO / _CHECKPOINT),
        "dtype": "float16",
    },
    "runtime": {},
}


@dataclass(frozen=True)
class Feature:
    """A feature as a change to the base section (`section`, `resources`), and what a plan that takes it
    says of it (`read`: the cell's text; None: "yes")."""

    name: str
    section: Mapping[str, Any] = None  # type: ignore[assignment]
    resources: Mapping[str, Any] = None  # type: ignore[assignment]
    read: Callable[[Any], str | None] | None = None


def _merge(base: Mapping[str, Any], change: Mapping[str, Any] | None) -> dict[str, Any]:
    out = json.loads(json.dumps(base))
    for key, value in (change or {}).items():
        out[key] = _merge(out.get(key) or {}, value) if isinstance(value, Mapping) else value
    return out


def _guides(plan: Any) -> str | None:
    if plan.guided_decoding_off is not None:
        return f"no: {plan.guided_decoding_off}"
    types = ", ".join(plan.guide_types) if plan.guide_types else "every type"
    return f"yes ({plan.guide_engine}; {types})"


def _forced(plan: Any) -> str | None:
    if plan.guided_decoding_off is not None:
        return "no: guided decoding is off"
    reason = plan.forced_syntax_off
    return "yes, in the family's own syntax" if reason is None else f"yes, as a JSON guide: {reason}"


def _top_logprobs(plan: Any) -> str | None:
    from trtllm_truss.planning.logprobs import top_logprobs_off
    from trtllm_truss.repository.interface import MAX_TOP_LOG_PROBS

    reason = top_logprobs_off(plan)
    return f"up to {MAX_TOP_LOG_PROBS}" if reason is None else f"1: {reason}"


def _one_process(plan: Any) -> str | None:
    if plan.world_size == 1:
        return "no: the stand-in runs as one process, whatever the parallel counts"
    return None


def _lora(dtype: str) -> dict[str, Any]:
    modules = ["attn_q", "attn_k", "attn_v", "attn_dense"]
    return {"build": {"dtype": dtype, "lora_adapters": {"pirate": str(REPO / _ADAPTER)},
                      "lora_configuration": {"lora_target_modules": modules}}}


def _speculative(mode: str, **fields: Any) -> dict[str, Any]:
    return {"speculative": {"speculative_decoding_mode": mode, **fields}}


FEATURES = (
    Feature("structured output (`response_format`, guides)", read=_guides),
    Feature("structured output with llguidance", {"runtime": {"guided_decoding_backend": "llguidance"}}, read=_guides),
    Feature("forced tool calls (`tool_choice` required / named)", read=_forced),
    Feature("`top_logprobs`", read=_top_logprobs),
    Feature("LoRA adapters per request (float16 weights)", _lora("float16")),
    Feature("LoRA adapters per request (bfloat16 weights)", _lora("bfloat16")),
    Feature("speculative: lookahead", _speculative("lookahead")),
    Feature("speculative: Eagle 3", _speculative("eagle3", num_draft_tokens=3, draft_repository="org/eagle3-head")),
    Feature("speculative: draft model", _speculative("draft_target", num_draft_tokens=3, draft_repository="org/draft")),
    Feature("speculative: n-gram", _speculative("ngram", num_draft_tokens=3, ngram_max_matching_size=2)),
    Feature(
        "speculative: MTP (DeepSeek V3/R1)",
        {**_speculative("mtp", num_draft_tokens=1), "build": {"base_model_architecture": "deepseek"}},
    ),
    Feature("`runtime.stream_interval` > 1", {"runtime": {"stream_interval": 4}}),
    Feature("KV-cache reuse (prefix caching)", {"runtime": {"enable_kv_cache_reuse": True}}),
    Feature("KV-cache offload to host memory", {"runtime": {"kv_cache_host_memory_bytes": 1 << 30}}),
    Feature("MoE expert parallelism", {"build": {"tensor_parallel_count": 2, "expert_parallel_count": 2}},
            {"accelerator": "H100:2"}, read=_one_process),
    Feature("several nodes (one MPI world)", {"build": {"tensor_parallel_count": 16}},
            {"accelerator": "H100:8", "node_count": 2}),
)


_VERSION = "\x00version\x00"


@dataclass(frozen=True)
class Column:
    backend: str
    version: str | None  # the TensorRT-LLM version planned for (None: the stand-in, no TensorRT-LLM)


def _columns() -> list[Column]:
    from trtllm_truss.artifacts.target import IMAGE_TRTLLM_VERSIONS
    from trtllm_truss.planning.plan import llmapi_version_ok

    versions = sorted(set(IMAGE_TRTLLM_VERSIONS.values()), key=_version_key)
    return [
        *(Column("tensorrtllm", v) for v in versions),
        *(Column("llmapi", v) for v in versions if llmapi_version_ok(v)),
        Column("pytorch", None),
    ]


def _cell(feature: Feature, column: Column, scratch: Path) -> str:
    """What the planner says of the feature on this column: the plan's own account, or its refusal."""
    from trtllm_truss.artifacts.target import target_facts
    from trtllm_truss.config import ConfigError, load_config
    from trtllm_truss.planning.plan import PlanError, make_plan

    section = _merge(_BASE, feature.section)
    section["runtime"]["backend"] = column.backend
    resources = {"accelerator": "H100", **(feature.resources or {})}
    truss = {"model_metadata": {"trt_llm": section}, "resources": resources}
    (scratch / "config.yaml").write_text(yaml.safe_dump(truss))
    try:
        resolved = load_config(scratch, environ={})
    except ConfigError as exc:
        return "no: " + "; ".join(exc.problems)
    refused = [w for w in resolved.warnings if "not applied" in w]
    if refused:
        return "no: " + "; ".join(refused)
    if column.version is None:
        facts = target_facts(0, None, "0.0.0")
    else:
        gpus = resolved.accelerator.count if resolved.accelerator is not None else 1
        facts = target_facts(gpus, resolved.accelerator, column.version)
    try:
        plan = make_plan(resolved, facts)
    except PlanError as exc:
        return "no: " + "; ".join(exc.problems)
    said = feature.read(plan) if feature.read is not None else None
    return said or "yes"



def feature_matrix() -> tuple[list[str], list[list[str]]]:
    """(column titles, rows: feature then one cell per column), columns of one backend whose cells agree over
    consecutive versions merged into one version range."""
    columns = _columns()
    with tempfile.TemporaryDirectory() as scratch:
        # A version named in a cell is the column's own: cells that differ only by it are alike.
        cells = [
            [_cell(f, c, Path(scratch)).replace(c.version or _VERSION, _VERSION) for c in columns] for f in FEATURES
        ]
    groups: list[list[int]] = []
    for index, column in enumerate(columns):
        last = groups[-1] if groups else None
        if last and columns[last[-1]].backend == column.backend and all(row[last[-1]] == row[index] for row in cells):
            last.append(index)
        else:
            groups.append([index])
    titles, spans = [], []
    for group in groups:
        first, last = columns[group[0]], columns[group[-1]]
        span = first.version if first is last else f"{first.version} to {last.version}"
        spans.append(span or "")
        titles.append(f"`{first.backend}` (CPU stand-in)" if first.version is None else f"`{first.backend}`, TensorRT-LLM {span}")
    rows = [
        [f.name, *(cells[i][g[0]].replace(_VERSION, span) for g, span in zip(groups, spans))]
        for i, f in enumerate(FEATURES)
    ]
    return titles, rows


def features_table() -> str:
    """The matrix with each reason said once, as a numbered note under the table."""
    titles, rows = feature_matrix()
    notes: dict[str, int] = {}

    def short(cell: str) -> str:
        head, sep, reason = cell.partition(": ")
        if not sep:
            return cell
        number = notes.setdefault(reason, len(notes) + 1)
        return f"{head} [{number}]"

    body = _table(["feature", *titles], [[row[0], *(short(c) for c in row[1:])] for row in rows])
    lines = [f"{number}. {reason}" for reason, number in notes.items()]
    return body + "\n" + "\n".join(lines) + "\n"


# --- families and parsers ------------------------------------------------------------------------


def families_table() -> str:
    from trtllm_truss import parsers
    from trtllm_truss.guides.tool_syntax import FamilySyntax

    rows = []
    for family in parsers.FAMILIES.values():
        reasoning = f"`{family.reasoning_parser}`" if family.reasoning_parser else "none"
        if family.reasoning_parser and family.thinks:
            reasoning += " if the template has " + " or ".join(_code(m) for m in family.thinks)
        found = [_code(m) for m in family.template] + [f"not {_code(m)}" for m in family.absent]
        found += [f"token {_code(t)}" for t in family.tokens]
        forced = parsers.TOOL_PARSERS[family.tool_parser].forced if family.tool_parser else "no tool calls"
        if isinstance(forced, FamilySyntax):
            text = f"own syntax (`{forced.xgrammar}`)" + (f"; {forced.differs}" if forced.differs else "")
        else:
            text = f"JSON guide: {forced}"
        rows.append([f"`{family.name}`", family.title, f"`{family.tool_parser}`", reasoning, ", ".join(found), text])
    header = ["family", "models", "tool-call parser", "reasoning parser", "detected by (chat template; special tokens)", "forced tool calls"]
    return _table(header, rows)


# --- the documents -------------------------------------------------------------------------------

REGIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "images": ("docs/configuration.md", images_table),
    "examples": ("docs/deploy.md", examples_table),
    "backend-features": ("docs/deploy.md", features_table),
    "families": ("docs/api.md", families_table),
}


def generated(repo: Path | None = None) -> Iterator[tuple[str, Path, str, str]]:
    """(region, document, committed body, generated body) for every region."""
    repo = repo or REPO
    for name, (doc, make) in REGIONS.items():
        path = repo / doc
        committed = region_body(path.read_text(encoding="utf-8"), name)
        if committed is None:
            start, end = _markers(name)
            raise ValueError(f"{doc}: no region {start} ... {end}")
        yield name, path, committed, make().rstrip("\n") + "\n"


def diff(name: str, doc: Path, committed: str, fresh: str) -> str:
    return "".join(
        difflib.unified_diff(
            committed.splitlines(keepends=True), fresh.splitlines(keepends=True),
            f"{doc} ({name}, committed)", f"{doc} ({name}, from the code)",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a region differs")
    args = parser.parse_args(argv)
    stale = 0
    for name, path, committed, fresh in generated():
        if committed == fresh:
            continue
        stale += 1
        if args.check:
            print(diff(name, path.relative_to(REPO), committed, fresh))
        else:
            path.write_text(replace_region(path.read_text(encoding="utf-8"), name, fresh), encoding="utf-8")
            print(f"rewrote {path.relative_to(REPO)} ({name})")
    if args.check and stale:
        print(f"{stale} generated table(s) differ from the code: run `{COMMAND}` and commit the docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
