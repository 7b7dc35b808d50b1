"""TEST DOUBLE: tensorrt_llm.llmapi QuantAlgo / QuantConfig / CalibConfig."""

import enum

from tensorrt_llm._names import NAMES, check

QuantAlgo = enum.Enum("QuantAlgo", {name: name for name in NAMES["quant_algo_members"]})


class QuantConfig:
    def __init__(self, **kwargs):
        check("QuantConfig", kwargs, "quant_config_fields")
        kv = kwargs.get("kv_cache_quant_algo")
        if kv is not None and kv.name not in NAMES["kv_cache_quant_algo_members"]:
            raise ValueError(f"kv_cache_quant_algo {kv.name} is not a KV-cache algorithm")
        self.__dict__.update(kwargs)


class CalibConfig:
    def __init__(self, **kwargs):
        check("CalibConfig", kwargs, "calib_config_fields")
        self.__dict__.update(kwargs)
