"""A JSON Schema over the guide bound, reduced (best effort) to the part nearest its root.

Some real schemas are megabytes of `definitions` (AWS CloudFormation's and SAM's, 1.8 MB: 4,000
definitions, one per resource and property type). Sent whole, xgrammar compiles one over a model's
tokenizer in about 4 minutes and llguidance refuses it ("schema too large"), so a guide is at most
`guides.guide.MAX_GUIDE_BYTES`. Without `strict`, a schema above that (up to `MAX_SCHEMA_BYTES`) is not
refused: its root is kept, and of its definitions those fewest `$ref`s away from the root, smallest
first, while the guide stays within `REDUCED_GUIDE_BYTES`. A `$ref` to a definition left out allows
any value, and an `anyOf` / `oneOf` with such a branch no longer constrains (it is left out too). What
was left out is reported like any other unenforced keyword; answers are still validated against the
whole schema.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

from trtllm_truss.guides.guide import ANNOTATIONS, GuideError, schema_text

MAX_SCHEMA_BYTES = 4 << 20  # a schema a request may send without strict (reduced past MAX_GUIDE_BYTES)
REDUCED_GUIDE_BYTES = 128 << 10  # what a reduced schema's guide may hold (compiles in seconds: docs/api.md)
DEFINITION_CONTAINERS = ("$defs", "definitions")  # where a schema keeps the subschemas its $refs name

DefinitionKey = tuple[str, str]  # (container, name)


def _nodes(value: Any) -> Iterator[dict]:
    """Every object under `value` (iteratively: schemas nest deep)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _definition_of(ref: Any) -> DefinitionKey | None:
    """The root definition a local `$ref` ("#/definitions/X...", "#/$defs/X...") points into."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    tokens = ref[2:].split("/")
    if len(tokens) < 2 or tokens[0] not in DEFINITION_CONTAINERS:
        return None
    return tokens[0], unquote(tokens[1]).replace("~1", "/").replace("~0", "~")


def _references(value: Any) -> set[DefinitionKey]:
    return {key for node in _nodes(value) if (key := _definition_of(node.get("$ref"))) is not None}


def _unconstrained(branch: Any) -> bool:
    return branch is True or (isinstance(branch, dict) and not set(branch) - ANNOTATIONS)


def _units(value: Any) -> list[frozenset[DefinitionKey]]:
    """The definitions `value` refers to, in the groups they are kept or left out by: the `$ref`
    branches of one `anyOf` / `oneOf` together (one left out makes the combinator constrain nothing,
    so keeping the others buys nothing), every other `$ref` alone."""
    units: list[frozenset[DefinitionKey]] = []
    grouped: set[int] = set()
    nodes = list(_nodes(value))
    for node in nodes:
        for combinator in ("anyOf", "oneOf"):
            branches = node.get(combinator)
            if not isinstance(branches, list):
                continue
            direct = [b for b in branches if isinstance(b, dict) and _definition_of(b.get("$ref")) is not None]
            grouped.update(id(b) for b in direct)
            if direct:
                units.append(frozenset(_definition_of(b["$ref"]) for b in direct))
    units += [frozenset({key}) for node in nodes if id(node) not in grouped and (key := _definition_of(node.get("$ref")))]
    return units


def _nearest_that_fit(root: dict, definitions: dict[DefinitionKey, Any], budget: int) -> set[DefinitionKey]:
    """The definitions to keep: reached from the root through kept ones, fewest `$ref`s away and
    cheapest first, while their text fits in `budget` bytes."""
    cost = {key: len(schema_text({key[1]: value}).encode("utf-8", "surrogatepass")) for key, value in definitions.items()}
    kept: set[DefinitionKey] = set()
    order = itertools.count()
    queue: list[tuple[int, int, int, frozenset[DefinitionKey]]] = []

    def reach(value: Any, distance: int) -> None:
        for unit in _units(value):
            if unit <= definitions.keys():  # a reference to no definition is never kept: it allows any value
                heapq.heappush(queue, (distance, sum(cost[k] for k in unit), next(order), unit))

    reach(root, 1)
    while queue:
        distance, _, _, unit = heapq.heappop(queue)
        new = unit - kept
        needed = sum(cost[k] for k in new)
        if not new or needed > budget:
            continue
        kept |= new
        budget -= needed
        for key in new:
            reach(definitions[key], distance + 1)
    return kept


def reduce_to_fit(schema: Mapping[str, Any], budget: int = REDUCED_GUIDE_BYTES) -> tuple[dict, list[str]]:
    """`schema` reduced to its root and the definitions nearest it that fit in `budget` bytes of guide
    text (module docstring), and notes ("<place>: <keyword> (why)") of what was left out. Raises
    GuideError when the root alone (without its definitions) is over the budget."""
    definitions: dict[DefinitionKey, Any] = {
        (container, name): value
        for container in DEFINITION_CONTAINERS
        if isinstance(schema.get(container), Mapping)
        for name, value in schema[container].items()
    }
    root = {key: value for key, value in schema.items() if key not in DEFINITION_CONTAINERS}
    size = len(schema_text(root).encode("utf-8", "surrogatepass"))
    if size > budget:
        raise GuideError(f"the schema's root alone (without its definitions) is {size} bytes; a reduced guide holds at most {budget}")

    kept = _nearest_that_fit(root, definitions, budget - size)
    reduced = copy.deepcopy(root)
    copies = {key: copy.deepcopy(definitions[key]) for key in kept}
    notes: list[str] = []
    for place, node in _post_order(reduced, copies):
        target = _definition_of(node.get("$ref"))
        if target is not None and target not in kept:
            del node["$ref"]
        for combinator in ("anyOf", "oneOf"):
            branches = node.get(combinator)
            if isinstance(branches, list) and any(_unconstrained(b) for b in branches):
                del node[combinator]
                notes.append(f"{place or '.'}: {combinator} (a branch refers to a definition left out)")
        if isinstance(node.get("allOf"), list):  # an unconstrained branch of allOf constrains nothing
            narrowed = [b for b in node["allOf"] if not _unconstrained(b)]
            if narrowed:
                node["allOf"] = narrowed
            else:
                del node["allOf"]

    # Kept definitions no longer referred to (their only $ref was in a branch left out) go too.
    reachable, frontier = set(), _references(reduced)
    while frontier:
        reachable |= frontier
        frontier = {k for key in frontier if key in copies for k in _references(copies[key])} - reachable
    for container in DEFINITION_CONTAINERS:
        entries = {name: value for (c, name), value in copies.items() if c == container and (c, name) in reachable}
        if entries:
            reduced[container] = entries
    total = len(definitions)
    notes.insert(
        0,
        f".: $ref (to {total - len(reachable & kept)} of {total} definitions, left out: the schema is over the"
        f" guide bound, a reference to one allows any value)",
    )
    return reduced, notes


def _post_order(root: dict, definitions: dict[DefinitionKey, Any]) -> list[tuple[str, dict]]:
    """(place, schema object) of every object under the root and the kept definitions, each after
    everything under it (so a branch is settled before the combinator holding it)."""
    order: list[tuple[str, dict]] = []
    stack: list[tuple[str, Any]] = [("", root)]
    stack += [(f".{container}.{name}", value) for (container, name), value in definitions.items()]
    while stack:
        place, item = stack.pop()
        if isinstance(item, dict):
            order.append((place, item))
            stack.extend((f"{place}.{key}", value) for key, value in item.items())
        elif isinstance(item, list):
            stack.extend((f"{place}[{i}]", value) for i, value in enumerate(item))
    order.reverse()
    return order
