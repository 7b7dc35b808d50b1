"""A peft LoRA adapter in NVIDIA's request layout: the `lora_weights` and `lora_config` inputs of the C++
backend's `tensorrt_llm` model, made the way NVIDIA's `examples/hf_lora_convert.py` makes them
(TensorRT-LLM, `convert_hf_model`; the backend's docs/lora.md sends its `model.lora_weights.npy` and
`model.lora_config.npy` with a task id's first request), with numpy and safetensors instead of torch.

- One row per (layer, module) of the adapter, in the order of the adapter's tensors.
- `lora_config[0, row]` = `[module id, layer index, adapter size]`, int32; module ids are
  `LoraManager.LORA_MODULE_IDS` (`attn_q` 1, `attn_k` 2, `attn_v` 3, `attn_dense` 4, `mlp_h_to_4h` 5,
  `mlp_4h_to_h` 6, `mlp_gate` 7), the adapter size is the rank.
- `lora_weights[0, row]` = A (`lora_A`, [rank, in]) flattened, then B (`lora_B`, [out, rank]) x scale
  flattened, in the engine's dtype, zero-padded to the longest row. The scale is `lora_alpha / r`
  (`lora_alpha / sqrt(r)` with `use_rslora`). A transposed-looking tensor is transposed as NVIDIA does
  (A must be [rank, hidden], B [hidden, rank], "the hidden dim is the larger").
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from trtllm_truss.planning.lora import PlannedAdapter

# NVIDIA's module ids (tensorrt_llm/lora_manager.py, LoraManager.LORA_MODULE_IDS) of the modules this
# truss takes, by Hugging Face name (hf_lora_convert.py, hf_modules_to_trtllm_modules).
HF_MODULE_IDS = {
    "q_proj": 1,  # attn_q
    "k_proj": 2,  # attn_k
    "v_proj": 3,  # attn_v
    "o_proj": 4,  # attn_dense
    "gate_proj": 5,  # mlp_h_to_4h
    "down_proj": 6,  # mlp_4h_to_h
    "up_proj": 7,  # mlp_gate
}
# hf_lora_convert.py's get_all_lora_weights pattern.
_KEY = re.compile(r".*\.layers\.([0-9]+)\.(self_attn|mlp)\.([a-z_]+)\.lora_(A|B)\.weight.*")
_DTYPES = {"float16": np.float16, "float32": np.float32}


class LoraConversionError(ValueError):
    """The adapter cannot be put in NVIDIA's layout (one line naming the adapter folder and why)."""


@dataclass(frozen=True)
class NvidiaLora:
    weights: np.ndarray  # [1, rows, row size], the engine's dtype
    config: np.ndarray  # [1, rows, 3] int32: module id, layer, adapter size

    def save(self, directory: Path) -> None:
        """`model.lora_weights.npy` / `model.lora_config.npy`, the names NVIDIA's converter writes."""
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "model.lora_weights.npy", self.weights)
        np.save(directory / "model.lora_config.npy", self.config)

    @classmethod
    def load(cls, directory: Path) -> NvidiaLora:
        return cls(np.load(directory / "model.lora_weights.npy"), np.load(directory / "model.lora_config.npy"))


