"""TEST DOUBLE: tensorrt_llm.plugin.PluginConfig."""

from tensorrt_llm._names import check


class PluginConfig:
    def __setattr__(self, name, value):
        check("PluginConfig", [name], "plugin_config_fields")
        object.__setattr__(self, name, value)
