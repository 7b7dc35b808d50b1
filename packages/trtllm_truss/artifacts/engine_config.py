"""Read a TensorRT-LLM engine directory's `config.json` and check it against the machine before Triton starts.

Two layouts exist:
- new (TensorRT-LLM >= 0.9): `{"version", "pretrained_config": {architecture, dtype, mapping, quantization},
  "build_config": {max_*, plugin_config}}` with `rank{r}.engine` files;
- old (<= 0.8): `{"builder_config": {name, precision, tensor_parallel, pipeline_parallel, max_*, quant_mode},
  "plugin_config": {...}}` with `<name>_<dtype>_tp<T>[_pp<P>]_rank<r>.engine` files.

A wrong engine otherwise fails deep inside the backend with messages like "Serialized Engine Version: 237,
Current: 228" or "key 'builder_config' not found"; here every mismatch is one line that says what to change.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from trtllm_truss.planning.engine_info import EngineInfo
from trtllm_truss.planning.probe import GpuInfo

ENGINE_CONFIG_FILE = "config.json"
# Optional sidecar our builder writes: the GPU an engine was built on (config.json does not record it).
BUILD_INFO_FILE = "trtllm_truss_build.json"

# QuantMode bit flags of TensorRT-LLM <= 0.8 (tensorrt_llm/quantization/mode.py), used by the old layout.
_QM_INT4_WEIGHTS, _QM_INT8_WEIGHTS, _QM_ACTIVATIONS = 1, 2, 4
_QM_PER_CHANNEL, _QM_PER_TOKEN, _QM_PER_GROUP = 8, 16, 32
_QM_INT8_KV_CACHE, _QM_FP8_KV_CACHE, _QM_FP8_QDQ = 64, 128, 256

_OLD_RANK_FILE = re.compile(r"^.+_tp(\d+)(?:_pp(\d+))?_rank(\d+)\.engine$")
_NEW_RANK_FILE = re.compile(r"^rank(\d+)\.engine$")
# The first TensorRT-LLM release whose runtime reads the new layout only.
NEW_LAYOUT_SINCE = (0, 9)


class EngineVerificationError(ValueError):
    """An engine directory that must not be handed to Triton. The message is one line saying what to change."""


def _where(path: Path | None) -> str:
    return str(path) if path is not None else "engine config"


def _require(mapping: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: str, src: str) -> Any:
    if key not in mapping:
        raise EngineVerificationError(
            f"{src}: key `{path}.{key}` is missing; the engine config is incomplete, rebuild or re-upload the engine"
        )
    value = mapping[key]
    if isinstance(value, bool) and kind is int or not isinstance(value, kind):
        raise EngineVerificationError(
            f"{src}: `{path}.{key}` is {value!r}, expected {getattr(kind, '__name__', kind)}; "
            "the engine config is corrupted, rebuild or re-upload the engine"
        )
    return value


def _optional_int(mapping: Mapping[str, Any], key: str) -> int | None:
    value = mapping.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _old_layout_quant(quant_mode: int) -> tuple[str | None, str | None]:
    """Map the old QuantMode bit mask to the QuantAlgo names the new layout uses."""
    if quant_mode & _QM_FP8_QDQ:
        algo: str | None = "FP8"
    elif quant_mode & _QM_ACTIVATIONS:
        algo = "W8A8_SQ_PER_CHANNEL" if quant_mode & _QM_PER_CHANNEL else "W8A8_SQ_PER_TENSOR"
        if quant_mode & _QM_PER_TOKEN:
            algo += "_PER_TOKEN_PLUGIN"
        else:
            algo += "_PER_TENSOR_PLUGIN"
    elif quant_mode & _QM_INT4_WEIGHTS:
        algo = "W4A16_AWQ" if quant_mode & _QM_PER_GROUP else "W4A16"
    elif quant_mode & _QM_INT8_WEIGHTS:
        algo = "W8A16"
    else:
        algo = None
    kv = "FP8" if quant_mode & _QM_FP8_KV_CACHE else "INT8" if quant_mode & _QM_INT8_KV_CACHE else None
    return algo, kv


def parse_engine_config(config: Mapping[str, Any], *, source: Path | None = None) -> EngineInfo:
    """Turn a parsed config.json (either layout) into an EngineInfo; raise EngineVerificationError if malformed."""
    src = _where(source)
    if not isinstance(config, Mapping):
        raise EngineVerificationError(f"{src}: expected a JSON object at the top level, got {type(config).__name__}")
    if "pretrained_config" in config or "build_config" in config:
        return _parse_new_layout(config, src)
    if "builder_config" in config:
        return _parse_old_layout(config, src)
    raise EngineVerificationError(
        f"{src}: neither `pretrained_config`/`build_config` (TensorRT-LLM >= 0.9) nor `builder_config` "
        "(<= 0.8) found; this is not a TensorRT-LLM engine config.json (a Hugging Face checkpoint's config?)"
    )


def _parse_new_layout(config: Mapping[str, Any], src: str) -> EngineInfo:
    pretrained = _require(config, "pretrained_config", dict, "", src)
    build = _require(config, "build_config", dict, "", src)
    mapping = pretrained.get("mapping") or {}
    if not isinstance(mapping, dict):
        raise EngineVerificationError(f"{src}: `pretrained_config.mapping` must be an object, got {mapping!r}")
    tp = _optional_int(mapping, "tp_size") or 1
    pp = _optional_int(mapping, "pp_size") or 1
    world = _optional_int(mapping, "world_size") or tp * pp
    quant = pretrained.get("quantization") or {}
    version = config.get("version")
    return EngineInfo(
        layout="new",
        version=str(version) if version is not None else None,
        architecture=str(pretrained.get("architecture", "unknown")),
        dtype=str(pretrained.get("dtype", "unknown")),
        tensor_parallel=tp,
        pipeline_parallel=pp,
        world_size=world,
        quant_algo=quant.get("quant_algo") if isinstance(quant, dict) else None,
        kv_cache_quant_algo=quant.get("kv_cache_quant_algo") if isinstance(quant, dict) else None,
        max_batch_size=_require(build, "max_batch_size", int, "build_config", src),
        max_input_len=_require(build, "max_input_len", int, "build_config", src),
        max_seq_len=_optional_int(build, "max_seq_len"),
        max_output_len=_optional_int(build, "max_output_len"),
        max_beam_width=_optional_int(build, "max_beam_width") or 1,
        max_num_tokens=_optional_int(build, "max_num_tokens"),
        plugin_config=dict(build.get("plugin_config") or {}),
    )


def _parse_old_layout(config: Mapping[str, Any], src: str) -> EngineInfo:
    builder = _require(config, "builder_config", dict, "", src)
    tp = _optional_int(builder, "tensor_parallel") or 1
    pp = _optional_int(builder, "pipeline_parallel") or 1
    quant_mode = _optional_int(builder, "quant_mode") or 0
    algo, kv = _old_layout_quant(quant_mode)
    return EngineInfo(
        layout="old",
        version=None,
        architecture=str(builder.get("name", "unknown")),
        dtype=str(builder.get("precision", "unknown")),
        tensor_parallel=tp,
        pipeline_parallel=pp,
        world_size=tp * pp,
        quant_algo=algo,
        kv_cache_quant_algo=kv,
        max_batch_size=_require(builder, "max_batch_size", int, "builder_config", src),
        max_input_len=_require(builder, "max_input_len", int, "builder_config", src),
        max_seq_len=None,
        max_output_len=_require(builder, "max_output_len", int, "builder_config", src),
        max_beam_width=_optional_int(builder, "max_beam_width") or 1,
        max_num_tokens=_optional_int(builder, "max_num_tokens"),
        plugin_config=dict(config.get("plugin_config") or {}),
    )


def read_engine_config(engine_dir: Path) -> EngineInfo:
    """Parse `<engine_dir>/config.json`; missing, empty or truncated files raise EngineVerificationError."""
    path = Path(engine_dir) / ENGINE_CONFIG_FILE
    if not path.is_file():
        raise EngineVerificationError(
            f"{path}: missing; an engine directory holds config.json and rank*.engine files "
            "(check the engine repository/path and revision)"
        )
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise EngineVerificationError(f"{path}: empty (0 bytes); the upload or download was incomplete, fetch it again")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineVerificationError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            "the file is truncated or corrupted, re-upload or fetch it again"
        ) from None
    return parse_engine_config(raw, source=path)


def expected_rank_files(info: EngineInfo) -> tuple[str, ...]:
    """The engine file names the runtime loads for each rank, in rank order."""
    if info.layout == "new":
        return tuple(f"rank{r}.engine" for r in range(info.world_size))
    pp = f"_pp{info.pipeline_parallel}" if info.pipeline_parallel > 1 else ""
    return tuple(
        f"{info.architecture}_{info.dtype}_tp{info.tensor_parallel}{pp}_rank{r}.engine" for r in range(info.world_size)
    )


def write_build_record(engine_dir: Path, gpu: GpuInfo | None, *, trtllm_version: str, cache_key: str) -> None:
    """Record the build GPU next to the engine: config.json does not, and a plan only runs on its SM."""
    record = {"trtllm_version": trtllm_version, "cache_key": cache_key, "gpu": None}
    if gpu is not None:
        record["gpu"] = {"name": gpu.name, "compute_capability": gpu.compute_capability}
    (Path(engine_dir) / BUILD_INFO_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _read_build_gpu(engine_dir: Path) -> GpuInfo | None:
    path = engine_dir / BUILD_INFO_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        gpu = raw["gpu"]
        if gpu is None:  # built where the driver could not name the GPU
            return None
        return GpuInfo(name=str(gpu["name"]), compute_capability=gpu.get("compute_capability"))
    except (ValueError, KeyError, TypeError) as exc:
        raise EngineVerificationError(f"{path}: unreadable build record ({exc!s}); delete it or rebuild") from None


def _release(version: str) -> tuple[int, ...]:
    """`0.12.0.dev2024` / `1.0.0rc2` -> (0, 12, 0): engines are tied to a release, not to its dev suffix."""
    numbers: list[int] = []
    for part in version.split(".")[:3]:
        digits = re.match(r"\d+", part)
        if not digits:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


def verify_engine_dir(
    engine_dir: Path,
    *,
    expected_tp: int | None = None,
    expected_pp: int | None = None,
    gpu_count: int | None = None,
    runtime_trtllm_version: str | None = None,
    runtime_gpu: GpuInfo | None = None,
    ranks: Collection[int] | None = None,
) -> EngineInfo:
    """Check an engine directory before launching Triton; return its EngineInfo.

    Checks that are given no fact (None) are skipped: on a machine without nvidia-smi the GPU checks
    cannot run, and the engine config alone says nothing about them. `ranks`: only these ranks' files
    must be there (one node of a multi-node world holds only its own); None: every rank's.
    """
    engine_dir = Path(engine_dir)
    if not engine_dir.is_dir():
        raise EngineVerificationError(
            f"{engine_dir}: engine directory does not exist; check the engine path/repository"
        )
    info = read_engine_config(engine_dir)
    where = str(engine_dir)

    # Layout and version first: a wrong-version engine makes every other message misleading.
    if runtime_trtllm_version is not None:
        runtime_release = _release(runtime_trtllm_version)
        if info.layout == "old" and runtime_release >= NEW_LAYOUT_SINCE:
            raise EngineVerificationError(
                f"{where}: engine uses the pre-0.9 config.json layout (`builder_config`) but the runtime is "
                f"TensorRT-LLM {runtime_trtllm_version}; rebuild the engine with TensorRT-LLM {runtime_trtllm_version}"
            )
        if info.version is not None and _release(info.version) != runtime_release:
            raise EngineVerificationError(
                f"{where}: engine was built with TensorRT-LLM {info.version} but the runtime is "
                f"{runtime_trtllm_version}; rebuild the engine with {runtime_trtllm_version} or use a serving image "
                f"with TensorRT-LLM {info.version}"
            )

    if info.world_size != info.tensor_parallel * info.pipeline_parallel:
        raise EngineVerificationError(
            f"{where}: config.json is inconsistent: mapping.world_size={info.world_size} but "
            f"tp_size*pp_size={info.tensor_parallel * info.pipeline_parallel}; the engine config is corrupted, rebuild it"
        )

    # Rank files: present and non-empty for every rank of the engine's world.
    present = {p.name: p for p in engine_dir.iterdir() if p.is_file() and p.name.endswith(".engine")}
    rank_files = expected_rank_files(info)
    needed_files = rank_files if ranks is None else tuple(rank_files[r] for r in sorted(ranks) if r < len(rank_files))
    missing = [name for name in needed_files if name not in present]
    if missing:
        found = ", ".join(sorted(present)) or "none"
        raise EngineVerificationError(
            f"{where}: missing engine file(s) {', '.join(missing)} for world size {info.world_size} "
            f"(tp={info.tensor_parallel}, pp={info.pipeline_parallel}; found: {found}); "
            "the upload or download is incomplete, upload every rank file or fetch again"
        )
    empty = [name for name in needed_files if present[name].stat().st_size == 0]
    if empty:
        raise EngineVerificationError(
            f"{where}: engine file(s) {', '.join(empty)} are empty (0 bytes); the upload or download was "
            "incomplete, re-upload or fetch again"
        )

    if expected_tp is not None and expected_tp != info.tensor_parallel:
        raise EngineVerificationError(
            f"{where}: engine was built with tensor parallelism {info.tensor_parallel} but the config asks for "
            f"{expected_tp}; set tensor_parallel_count: {info.tensor_parallel} or rebuild the engine with tp={expected_tp}"
        )
    if expected_pp is not None and expected_pp != info.pipeline_parallel:
        raise EngineVerificationError(
            f"{where}: engine was built with pipeline parallelism {info.pipeline_parallel} but the config asks for "
            f"{expected_pp}; set pipeline_parallel_count: {info.pipeline_parallel} or rebuild the engine with "
            f"pp={expected_pp}"
        )
    if gpu_count is not None and gpu_count < info.world_size:
        raise EngineVerificationError(
            f"{where}: engine needs {info.world_size} GPUs (tp={info.tensor_parallel} x pp={info.pipeline_parallel}) "
            f"but {gpu_count} are visible; set resources.accelerator to <GPU>:{info.world_size} or rebuild with "
            f"tensor_parallel_count x pipeline_parallel_count = {gpu_count}"
        )

    build_gpu = _read_build_gpu(engine_dir)
    build_sm = build_gpu.sm if build_gpu is not None else None
    runtime_sm = runtime_gpu.sm if runtime_gpu is not None else None
    if build_sm is not None and runtime_sm is not None and build_sm != runtime_sm:
        assert build_gpu is not None and runtime_gpu is not None
        raise EngineVerificationError(
            f"{where}: engine was built on {build_gpu.name} (SM {build_sm}) but this machine has "
            f"{runtime_gpu.name} (SM {runtime_sm}); TensorRT engines only run on the GPU architecture they "
            f"were built for: rebuild on {runtime_gpu.name} or serve on {build_gpu.name}"
        )

    return EngineInfo(**{**info.__dict__, "rank_files": rank_files, "build_gpu": build_gpu})
