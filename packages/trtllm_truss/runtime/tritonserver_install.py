"""Where `tritonserver` lives and what its process needs around it.

Two installations are supported:
- NVIDIA's `tritonserver:<yy.mm>-trtllm-python-py3` image: `/opt/tritonserver/bin/tritonserver` with its
  own `backends/` (python + tensorrtllm), used as it is.
- the `nvidia-pytriton` wheel (CPU machines, tests): the wheel ships the binary, the python backend and
  one python-backend stub per Python version, but no ready backend directory. We assemble one (symlinks,
  no copies) holding the stub that matches the running interpreter.

The python backend's stub embeds the first `python3` on PATH (its prefix, hence its site-packages), so the
child environment puts the running interpreter's directory first on PATH and `packages/` on PYTHONPATH;
model code imports `trtllm_truss`. That environment must have numpy < 2: Triton 2.51's stub crashes on the
first BYTES tensor with numpy 2.x (see shared/reference/triton-on-cpu.md), so we check it up front.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TRITONSERVER_PATH_ENV = "TRITONSERVER_PATH"
OPT_TRITONSERVER = Path("/opt/tritonserver")

# Which locator found the binary; shown in logs and errors so users know which server they run.
BinarySource = Literal["runtime.tritonserver_path", "TRITONSERVER_PATH", "PATH", "/opt/tritonserver", "nvidia-pytriton"]

_SETTING_NAMES = {
    "runtime.tritonserver_path": "model_metadata.trt_llm.runtime.tritonserver_path",
    "TRITONSERVER_PATH": "$TRITONSERVER_PATH",
}

# The python backend's files in the wheel, linked into the assembled backend directory.
_PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
_STUB_NAME = "triton_python_backend_stub"


class TritonInstallError(RuntimeError):
    """tritonserver or its python backend cannot be used here; the message says what to change."""


@dataclass(frozen=True)
class BinaryCandidate:
    source: BinarySource
    path: Path


@dataclass(frozen=True)
class TritonInstallation:
    """A located tritonserver plus what its process needs: backend directory and library path."""

    binary: Path
    source: BinarySource
    backend_dir: Path
    # Prepended to LD_LIBRARY_PATH of the child (the wheel's bundled libraries, the interpreter's libpython).
    library_dirs: tuple[Path, ...] = ()

    @property
    def from_wheel(self) -> bool:
        return self.source == "nvidia-pytriton"


# --------------------------------------------------------------------------------------------- locate


def pytriton_root() -> Path | None:
    """`site-packages/pytriton` of the nvidia-pytriton wheel, found without importing pytriton."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def candidate_binaries(
    explicit: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    opt_root: Path = OPT_TRITONSERVER,
    wheel_root: Path | None = None,
) -> list[BinaryCandidate]:
    """Every place a tritonserver may be, in the order they are tried.

    Order: the explicit setting (runtime.tritonserver_path), $TRITONSERVER_PATH, PATH, /opt/tritonserver,
    the nvidia-pytriton wheel. Pure: nothing here checks that the files exist.
    """
    env = os.environ if environ is None else environ
    candidates: list[BinaryCandidate] = []
    if explicit:
        candidates.append(BinaryCandidate("runtime.tritonserver_path", Path(explicit)))
    if env.get(TRITONSERVER_PATH_ENV):
        candidates.append(BinaryCandidate("TRITONSERVER_PATH", Path(env[TRITONSERVER_PATH_ENV])))
    on_path = shutil.which("tritonserver", path=env.get("PATH", ""))
    if on_path:
        candidates.append(BinaryCandidate("PATH", Path(on_path)))
    candidates.append(BinaryCandidate("/opt/tritonserver", opt_root / "bin" / "tritonserver"))
    if wheel_root is not None:
        candidates.append(BinaryCandidate("nvidia-pytriton", wheel_root / "tritonserver" / "bin" / "tritonserver"))
    return candidates


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def locate_tritonserver(
    explicit: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    opt_root: Path = OPT_TRITONSERVER,
    wheel_root: Path | None | Literal["auto"] = "auto",
) -> BinaryCandidate:
    """The first usable tritonserver in `candidate_binaries` order.

    An explicit setting (config or $TRITONSERVER_PATH) that does not point at an executable is an error,
    not something to silently skip: the user asked for that binary.
    """
    root = pytriton_root() if wheel_root == "auto" else wheel_root
    candidates = candidate_binaries(explicit, environ, opt_root=opt_root, wheel_root=root)
    for candidate in candidates:
        if _is_executable(candidate.path):
            return candidate
        if candidate.source in ("runtime.tritonserver_path", "TRITONSERVER_PATH"):
            setting = _SETTING_NAMES[candidate.source]
            raise TritonInstallError(
                f"{setting} points at {candidate.path}, which is not an executable tritonserver; "
                "fix the path or unset it to use the one found automatically"
            )
    tried = ", ".join(str(c.path) for c in candidates)
    raise TritonInstallError(
        f"tritonserver not found (tried: {tried}). Install the nvidia-pytriton wheel "
        "(`pip install nvidia-pytriton==0.7.0`), run in NVIDIA's tritonserver image, or set "
        f"model_metadata.trt_llm.runtime.tritonserver_path / ${TRITONSERVER_PATH_ENV}"
    )


