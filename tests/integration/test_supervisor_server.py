"""The supervisor against the real tritonserver from nvidia-pytriton, with tiny repositories made here.

The repository mimics the product's shape without depending on it: an `ensemble` of a python
`preprocessing` step and a decoupled python `tensorrt_llm` step that streams one response per word.
Like every product model, each starts the parent watch (runtime/stub_watch.py): Triton's stub alone
outlives a tritonserver that dies while the stub initializes (a rank of world size 2 still loading when
its parent is killed), deadlocked in its own exit.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import shutil
import signal
import socket
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from trtllm_truss.runtime.process_tree import _session_members
from trtllm_truss.runtime.supervisor import (
    RestartPolicy,
    ServerExit,
    TritonServer,
    TritonStartupError,
)
from trtllm_truss.runtime.tritonserver_install import TritonInstallError, locate_tritonserver

pytestmark = [pytest.mark.triton, pytest.mark.timeout(180)]

MARKER_ENV = "SUPERVISOR_TEST_MARKERS"

# Each python model records which MPI rank loaded it, so tests can tell what ran where.
_MARKER_CODE = f"""
import os
from trtllm_truss.runtime.stub_watch import watch_parent
def record_load(model_name):
    marker_dir = os.environ.get("{MARKER_ENV}")
    if marker_dir:
        rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
        open(os.path.join(marker_dir, f"{{model_name}}-rank{{rank}}-pid{{os.getpid()}}"), "w").close()
"""

_PREPROCESSING = _MARKER_CODE + """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        record_load(args["model_name"])
        self._parent_watch = watch_parent(args["model_name"])

    def finalize(self):
        self._parent_watch.finalized()

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.decode("utf-8").upper().encode("utf-8") for t in text.reshape(-1)], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("WORDS", upper.reshape(text.shape))]))
        return responses
"""

_STREAMING_ENGINE = _MARKER_CODE + """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        record_load(args["model_name"])
        self._parent_watch = watch_parent(args["model_name"])

    def finalize(self):
        self._parent_watch.finalized()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "WORDS").as_numpy().reshape(-1)[0].decode("utf-8")
            for word in text.split():
                out = np.array([word.encode("utf-8")], dtype=object)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", out)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

