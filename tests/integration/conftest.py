"""Session-scoped real tritonservers serving repositories rendered by `trtllm_truss.repository`.

* `echo_triton`: the rendered repository with the `tensorrt_llm` step replaced by a TEST DOUBLE of
  TensorRT-LLM (tests/integration/triton_models/tensorrt_llm_echo_double) whose output text is known
  exactly; three postprocessing instances, so streams are spread over instances.
* `echo_relay_triton`: the same, laid out as for NVIDIA's engine: the ensemble calls the
  `tensorrt_llm_window` relay, which adds `prefix_ids` itself.
* `standin_triton`: the rendered repository as shipped for backend "pytorch": the stand-in engine
  running the embedded model (skipped until the stand-in's model.py exists).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from trtllm_truss.planning.plan import ServingPlan
from trtllm_truss.repository import render_repository
from trtllm_truss.repository.render import TRITON_MODELS_DIR

try:
    from trtllm_truss.config import RuntimeConfig
except ImportError:  # the config package's public names are still being written
    from trtllm_truss.config.runtime import RuntimeConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_MODEL_DIR = REPO_ROOT / "data" / "embedded-llama"
ECHO_ENGINE_DOUBLE = Path(__file__).resolve().parent / "triton_models" / "tensorrt_llm_echo_double" / "model.py"
STANDIN_MODEL = TRITON_MODELS_DIR / "tensorrt_llm_pytorch" / "model.py"
SERVER_STARTUP_TIMEOUT_S = 180.0


def _plan(runtime: RuntimeConfig, *, max_batch_size: int) -> ServingPlan:
    return ServingPlan(
        backend="pytorch",
        tokenizer_dir=EMBEDDED_MODEL_DIR,
        model_dir=EMBEDDED_MODEL_DIR,
        max_batch_size=max_batch_size,
        max_input_len=512,
        max_output_len=256,
        runtime=runtime,
    )


_RUNNING: set = set()  # the servers `_serve` started and has not stopped yet


def _serve(repository: Path) -> Iterator[object]:
    from trtllm_truss.runtime.supervisor import TritonServer

    server = TritonServer(repository, startup_timeout_s=SERVER_STARTUP_TIMEOUT_S)
    server.start()
    _RUNNING.add(server)
    try:
        server.wait_ready(SERVER_STARTUP_TIMEOUT_S)
        yield server
    finally:
        server.stop()
        _RUNNING.discard(server)


def _stop_side_by_side(servers: list) -> None:
    """Each `stop()` on its own thread; one that raises fails this teardown, as its finalizer would have."""
    if servers:
        with ThreadPoolExecutor(len(servers)) as pool:
            for stopped in [pool.submit(server.stop) for server in servers]:
                stopped.result()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Before pytest finalizes fixtures one at a time, the servers they would stop stop side by side (each
    finalizer then finds its server stopped: `stop()` is idempotent). A stop is mostly waiting (unloads, the
    stubs' exits), so together they take about as long as the slowest instead of their sum: after a module's
    last test, its truss servers (module-scoped: `truss_serving`); after this directory's last test, the
    session's tritonservers (41 s -> 11 s for three files' tritonservers here)."""
    from truss_serving import RUNNING

    if nextitem is None or nextitem.module is not item.module:
        _stop_side_by_side(list(RUNNING.values()))
    if nextitem is None or Path(__file__).parent not in Path(str(nextitem.path)).parents:
        _stop_side_by_side(list(_RUNNING))


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    if not (EMBEDDED_MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("data/embedded-llama is missing (scripts/make_embedded_model.py)")
    return EMBEDDED_MODEL_DIR


@pytest.fixture(scope="session")
def echo_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    runtime = RuntimeConfig(preprocessing_instance_count=2, postprocessing_instance_count=3)
    repository = render_repository(
        _plan(runtime, max_batch_size=64),
        tmp_path_factory.mktemp("echo") / "model_repository",
        engine_model_source=ECHO_ENGINE_DOUBLE,
    )
    yield from _serve(repository)


@pytest.fixture(scope="session")
def echo_relay_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The GPU path's layout (ensemble -> tensorrt_llm_window relay -> engine that sends no
    prefix_ids of its own use) with the echo TEST DOUBLE as the engine."""
    runtime = RuntimeConfig(preprocessing_instance_count=1, postprocessing_instance_count=3)
    repository = render_repository(
        _plan(runtime, max_batch_size=64),
        tmp_path_factory.mktemp("echo_relay") / "model_repository",
        engine_model_source=ECHO_ENGINE_DOUBLE,
        window_relay=True,
    )
    yield from _serve(repository)


@pytest.fixture(scope="session")
def standin_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    if not STANDIN_MODEL.is_file():
        pytest.skip(f"{STANDIN_MODEL} not written yet")
    runtime = RuntimeConfig(
        preprocessing_instance_count=1,
        postprocessing_instance_count=2,
        pytorch={"device": "cpu", "num_threads": 1},  # 2 shared cores: more threads only contend
    )
    repository = render_repository(_plan(runtime, max_batch_size=32), tmp_path_factory.mktemp("standin") / "model_repository")
    yield from _serve(repository)


def _synthetic_two_slot(tmp_path_factory: pytest.TempPathFactory, *, window_relay: bool) -> Iterator[object]:
    if not STANDIN_MODEL.is_file():
        pytest.skip(f"{STANDIN_MODEL} not written yet")
    runtime = RuntimeConfig(
        preprocessing_instance_count=1,
        postprocessing_instance_count=1,
        pytorch={"device": "cpu", "num_threads": 1, "synthetic": {"step_time_ms": 50.0}},
    )
    repository = render_repository(
        _plan(runtime, max_batch_size=2),
        tmp_path_factory.mktemp("synthetic") / "model_repository",
        window_relay=window_relay,
    )
    yield from _serve(repository)


@pytest.fixture(scope="session")
def synthetic_two_slot_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The stand-in emitting synthetic tokens every 50 ms with only two sequence slots."""
    yield from _synthetic_two_slot(tmp_path_factory, window_relay=False)


@pytest.fixture(scope="session")
def synthetic_two_slot_relay_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """As above, laid out as for NVIDIA's engine (ensemble -> tensorrt_llm_window -> tensorrt_llm)."""
    yield from _synthetic_two_slot(tmp_path_factory, window_relay=True)
