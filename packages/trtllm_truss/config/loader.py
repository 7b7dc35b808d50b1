"""`load_config(truss_dir)`: config.yaml + environment -> validated `ResolvedConfig` with provenance."""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trtllm_truss.config.accelerator import Accelerator, parse_accelerator
from trtllm_truss.config.build import BuildConfig
from trtllm_truss.config.checks import hardware_problems
from trtllm_truss.config.errors import (
    SECTION_PATH,
    ConfigError,
    did_you_mean,
    dotted,
    remember_secret_values,
    show_value,
)
from trtllm_truss.config.locations import RepositoryLocation, resolve_repository
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.config.schema import ServeConfig, TrtLlmConfig
from trtllm_truss.config.secrets import declared_secret_names, secret_values
from trtllm_truss.config.sources import (
    DEFAULT,
    KeyPath,
    RawSection,
    Source,
    djl_overrides,
    model_at,
    section_from_file,
    section_model,
    trtllm_env_overrides,
)

CONFIG_FILE = "config.yaml"

# Defaults that are copies of another key, shown as such by `trtllm-truss validate`.
_DERIVED_DEFAULTS: dict[KeyPath, KeyPath] = {
    ("serve", "tokenizer_repository"): ("serve", "engine_repository"),
    ("serve", "tokenizer_revision"): ("serve", "engine_revision"),
}


@dataclass(frozen=True)
class ResolvedConfig:
    trt_llm: TrtLlmConfig
    accelerator: Accelerator | None
    sources: dict[str, Source]  # full dotted key ("model_metadata.trt_llm.build.dtype") -> origin
    truss_dir: Path
    secrets: list[str]  # declared secret names; their values are only remembered for redaction
    warnings: list[str] = field(default_factory=list)
    model_name: str | None = None
    node_count: int = 1  # resources.node_count: nodes that serve the model together as one MPI world

    def source_of(self, key: str) -> Source:
        """Origin of a key given as a full dotted path or relative to model_metadata.trt_llm."""
        full = key if key.startswith(SECTION_PATH + ".") else f"{SECTION_PATH}.{key}"
        return self.sources[full]

    def values(self) -> dict[str, Any]:
        """Every leaf as full dotted key -> value (enums as their names), in schema order."""
        return {dotted(SECTION_PATH, *path): value for path, value in _leaves(self.trt_llm, ())}

    def resolve_repository(self, value: str) -> RepositoryLocation:
        return resolve_repository(value, self.truss_dir)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _leaves(model: BaseModel | None, prefix: KeyPath):
    if model is None:
        return
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _leaves(value, prefix + (name,))
        elif isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in value.values()):
            for key, entry in value.items():  # a mapping of sections (build.lora_adapters.<name>)
                yield from _leaves(entry, prefix + (name, str(key)))
        elif value is None and section_model(type(model).model_fields[name].annotation) is not None:
            if name not in ("build", "serve"):  # the unused mode is not a setting worth listing
                yield prefix + (name,), None
        else:
            yield prefix + (name,), _plain(value)


def _source_for(path: KeyPath, origins: Mapping[KeyPath, Source]) -> Source:
    for depth in range(len(path), 0, -1):  # a value may have been set as a whole section (JSON env)
        if path[:depth] in origins:
            return origins[path[:depth]]
    if path in _DERIVED_DEFAULTS:
        return Source("default", "= " + ".".join(_DERIVED_DEFAULTS[path]))
    return DEFAULT


_SECTIONS: dict[str, type[BaseModel]] = {"build": BuildConfig, "serve": ServeConfig, "runtime": RuntimeConfig}


def _other_section_hint(loc: KeyPath) -> str:
    """' max_input_len belongs in build;' when a section's key was put into another section."""
    if len(loc) != 2:
        return ""
    homes = [name for name, model in _SECTIONS.items() if name != loc[0] and loc[-1] in model.model_fields]
    return f" {loc[-1]} belongs in {' or '.join(homes)};" if homes else ""


