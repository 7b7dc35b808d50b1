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

Both modes first check the schema against its meta-schema (`guides.guide.check_meta_schema`). A schema
over the guide bound is refused when strict and otherwise reduced to the part nearest its root
(`guides.oversized`), and then only that part is checked and prepared.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trtllm_truss.guides import oversized
from trtllm_truss.guides.guide import (
    ANNOTATIONS,
    LLGUIDANCE,
    MAX_GUIDE_BYTES,
    XGRAMMAR,
    GuideError,
    check_guide,
    check_meta_schema,
    schema_text,
)

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
        super().__init__(cannot_enforce(keyword, engine))


def cannot_enforce(keyword: str, engine: str) -> str:
    """"keyword 'format' cannot be enforced by xgrammar (format 'x')", or "(beside anyOf)" and the like."""
    name, _, detail = keyword.partition(" ")
    if detail.startswith("("):
        return f"keyword {name!r} cannot be enforced by {engine} {detail}"
    return f"keyword {name!r} cannot be enforced by {engine}" + (f" ({keyword})" if detail else "")


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


def _unknown_keywords(schema: Any, engine: str, where: str = "") -> Iterator[tuple[str, str]]:
    """(place, keyword) of each key the engine does not know (an unknown `format` as "format 'x'")."""
    enforced = ENFORCED[engine]
    for place, node in _walk(schema, where):
        for key, value in node.items():
            if key == "format" and isinstance(value, str) and value not in FORMATS[engine]:
                yield place, f"format {value!r}"
            elif key not in enforced and key not in ANNOTATIONS:
                yield place, key


def enforceable(schema: Any, engine: str, where: str = "") -> tuple[Any, list[tuple[str, str]]]:
    """A copy of `schema` rewritten (exactly) into what `engine` enforces, and (place, keyword) of each
    key it still does not: unknown keywords, and for xgrammar those its combinators override."""
    rewritten = copy.deepcopy(schema)
    missing = list(_unknown_keywords(rewritten, engine, where))
    if engine == XGRAMMAR and isinstance(rewritten, dict):
        missing += [(place, f"{key} ({why})") for place, _, key, why in xgrammar_combinators(rewritten, where)]
    return rewritten, missing


def unenforced(schema: Any, engine: str, where: str = "") -> list[tuple[str, str]]:
    """(place, keyword) of each key of `schema` the engine does not enforce, even rewritten."""
    return enforceable(schema, engine, where)[1]


def prepare(schema: Mapping[str, Any], engine: str, *, strict: bool) -> PreparedSchema:
    """The schema as the guide `engine` enforces (module docstring); raises NotASchema (not a JSON
    Schema), KeywordRefused (strict: the place and keyword) or GuideError with the engine's reason. A
    schema over the guide bound is reduced first (`guides.oversized`; strict: refused)."""
    size = len(schema_text(schema).encode("utf-8", "surrogatepass"))
    notes: list[str] = []
    if size > MAX_GUIDE_BYTES:
        if strict:
            raise GuideError(
                f"the schema is {size} bytes; strict: true sends it as it is, and a guide holds at most {MAX_GUIDE_BYTES}"
                " (without strict it is reduced to the part nearest its root)"
            )
        schema, notes = oversized.reduce_to_fit(schema)
    check_meta_schema(schema)
    if strict:
        rewritten, missing = enforceable(dict(schema), engine)
        for place, key in missing:
            raise KeywordRefused(place, key, engine)
        text = schema_text(rewritten)
        check_guide("json_schema", text, engine)
        return PreparedSchema(text)
    trimmed = copy.deepcopy(dict(schema))
    _normalise(trimmed)
    for place, node in list(_walk(trimmed)):
        for key in [k for k in node if k not in ENFORCED[engine] and k not in ANNOTATIONS]:
            del node[key]
            notes.append(f"{place or '.'}: {key}")
        value = node.get("format")
        if isinstance(value, str) and value not in FORMATS[engine]:
            del node["format"]
            notes.append(f"{place or '.'}: format {value!r}")
    if engine != XGRAMMAR:
        return _repaired(trimmed, engine, notes)
    unmerged, unmerged_notes = copy.deepcopy(trimmed), list(notes)
    _leave_out(xgrammar_combinators(trimmed), notes)
    try:
        return _repaired(trimmed, engine, notes)
    except GuideError:
        # A merge can make the engine see a part no value satisfies, which xgrammar's override hid:
        # then do as xgrammar does, leaving out what it ignores (reported).
        _leave_out(xgrammar_combinators(unmerged, merge=False), unmerged_notes)
        return _repaired(unmerged, engine, unmerged_notes)