# ------------------------------------------------------------------------------------ backend directory


def _wheel_root_of(binary: Path) -> Path | None:
    """The `pytriton` package directory if `binary` is the wheel's tritonserver, else None."""
    resolved = binary.resolve()
    if resolved.parent.name == "bin" and resolved.parent.parent.name == "tritonserver":
        root = resolved.parent.parent.parent
        if (root / "tritonserver" / "python_backend_stubs").is_dir():
            return root
    return None


def _libpython_dir() -> Path | None:
    """Directory of the running interpreter's shared libpython, so the stub links the same Python."""
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and (Path(libdir) / soname).exists():
        return Path(libdir)
    return None


def assemble_wheel_backends(wheel_root: Path, dest: Path, python_version: tuple[int, int] | None = None) -> Path:
    """Build `dest/python/` from the wheel: the python backend plus the stub for `python_version`.

    Symlinks, not copies: the directory costs nothing and is rebuilt on every start.
    """
    major, minor = python_version or sys.version_info[:2]
    stubs = wheel_root / "tritonserver" / "python_backend_stubs"
    stub = stubs / f"{major}.{minor}" / _STUB_NAME
    if not stub.is_file():
        available = sorted(p.name for p in stubs.iterdir() if (p / _STUB_NAME).is_file()) if stubs.is_dir() else []
        raise TritonInstallError(
            f"nvidia-pytriton has no python backend stub for Python {major}.{minor} "
            f"(it has: {', '.join(available) or 'none'}); run with one of those Python versions"
        )
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    sources = {name: wheel_root / "tritonserver" / "backends" / "python" / name for name in _PYTHON_BACKEND_FILES}
    sources[_STUB_NAME] = stub
    for name, source in sources.items():
        if not source.exists():
            raise TritonInstallError(f"nvidia-pytriton installation is incomplete: {source} is missing")
        link = python_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source)
    return dest


def prepare_installation(binary: BinaryCandidate, work_dir: Path) -> TritonInstallation:
    """Backend directory and library path for `binary`.

    The wheel's binary gets an assembled backend directory under `work_dir`; any other binary uses the
    `backends/` next to its `bin/` (in NVIDIA's image that holds python and tensorrtllm).
    """
    wheel_root = _wheel_root_of(binary.path)
    libpython = _libpython_dir()
    if wheel_root is not None:
        backend_dir = assemble_wheel_backends(wheel_root, work_dir / "backends")
        # Copies of the backend lose the stub's $ORIGIN rpath: point the loader at the wheel's libraries.
        library_dirs = tuple(d for d in (wheel_root.parent / "nvidia_pytriton.libs", libpython) if d is not None)
        return TritonInstallation(binary.path, binary.source, backend_dir, library_dirs)
    backend_dir = binary.path.resolve().parent.parent / "backends"
    if not backend_dir.is_dir():
        raise TritonInstallError(
            f"tritonserver at {binary.path} (from {binary.source}) has no backends directory at {backend_dir}"
        )
    return TritonInstallation(binary.path, binary.source, backend_dir, ())


