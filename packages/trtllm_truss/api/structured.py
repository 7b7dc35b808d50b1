"""Structured output: each dialect's fields turned into one guide in NVIDIA's terms, bounded and
checked before the request is queued.

A `Guide` is TensorRT-LLM's `guided_decoding_guide_type` with its `guided_decoding_guide` text
(`trtllm_truss.guides.guide.GUIDE_TYPES`), plus the request field it came from (for errors). Sources:

- OpenAI `response_format` (chat, completions): `text`, `json_object` -> "json_schema" of an
  object (NVIDIA's "json" is any JSON value), `json_schema`
  (`name`, `description`, `schema`, `strict`) -> "json_schema"; trtllm-serve's additions
  (`tensorrt_llm/serve/openai_protocol.py` `ResponseFormat`): `json` (`schema`), `regex` (`regex`),
  `ebnf` (`ebnf`) -> "ebnf_grammar", `structural_tag` (`format`, or `structures` + `triggers`).
- vLLM's `structured_outputs` {`json`, `regex`, `choice`, `grammar`, `json_object`,
  `structural_tag`} and its older `guided_json` / `guided_regex` / `guided_choice` /
  `guided_grammar`; `choice` becomes a regex of the escaped alternatives. vLLM's other knobs
  (`guided_decoding_backend`, `whitespace_pattern`, `disable_*`) are refused by name (unknown fields).
- Responses `text.format`, Messages `output_config.format` (converted to `response_format` by
  their dialects), the native route's `guided_decoding_guide_type` / `guided_decoding_guide`, and
  the guides `tool_choice` required / named builds (`api.tools.tool_guide`).

Bounds (checked on the event loop, cheap): a guide's text at most the engine's `MAX_GUIDE_BYTES`, a schema at most
`MAX_SCHEMA_BYTES` (past the guide bound it is reduced, without strict: `guides.oversized`) and `MAX_GUIDE_DEPTH`
levels of JSON nesting. Then, off the event loop, a schema is checked against its meta-schema (seconds for a
large one) and the grammar engine the deployment uses (`RequestLimits.guide_engine`: xgrammar or llguidance, with
TensorRT-LLM's options) judges the guide (`guides.verdict`: `guides.best_effort.prepare` for a schema,
`guides.guide.check_guide` for the other types): with `strict: true` a keyword that engine does not enforce is
a 400 naming its place under the field; without it, it is left out of the guide and reported
(`CheckedGuide.unenforced`); a guide the engine refuses is a 400 with the engine's reason.

Where it runs: served, in the replica's guide compile service (`guides.compile_service`, a `GuideChecker`
the front attaches to the request core), which also compiles the guide over the model's tokenizer within
`runtime.guides.compile_budget_s` in processes it kills past it, and caches verdicts in bytes: over the budget
is a 400 naming the field and the budget, no compile process free in time a 429 with Retry-After (`GuideBusy`),
the service not answering a 503 (`GuideCheckerUnavailable`). Without a service (a library caller, unit tests)
the check runs here in a small thread pool with a timeout (`CHECK_TIMEOUT_S`), without the tokenizer, and
results are kept in an LRU keyed by the engine, strictness and the guide's hash.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import Field

from trtllm_truss.api.body import text_depth
from trtllm_truss.api.errors import field_error
from trtllm_truss.api.sampling import StrictModel, Text
from trtllm_truss.guides.guide import MAX_GUIDE_BYTES, NotASchema, check_meta_schema, schema_text
from trtllm_truss.guides.oversized import MAX_SCHEMA_BYTES
from trtllm_truss.guides.verdict import Accepted, Refused, judge, not_a_schema

MAX_GUIDE_DEPTH = 64  # JSON nesting (objects and arrays) of a schema document
MAX_CHOICES = 256  # alternatives of vLLM's `choice`
CHECK_TIMEOUT_S = 5.0  # without a compile service: checking one guide; longer is a 400 (it finishes in its thread)
CHECK_THREADS = 2
CACHE_ENTRIES = 512


@dataclass(frozen=True)
class Guide:
    """A guided-decoding constraint in TensorRT-LLM's terms: `type` one of `guides.guide.GUIDE_TYPES`
    ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag"), `guide` its text (None for
    "json"), sent as the engine inputs `guided_decoding_guide_type` / `guided_decoding_guide`.
    `field`: the request field it came from, named in errors."""

    type: str
    guide: str | None = None
    field: str = "response_format"
    strict: bool = False  # json_schema: a keyword the engine cannot enforce is a 400 (else left out and reported)


@dataclass(frozen=True)
class CheckedGuide:
    """A guide as the engine will enforce it: `text` to send (a schema with what the engine cannot
    enforce left out, when not strict), `unenforced` what was left out or is ignored ("<place>: <keyword>")."""

    text: str | None
    unenforced: tuple[str, ...] = ()


# --- request schemas ------------------------------------------------------------------------------


class JsonSchemaFormat(StrictModel):
    """OpenAI's `response_format.json_schema`."""

    name: Text | None = Field(None, description="accepted and ignored (OpenAI requires it; vLLM does not)")
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(None, description="true: a keyword that cannot be enforced is a 400")


