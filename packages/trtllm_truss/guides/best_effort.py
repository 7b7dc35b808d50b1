"""A JSON Schema made into the guide one grammar engine enforces: everything it can, and a list of what not.

`strict` (OpenAI's `strict: true`, Anthropic's Messages always): the schema is sent as it is; a
keyword the engine does not enforce is refused naming its place, and a schema the engine refuses is
refused with the engine's own reason (the engine compiled with TensorRT-LLM's options, `guides.guide`).

Not strict (OpenAI's best effort): keywords the engine does not enforce are left out of the guide and
reported, never refused: first those it would ignore or refuse by name (`unenforced`: not in its
keyword list, an unknown `format`), then, while the engine still refuses the schema, what its message
points at (llguidance's `oneOf` -> `anyOf`, a remote `$ref`, a regex it cannot compile, min/max
properties it cannot combine; draft-04 tuple `items` and boolean `exclusiveMinimum` /
`exclusiveMaximum` are rewritten in their 2020-12 spelling, which both engines enforce). The guide
sent is compiled by the engine with TensorRT-LLM's options like any other, so what the CPU accepts
the GPU accepts. Outputs are validated against the original schema (`jsonschema`) after generation.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trtllm_truss.guides.guide import LLGUIDANCE, XGRAMMAR, GuideError, check_guide, schema_text

_COMMON = frozenset(
    {
        "type", "enum", "const", "anyOf", "allOf", "$ref", "$defs", "definitions",
        "properties", "additionalProperties", "required", "patternProperties",
        "items", "prefixItems", "minItems", "maxItems",
        "minLength", "maxLength", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    }
)
# Keywords each engine enforces (xgrammar 0.2.8 and llguidance 1.9.1: their docs, and what each
# refuses or lets through when probed). xgrammar takes oneOf as anyOf where the branches may overlap
# (it warns), llguidance refuses such a oneOf: both are listed as enforced for disjoint branches.
ENFORCED: dict[str, frozenset[str]] = {
    XGRAMMAR: _COMMON
    | {"oneOf", "propertyNames", "minProperties", "maxProperties", "unevaluatedProperties", "contains", "minContains", "maxContains"},
    LLGUIDANCE: _COMMON | {"oneOf", "minProperties", "maxProperties"},
}
FORMATS: dict[str, frozenset[str]] = {
    XGRAMMAR: frozenset(
        {
            "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
            "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
        }
    ),
    LLGUIDANCE: frozenset({"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri", "unknown"}),
}
# Constrain nothing: accepted in both modes.
ANNOTATIONS = frozenset(
    {
        "$schema", "$id", "id", "$anchor", "$comment", "title", "description", "default", "examples",
        "readOnly", "writeOnly", "deprecated", "contentEncoding", "contentMediaType", "markdownDescription",
    }
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames", "additionalItems",
               "unevaluatedProperties", "unevaluatedItems")
MAX_REPAIRS = 8


class KeywordRefused(GuideError):
    """Strict: a keyword at `place` (a dotted path under the schema, "" for its root) that `engine` does
    not enforce."""

    def __init__(self, place: str, keyword: str, engine: str) -> None:
        self.place = place
        name, _, detail = keyword.partition(" ")
        super().__init__(f"keyword {name!r} cannot be enforced by {engine}" + (f" ({keyword})" if detail else ""))


@dataclass(frozen=True)
class PreparedSchema:
    """The guide text to send and what of the schema it does not enforce ("<place>: <keyword>")."""

    text: str
    unenforced: tuple[str, ...] = ()


def subschemas(schema: Mapping[str, Any], where: str) -> Iterator[tuple[str, Any, Mapping[str, Any], Any]]:
    """(place, child schema, parent mapping, key in the parent) of each direct subschema."""
    for key in _SCHEMA_MAPS:
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            for name, child in sub.items():
                yield f"{where}.{key}.{name}", child, sub, name
    for key in _SCHEMA_LISTS + ("items",):
        sub = schema.get(key)
        if isinstance(sub, list):
            for i, child in enumerate(sub):
                yield f"{where}.{key}[{i}]", child, sub, i
    for key in _SCHEMA_ONE:
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            yield f"{where}.{key}", sub, schema, key


def _walk(schema: Any, where: str = "") -> Iterator[tuple[str, dict]]:
    """(place, schema) of `schema` and every subschema under it (iteratively: schemas nest deep)."""
    stack = [(where, schema)]
    while stack:
        place, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield place, node
        stack.extend((p, child) for p, child, _, _ in subschemas(node, place))


def unenforced(schema: Any, engine: str, where: str = "") -> Iterator[tuple[str, str]]:
    """(place, keyword) of each key the engine does not enforce (an unknown `format` as "format 'x'")."""
    enforced = ENFORCED[engine]
    for place, node in _walk(schema, where):
        for key, value in node.items():
            if key == "format" and isinstance(value, str) and value not in FORMATS[engine]:
                yield place, f"format {value!r}"
            elif key not in enforced and key not in ANNOTATIONS:
                yield place, key


def prepare(schema: Mapping[str, Any], engine: str, *, strict: bool) -> PreparedSchema:
    """The schema as the guide `engine` enforces (module docstring); raises KeywordRefused (strict: the
    place and keyword) or GuideError with the engine's reason."""
    if strict:
        for place, key in unenforced(schema, engine):
            raise KeywordRefused(place, key, engine)
        text = schema_text(schema)
        check_guide("json_schema", text, engine)
        return PreparedSchema(text)
    trimmed = copy.deepcopy(dict(schema))
    notes: list[str] = []
    _normalise(trimmed)
    for place, node in list(_walk(trimmed)):
        for key in [k for k in node if k not in ENFORCED[engine] and k not in ANNOTATIONS]:
            del node[key]
            notes.append(f"{place or '.'}: {key}")
        value = node.get("format")
        if isinstance(value, str) and value not in FORMATS[engine]:
            del node["format"]
            notes.append(f"{place or '.'}: format {value!r}")
    for _ in range(MAX_REPAIRS):
        text = schema_text(trimmed)
        try:
            check_guide("json_schema", text, engine)
            return PreparedSchema(text, tuple(dict.fromkeys(notes)))
        except GuideError as exc:
            repair = _repair_for(str(exc))
            if repair is None or not repair(trimmed, engine, notes):
                raise
    raise GuideError("the schema still cannot be enforced after leaving out what the engine named")