def convert_adapter(adapter_dir: Path, dtype: str = "float16") -> NvidiaLora:
    """NVIDIA's layout of the peft adapter in `adapter_dir` (adapter_config.json, adapter_model.safetensors).
    `dtype`: the engine's (float16 or float32; bfloat16 has no numpy type and is refused)."""
    from safetensors.numpy import load_file

    adapter_dir = Path(adapter_dir)
    if dtype not in _DTYPES:
        raise LoraConversionError(f"{adapter_dir}: LoRA weights in {dtype} are not supported here (float16, float32)")
    config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        raise LoraConversionError(f"{adapter_dir}: adapter_config.json needs an int r and a lora_alpha")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    modules: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise LoraConversionError(f"{adapter_dir}: {key} is not a LoRA A/B weight of a layer's attention or MLP")
        layer, module, which = int(match[1]), match[3], match[4]
        if module not in HF_MODULE_IDS:
            raise LoraConversionError(f"{adapter_dir}: {key}: NVIDIA's LoRA takes no module {module!r}")
        modules.setdefault((layer, module), {})["in" if which == "A" else "out"] = value.astype(np.float32)
    rows, configs = [], []
    for (layer, module), weights in modules.items():
        if set(weights) != {"in", "out"}:
            raise LoraConversionError(f"{adapter_dir}: layer {layer} {module} has lora_A or lora_B only")
        parts, size = [], 0
        for inout in ("in", "out"):
            w = weights[inout]
            if w.ndim != 2:
                raise LoraConversionError(f"{adapter_dir}: layer {layer} {module} lora weights are not matrices")
            dim0, dim1 = w.shape
            size = min(dim0, dim1)
            if dim1 < dim0 and inout == "in":
                size, w = dim1, w.T
            elif dim0 < dim1 and inout == "out":
                size, w = dim0, w.T
            if inout == "out":
                w = w * scale
            parts.append(np.ascontiguousarray(w).reshape(-1))
        rows.append(np.concatenate(parts))
        configs.append([HF_MODULE_IDS[module], layer, size])
    if not rows:
        raise LoraConversionError(f"{adapter_dir}: adapter_model.safetensors holds no LoRA weights")
    width = max(row.size for row in rows)
    weights = np.zeros((1, len(rows), width), dtype=_DTYPES[dtype])
    for i, row in enumerate(rows):
        weights[0, i, : row.size] = row
    return NvidiaLora(weights, np.asarray([configs], dtype=np.int32))


# Triton datatype -> (protobuf contents field, little-endian numpy dtype) of the inputs the workers send.
_RAW = {
    "INT32": ("int_contents", "<i4"),
    "UINT64": ("uint64_contents", "<u8"),
    "FP32": ("fp32_contents", "<f4"),
    "BOOL": ("bool_contents", "?"),
}


def add_request_inputs(request, weights: np.ndarray, config: np.ndarray, *, batched: bool) -> None:
    """Add `lora_weights` (FP16) and `lora_config` (INT32) to a ModelInferRequest. `lora_weights` is FP16
    in NVIDIA's config.pbtxt, which the protobuf `contents` fields cannot hold, and Triton takes either
    every input raw or none: the request's other inputs move to `raw_input_contents` too. `weights` /
    `config` carry NVIDIA's leading batch dimension of 1 (dropped where the model is not batched)."""
    for tensor in request.inputs:
        field, dtype = _RAW[tensor.datatype]
        values = getattr(tensor.contents, field)
        request.raw_input_contents.append(np.asarray(list(values), dtype=dtype).tobytes())
        tensor.ClearField("contents")
    for name, datatype, array in (("lora_weights", "FP16", weights.astype("<f2")), ("lora_config", "INT32", config.astype("<i4"))):
        shape = list(array.shape) if batched else list(array.shape[1:])
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())


def with_nvidia_layouts(
    adapters: tuple[PlannedAdapter, ...], root: Path, revisions: Mapping[Path, str]
) -> tuple[PlannedAdapter, ...]:
    """The adapters with NVIDIA's request layout made once per adapter revision (backend tensorrtllm) under
    `<root>/lora/<name>/<revision>-float16/` (`convert_adapter`); `revisions`: adapter folder ->
    its resolved revision (commit sha or content fingerprint)."""
    out = []
    for adapter in adapters:
        revision = re.sub(r"[^A-Za-z0-9]+", "", revisions.get(adapter.dir, "unknown"))[:16] or "unknown"
        dest = root / "lora" / re.sub(r"[^A-Za-z0-9._-]+", "-", adapter.name) / f"{revision}-float16"
        if not (dest / "model.lora_config.npy").is_file():
            scratch = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
            shutil.rmtree(scratch, ignore_errors=True)
            convert_adapter(adapter.dir, "float16").save(scratch)
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(scratch, dest)
        out.append(dataclasses.replace(adapter, nvidia_dir=dest))
    return tuple(out)
