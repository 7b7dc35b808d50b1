"""Pure parts of the supervisor: command lines, binary locator order, log classification, environment."""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path

import pytest
from trtllm_truss.runtime.launch import (
    LaunchSpec,
    TritonPorts,
    build_launch_command,
    choose_free_ports,
)
from trtllm_truss.runtime.supervisor import RestartPolicy
from trtllm_truss.runtime.triton_logs import log_level_of, triton_error_lines
from trtllm_truss.runtime.tritonserver_install import (
    TritonInstallation,
    TritonInstallError,
    assemble_wheel_backends,
    candidate_binaries,
    check_numpy_version,
    child_environment,
    locate_tritonserver,
    packages_dir,
)

PORTS = TritonPorts(http=18000, grpc=18001, metrics=18002)


def _spec(world_size: int, **kw) -> LaunchSpec:
    return LaunchSpec(
        binary=Path("/opt/tritonserver/bin/tritonserver"),
        repository=Path("/srv/repo"),
        backend_dir=Path("/opt/tritonserver/backends"),
        ports=PORTS,
        world_size=world_size,
        shm_prefix="srv_",
        **kw,
    )


# --------------------------------------------------------------------------------- command lines

# What NVIDIA's launcher puts on each rank's command line, read from NVIDIA/TensorRT-LLM
# triton_backend/scripts/launch_triton_server.py (commit 0a2e2c1f1268b34586393794045691b666ba28be),
# get_cmd(): `mpirun --allow-run-as-root [--oversubscribe]`, then per rank `-n 1 <tritonserver>
# --model-repository=<repo>`, ranks > 0 `--model-control-mode=explicit --load-model=tensorrt_llm`,
# every rank `--disable-auto-complete-config --backend-config=python,shm-region-prefix-name=prefix{i}_`,
# rank contexts separated by ':'.
NVIDIA_MPIRUN_PREFIX = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
NVIDIA_EVERY_RANK = ["--disable-auto-complete-config"]
NVIDIA_WORKER_RANK = ["--model-control-mode=explicit", "--load-model=tensorrt_llm"]


def _app_contexts(command: list[str]) -> list[list[str]]:
    contexts, current = [], []
    for arg in command[len(NVIDIA_MPIRUN_PREFIX):]:
        if arg == ":":
            contexts.append(current)
            current = []
        else:
            current.append(arg)
    return contexts + [current]


def test_world_size_1_is_plain_tritonserver_not_mpirun():
    command = build_launch_command(_spec(1))
    assert command[0] == "/opt/tritonserver/bin/tritonserver"
    assert "mpirun" not in command and ":" not in command
    assert "--model-repository=/srv/repo" in command
    assert "--backend-directory=/opt/tritonserver/backends" in command
    assert {"--http-port=18000", "--grpc-port=18001", "--metrics-port=18002"} <= set(command)
    assert "--model-control-mode=explicit" not in command


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_mpirun_command_matches_nvidias_launcher(world_size):
    command = build_launch_command(_spec(world_size))
    assert command[: len(NVIDIA_MPIRUN_PREFIX)] == NVIDIA_MPIRUN_PREFIX
    contexts = _app_contexts(command)
    assert len(contexts) == world_size
    for rank, context in enumerate(contexts):
        assert context[:3] == ["-n", "1", "/opt/tritonserver/bin/tritonserver"]
        assert "--model-repository=/srv/repo" in context
        assert set(NVIDIA_EVERY_RANK) <= set(context)
        prefixes = [a for a in context if a.startswith("--backend-config=python,shm-region-prefix-name=")]
        assert prefixes == [f"--backend-config=python,shm-region-prefix-name=srv_prefix{rank}_"]
        if rank == 0:
            assert {"--http-port=18000", "--grpc-port=18001", "--metrics-port=18002"} <= set(context)
            assert not set(NVIDIA_WORKER_RANK) & set(context)
        else:
            assert set(NVIDIA_WORKER_RANK) <= set(context)
            # Worker ranks serve nothing, so they must not try to bind rank 0's ports.
            assert not [a for a in context if a.endswith(("-port=18000", "-port=18001"))]
            assert {"--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"} <= set(context)


