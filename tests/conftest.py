"""Puts tests/ on sys.path (pytest does so for a folder holding a conftest.py), so test data modules
shared by unit and integration tests, such as edge_case_texts, can be imported from both."""

import importlib.util
import shutil
from pathlib import Path

import pytest

# torch's CPU wheel is installed for Python 3.11 only (.venv); the other Pythons' venvs run the rest.
HAS_TORCH = importlib.util.find_spec("torch") is not None
# nvidia-pytriton (the bundled tritonserver) needs numpy < 2, which has no Python 3.13 wheel.
HAS_TRITONSERVER = importlib.util.find_spec("pytriton") is not None or shutil.which("tritonserver") is not None
# Tritonservers of these fixtures run the stand-in engine, whose python-backend model imports torch.
TORCH_FIXTURES = {"standin_triton", "synthetic_two_slot_triton", "synthetic_two_slot_relay_triton"}
# Modules that import trtllm_truss.engine_standin (hence torch) at the top.
TORCH_MODULES = sorted(
    str(path.relative_to(Path(__file__).parent)) for path in Path(__file__).parent.glob("unit/test_standin_*.py")
)

# Modules whose clients (the `anthropic`, `openai-agents` and `langchain-openai` SDKs; pydantic-ai, instructor and
# langgraph) are pinned for Python 3.11 only: their tests talk to the embedded model, which needs torch anyway.
SDK_MODULES = [
    "integration/test_batches.py",
    "integration/test_count_tokens.py",
    "integration/test_forced_calls_only.py",
    "integration/test_truss_server_agent_apis.py",
    "integration/test_truss_server_agent_frameworks.py",
    "integration/test_truss_server_structured.py",
]

collect_ignore = [] if HAS_TORCH else TORCH_MODULES + SDK_MODULES
# The stand-in tests' fixtures (the embedded model's runner and tokenizer, one torch thread).
pytest_plugins = ["standin_testing"] if HAS_TORCH else []

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # also fixtures requested by name through a parameter (request.getfixturevalue(layout))
        params = getattr(getattr(item, "callspec", None), "params", {})
        requested = set(getattr(item, "fixturenames", ())) | {v for v in params.values() if isinstance(v, str)}
        if TORCH_FIXTURES & requested:
            item.add_marker(pytest.mark.torch)
        if not HAS_TORCH and item.get_closest_marker("torch"):
            item.add_marker(pytest.mark.skip(reason="needs torch, which is installed for Python 3.11 only"))
        elif not HAS_TRITONSERVER and item.get_closest_marker("triton"):
            item.add_marker(pytest.mark.skip(reason="no tritonserver: nvidia-pytriton does not install on this Python"))