class ResponseFormat(StrictModel):
    """`response_format` of chat and completions: OpenAI's three types and trtllm-serve's four."""

    type: Literal["text", "json_object", "json_schema", "json", "regex", "ebnf", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="trtllm-serve's type json")
    regex: Text | None = None
    ebnf: Text | None = None
    format: dict[str, Any] | None = Field(None, description="trtllm-serve's structural_tag (xgrammar's format)")
    structures: list[dict[str, Any]] | None = None
    triggers: list[Text] | None = None


class StructuredOutputs(StrictModel):
    """vLLM's `structured_outputs` (exactly one constraint)."""

    json_: dict[str, Any] | Text | None = Field(None, alias="json")
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None
    json_object: bool | None = None
    structural_tag: Text | None = None


class VllmGuidedFields(StrictModel):
    """vLLM's older per-request fields, mixed into the chat and completion requests."""

    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | Text | None = None
    guided_regex: Text | None = None
    guided_choice: list[Text] | None = None
    guided_grammar: Text | None = None


# --- fields -> guide ------------------------------------------------------------------------------


def response_format_guide(
    fmt: ResponseFormat | None, field: str = "response_format", *, schema_field: str | None = None, strict: bool | None = None
) -> Guide | None:
    """`response_format` (or a dialect's equivalent, named `field`, its schema named `schema_field`)
    as a bounded guide; None for text. `strict`: overrides `json_schema.strict` (Messages: always)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return object_guide(field)
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if spec is None:
            raise field_error(f"{field}.json_schema", "is required for type json_schema")
        if spec.schema_ is None:
            raise field_error(f"{field}.json_schema.schema", "is required: the JSON Schema the answer must match")
        where = schema_field or f"{field}.json_schema.schema"
        return schema_guide(spec.schema_, where, strict=bool(spec.strict if strict is None else strict))
    if fmt.type == "json":
        if fmt.schema_ is None:
            raise field_error(f"{field}.schema", "is required for type json")
        return schema_guide(fmt.schema_, f"{field}.schema")
    if fmt.type == "regex":
        return text_guide("regex", fmt.regex, f"{field}.regex")
    if fmt.type == "ebnf":
        return text_guide("ebnf_grammar", fmt.ebnf, f"{field}.ebnf")
    # structural_tag: the whole format object, as trtllm-serve sends it to GuidedDecodingParams.
    body = fmt.model_dump(by_alias=True, exclude_none=True)
    return text_guide("structural_tag", json.dumps(body, separators=(",", ":"), ensure_ascii=False), field)


def vllm_guides(fields: VllmGuidedFields) -> list[Guide]:
    """The guides vLLM's fields ask for (the caller refuses more than one)."""
    guides: list[Guide] = []
    so = fields.structured_outputs
    if so is not None:
        guides += _vllm_guides("structured_outputs.", so.json_, so.regex, so.choice, so.grammar)
        if so.json_object:
            guides.append(object_guide("structured_outputs.json_object"))
        if so.structural_tag is not None:
            guides.append(text_guide("structural_tag", so.structural_tag, "structured_outputs.structural_tag"))
        if not guides:
            raise field_error("structured_outputs", "give one of json, regex, choice, grammar, json_object, structural_tag")
    guides += _vllm_guides("guided_", fields.guided_json, fields.guided_regex, fields.guided_choice, fields.guided_grammar)
    return guides