def test_engine_model_name_and_oversubscribe_are_configurable():
    command = build_launch_command(_spec(2, engine_model="llm_engine", oversubscribe=False))
    assert "--oversubscribe" not in command
    assert "--load-model=llm_engine" in command


def test_launch_spec_rejects_bad_world_size_and_ports():
    with pytest.raises(ValueError, match="world_size"):
        _spec(0)
    with pytest.raises(ValueError, match="distinct"):
        TritonPorts(http=1, grpc=1, metrics=2)


def test_free_ports_are_distinct():
    ports = choose_free_ports()
    assert len({ports.http, ports.grpc, ports.metrics}) == 3


# ------------------------------------------------------------------------------------ locating


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def installs(tmp_path):
    return {
        "explicit": _executable(tmp_path / "explicit" / "tritonserver"),
        "env": _executable(tmp_path / "env" / "tritonserver"),
        "path": _executable(tmp_path / "onpath" / "tritonserver"),
        "opt": _executable(tmp_path / "opt" / "bin" / "tritonserver"),
        "wheel": _executable(tmp_path / "pytriton" / "tritonserver" / "bin" / "tritonserver"),
    }


def test_candidate_order_is_explicit_env_path_opt_wheel(installs, tmp_path):
    environ = {"TRITONSERVER_PATH": str(installs["env"]), "PATH": str(installs["path"].parent)}
    candidates = candidate_binaries(
        installs["explicit"], environ, opt_root=tmp_path / "opt", wheel_root=tmp_path / "pytriton"
    )
    assert [c.source for c in candidates] == [
        "runtime.tritonserver_path", "TRITONSERVER_PATH", "PATH", "/opt/tritonserver", "nvidia-pytriton",
    ]
    assert [c.path for c in candidates] == [installs[k] for k in ("explicit", "env", "path", "opt", "wheel")]


@pytest.mark.parametrize(
    "present, expected",
    [
        (("explicit", "env", "path", "opt", "wheel"), "runtime.tritonserver_path"),
        (("env", "path", "opt", "wheel"), "TRITONSERVER_PATH"),
        (("path", "opt", "wheel"), "PATH"),
        (("opt", "wheel"), "/opt/tritonserver"),
        (("wheel",), "nvidia-pytriton"),
    ],
)
def test_locator_takes_the_first_present(installs, tmp_path, present, expected):
    environ = {"PATH": str(installs["path"].parent) if "path" in present else "/nonexistent"}
    if "env" in present:
        environ["TRITONSERVER_PATH"] = str(installs["env"])
    if "opt" not in present:
        installs["opt"].unlink()
    found = locate_tritonserver(
        installs["explicit"] if "explicit" in present else None,
        environ,
        opt_root=tmp_path / "opt",
        wheel_root=tmp_path / "pytriton",
    )
    assert found.source == expected


def test_explicit_setting_that_is_not_executable_is_an_error(tmp_path):
    with pytest.raises(TritonInstallError, match=r"^model_metadata\.trt_llm\.runtime\.tritonserver_path points at .*/missing/tritonserver"):
        locate_tritonserver(tmp_path / "missing" / "tritonserver", {"PATH": ""}, wheel_root=None)
    with pytest.raises(TritonInstallError, match=r"^\$TRITONSERVER_PATH points at"):
        locate_tritonserver(None, {"TRITONSERVER_PATH": str(tmp_path / "nope"), "PATH": ""}, wheel_root=None)


def test_nothing_found_lists_where_it_looked(tmp_path):
    with pytest.raises(TritonInstallError) as error:
        locate_tritonserver(None, {"PATH": ""}, opt_root=tmp_path / "opt", wheel_root=tmp_path / "wheel")
    message = str(error.value)
    assert str(tmp_path / "opt" / "bin" / "tritonserver") in message and "nvidia-pytriton" in message


