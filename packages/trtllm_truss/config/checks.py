"""Checks of the section against the hardware named in `resources.accelerator` and the nodes of
`resources.node_count` (no probing)."""

from __future__ import annotations

from trtllm_truss.config.accelerator import (
    BF16_MIN_COMPUTE_CAPABILITY,
    FP4_MIN_COMPUTE_CAPABILITY,
    FP8_MIN_COMPUTE_CAPABILITY,
    Accelerator,
    gpus_with_compute_capability,
)
from trtllm_truss.config.enums import AwqFormat, Backend, Dtype, Quantization
from trtllm_truss.config.errors import SECTION_PATH
from trtllm_truss.config.schema import TrtLlmConfig


def hardware_problems(
    config: TrtLlmConfig, accelerator: Accelerator | None, node_count: int = 1
) -> tuple[list[str], list[str]]:
    """(problems, warnings) for parallelism (over `node_count` nodes of `accelerator`), FP8 and bfloat16
    versus the requested GPUs."""
    problems: list[str] = []
    warnings: list[str] = []
    mode_path = f"{SECTION_PATH}.{config.mode}"
    tp, pp, world = config.tensor_parallel_count, config.pipeline_parallel_count, config.world_size
    if node_count > 1:
        problem = node_count_problem(
            world,
            node_count,
            accelerator.count if accelerator is not None else None,
            key=f"{mode_path}.tensor_parallel_count {tp} x pipeline_parallel_count {pp}",
        )
        if problem is not None:
            problems.append(problem)
    elif accelerator is None:
        if world > 1:
            problems.append(
                f"{mode_path}.tensor_parallel_count: tensor_parallel_count {tp} x pipeline_parallel_count {pp}"
                f" needs {world} GPUs but resources.accelerator is not set;"
                f" set e.g. resources.accelerator: H100:{world}"
            )
        if config.runtime.backend is Backend.TENSORRTLLM:
            problems.append(
                f"{SECTION_PATH}.runtime.backend: tensorrtllm needs a GPU but resources.accelerator is not set;"
                " set it, or use backend auto or pytorch"
            )
    else:
        if world > accelerator.count:
            problems.append(
                f"{mode_path}.tensor_parallel_count: tensor_parallel_count {tp} x pipeline_parallel_count {pp}"
                f" = {world} GPUs, but resources.accelerator is {accelerator}; set resources.accelerator:"
                f" {accelerator.gpu}:{world} or lower the counts"
            )
        elif world < accelerator.count:
            warnings.append(
                f"{mode_path}.tensor_parallel_count: the engine uses {world} of the {accelerator.count} GPUs"
                f" of resources.accelerator {accelerator}"
            )
    build = config.build
    if (
        build is not None
        and config.runtime.backend is Backend.PYTORCH
        and build.quantization_type is not Quantization.NO_QUANT
    ):
        warnings.append(
            f"{SECTION_PATH}.build.quantization_type: {build.quantization_type.value} is not applied by the"
            " pytorch stand-in engine (runtime.backend pytorch)"
        )
    if config.runtime.pytorch.synthetic is not None and build is not None and build.lora_adapters:
        # The stand-in's synthetic engine, run by backend pytorch or by backend llmapi's LLM-API double.
        warnings.append(
            f"{SECTION_PATH}.build.lora_adapters: not applied by the synthetic engine (runtime.pytorch.synthetic):"
            " requests naming an adapter are served with the same synthetic tokens"
        )
    if config.runtime.backend is Backend.PYTORCH:
        # Speculation changes speed only (drafts are verified against the model), host offload only capacity.
        if config.speculative is not None:
            warnings.append(
                f"{SECTION_PATH}.speculative: not applied by the pytorch stand-in engine (runtime.backend pytorch);"
                " it generates one token per step"
            )
        for name in ("lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size",
                     "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes"):
            if getattr(config.runtime, name) is not None:
                warnings.append(
                    f"{SECTION_PATH}.runtime.{name}: not applied by the pytorch stand-in engine (runtime.backend"
                    " pytorch), which keeps every adapter of build.lora_adapters loaded"
                )
        if config.runtime.kv_cache_host_memory_bytes is not None:
            warnings.append(
                f"{SECTION_PATH}.runtime.kv_cache_host_memory_bytes: not applied by the pytorch stand-in engine"
                " (runtime.backend pytorch), which keeps no KV-cache blocks on the host"
            )
    sm = accelerator.compute_capability if accelerator is not None else None
    if build is None or sm is None:
        return problems, warnings
    capability = f"{accelerator.gpu} is SM {sm // 10}.{sm % 10}"
    if build.quantization_type.is_fp8 and sm < FP8_MIN_COMPUTE_CAPABILITY:
        problems.append(
            f"{SECTION_PATH}.build.quantization_type: {build.quantization_type.value} needs SM >= 8.9"
            f" ({', '.join(gpus_with_compute_capability(FP8_MIN_COMPUTE_CAPABILITY))}) but {capability};"
            " use weights_int8, smooth_quant or awq, or a newer GPU"
        )
    if build.quantization_type.is_fp4 and sm < FP4_MIN_COMPUTE_CAPABILITY:
        problems.append(
            f"{SECTION_PATH}.build.quantization_type: {build.quantization_type.value} (NVFP4) needs a Blackwell GPU,"
            f" SM >= 10.0 ({', '.join(gpus_with_compute_capability(FP4_MIN_COMPUTE_CAPABILITY))}) but {capability};"
            " use fp8 or fp8_kv (SM >= 8.9), or a Blackwell GPU"
        )
    if (
        build.quantization_type is Quantization.AWQ
        and build.awq.format is AwqFormat.W4A8_AWQ
        and sm < FP8_MIN_COMPUTE_CAPABILITY
    ):
        problems.append(f"{SECTION_PATH}.build.awq.format: w4a8_awq needs SM >= 8.9 but {capability}; use int4_awq")
    if build.dtype is Dtype.BFLOAT16 and sm < BF16_MIN_COMPUTE_CAPABILITY:
        problems.append(f"{SECTION_PATH}.build.dtype: bfloat16 needs SM >= 8.0 but {capability}; use float16")
    return problems, warnings


def node_count_problem(world_size: int, node_count: int, gpus_per_node: int | None, *, key: str) -> str | None:
    """Why `node_count` nodes of `gpus_per_node` GPUs cannot hold a world of `world_size` ranks (None: they do).

    A multi-node world must fill every node: each node runs gpus_per_node ranks."""
    if node_count <= 1:
        return None
    if gpus_per_node is None:
        return (
            f"resources.node_count: {node_count} nodes need resources.accelerator (e.g. H100:8) to know each"
            " node's GPUs"
        )
    nodes_needed = -(-world_size // gpus_per_node)
    if world_size == node_count * gpus_per_node:
        return None
    if nodes_needed < node_count:
        fits = "one node" if nodes_needed == 1 else f"{nodes_needed} nodes"
        return (
            f"resources.node_count: {node_count} nodes of {gpus_per_node} GPUs hold {node_count * gpus_per_node}"
            f" ranks but {key} gives a world of {world_size}, which fits on {fits}; set resources.node_count:"
            f" {nodes_needed}, or raise the parallel counts to {node_count * gpus_per_node} ranks"
        )
    return (
        f"resources.node_count: {node_count} nodes x {gpus_per_node} GPUs = {node_count * gpus_per_node} ranks"
        f" but {key} gives a world of {world_size}; the world must fill every node"
        f" (nodes x GPUs per node = tensor x pipeline parallel)"
    )