def _vllm_guides(prefix: str, json_: Any, regex: str | None, choice: list[str] | None, grammar: str | None) -> list[Guide]:
    guides = []
    if json_ is not None:
        field = f"{prefix}json"
        if isinstance(json_, str):
            try:
                json_ = json.loads(json_)
            except ValueError as exc:
                raise field_error(field, f"is not JSON: {exc}") from None
            if not isinstance(json_, dict):
                raise field_error(field, "must be a JSON Schema object")
        guides.append(schema_guide(json_, field))
    if regex is not None:
        guides.append(text_guide("regex", regex, f"{prefix}regex"))
    if choice is not None:
        guides.append(choice_guide(choice, f"{prefix}choice"))
    if grammar is not None:
        guides.append(text_guide("ebnf_grammar", grammar, f"{prefix}grammar"))
    return guides


def one_guide(candidates: list[Guide | None]) -> Guide | None:
    """The request's one constraint; 400 naming the fields when it sets several."""
    guides = [g for g in candidates if g is not None]
    if len(guides) > 1:
        raise field_error(guides[1].field, f"only one output constraint per request (also given: {guides[0].field})")
    return guides[0] if guides else None


def native_guide(guide_type: str | None, guide: str | None) -> Guide | None:
    """The native route's NVIDIA-named fields `guided_decoding_guide_type` / `guided_decoding_guide`."""
    if guide_type is None:
        if guide is not None:
            raise field_error("guided_decoding_guide_type", "is required with guided_decoding_guide")
        return None
    if guide_type == "json":
        if guide is not None:
            raise field_error("guided_decoding_guide", "type json takes no guide (any JSON object); use json_schema")
        return Guide("json", None, "guided_decoding_guide")
    if guide_type == "json_schema" and guide is not None:
        try:
            schema = json.loads(guide)
        except ValueError as exc:
            raise field_error("guided_decoding_guide", f"is not JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise field_error("guided_decoding_guide", "must be a JSON Schema object")
        return schema_guide(schema, "guided_decoding_guide")
    return text_guide(guide_type, guide, "guided_decoding_guide")


# OpenAI's (and vLLM's) json_object is a JSON object; NVIDIA's "json" is any JSON value (xgrammar's
# builtin JSON grammar: `[2025]` in its docs), so an object is asked for by its schema on every engine.
OBJECT_SCHEMA = '{"type":"object"}'


def object_guide(field: str) -> Guide:
    return Guide("json_schema", OBJECT_SCHEMA, field)


def choice_guide(choices: list[str], field: str) -> Guide:
    """vLLM's `choice`: exactly one of the strings."""
    if not choices:
        raise field_error(field, "give at least one choice")
    if len(choices) > MAX_CHOICES:
        raise field_error(field, f"{len(choices)} choices are more than {MAX_CHOICES}")
    return text_guide("regex", "(" + "|".join(_regex_literal(c) for c in choices) + ")", field)


def _regex_literal(text: str) -> str:
    """`text` as a regex matching exactly it (Rust regex syntax: every ASCII punctuation may be escaped)."""
    return "".join("\\" + ch if ch.isascii() and not ch.isalnum() and not ch.isspace() and ch != "_" else ch for ch in text)


def text_guide(guide_type: str, text: str | None, field: str) -> Guide:
    if not text:
        raise field_error(field, f"a {guide_type} guide needs its text")
    _check_size(field, text)
    return Guide(guide_type, text, field)


def schema_guide(schema: Mapping[str, Any], field: str, *, strict: bool = False) -> Guide:
    """A JSON Schema object as a "json_schema" guide, bounded (size, depth); `strict` is carried to the
    engine's check (`check`), which checks it against its metaschema (off the event loop: a large
    schema takes seconds) and refuses what the engine does not enforce."""
    try:
        text = schema_text(schema)
    except RecursionError:  # deeper than json.dumps goes: far over the bound
        raise field_error(field, f"nests deeper than {MAX_GUIDE_DEPTH} levels") from None
    _check_size(field, text, MAX_SCHEMA_BYTES)
    depth = text_depth(text) if text.count("{") + text.count("[") > MAX_GUIDE_DEPTH else 0
    if depth > MAX_GUIDE_DEPTH:
        raise field_error(field, f"nests {depth} levels deep; at most {MAX_GUIDE_DEPTH} are accepted")
    return Guide("json_schema", text, field, strict)


def check_schema(field: str, schema: Any) -> None:
    """400 naming the field when `schema` is not a JSON Schema (checked against its metaschema)."""
    try:
        check_meta_schema(schema)
    except NotASchema as exc:
        raise field_error(field, not_a_schema(exc)) from None


def _check_size(field: str, text: str, bound: int = MAX_GUIDE_BYTES) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > bound:
        raise field_error(field, f"is {size} bytes; at most {bound} are accepted")


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0, `{}` is 1), without recursion."""
    depth, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, Mapping):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth = max(depth, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (Mapping, list)))
    return depth


# --- compiling, off the event loop ----------------------------------------------------------------


class GuideChecker(Protocol):
    """The replica's guide compile service as a frontend sees it (`guides.compile_client.GuideServiceClient`)."""

    async def check(self, guide_type: str, guide: str | None, strict: bool) -> dict[str, Any]: ...


