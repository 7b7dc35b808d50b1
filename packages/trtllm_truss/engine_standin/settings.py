"""Engine stand-in settings, read from the string parameters of the Triton model config.

The names are documented (with the tensor list) in `triton_models/tensorrt_llm_pytorch/model.py`
(`STANDIN_MODEL_INTERFACE`) so the repository renderer writes exactly these.
"""

from __future__ import annotations

from collections.abc import Mapping
import json
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_truss.engine_standin.types import EngineLimits


class SettingsError(ValueError):
    pass


# The stand-in's KV pool when runtime.max_tokens_in_paged_kv_cache is not set (tokens; about 128 MiB of
# cached KV for the embedded model, 8 KiB a token).
DEFAULT_MAX_KV_POOL_TOKENS = 16_384

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclass(frozen=True)
class StandinSettings:
    limits: EngineLimits
    model_dir: Path | None  # HF checkpoint (the synthetic engine reads only its config, if present)
    tokenizer_dir: Path | None = None  # the synthetic engine picks ordinary word pieces from it
    device: str = "cpu"  # cpu | cuda | auto
    dtype: str | None = None  # float32 | float16 | bfloat16; None: float32 on CPU, float16 on GPU
    num_threads: int | None = None
    synthetic_step_time_ms: float | None = None  # set: the synthetic engine, with this step time
    exclude_input_in_output: bool = False  # default when the request does not say (NVIDIA's: false)
    # False (NVIDIA's behaviour): one response per request per engine step, queued in order when
    # the sender falls behind. True: a sender that fell behind merges the waiting tokens of a
    # request into one response (not what a real engine does; kept for comparisons).
    merge_responses: bool = False
    sender_threads: int = 1  # per instance; >1 crashed tritonserver 2.51 now and then (docs/design.md)
    # TensorRT-LLM's LLM API stream_interval (runtime.stream_interval): a streamed request gets its first
    # token at once, then a response every this many decode steps, and its last one.
    stream_interval: int = 1
    # NVIDIA's lora_task_id -> (adapter name, peft folder), from build.lora_adapters; and how many different
    # adapters one engine step may run (lora_configuration.max_loras; None: any number).
    lora_adapters: Mapping[int, tuple[str, Path]] = field(default_factory=dict)
    max_loras: int | None = None
    # runtime.guided_decoding_backend resolved: the grammar engine guides are compiled and masked with
    # (xgrammar | llguidance, as TensorRT-LLM's PyTorch path); "none": guided requests are refused.
    guided_decoding_backend: str = "xgrammar"
    # runtime.pytorch.guided_whitespace: compact (JSON without free whitespace) | flexible (TensorRT-LLM's).
    guided_whitespace: str = "compact"
    # runtime.pytorch.guide_cache_bytes: what each instance's compiled guides may hold (engine_standin.guidance).
    guide_cache_bytes: int = 128 << 20
    # The paged KV block pool (engine_standin/kv_blocks.py): build.plugin_configuration.tokens_per_block,
    # runtime.enable_kv_cache_reuse, runtime.max_tokens_in_paged_kv_cache (None: kv_pool_tokens' default),
    # runtime.event_buffer_max_size (0: no KV cache events).
    tokens_per_block: int = 64
    kv_cache_reuse: bool = False
    max_tokens_in_paged_kv_cache: int | None = None
    event_buffer_max_size: int = 0
    # runtime.pytorch.synthetic.prefill_time_per_token_ms: the synthetic engine's prefill cost per uncached prompt token.
    synthetic_prefill_time_per_token_ms: float = 0.0

    @property
    def kv_pool_tokens(self) -> int:
        """The pool's size in tokens: max_tokens_in_paged_kv_cache, else room for a full batch of the longest
        requests, at most DEFAULT_MAX_KV_POOL_TOKENS (the stand-in keeps cached blocks' KV in host memory)."""
        if self.max_tokens_in_paged_kv_cache is not None:
            return self.max_tokens_in_paged_kv_cache
        limits = self.limits
        return min(limits.max_batch_size * (limits.max_input_len + limits.max_output_len), DEFAULT_MAX_KV_POOL_TOKENS)

    @property
    def synthetic(self) -> bool:
        return self.synthetic_step_time_ms is not None

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> StandinSettings:
        """`parameters`: name -> string value (Triton's `{"string_value": ...}` already unwrapped)."""
        problems: list[str] = []

        def text(name: str) -> str | None:
            value = parameters.get(name)
            value = value.strip() if isinstance(value, str) else value
            return value or None

        def integer(name: str, default: int, minimum: int = 1) -> int:
            raw = text(name)
            if raw is None:
                return default
            try:
                value = int(raw)
            except ValueError:
                problems.append(f"parameters.{name}: {raw!r} is not an integer")
                return default
            if value < minimum:
                problems.append(f"parameters.{name}: {value} is below the minimum {minimum}")
            return value

        def boolean(name: str, default: bool) -> bool:
            raw = text(name)
            if raw is None:
                return default
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            problems.append(f"parameters.{name}: {raw!r} is not a boolean (true/false)")
            return default

        max_batch_size = integer("max_batch_size", 8)
        if text("max_num_sequences") is not None:  # TensorRT-LLM's cap on sequences in flight
            max_batch_size = min(max_batch_size, integer("max_num_sequences", max_batch_size))
        limits = EngineLimits(
            max_batch_size=max_batch_size,
            max_input_len=integer("max_input_len", 1024),
            max_output_len=integer("max_output_len", 1024),
        )
        step_raw = text("synthetic_step_time_ms")
        synthetic = boolean("synthetic", step_raw is not None)
        step: float | None = None
        if synthetic and step_raw is None:
            step = 0.0
        elif synthetic and step_raw is not None:
            try:
                step = float(step_raw)
                if step < 0:
                    problems.append(f"parameters.synthetic_step_time_ms: {step} must be >= 0")
            except ValueError:
                problems.append(f"parameters.synthetic_step_time_ms: {step_raw!r} is not a number")
        device = (text("device") or "cpu").lower()
        if device not in {"cpu", "cuda", "auto"}:
            problems.append(f"parameters.device: {device!r} is not one of cpu, cuda, auto")
        model_dir = text("model_dir")
        tokenizer_dir = text("tokenizer_dir") or model_dir
        if model_dir is None and step is None:
            problems.append("parameters.model_dir: required (the Hugging Face checkpoint to run)")
        threads_raw = text("num_threads")
        guide_engine = (text("guided_decoding_backend") or "xgrammar").lower()
        if guide_engine not in {"xgrammar", "llguidance", "none"}:
            problems.append(f"parameters.guided_decoding_backend: {guide_engine!r} is not one of xgrammar, llguidance, none")
        whitespace = (text("guided_whitespace") or "compact").lower()
        if whitespace not in {"compact", "flexible"}:
            problems.append(f"parameters.guided_whitespace: {whitespace!r} is not one of compact, flexible")
        adapters = _lora_adapters(text("lora_adapters"), problems)
        prefill_raw = text("synthetic_prefill_time_per_token_ms")
        prefill = 0.0
        if prefill_raw is not None:
            try:
                prefill = float(prefill_raw)
            except ValueError:
                problems.append(f"parameters.synthetic_prefill_time_per_token_ms: {prefill_raw!r} is not a number")
            if prefill < 0:
                problems.append(f"parameters.synthetic_prefill_time_per_token_ms: {prefill} must be >= 0")
        settings = cls(
            limits=limits,
            model_dir=Path(model_dir) if model_dir else None,
            tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir else None,
            device=device,
            dtype=text("dtype"),
            num_threads=integer("num_threads", 1) if threads_raw else None,
            synthetic_step_time_ms=step,
            exclude_input_in_output=boolean("exclude_input_in_output", False),
            merge_responses=boolean("merge_responses", False),
            sender_threads=integer("sender_threads", 1),
            stream_interval=integer("stream_interval", 1),
            lora_adapters=adapters,
            max_loras=integer("lora_max_loras", 1) if text("lora_max_loras") else None,
            guided_decoding_backend=guide_engine,
            guided_whitespace=whitespace,
            guide_cache_bytes=integer("guide_cache_bytes", 128 << 20, minimum=0),
            tokens_per_block=integer("tokens_per_block", 64),
            kv_cache_reuse=boolean("enable_kv_cache_reuse", False),
            max_tokens_in_paged_kv_cache=integer("max_tokens_in_paged_kv_cache", 1) if text("max_tokens_in_paged_kv_cache") else None,
            event_buffer_max_size=integer("event_buffer_max_size", 0, minimum=0),
            synthetic_prefill_time_per_token_ms=prefill,
        )
        if problems:
            raise SettingsError("; ".join(problems))
        return settings


def _lora_adapters(raw: str | None, problems: list[str]) -> dict[int, tuple[str, Path]]:
    """`{"<task id>": {"name": ..., "dir": ...}}` (trtllm_truss.planning.lora.stand_in_parameter)."""
    if raw is None:
        return {}
    try:
        entries = json.loads(raw)
        return {int(task): (str(entry["name"]), Path(entry["dir"])) for task, entry in entries.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        problems.append(f"parameters.lora_adapters: not a JSON map of task id -> {{name, dir}} ({exc})")
        return {}


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def checkpoint_eos_token_id(model_dir: Path | str | None) -> int | None:
    """A checkpoint's end token (generation_config.json first, as transformers does), if it has one: read
    from its JSON, so no tokenizer (nor transformers) is loaded for it."""
    if model_dir is None:
        return None
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            if isinstance(value, list):
                value = value[0] if value else None
            if isinstance(value, int):
                return value
    return None