_PYTHON_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
{extra}
input [ {{ name: "{input}" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "{output}" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

_ENSEMBLE_CONFIG = """
name: "ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "preprocessing"
      model_version: -1
      input_map { key: "TEXT" value: "text_input" }
      output_map { key: "WORDS" value: "_words" }
    },
    {
      model_name: "tensorrt_llm"
      model_version: -1
      input_map { key: "WORDS" value: "_words" }
      output_map { key: "text_output" value: "text_output" }
    }
  ]
}
"""


def _python_model(repo: Path, name: str, code: str, *, input: str, output: str, decoupled: bool = False) -> None:
    extra = "model_transaction_policy { decoupled: true }" if decoupled else ""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(_PYTHON_CONFIG.format(name=name, extra=extra, input=input, output=output))
    (repo / name / "1" / "model.py").write_text(code)


def make_tiny_repository(root: Path) -> Path:
    repo = root / "repository"
    _python_model(repo, "preprocessing", _PREPROCESSING, input="TEXT", output="WORDS")
    _python_model(repo, "tensorrt_llm", _STREAMING_ENGINE, input="WORDS", output="text_output", decoupled=True)
    (repo / "ensemble" / "1").mkdir(parents=True)
    (repo / "ensemble" / "config.pbtxt").write_text(_ENSEMBLE_CONFIG)
    return repo


def stream_words(grpc_url: str, text: str, timeout_s: float = 30.0) -> list[str]:
    """Stream `text` through the ensemble over gRPC; the words the engine step sent back."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        text_input = grpcclient.InferInput("text_input", [1], "BYTES")
        text_input.set_data_from_numpy(np.array([text.encode()], dtype=object))
        client.async_stream_infer("ensemble", [text_input], enable_empty_final_response=True)
        words = []
        while True:
            result, error = responses.get(timeout=timeout_s)
            assert error is None, error
            output = result.as_numpy("text_output")
            if output is not None:
                words.extend(o.decode() for o in output.reshape(-1))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return words
    finally:
        client.stop_stream()
        client.close()


def _port_is_free(port: int) -> bool:
    """No listener on `port` (connections of ours left in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def _poll(condition, timeout_s: float, what: str, describe=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} {describe()}")
        time.sleep(0.05)


def _describe_processes(pids: list[int]) -> str:
    described = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        described.append(f"{pid} (parent {stat[1]}, state {stat[0]}): {name}")
    return "; ".join(described)


@pytest.fixture(scope="module")
def tiny_repository(tmp_path_factory) -> Path:
    return make_tiny_repository(tmp_path_factory.mktemp("supervisor"))


@pytest.fixture(scope="module")
def running_server(tiny_repository):
    with TritonServer(tiny_repository, startup_timeout_s=120) as server:
        yield server


def test_locates_the_wheel_binary_when_nothing_else_is_configured(monkeypatch):
    if Path("/opt/tritonserver/bin/tritonserver").exists() or shutil.which("tritonserver"):
        pytest.skip("a tritonserver outside the wheel is installed here and would win")
    monkeypatch.delenv("TRITONSERVER_PATH", raising=False)
    found = locate_tritonserver()
    assert found.source == "nvidia-pytriton"
    assert found.path.name == "tritonserver" and os.access(found.path, os.X_OK)


def test_started_server_is_ready_streams_and_serves_metrics(running_server):
    import urllib.request

    assert running_server.alive and running_server.ready()
    assert running_server.ready(models=("ensemble", "tensorrt_llm", "preprocessing"))
    assert not running_server.ready(models=("no_such_model",))
    assert stream_words(running_server.grpc_url, "hello supervised world") == ["HELLO", "SUPERVISED", "WORLD"]
    with urllib.request.urlopen(running_server.metrics_url, timeout=5) as response:
        metrics = response.read().decode()
    assert 'nv_inference_request_success{model="ensemble"' in metrics
    # The forwarded log's tail shows the models Triton loaded.
    assert any("successfully loaded 'tensorrt_llm'" in line for line in running_server.log_tail(400))


def test_ports_are_chosen_free_and_distinct(running_server):
    ports = running_server.ports
    assert len({ports.http, ports.grpc, ports.metrics}) == 3
    assert running_server.grpc_url == f"127.0.0.1:{ports.grpc}"
    assert running_server.http_url == f"http://127.0.0.1:{ports.http}"
    assert not _port_is_free(ports.grpc) and not _port_is_free(ports.http)  # taken by the server now
    # World size 1 is a plain tritonserver, never mpirun.
    assert "mpirun" not in running_server.command
    assert any(Path(arg).name == "tritonserver" for arg in running_server.command)


def test_killed_server_is_detected_restarted_and_stop_leaves_nothing(tiny_repository, caplog):
    caplog.set_level(logging.INFO, logger="trtllm_truss.tritonserver")
    exits: list[ServerExit] = []
    exited = threading.Event()

    def on_exit(event: ServerExit) -> None:
        exits.append(event)
        exited.set()

    server = TritonServer(
        tiny_repository,
        startup_timeout_s=120,
        restart=RestartPolicy(initial_backoff_s=0.1),
        on_exit=on_exit,
    )
    pids = []
    try:
        server.start()
        server.wait_ready()
        pids.append(server.pid)
        assert server.restarts == 0 and server.generation == 0
        os.kill(server.pid, signal.SIGKILL)

        assert exited.wait(30), "the death of tritonserver was not reported"
        assert exits[0].returncode == -signal.SIGKILL and exits[0].was_ready and exits[0].will_restart
        assert not server.ready()
        _poll(lambda: server.restarts == 1, 30, "the restart")
        server.wait_ready(timeout_s=120)
        pids.append(server.pid)
        assert server.generation == 1 and pids[1] != pids[0]
        assert stream_words(server.grpc_url, "back again") == ["BACK", "AGAIN"]
    finally:
        server.stop()
    assert not server.alive
    assert server.restarts == 1 and len(exits) == 1  # stopping is not a death and restarts nothing
    for pid in pids:  # tritonserver and every python backend stub it started are gone
        assert _session_members(pid) == []
    assert _port_is_free(server.ports.http) and _port_is_free(server.ports.grpc)
    assert not list(Path("/dev/shm").glob(f"{server._spec.shm_prefix}*"))
    # Triton's log was forwarded through `logging` with the prefix.
    assert any(
        r.name == "trtllm_truss.tritonserver" and r.getMessage().startswith("[tritonserver] ")
        and "successfully loaded" in r.getMessage()
        for r in caplog.records
    )


def test_bad_repository_fails_fast_with_tritons_own_error(tmp_path):
    repo = make_tiny_repository(tmp_path)
    broken = _MARKER_CODE + textwrap.dedent(
        """
        class TritonPythonModel:
            def initialize(self, args):
                raise RuntimeError("deliberately broken preprocessing 7f3a")
        """
    )
    (repo / "preprocessing" / "1" / "model.py").write_text(broken)
    server = TritonServer(repo, restart=RestartPolicy(initial_backoff_s=0.1))
    started = time.monotonic()
    try:
        server.start()
        with pytest.raises(TritonStartupError) as error:
            server.wait_ready(timeout_s=90)
    finally:
        server.stop()
    elapsed = time.monotonic() - started
    message = str(error.value)
    assert "exited with code" in message and "before ensemble became ready" in message
    assert "deliberately broken preprocessing 7f3a" in message  # Triton's own error line, verbatim
    assert "Triton's errors:" in message and "CudaDriverHelper" not in message.split("Last log lines:")[0]
    assert elapsed < 60  # it died; we did not sit out the timeout
    assert server.restarts == 0  # a startup failure is reported, not retried
    assert server.failed is not None and not server.failed.will_restart


def _listening_socket() -> socket.socket:
    taker = socket.socket()
    taker.bind(("", 0))
    taker.listen()
    return taker


def test_a_port_we_chose_taken_before_triton_binds_it_is_chosen_again(tiny_repository, monkeypatch, caplog):
    """Triton binds after loading its models; meanwhile another process may take a port we chose."""
    import trtllm_truss.runtime.supervisor as supervisor

    taker = _listening_socket()
    choose_free_ports = supervisor.choose_free_ports
    choices = []

    def choose_with_grpc_taken_first():
        free = choose_free_ports()
        if not choices:
            free = dataclasses.replace(free, grpc=taker.getsockname()[1])
        choices.append(free)
        return free

    monkeypatch.setattr(supervisor, "choose_free_ports", choose_with_grpc_taken_first)
    caplog.set_level(logging.WARNING, logger="trtllm_truss.runtime.supervisor")
    try:
        with TritonServer(tiny_repository, startup_timeout_s=120) as server:
            assert len(choices) == 2 and server.ports == choices[1]
            assert stream_words(server.grpc_url, "fresh ports") == ["FRESH", "PORTS"]
            assert server.restarts == 0 and server.failed is None
    finally:
        taker.close()
    assert any("lost a port to another process" in r.getMessage() for r in caplog.records)


def test_a_taken_port_the_user_gave_is_a_startup_error(tiny_repository):
    from trtllm_truss.runtime.launch import choose_free_ports

    taker = _listening_socket()
    try:
        ports = dataclasses.replace(choose_free_ports(), http=taker.getsockname()[1])
        server = TritonServer(tiny_repository, ports=ports)
        try:
            server.start()
            with pytest.raises(TritonStartupError, match="already in use"):
                server.wait_ready(timeout_s=90)
            assert server.ports == ports
        finally:
            server.stop()
    finally:
        taker.close()


def test_hanging_model_times_out_and_stop_kills_the_stub(tmp_path):
    repo = make_tiny_repository(tmp_path)
    (repo / "preprocessing" / "1" / "model.py").write_text(
        "import time\nclass TritonPythonModel:\n    def initialize(self, args):\n        time.sleep(600)\n"
    )
    server = TritonServer(repo, stop_timeout_s=6)
    try:
        server.start()
        started = time.monotonic()
        with pytest.raises(TritonStartupError, match=r"did not make ensemble ready within 3s"):
            server.wait_ready(timeout_s=3)
        assert time.monotonic() - started < 10
        pid = server.pid
    finally:
        server.stop()
    assert _session_members(pid) == []


def test_numpy_2_in_the_stub_environment_is_refused_clearly(tmp_path, tiny_repository, monkeypatch):
    import trtllm_truss.runtime.tritonserver_install as install

    real_probe = install.probe_stub_python

    def probe_seeing_numpy_2(env, timeout_s=60.0):  # as if the interpreter's site-packages had numpy 2
        return dataclasses.replace(real_probe(env, timeout_s), numpy_version="2.1.3")

    monkeypatch.setattr(install, "probe_stub_python", probe_seeing_numpy_2)
    server = TritonServer(tiny_repository)
    try:
        with pytest.raises(TritonInstallError) as error:
            server.start()
    finally:
        server.stop()
    message = str(error.value)
    assert "numpy 2.1.3" in message and "numpy<2" in message and "python backend" in message
    assert server.pid is None  # refused before anything was launched


def test_the_numpy_check_ignores_pythonpath_as_the_stub_does(tmp_path):
    """A numpy on PYTHONPATH never reaches the stub, so it must not satisfy (or fail) the check."""
    from trtllm_truss.runtime.tritonserver_install import probe_stub_python

    fake = tmp_path / "site" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "2.1.3"\n')
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(fake.parent)}
    assert probe_stub_python(env).numpy_version == np.__version__


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_world_size_2_runs_two_ranks_with_workers_loading_only_the_engine(tmp_path):
    repo = make_tiny_repository(tmp_path)
    markers = tmp_path / "markers"
    markers.mkdir()
    server = TritonServer(repo, world_size=2, env={MARKER_ENV: str(markers)}, startup_timeout_s=150)
    try:
        server.start()
        assert "mpirun" in server.command and "--oversubscribe" in server.command
        server.wait_ready()
        # Rank 0 has all models loaded; rank 1's engine model loads on its own schedule.
        _poll(lambda: any(m.name.startswith("tensorrt_llm-rank1-") for m in markers.iterdir()), 60, "rank 1's engine")
        assert stream_words(server.grpc_url, "two ranks") == ["TWO", "RANKS"]
        mpirun_pid = server.pid
        assert len([p for p in _session_members(mpirun_pid)]) >= 3  # mpirun + 2 tritonservers (+ stubs)
    finally:
        server.stop()
    loaded = sorted(m.name.rsplit("-pid", 1)[0] for m in markers.iterdir())
    assert loaded == ["preprocessing-rank0", "tensorrt_llm-rank0", "tensorrt_llm-rank1"]
    assert _session_members(mpirun_pid) == []


_ORPHAN_PARENT = """
import sys, time
from pathlib import Path
from trtllm_truss.runtime.supervisor import TritonServer
server = TritonServer(Path(sys.argv[1]), world_size=int(sys.argv[2]))
server.start()
server.wait_ready(150)
print(server.pid, server._spec.shm_prefix, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux setpriv is not installed")
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_parent_killed_without_stop_takes_tritonserver_with_it(tmp_path, world_size):
    if world_size > 1 and shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed")
    import subprocess
    import sys

    repo = make_tiny_repository(tmp_path)
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_PARENT, str(repo), str(world_size)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        line = parent.stdout.readline()  # the parent prints the pid once tritonserver is ready
        assert line.strip(), "the parent process did not get tritonserver ready"
        pid, shm_prefix = line.split()
        session = int(pid)
        assert len(_session_members(session)) >= 1 + world_size
    finally:
        parent.kill()  # SIGKILL: no stop(), no atexit, nothing
        parent.wait()
    def servers_left() -> list[int]:  # mpirun and tritonserver ranks; python backend stubs excepted
        return [p for p in _session_members(session) if "python_backend_stub" not in _describe_processes([p])]

    _poll(lambda: servers_left() == [], 30, "tritonserver to exit:", lambda: _describe_processes(servers_left()))
    # Orphaned stubs notice their parent's death on their own; on a busy machine that can take a while.
    _poll(
        lambda: _session_members(session) == [], 120, "the python backend stubs to exit:",
        lambda: _describe_processes(_session_members(session)),
    )
    # SIGTERM, not SIGKILL: Triton shut down and removed its python backend shared memory itself.
    assert not list(Path("/dev/shm").glob(f"{shm_prefix}*"))


# A model still initializing when its tritonserver dies. tritonserver traps SIGTERM only once its startup
# models are loaded, so its parent-death signal ends it at once (as a rank of world size 2 that is still
# loading when the parent is killed). The model returns from initialize once tritonserver is gone, which
# leaves Triton's stub deadlocked in its own exit (its main thread waits for tritonserver with the GIL
# held): only the parent watch, started last in initialize as in the product's models, ends it.
_INITIALIZING_ENGINE = f"""
import os, threading
from trtllm_truss.runtime.stub_watch import watch_parent

class TritonPythonModel:
    def initialize(self, args):
        started_by = os.getppid()
        open(os.path.join(os.environ["{MARKER_ENV}"], "initializing"), "w").close()
        while os.getppid() == started_by:  # the model's load outlasts tritonserver
            threading.Event().wait(0.01)
        self._parent_watch = watch_parent(args["model_name"])

    def execute(self, requests):
        return None
"""

_LOADING_PARENT = f"""
import sys, time
from pathlib import Path
from trtllm_truss.runtime.supervisor import TritonServer
server = TritonServer(Path(sys.argv[1]), env={{"{MARKER_ENV}": sys.argv[2]}}, ready_models=("engine",))
server.start()
print(server.pid, server._spec.shm_prefix, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux setpriv is not installed")
def test_a_stub_whose_tritonserver_dies_while_it_initializes_ends(tmp_path):
    import subprocess

    from trtllm_truss.runtime.process_tree import _kill_session_and_wait, _remove_shm_regions

    repo = tmp_path / "repository"
    _python_model(repo, "engine", _INITIALIZING_ENGINE, input="WORDS", output="text_output")
    markers = tmp_path / "markers"
    markers.mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", _LOADING_PARENT, str(repo), str(markers)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    session, shm_prefix = None, None
    try:
        line = parent.stdout.readline()
        assert line.strip(), "the parent process did not start tritonserver"
        pid, shm_prefix = line.split()
        session = int(pid)
        _poll(lambda: (markers / "initializing").exists(), 120, "the model's initialize to start")
        parent.kill()  # tritonserver gets its parent-death SIGTERM while still loading
        parent.wait()
        _poll(
            lambda: _session_members(session) == [], 60, "tritonserver and its stub to exit:",
            lambda: _describe_processes(_session_members(session)),
        )
        # The stub removed its shared-memory region, as Triton's own exit of an orphaned stub does.
        assert not list(Path("/dev/shm").glob(f"{shm_prefix}*"))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if session is not None:
            _kill_session_and_wait(session)
        if shm_prefix is not None:
            _remove_shm_regions(shm_prefix)  # after a failure


def test_python_models_import_from_the_rendered_import_path_not_pythonpath(tmp_path):
    """The stub embeds the interpreter but ignores PYTHONPATH: a model reaches modules outside the
    interpreter's site-packages (truss's /packages) only through the header render writes."""
    from trtllm_truss.repository.render import with_import_path

    extra = tmp_path / "extra_packages"
    extra.mkdir()
    (extra / "stub_path_probe_9c1e.py").write_text("GREETING = 'probe-9c1e'\n")
    repo = make_tiny_repository(tmp_path)
    engine = repo / "tensorrt_llm" / "1" / "model.py"
    source = '"""engine that needs a module from outside site-packages"""\nfrom __future__ import annotations\n\nimport stub_path_probe_9c1e\n' + engine.read_text()
    engine.write_text(with_import_path(source, [str(extra)]))
    server = TritonServer(repo, env={**os.environ, "PYTHONPATH": ""})
    try:
        server.start()
        server.wait_ready(timeout_s=90)  # raises with Triton's ModuleNotFoundError if the header did not work
        assert stream_words(server.grpc_url, "hello path") == ["HELLO", "PATH"]
    finally:
        server.stop()
