"""TEST DOUBLE: tensorrt_llm._tensorrt_engine.LLM; `save` writes a realistic engine directory."""

import json
import os
import sys
from pathlib import Path

from tensorrt_llm._names import check


class LLM:
    def __init__(self, **kwargs):
        check("LLM", kwargs, "llm_kwargs")
        self.kwargs = kwargs

    def save(self, engine_dir: str) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
        from fakes.fake_trtllm_build import write_fake_engine

        build = self.kwargs["build_config"]
        record = os.environ.get("FAKE_TRTLLM_RECORD")
        if record:
            quant = self.kwargs["quant_config"]
            Path(record).write_text(json.dumps({
                "model": self.kwargs["model"],
                "tensor_parallel_size": self.kwargs["tensor_parallel_size"],
                "kv_cache_type": build.kv_cache_type.name,
                "quant_algo": getattr(getattr(quant, "quant_algo", None), "name", None),
                "kv_cache_quant_algo": getattr(getattr(quant, "kv_cache_quant_algo", None), "name", None),
                "calib": vars(self.kwargs["calib_config"]) if self.kwargs.get("calib_config") else None,
                "plugin": vars(build.plugin_config),
            }))
        print("[fake LLM] building engine", flush=True)
        write_fake_engine(Path(engine_dir), tp=self.kwargs["tensor_parallel_size"], pp=self.kwargs["pipeline_parallel_size"],
                          max_batch_size=build.max_batch_size, max_input_len=build.max_input_len,
                          max_seq_len=build.max_seq_len, version="1.2.0")

    def shutdown(self) -> None:
        pass