# ---------------------------------------------------------------------------- backend directory


def _fake_wheel(root: Path, versions: tuple[str, ...]) -> Path:
    wheel = root / "pytriton"
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        path = wheel / "tritonserver" / "backends" / "python" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
    for version in versions:
        _executable(wheel / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub")
    return wheel


def test_backend_directory_links_the_stub_of_the_running_python(tmp_path):
    current = f"{sys.version_info[0]}.{sys.version_info[1]}"
    wheel = _fake_wheel(tmp_path, ("3.9", current))
    backends = assemble_wheel_backends(wheel, tmp_path / "work" / "backends")
    python_dir = backends / "python"
    stub = python_dir / "triton_python_backend_stub"
    assert stub.resolve() == (wheel / "tritonserver" / "python_backend_stubs" / current / stub.name).resolve()
    assert (python_dir / "libtriton_python.so").is_file()
    assemble_wheel_backends(wheel, tmp_path / "work" / "backends")  # rebuilding over itself is fine


def test_missing_stub_for_this_python_names_the_available_ones(tmp_path):
    wheel = _fake_wheel(tmp_path, ("3.8", "3.9"))
    with pytest.raises(TritonInstallError, match=r"no python backend stub for Python 3\.99 \(it has: 3\.8, 3\.9\)"):
        assemble_wheel_backends(wheel, tmp_path / "backends", python_version=(3, 99))


def test_child_environment_puts_this_python_and_packages_first(tmp_path):
    installation = TritonInstallation(
        binary=tmp_path / "tritonserver", source="nvidia-pytriton", backend_dir=tmp_path,
        library_dirs=(tmp_path / "libs",),
    )
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/elsewhere", "LD_LIBRARY_PATH": "/opt/lib", "HOME": "/root"}
    env = child_environment(installation, base, python_executable="/venv/bin/python")
    assert env["PATH"].split(os.pathsep) == ["/venv/bin", "/usr/bin", "/bin"]
    assert env["PYTHONPATH"].split(os.pathsep) == [str(packages_dir()), "/elsewhere"]
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [str(tmp_path / "libs"), "/opt/lib"]
    assert env["HOME"] == "/root"
    assert (packages_dir() / "trtllm_truss" / "__init__.py").is_file()
    # Applying it twice does not grow the paths.
    again = child_environment(installation, env, python_executable="/venv/bin/python")
    assert again["PATH"] == env["PATH"] and again["PYTHONPATH"] == env["PYTHONPATH"]


@pytest.mark.parametrize("version", ["2.0.0", "2.1.3", "10.0"])
def test_numpy_2_or_later_is_refused_with_the_fix(version):
    with pytest.raises(TritonInstallError) as error:
        check_numpy_version(version, "/venv/bin/python3")
    message = str(error.value)
    assert f"numpy {version}" in message and "/venv/bin/python3" in message and "numpy<2" in message


@pytest.mark.parametrize("version", ["1.26.4", "1.24.0"])
def test_numpy_1_is_accepted(version):
    check_numpy_version(version, "/venv/bin/python3")


def test_unreadable_numpy_version_is_an_error():
    with pytest.raises(TritonInstallError, match="cannot read the numpy version"):
        check_numpy_version("dev", "/venv/bin/python3")


# ------------------------------------------------------------------------------------------ logs

ERROR_LINE = 'E1122 01:54:48.699407 17078 model_lifecycle.cc:642] "failed to load \'tensorrt_llm\' version 1: boom"'
GPU_NOISE = 'E1122 01:51:11.479672 12841 server.cc:241] "CudaDriverHelper has not been initialized."'


def test_log_levels_follow_tritons_severity_letters():
    assert log_level_of(ERROR_LINE) == logging.ERROR
    assert log_level_of('W1122 01:51:11.479454 12841 pinned_memory_manager.cc:170] "fallback"') == logging.WARNING
    assert log_level_of('I1122 01:51:13.092608 12841 model_lifecycle.cc:839] "loaded"') == logging.INFO
    assert log_level_of("error: creating server: Internal - failed to load all models") == logging.ERROR
    assert log_level_of("| Model | Version | Status |") == logging.INFO


def test_gpu_noise_is_quiet_only_on_a_host_without_gpus():
    assert log_level_of(GPU_NOISE, gpu_host=False) == logging.DEBUG
    assert log_level_of(GPU_NOISE, gpu_host=True) == logging.ERROR
    lines = [GPU_NOISE, "I1122 01:51:13.0 1 x.cc:1] ok", ERROR_LINE, "error: creating server: Internal"]
    assert triton_error_lines(lines, gpu_host=False) == [ERROR_LINE, "error: creating server: Internal"]


def test_a_stubs_crash_dump_is_forwarded_as_errors_and_the_lines_after_it_keep_their_level(caplog):
    """A real faulthandler dump (the stubs enable it: runtime/stub_watch.py) from a process that segfaults."""
    import subprocess

    from trtllm_truss.runtime.triton_logs import LogForwarder

    crash = "import faulthandler, os, signal; faulthandler.enable(file=2, all_threads=True); os.kill(os.getpid(), signal.SIGSEGV)"
    script = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {crash!r}]); print('I1122 01:51:13.0 1 x.cc:1] after', flush=True)"
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    forwarder = LogForwarder(process.stdout, "tritonserver", log=logging.getLogger("test.crash"))
    with caplog.at_level(logging.DEBUG, logger="test.crash"):
        forwarder.start()
        process.wait(timeout=60)
        forwarder.join(timeout=60)
    levels = {record.getMessage().removeprefix("[tritonserver] "): record.levelno for record in caplog.records}
    assert levels["Fatal Python error: Segmentation fault"] == logging.ERROR
    stack_lines = [line for line in levels if line.startswith(("Current thread 0x", '  File "<string>"'))]
    assert stack_lines and all(levels[line] == logging.ERROR for line in stack_lines)
    assert levels["I1122 01:51:13.0 1 x.cc:1] after"] == logging.INFO