# --- equivalent rewrites and repairs ------------------------------------------------------------


def _normalise(schema: dict) -> None:
    """Draft-04's spellings in 2020-12's, which both engines take: tuple `items` -> `prefixItems` (and
    `additionalItems` -> `items`), boolean `exclusiveMinimum`/`exclusiveMaximum` -> numbers."""
    for _, node in list(_walk(schema)):
        items = node.get("items")
        if isinstance(items, list):
            node["prefixItems"] = node.pop("items")
            # Draft-04: items past the tuple are allowed unless additionalItems says otherwise (xgrammar's
            # strict mode would forbid them where nothing is said).
            extra = node.pop("additionalItems", True)
            node["items"] = extra if isinstance(extra, (dict, bool)) else True
        for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            flag = node.get(exclusive)
            if isinstance(flag, bool):
                del node[exclusive]
                if flag and isinstance(node.get(bound), (int, float)):
                    node[exclusive] = node.pop(bound)


def _one_of_as_any_of(schema: dict, engine: str, notes: list[str]) -> bool:
    changed = False
    for place, node in list(_walk(schema)):
        if "oneOf" in node and "anyOf" not in node:
            node["anyOf"] = node.pop("oneOf")
            notes.append(f"{place or '.'}: oneOf (enforced as anyOf)")
            changed = True
    if changed:  # references into a renamed oneOf follow it
        for _, node in list(_walk(schema)):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#") and "/oneOf/" in ref:
                node["$ref"] = ref.replace("/oneOf/", "/anyOf/")
    return changed


def _unresolved_ref(root: dict) -> Callable[[dict, str], bool]:
    """A local `$ref` whose JSON pointer (read literally, as the engines read it) points at nothing."""

    def unresolved(node: dict, engine: str) -> bool:
        ref = node.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#"):
            return False
        target: Any = root
        for token in [t for t in ref[1:].split("/") if t]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                return True
        return False

    return unresolved