def _format_validation_error(exc: ValidationError, origins: Mapping[KeyPath, Source]) -> list[str]:
    lines = []
    for err in exc.errors(include_url=False):
        loc: KeyPath = tuple(str(part) for part in err["loc"])
        kind = err["type"]
        value = err.get("input")
        shown_value = True
        if kind == "field_problem":
            relative = err["ctx"]["field"]
            loc = loc + tuple(relative.split(".")) if relative else loc
            message, shown_value = err["ctx"]["detail"], False
        elif kind == "extra_forbidden":
            parent = model_at(loc[:-1])
            allowed = list(parent.model_fields) if parent else []
            hint = did_you_mean(loc[-1], allowed) or _other_section_hint(loc)
            message = f"unknown key;{hint} allowed keys: {', '.join(allowed)}"
            shown_value = False
        elif kind == "missing":
            message, shown_value = "required", False
        elif kind == "string_type":
            message = "expected a string (quote the value in config.yaml)"
        elif kind in ("model_type", "dict_type", "model_attributes_type"):
            message = "expected a mapping of keys"
        elif kind == "value_error":
            message = err["msg"].removeprefix("Value error, ")
            shown_value = False  # our parsers quote the value themselves
        else:
            message = err["msg"][:1].lower() + err["msg"][1:]
        got = f" (got {show_value(value)})" if shown_value else ""
        source = _source_for(loc, origins)
        origin = f" [set by {source.detail}]" if source.kind == "env" else ""
        lines.append(f"{dotted(SECTION_PATH, *loc)}: {message}{got}{origin}")
    return lines


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (plain YAML keeps the last one
    silently, so a duplicated `max_input_len` would quietly override the first)."""

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_truss_config(truss_dir: Path) -> dict[str, Any]:
    path = truss_dir / CONFIG_FILE
    if not path.is_file():
        raise ConfigError([f"{path}: no truss configuration file"])
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError([f"{CONFIG_FILE}: invalid YAML{where}: {getattr(exc, 'problem', exc)}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{CONFIG_FILE}: expected a mapping at the top level, got {type(data).__name__}"])
    return data


def _effective_environ(
    truss_config: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """config.yaml's environment_variables under the process environment (as in the container,
    where truss exports them), plus a label for variables that only the file sets."""
    declared = truss_config.get("environment_variables") or {}
    if not isinstance(declared, dict):
        declared = {}
    from_file = {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in declared.items()}
    labels = {name: " in config.yaml environment_variables" for name in from_file if name not in environ}
    return {**from_file, **environ}, labels


def load_config(
    truss_dir: Path | str, environ: Mapping[str, str] | None = None, *, secrets: Mapping[str, Any] | None = None
) -> ResolvedConfig:
    """Read `config.yaml`, apply environment overrides, validate. Raises `ConfigError` listing every
    problem found (one line each, with its dotted key path). `secrets`: truss's mapping, whose values (a local
    run's can be ones neither the environment nor /secrets holds) no error or log line may show either."""
    truss_dir = Path(truss_dir).resolve()
    truss_config = _read_truss_config(truss_dir)
    env, env_labels = _effective_environ(truss_config, os.environ if environ is None else environ)
    declared_secrets = declared_secret_names(truss_config)
    # Before any value is validated: from here on no error, table or log line can show a secret's value.
    remember_secret_values(secret_values(declared_secrets, secrets=secrets, environ=env))
    raw = RawSection()

    resources = truss_config.get("resources") or {}
    accelerator = None
    try:
        accelerator = parse_accelerator(resources.get("accelerator") if isinstance(resources, dict) else None)
    except ValueError as exc:
        raw.problems.append(f"resources.accelerator: {exc}")
    node_count = 1
    declared_nodes = resources.get("node_count") if isinstance(resources, dict) else None
    if declared_nodes is not None:
        # truss's own schema: a strict integer >= 1 (or null)
        if isinstance(declared_nodes, bool) or not isinstance(declared_nodes, int) or declared_nodes < 1:
            raw.problems.append(f"resources.node_count: expected an integer >= 1 (got {show_value(declared_nodes)})")
        else:
            node_count = declared_nodes

    for name in declared_secrets:
        if declared_secrets[name] not in (None, ""):
            raw.warnings.append(
                f"secrets.{name}: config.yaml holds a value (not shown); keep it null here and store the value"
                " as a secret of the deployment"
            )

    section_from_file(truss_config, raw)
    trtllm_overrides = trtllm_env_overrides(env, raw, env_labels)
    mode = raw.mode_hint
    if any(path[0] == "serve" for path, _, _ in trtllm_overrides) and raw.data.get("build") is None:
        mode = "serve"
    for path, value, source in djl_overrides(env, raw, mode, accelerator, env_labels) + trtllm_overrides:
        raw.set(path, value, source)  # TRTLLM_ variables come last, so they win over DJL aliases

    problems = list(raw.problems)
    config = None
    try:
        config = TrtLlmConfig.model_validate(raw.data)
    except ValidationError as exc:
        problems += _format_validation_error(exc, raw.origins)
    warnings = list(raw.warnings)
    if config is not None:
        hw_problems, hw_warnings = hardware_problems(config, accelerator, node_count)
        problems += hw_problems
        warnings += hw_warnings
    if problems:
        raise ConfigError(problems)
    assert config is not None
    sources = {dotted(SECTION_PATH, *path): _source_for(path, raw.origins) for path, _ in _leaves(config, ())}
    model_name = truss_config.get("model_name")
    return ResolvedConfig(
        trt_llm=config,
        accelerator=accelerator,
        sources=sources,
        truss_dir=truss_dir,
        secrets=list(declared_secrets),
        warnings=warnings,
        model_name=str(model_name) if model_name is not None else None,
        node_count=node_count,
    )


def fleet_configured(
    truss_dir: Path | str, environ: Mapping[str, str] | None = None, *, secrets: Mapping[str, Any] | None = None
) -> bool:
    """`model_metadata.trt_llm.fleet` is set (in config.yaml, or by a TRTLLM_FLEET__* override, config.yaml's
    `environment_variables` included): the truss serves a fleet, under truss's server and `serve` alike.
    Raises `ConfigError` as `load_config` does (`secrets` as there: the first read of a truss's configuration
    is the one whose error is shown)."""
    return load_config(truss_dir, environ, secrets=secrets).trt_llm.fleet is not None
