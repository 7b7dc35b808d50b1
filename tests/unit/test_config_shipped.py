"""Every shipped config.yaml loads through real truss (what `truss push` runs) and through our
schema; the documentation lists every key and alias; pinned requirements match the lock file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from trtllm_truss.config import DJL_ALIASES, Quantization, load_config
from trtllm_truss.config.schema import TrtLlmConfig
from trtllm_truss.config.sources import section_model

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [ROOT, *sorted(p.parent for p in (ROOT / "examples").glob("*/config.yaml"))]
IDS = [str(p.relative_to(ROOT)) or "root" for p in SHIPPED]


def test_three_examples_are_shipped():
    assert len(SHIPPED) >= 4, SHIPPED


@pytest.mark.parametrize("truss_dir", SHIPPED, ids=IDS)
def test_loads_through_real_truss(truss_dir: Path):
    from truss.base.truss_config import TrussConfig

    config = TrussConfig.from_yaml(truss_dir / "config.yaml")
    config.validate_forbid_extra()  # what `truss push` runs: unknown top-level keys fail here
    assert "trt_llm" in config.model_metadata
    assert config.trt_llm is None  # truss's own engine-builder key stays unused
    assert config.secrets.get("hf_access_token", "absent") is None  # declared, never a value in the file


@pytest.mark.parametrize("truss_dir", SHIPPED, ids=IDS)
def test_loads_through_our_schema(truss_dir: Path):
    resolved = load_config(truss_dir, environ={})
    assert resolved.warnings == []  # shipped configs use every GPU they ask for and hold no secret values
    assert "hf_access_token" in resolved.secrets


def test_root_config_is_the_embedded_default():
    resolved = load_config(ROOT, environ={})
    build = resolved.trt_llm.build
    assert resolved.accelerator is None
    assert (build.base_model_architecture.value, build.huggingface_ckpt_repository) == ("llama", "data/embedded-llama")
    assert (build.max_input_len, build.max_output_len, build.max_batch_size, build.dtype.value) == (
        512,
        256,
        32,
        "float32",
    )
    assert resolved.trt_llm.runtime.backend.value == "auto"
    truss_config = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert truss_config["python_version"] == "py311"
    assert truss_config["runtime"]["predict_concurrency"] >= 64


def test_examples_match_their_brief():
    by_name = {p.name: load_config(p, environ={}) for p in SHIPPED[1:]}
    fp8 = by_name["llama3.1-8b-fp8-h100"]  # FP8 as NVIDIA exported it, loaded by the LLM API: nothing calibrated
    assert fp8.trt_llm.build.quantization_type is Quantization.NO_QUANT and str(fp8.accelerator) == "H100"
    assert fp8.trt_llm.runtime.backend.value == "llmapi" and fp8.trt_llm.build.huggingface_ckpt_repository.endswith("-FP8")
    legacy_fp8 = by_name["legacy-llama3-8b-fp8-engine-h100"]
    assert legacy_fp8.trt_llm.build.quantization_type is Quantization.FP8 and legacy_fp8.trt_llm.runtime.backend.value == "tensorrtllm"
    served = by_name["legacy-llama3-70b-engine-tp2-h100"]
    assert served.trt_llm.mode == "serve" and served.trt_llm.world_size == 2 and str(served.accelerator) == "H100:2"
    mixtral = by_name["mixtral-8x7b-tp4-h100"]
    assert mixtral.trt_llm.build.base_model_architecture.value == "mixtral"
    assert mixtral.trt_llm.tensor_parallel_count == 4 and str(mixtral.accelerator) == "H100:4"


def _lock_pins(python_version: str = "py311") -> dict[str, str]:
    """Pins of the lock for a truss `python_version` (py311: lock.txt; py310: lock-py3.10.txt ...)."""
    minor = f"3.{python_version.removeprefix('py3')}"
    name = "lock.txt" if minor == "3.11" else f"lock-py{minor}.txt"
    pins = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;#]+)", line.strip())
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


@pytest.mark.parametrize("truss_dir", SHIPPED, ids=IDS)
def test_requirements_are_pinned_to_the_lock(truss_dir: Path):
    truss_config = yaml.safe_load((truss_dir / "config.yaml").read_text())
    pins = _lock_pins(truss_config["python_version"])
    for requirement in truss_config.get("requirements", []):
        match = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)$", requirement)
        assert match, f"{requirement!r} is not an exact pin"
        name = match.group(1).lower().replace("_", "-")
        assert pins.get(name) == match.group(2), f"{requirement} differs from the lock of {truss_config['python_version']} ({pins.get(name)})"


def _all_keys(model=TrtLlmConfig, prefix=()):
    for name, info in model.model_fields.items():
        sub = section_model(info.annotation)
        if sub is not None:
            if name == "synthetic":  # an optional section: documented itself and by its keys
                yield ".".join(prefix + (name,))
            yield from _all_keys(sub, prefix + (name,))
        else:
            yield ".".join(prefix + (name,))


def test_documentation_lists_every_key_and_alias():
    text = (ROOT / "docs" / "configuration.md").read_text()
    missing = [key for key in _all_keys() if f"`{key}`" not in text]
    assert not missing, f"docs/configuration.md lacks {missing}"
    missing_aliases = [name for alias in DJL_ALIASES for name in alias.names if f"`{name}`" not in text]
    assert not missing_aliases, f"docs/configuration.md lacks {missing_aliases}"