def _drop_unresolved_refs(schema: dict, engine: str, notes: list[str]) -> bool:
    return _drop_where(_unresolved_ref(schema), "$ref")(schema, engine, notes)


def _drop_where(predicate: Callable[[dict, str], bool], keyword: str) -> Callable[[dict, str, list[str]], bool]:
    def repair(schema: dict, engine: str, notes: list[str]) -> bool:
        changed = False
        for place, node in list(_walk(schema)):
            if keyword in node and predicate(node, engine):
                del node[keyword]
                notes.append(f"{place or '.'}: {keyword}")
                changed = True
        return changed

    return repair


def _remote_ref(node: dict, engine: str) -> bool:
    return isinstance(node.get("$ref"), str) and not node["$ref"].startswith("#")


def _engine_refuses(fragment: dict, engine: str) -> bool:
    """Whether the engine refuses a schema made of this fragment alone."""
    try:
        check_guide("json_schema", json.dumps(fragment), engine)
    except GuideError:
        return True
    return False


def _regex_refused(node: dict, engine: str) -> bool:
    pattern = node.get("pattern")
    return isinstance(pattern, str) and _engine_refuses({"type": "string", "pattern": pattern}, engine)


def _pattern_properties_refused(node: dict, engine: str) -> bool:
    value = node.get("patternProperties")
    return isinstance(value, Mapping) and _engine_refuses({"type": "object", "patternProperties": value}, engine)


def _drop_many(*repairs: Callable[[dict, str, list[str]], bool]) -> Callable[[dict, str, list[str]], bool]:
    def repair(schema: dict, engine: str, notes: list[str]) -> bool:
        return any([r(schema, engine, notes) for r in repairs])

    return repair


def _open_tuples(schema: dict, engine: str, notes: list[str]) -> bool:
    """xgrammar's strict mode closes a `prefixItems` tuple that says nothing of further items, which
    JSON Schema allows: say so (`items: true`) where `minItems` needs them."""
    changed = False
    for _, node in list(_walk(schema)):
        if isinstance(node.get("prefixItems"), list) and "items" not in node:
            node["items"] = True
            changed = True
    return changed


def _drop_meta_schema(schema: dict) -> bool:
    """llguidance fetches a `$schema` it does not know (to learn the draft): the guide goes without it
    (an annotation; the output is still validated with the draft the schema names)."""
    return schema.pop("$schema", None) is not None


def _ref_siblings(schema: dict, engine: str, notes: list[str]) -> bool:
    """llguidance refuses keys beside a circular `$ref`: keep the `$ref`, leave the siblings out."""
    changed = False
    for place, node in list(_walk(schema)):
        if "$ref" in node:
            for key in [k for k in node if k != "$ref" and k not in ANNOTATIONS]:
                del node[key]
                notes.append(f"{place or '.'}: {key} (beside $ref)")
                changed = True
    return changed


_REPAIRS: tuple[tuple[str, Callable[[dict, str, list[str]], bool]], ...] = (
    ("oneOf constraints are not supported", _one_of_as_any_of),
    ("is not present in a registry", lambda schema, engine, notes: _drop_meta_schema(schema) | _drop_where(_remote_ref, "$ref")(schema, engine, notes)),
    ("regex", _drop_many(_drop_where(_regex_refused, "pattern"), _drop_where(_pattern_properties_refused, "patternProperties"))),
    ("Regex", _drop_many(_drop_where(_regex_refused, "pattern"), _drop_where(_pattern_properties_refused, "patternProperties"))),
    ("not disjoint", _drop_where(lambda node, engine: True, "patternProperties")),
    ("min/maxProperties", _drop_many(_drop_where(lambda n, e: True, "minProperties"), _drop_where(lambda n, e: True, "maxProperties"))),
    ("minProperties", _drop_where(lambda n, e: True, "minProperties")),
    ("circular references with sibling keys", _ref_siblings),
    ("Cannot find field", _drop_unresolved_refs),
    ("but additional items are not", _open_tuples),
    ("does not exist", _drop_unresolved_refs),
    ("intersection stack level exceeded", _drop_where(lambda n, e: True, "allOf")),
)


def _repair_for(message: str) -> Callable[[dict, str, list[str]], bool] | None:
    return next((repair for marker, repair in _REPAIRS if marker in message), None)
