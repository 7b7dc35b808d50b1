"""TEST DOUBLE for TensorRT-LLM's builders (TensorRT-LLM cannot be installed here).

`write_fake_engine(dest, ...)` writes what a real `trtllm-build` leaves behind: a new-layout
`config.json` (version / pretrained_config / build_config) and one `rank<r>.engine` per rank of
TP*PP. Run as a script it stands in for both steps of the 0.x flow so `run_build_plan` can execute a
real plan: `convert_checkpoint.py` / `quantize.py` (writes a TensorRT-LLM checkpoint) and
`trtllm-build` (reads it, writes the engine). Env FAKE_TRTLLM_FAIL=<step> makes that step fail
after printing some log lines; FAKE_TRTLLM_ECHO_ENV=<NAME> prints that variable (to check redaction).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

FAKE_VERSION = "0.21.0"


def write_fake_engine(
    dest: Path,
    *,
    tp: int = 1,
    pp: int = 1,
    architecture: str = "LlamaForCausalLM",
    dtype: str = "float16",
    max_batch_size: int = 8,
    max_input_len: int = 128,
    max_seq_len: int = 256,
    max_beam_width: int = 1,
    rank_bytes: int = 4096,
    version: str = FAKE_VERSION,
) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    world = tp * pp
    config = {
        "version": version,
        "pretrained_config": {
            "architecture": architecture,
            "dtype": dtype,
            "mapping": {"world_size": world, "tp_size": tp, "pp_size": pp},
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        },
        "build_config": {
            "max_batch_size": max_batch_size,
            "max_input_len": max_input_len,
            "max_seq_len": max_seq_len,
            "max_beam_width": max_beam_width,
            "max_num_tokens": max_batch_size * max_input_len,
            "kv_cache_type": "PAGED",
            "plugin_config": {"gpt_attention_plugin": dtype, "gemm_plugin": dtype},
        },
    }
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    for rank in range(world):
        # Distinct, deterministic bytes per rank: identical builds give identical files.
        (dest / f"rank{rank}.engine").write_bytes(bytes([rank % 256]) * rank_bytes)
    return dest


def _convert(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--tp_size", type=int, default=1)
    parser.add_argument("--pp_size", type=int, default=1)
    args, _ = parser.parse_known_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    world = args.tp_size * args.pp_size
    mapping = {"world_size": world, "tp_size": args.tp_size, "pp_size": args.pp_size}
    (out / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM", "dtype": args.dtype, "mapping": mapping}))
    for rank in range(world):
        (out / f"rank{rank}.safetensors").write_bytes(b"w" * 64)
    print(f"converted {args.model_dir} into {world} rank(s)")
    return 0


def _build(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_batch_size", type=int, default=8)
    parser.add_argument("--max_input_len", type=int, default=128)
    parser.add_argument("--max_seq_len", type=int, default=256)
    parser.add_argument("--max_beam_width", type=int, default=1)
    args, _ = parser.parse_known_args(argv)
    ckpt = json.loads((Path(args.checkpoint_dir) / "config.json").read_text())
    mapping = ckpt["mapping"]
    write_fake_engine(
        Path(args.output_dir), tp=mapping["tp_size"], pp=mapping["pp_size"], dtype=ckpt["dtype"],
        max_batch_size=args.max_batch_size, max_input_len=args.max_input_len, max_seq_len=args.max_seq_len,
        max_beam_width=args.max_beam_width,
    )
    print(f"built engine into {args.output_dir}")
    return 0


def main(step: str, argv: list[str]) -> int:
    for number in range(3):
        print(f"[fake {step}] working {number}")
    echo = os.environ.get("FAKE_TRTLLM_ECHO_ENV")
    if echo:
        print(f"[fake {step}] {echo}={os.environ.get(echo, '')}")
    if os.environ.get("FAKE_TRTLLM_FAIL") == step:
        print(f"[fake {step}] error: out of memory while building", flush=True)
        return 3
    return _build(argv) if step == "trtllm-build" else _convert(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