# ---------------------------------------------------------------------------------------- environment


def packages_dir() -> Path:
    """The directory containing the `trtllm_truss` package (put on the stub's PYTHONPATH)."""
    return Path(__file__).resolve().parents[2]


def _prepend(path_list: str | None, *entries: str) -> str:
    existing = [p for p in (path_list or "").split(os.pathsep) if p]
    front = [e for e in entries if e]
    return os.pathsep.join(front + [p for p in existing if p not in front])


def child_environment(
    installation: TritonInstallation,
    base: Mapping[str, str] | None = None,
    *,
    python_executable: str = sys.executable,
) -> dict[str, str]:
    """Environment of tritonserver (and so of the python backend stubs it forks)."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = _prepend(env.get("PATH"), str(Path(python_executable).parent))
    env["PYTHONPATH"] = _prepend(env.get("PYTHONPATH"), str(packages_dir()))
    if installation.library_dirs:
        env["LD_LIBRARY_PATH"] = _prepend(env.get("LD_LIBRARY_PATH"), *map(str, installation.library_dirs))
    return env


def parse_numpy_major(version: str) -> int:
    head = version.strip().split(".", 1)[0]
    if not head.isdigit():
        raise TritonInstallError(f"cannot read the numpy version {version!r} of the python backend's environment")
    return int(head)


def check_numpy_version(version: str, python3: str) -> None:
    """Raise the clear error for numpy >= 2 in the python backend's environment."""
    if parse_numpy_major(version) >= 2:
        raise TritonInstallError(
            f"numpy {version} is installed for {python3}, the Python that tritonserver's python backend "
            "will embed; Triton 2.51's python backend stub crashes with numpy >= 2 on the first string "
            "tensor. Install numpy<2 there (e.g. `pip install 'numpy==1.26.4'`)"
        )


@dataclass(frozen=True)
class StubPython:
    """The python3 the python backend stub will embed, as seen in the child's environment."""

    python3: str
    version: str  # "3.11"
    numpy_version: str


def probe_stub_python(env: Mapping[str, str], timeout_s: float = 60.0) -> StubPython:
    """Run the first python3 on the child's PATH with the child's environment: its version and numpy's.

    Without PYTHONPATH: the stub embeds that interpreter but does not read PYTHONPATH, so the numpy it
    gets is the one in the interpreter's own site-packages (a numpy < 2 on PYTHONPATH does not help).
    """
    python3 = shutil.which("python3", path=env.get("PATH", ""))
    if python3 is None:
        raise TritonInstallError("no python3 on the PATH given to tritonserver; its python backend needs one")
    code = "import sys, numpy; print('%d.%d' % sys.version_info[:2], numpy.__version__)"
    try:
        stub_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        result = subprocess.run([python3, "-c", code], env=stub_env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise TritonInstallError(f"checking numpy with {python3} took longer than {timeout_s:.0f}s") from exc
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise TritonInstallError(f"numpy cannot be imported by {python3} (the python backend's Python): {last}")
    version, numpy_version = result.stdout.split()
    return StubPython(python3=python3, version=version, numpy_version=numpy_version)


def verify_stub_environment(env: Mapping[str, str], installation: TritonInstallation | None = None) -> StubPython:
    """numpy < 2 for the stub's Python, and (for the wheel) the stub built for that Python's version."""
    stub_python = probe_stub_python(env)
    check_numpy_version(stub_python.numpy_version, stub_python.python3)
    expected = "{}.{}".format(*sys.version_info[:2])
    if installation is not None and installation.from_wheel and stub_python.version != expected:
        raise TritonInstallError(
            f"the first python3 on tritonserver's PATH is {stub_python.python3} (Python {stub_python.version}), "
            f"but the python backend stub was chosen for this interpreter's Python {expected}; "
            "run trtllm-truss from a virtual environment (its bin/ has python3) or put a matching python3 first on PATH"
        )
    return stub_python