def _leave_out(ignored: list[tuple[str, dict, str, str]], notes: list[str]) -> None:
    for place, node, key, why in ignored:
        if key != "pattern":  # a pattern whose lookaround is ignored only allows more
            node.pop(key, None)
        notes.append(f"{place or '.'}: {key} ({why})")


def _repaired(trimmed: dict, engine: str, notes: list[str]) -> PreparedSchema:
    """The guide once the engine takes it, after the repairs its messages call for."""
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


# --- xgrammar's combinators ----------------------------------------------------------------------

# xgrammar 0.2.8 converts a node by the first of these it has and ignores the node's other keywords
# (probed: `{"type": "object", "properties": ..., "anyOf": [{"required": ["a"]}, ...]}` allows any JSON
# value); an `allOf` of two or more branches allows any value. llguidance intersects them all.
XGRAMMAR_DOMINANT = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")
_OPENS_PROPERTIES = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def xgrammar_combinators(schema: dict, where: str = "", *, merge: bool = True) -> list[tuple[str, dict, str, str]]:
    """In place: each node's keywords that xgrammar would ignore beside its combinator are merged into
    it where that is exact (siblings into every `anyOf`/`oneOf` branch, an `allOf` into one schema, a
    `const`/`enum` kept to the values its siblings allow). Returns (place, node, keyword, why) of each
    keyword xgrammar still ignores, and of each `allOf` it does not enforce at all (left out, it leaves
    its siblings enforced). `merge=False`: nothing is merged, everything ignored is returned."""
    ignored: list[tuple[str, dict, str, str]] = []
    for place, node in _walk(schema, where):
        while True:  # a merged allOf may leave the node another combinator
            dominant = next((k for k in XGRAMMAR_DOMINANT if k in node), None)
            if dominant is None:
                break
            siblings = {
                k: v for k, v in node.items() if k != dominant and k not in ANNOTATIONS and k not in oversized.DEFINITION_CONTAINERS
            }
            merged = _merged_combinator(node[dominant], dominant, siblings) if merge else None
            if merged is None:
                if dominant == "allOf" and isinstance(node["allOf"], list) and len(node["allOf"]) > 1:
                    ignored.append((place, node, "allOf", "branches that do not merge into one schema"))
                else:
                    ignored += [(place, node, key, f"beside {dominant}") for key in siblings]
                break
            for key in siblings:
                del node[key]
            if dominant == "allOf":
                del node["allOf"]
                node.update(merged)
                continue
            node[dominant] = merged
            break
        if "items" not in node and (isinstance(node.get("prefixItems"), list) or node.get("minItems")):
            # xgrammar's strict mode closes an array that says nothing of (further) items; JSON Schema
            # leaves it open, and xgrammar refuses it outright where minItems needs more items.
            node["items"] = True
        ignored += [(place, node, key, why) for key, why in _xgrammar_ignores_beside(node)]
    return ignored


_LOOKAROUND = re.compile(r"\(\?<?[=!]")


def _xgrammar_ignores_beside(node: dict) -> Iterator[tuple[str, str]]:
    """Keywords xgrammar 0.2.8 ignores beside others (its warnings say so)."""
    for length in ("minLength", "maxLength"):
        beside = next((k for k in ("pattern", "format") if k in node), None)
        if length in node and beside:
            yield length, f"beside {beside}"
    if "multipleOf" in node and node.get("type") != "integer":
        yield "multipleOf", "enforced for integers only"
    if isinstance(node.get("pattern"), str) and _LOOKAROUND.search(node["pattern"]):
        yield "pattern", "its lookaround is not enforced"  # the rest of it is: best effort keeps it


