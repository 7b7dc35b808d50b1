"""TEST DOUBLE of the `tensorrt_llm` package (1.x engine path only); see _names.py."""

from tensorrt_llm._names import check

__version__ = "1.2.0"


class BuildConfig:
    def __init__(self, **kwargs):
        check("BuildConfig", kwargs, "build_config_fields")
        self.__dict__.update(kwargs)

    def __setattr__(self, name, value):
        check("BuildConfig", [name], "build_config_fields")
        object.__setattr__(self, name, value)
