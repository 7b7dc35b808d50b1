"""The building blocks every model of the section is made of: the strict base model, the error that names
a key, the strict non-empty string (every module of the section builds on them)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError


def field_problem(field: str, detail: str) -> PydanticCustomError:
    """A cross-field error attributed to `field` (dotted, relative to the model that raises it), so
    the message names the key the user has to change rather than the enclosing section."""
    return PydanticCustomError("field_problem", "{detail}", {"field": field, "detail": detail})


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# Strict: YAML reads an unquoted `12345` or `1e3` as a number; a repository or revision given that way is
# an error naming the key, never silently coerced into a different string ("1000.0").
NonEmptyStr = Annotated[str, Field(min_length=1, strict=True)]