def _merged_combinator(value: Any, dominant: str, siblings: dict) -> Any:
    """The combinator's value with `siblings` merged in (for allOf: the one schema), None if not exact."""
    if not siblings and dominant != "allOf":
        return None
    if dominant in ("anyOf", "oneOf") and isinstance(value, list):
        branches = [_merge(siblings, branch) for branch in value]
        return None if any(b is None for b in branches) else branches
    if dominant == "allOf" and isinstance(value, list) and (siblings or len(value) > 1):
        merged: dict | None = dict(siblings)
        for branch in value:
            merged = _merge(merged, branch) if merged is not None else None
        return merged
    if dominant in ("const", "enum"):
        allowed = _allowed_values([value] if dominant == "const" else value, siblings)
        if allowed:
            return allowed[0] if dominant == "const" else allowed
    return None


def _allowed_values(values: Any, siblings: dict) -> list | None:
    """The values that satisfy `siblings` (None when they cannot be judged alone, e.g. a `$ref`)."""
    if not isinstance(values, list):
        return None
    try:
        import jsonschema

        check = jsonschema.Draft202012Validator(siblings)
        return [v for v in values if check.is_valid(v)]
    except Exception:  # noqa: BLE001 -- a keyword the validator cannot judge alone
        return None


def _merge(a: Any, b: Any) -> dict | None:
    """One schema meaning `a` and `b` both, when their keywords combine exactly; otherwise None."""
    if b is True:
        return dict(a)
    if not isinstance(a, dict) or not isinstance(b, dict) or ("$ref" in a and b) or ("$ref" in b and a):
        return None
    for x, y in ((a, b), (b, a)):
        # `additionalProperties` and its kin apply to their own schema's `properties` only.
        if any(k in x for k in _OPENS_PROPERTIES) and set(y.get("properties") or ()) - set(x.get("properties") or ()):
            return None
        if "prefixItems" in x and "items" in y and y.get("items") != x.get("items"):
            return None
    out = dict(a)
    for key, value in b.items():
        if key not in out or out[key] == value or key in ANNOTATIONS:
            out.setdefault(key, value)
        elif key == "required" and isinstance(value, list) and isinstance(out[key], list):
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key == "properties" and isinstance(value, dict) and isinstance(out[key], dict):
            if any(name in out[key] and out[key][name] != sub for name, sub in value.items()):
                return None
            out[key] = {**out[key], **value}
        elif key == "type":
            mine = [out[key]] if isinstance(out[key], str) else out[key]
            theirs = [value] if isinstance(value, str) else value
            both = [t for t in mine if t in theirs]
            if not both:
                return None
            out[key] = both[0] if len(both) == 1 else both
        else:
            return None
    return out


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


def _drop_meta_schema(schema: dict) -> bool:
    """llguidance fetches a `$schema` it does not know (to learn the draft): the guide goes without it
    (an annotation; the output is still validated with the draft the schema names)."""
    return schema.pop("$schema", None) is not None


def _drop_base_uri(schema: dict, engine: str, notes: list[str]) -> bool:
    """llguidance resolves relative `$ref`s against the root's `$id` into its own copies of the JSON
    Schema meta-schemas, whose keywords it does not implement: without the `$id` they are unresolved
    remote references, left out like any other."""
    if "$id" not in schema:
        return False
    del schema["$id"]
    notes.append(".: $id (a base for references into meta-schemas)")
    return True


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
    ("Unimplemented keys", _drop_base_uri),
    ("Cannot find field", _drop_unresolved_refs),
    ("does not exist", _drop_unresolved_refs),
    ("intersection stack level exceeded", _drop_where(lambda n, e: True, "allOf")),
)


def _repair_for(message: str) -> Callable[[dict, str, list[str]], bool] | None:
    return next((repair for marker, repair in _REPAIRS if marker in message), None)
