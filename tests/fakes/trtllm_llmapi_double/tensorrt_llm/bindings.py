"""TEST DOUBLE: tensorrt_llm.bindings.KVCacheType."""

import enum

from tensorrt_llm._names import NAMES

KVCacheType = enum.Enum("KVCacheType", {name: name for name in NAMES["kv_cache_type_members"]})