class GuideBusy(Exception):
    """No compile process could take the guide in time: a 429 with Retry-After (the guide is not at fault)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message, self.retry_after_s = message, retry_after_s


class GuideCheckerUnavailable(Exception):
    """The compile service did not answer (it is being started again): a 503."""


_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None
_CACHE: OrderedDict[bytes, concurrent.futures.Future[Accepted | Refused]] = OrderedDict()
_LOCK = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = concurrent.futures.ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="guide-check")
    return _EXECUTOR


def _judged(guide_type: str, guide: str | None, engine: str, strict: bool) -> Accepted | Refused:
    return judge(guide_type, guide, engine, strict)[0]


def _checking(guide: Guide, engine: str) -> concurrent.futures.Future[Accepted | Refused]:
    """The (cached, or newly started) in-process check of `guide`; concurrent requests share one."""
    key = hashlib.sha256(f"{engine}\0{guide.strict}\0{guide.type}\0{guide.guide or ''}".encode("utf-8", "surrogatepass")).digest()
    with _LOCK:
        future = _CACHE.get(key)
        if future is not None:
            _CACHE.move_to_end(key)
            return future
        future = _executor().submit(_judged, guide.type, guide.guide, engine, guide.strict)
        _CACHE[key] = future
        while len(_CACHE) > CACHE_ENTRIES:
            _CACHE.popitem(last=False)
        return future


async def _in_process(guide: Guide, timeout_s: float, engine: str) -> Accepted | Refused:
    future = _checking(guide, engine)
    if future.done():
        return future.result()
    try:
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout_s)
    except asyncio.TimeoutError:
        raise field_error(guide.field, f"took longer than {timeout_s:g} s to compile; simplify it") from None


async def _by_service(guide: Guide, checker: GuideChecker) -> Accepted | Refused:
    try:
        verdict = await checker.check(guide.type, guide.guide, guide.strict)
    except (ConnectionError, RuntimeError) as exc:  # guides.compile_client.GuideServiceUnavailable
        raise GuideCheckerUnavailable(f"the guide compile service is restarting ({exc}); retry shortly") from None
    if "busy" in verdict:
        busy = verdict["busy"]
        raise GuideBusy(f"{guide.field}: {busy['message']}", int(busy.get("retry_after") or 1))
    if "refused" in verdict:
        return Refused(verdict["refused"]["message"], verdict["refused"].get("place") or "")
    accepted = verdict["accepted"]
    return Accepted(accepted.get("text"), tuple(accepted.get("unenforced") or ()))


async def check(
    guide: Guide | None, timeout_s: float = CHECK_TIMEOUT_S, *, engine: str = "xgrammar", checker: GuideChecker | None = None
) -> CheckedGuide | None:
    """The guide as `engine` ("xgrammar" | "llguidance", with TensorRT-LLM's options) will enforce it;
    400 naming `guide.field` with the engine's reason when it cannot, or when it costs more than the
    budget (the module docstring: by the compile service `checker`, else in process within `timeout_s`);
    GuideBusy / GuideCheckerUnavailable when the service cannot take it now. The event loop never waits on
    a compiler."""
    if guide is None:
        return None
    if guide.guide is not None:
        _check_size(guide.field, guide.guide, MAX_SCHEMA_BYTES if guide.type == "json_schema" else MAX_GUIDE_BYTES)
    if checker is not None:
        result = await _by_service(guide, checker)
    else:
        result = await _in_process(guide, timeout_s, engine)
    if isinstance(result, Refused):
        raise field_error(f"{guide.field}{result.place}", result.message)
    return CheckedGuide(guide.guide if result.text is None else result.text, result.unenforced)


def cache_clear() -> None:
    with _LOCK:
        _CACHE.clear()