def test_restart_backoff_doubles_up_to_the_cap():
    policy = RestartPolicy(initial_backoff_s=1.0, max_backoff_s=5.0)
    assert [policy.backoff_s(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_startup_error_context_drops_tritons_option_tables_but_keeps_failed_models():
    from trtllm_truss.runtime.triton_logs import _without_tables

    lines = [
        "+----------+-------+",
        "| Option   | Value |",
        "| server_id | triton |",
        "| tensorrt_llm | 1 | UNAVAILABLE: Internal: boom |",
        "",
        ERROR_LINE,
    ]
    assert _without_tables(lines) == ["| tensorrt_llm | 1 | UNAVAILABLE: Internal: boom |", ERROR_LINE]


def test_serve_fills_the_ports_not_given_with_distinct_free_ones():
    from trtllm_truss.commands.serve import requested_ports

    assert requested_ports(None, None, None) is None  # the supervisor chooses all three
    ports = requested_ports(None, 18001, None)
    assert ports.grpc == 18001
    assert len({ports.http, ports.grpc, ports.metrics}) == 3


def test_parent_death_signals_wrap_mpirun_and_every_rank():
    graceful = ["/usr/bin/setpriv", "--pdeathsig", "TERM", "--"]
    single = build_launch_command(_spec(1, setpriv="/usr/bin/setpriv"))
    assert single[:5] == [*graceful, "/opt/tritonserver/bin/tritonserver"]
    command = build_launch_command(_spec(2, setpriv="/usr/bin/setpriv"))
    assert command[:6] == ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--", "mpirun", "--allow-run-as-root"]
    # Open MPI ranks outlive a killed mpirun: each rank carries its own (graceful) parent-death signal.
    rank_starts = [i for i, arg in enumerate(command) if arg == "-n"]
    assert len(rank_starts) == 2
    for i in rank_starts:
        assert command[i + 2 : i + 7] == [*graceful, "/opt/tritonserver/bin/tritonserver"]
