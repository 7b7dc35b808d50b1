"""Completed guided answers checked against the request's JSON Schema, in the stream worker.

Guided decoding enforces what the grammar engine can; a schema sent without `strict` may hold more
(`guides.best_effort`), so every completed answer is validated here with `jsonschema` (the
validator of the draft its `$schema` names, 2020-12 by default) and the outcome rides on the
request's `StreamEnd` to the serving metrics. Validators are kept per schema text (a repeated schema
costs a lookup); the check is one parse and one validation per answer, never per token.
"""

from __future__ import annotations

import functools
import json
from typing import Any


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str) -> Any:
    import jsonschema

    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def answer_valid(schema_text: str, answer: str) -> bool:
    """Whether `answer` is JSON that `schema_text` (a JSON Schema) accepts."""
    try:
        value = json.loads(answer)
    except ValueError:
        return False
    try:
        return bool(_validator(schema_text).is_valid(value))
    except Exception:  # a schema jsonschema cannot evaluate (an unresolvable $ref): not counted as valid
        return False
