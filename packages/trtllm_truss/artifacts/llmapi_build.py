"""`python -m trtllm_truss.artifacts.llmapi_build SPEC_JSON`: the TensorRT-LLM 1.x engine build.

Runs inside the build environment (where `tensorrt_llm` is installed); the plan in `build.py` writes
the spec, so every argument name is checked by the contract tests without importing TensorRT-LLM.
"""

from __future__ import annotations

import sys

from trtllm_truss.artifacts.build import LlmApiSpec


def _speculative_kwargs(spec: LlmApiSpec) -> dict:
    """`speculative_config` for a lookahead engine: NVIDIA's LookaheadDecodingConfig sets the build's
    speculative_decoding_mode and max_draft_len from the sizes (llm_args.py validate_speculative_config)."""
    if not spec.speculative_config:
        return {}
    from tensorrt_llm.llmapi import LookaheadDecodingConfig

    fields = {k: v for k, v in spec.speculative_config.items() if k != "decoding_type"}
    return {"speculative_config": LookaheadDecodingConfig(**fields)}


def build_engine(spec: LlmApiSpec) -> None:
    # Imported here: `import tensorrt_llm` costs seconds and initialises CUDA.
    from tensorrt_llm import BuildConfig
    from tensorrt_llm._tensorrt_engine import LLM
    from tensorrt_llm.bindings import KVCacheType
    from tensorrt_llm.llmapi import CalibConfig, QuantAlgo, QuantConfig
    from tensorrt_llm.plugin import PluginConfig

    build_fields = dict(spec.build_config)
    kv_cache_type = build_fields.pop("kv_cache_type", None)
    build_config = BuildConfig(**build_fields)
    if kv_cache_type is not None:
        build_config.kv_cache_type = KVCacheType[str(kv_cache_type)]
    plugin_config = PluginConfig()
    for name, value in spec.plugin_config.items():
        setattr(plugin_config, name, value)
    build_config.plugin_config = plugin_config

    quant_fields = dict(spec.quant_config)
    for name in ("quant_algo", "kv_cache_quant_algo"):
        if name in quant_fields:
            quant_fields[name] = QuantAlgo[str(quant_fields[name])]
    llm = LLM(
        model=spec.model,
        dtype=spec.dtype,
        tensor_parallel_size=spec.tensor_parallel_size,
        pipeline_parallel_size=spec.pipeline_parallel_size,
        build_config=build_config,
        quant_config=QuantConfig(**quant_fields),
        calib_config=CalibConfig(**spec.calib_config) if spec.calib_config else None,
        **_speculative_kwargs(spec),
    )
    try:
        llm.save(spec.output_dir)
    finally:
        llm.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trtllm_truss.artifacts.llmapi_build SPEC_JSON", file=sys.stderr)
        return 2
    build_engine(LlmApiSpec.from_json(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
