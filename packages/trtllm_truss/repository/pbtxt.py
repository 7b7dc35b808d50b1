"""Write a `ModelConfig` as protobuf text format (Triton's `config.pbtxt`).

Only set fields are written; there is no templating, so nothing can be left as `${...}`.
"""

from __future__ import annotations

from trtllm_truss.repository.model_config import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelConfig,
    Tensor,
)

_INDENT = "  "


def quote(value: str) -> str:
    """A protobuf text-format string literal (C-style escapes; non-ASCII as UTF-8 octal bytes)."""
    out = []
    for byte in value.encode("utf-8"):
        ch = chr(byte)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _dims(dims: tuple[int, ...]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]" if dims else "[ ]"


def _tensor(tensor: Tensor, *, is_input: bool) -> list[str]:
    lines = [f"name: {quote(tensor.name)}", f"data_type: {tensor.data_type.value}", f"dims: {_dims(tensor.dims)}"]
    if tensor.reshape is not None:
        lines.append(f"reshape: {{ shape: {_dims(tensor.reshape)} }}")
    if is_input and tensor.optional:
        lines.append("optional: true")
    if is_input and tensor.allow_ragged_batch:
        lines.append("allow_ragged_batch: true")
    return lines


def _block(header: str, body: list[str], depth: int) -> list[str]:
    pad = _INDENT * depth
    return [f"{pad}{header} {{", *(f"{pad}{_INDENT}{line}" for line in body), f"{pad}}}"]


def _list(field_name: str, items: list[list[str]]) -> list[str]:
    lines = [f"{field_name} ["]
    for index, body in enumerate(items):
        block = _block("", body, 1)
        block[0] = block[0].replace(" {", "{", 1)
        if index < len(items) - 1:
            block[-1] += ","
        lines.extend(block)
    lines.append("]")
    return lines


def _dynamic_batching(batching: DynamicBatching) -> list[str]:
    body = []
    if batching.preferred_batch_size:
        body.append(f"preferred_batch_size: {_dims(batching.preferred_batch_size)}")
    body.append(f"max_queue_delay_microseconds: {batching.max_queue_delay_microseconds}")
    if batching.preserve_ordering:
        body.append("preserve_ordering: true")
    if batching.max_queue_size is not None:
        body.append(f"default_queue_policy {{ max_queue_size: {batching.max_queue_size} }}")
    return _block("dynamic_batching", body, 0)


def _instance_group(group: InstanceGroup) -> list[str]:
    return [f"count: {group.count}", f"kind: {group.kind.value}"]


def _step(step: EnsembleStep) -> list[str]:
    body = [f"model_name: {quote(step.model_name)}", f"model_version: {step.model_version}"]
    for key, value in step.input_map:
        body.append(f"input_map {{ key: {quote(key)} value: {quote(value)} }}")
    for key, value in step.output_map:
        body.append(f"output_map {{ key: {quote(key)} value: {quote(value)} }}")
    return body


def to_pbtxt(config: ModelConfig) -> str:
    lines = [f"name: {quote(config.name)}"]
    if config.backend is not None:
        lines.append(f"backend: {quote(config.backend)}")
    if config.platform is not None:
        lines.append(f"platform: {quote(config.platform)}")
    lines.append(f"max_batch_size: {config.max_batch_size}")
    if config.decoupled is not None:
        lines.extend(_block("model_transaction_policy", [f"decoupled: {_bool(config.decoupled)}"], 0))
    if config.dynamic_batching is not None:
        lines.extend(_dynamic_batching(config.dynamic_batching))
    lines.extend(_list("input", [_tensor(t, is_input=True) for t in config.inputs]))
    lines.extend(_list("output", [_tensor(t, is_input=False) for t in config.outputs]))
    if config.instance_groups:
        lines.extend(_list("instance_group", [_instance_group(g) for g in config.instance_groups]))
    for key, value in config.parameters:
        lines.append(f"parameters {{ key: {quote(key)} value {{ string_value: {quote(value)} }} }}")
    if config.ensemble_steps:
        steps = _list("step", [_step(s) for s in config.ensemble_steps])
        lines.extend(_block("ensemble_scheduling", steps, 0))
    return "\n".join(lines) + "\n"
