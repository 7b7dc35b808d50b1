"""Write the Triton model repository for a `ServingPlan` to disk.

The repository is rendered into a scratch directory next to `out_dir` and moved into place, so a
crash never leaves a half-written repository for tritonserver to load.
"""

from __future__ import annotations

import ast
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_truss.guides.engines import TOKENIZER_INFO_FILE, write_xgrammar_tokenizer_info
from trtllm_truss.repository.models import (
    ENGINE,
    POSTPROCESSING,
    PREPROCESSING,
    WINDOW_RELAY,
    RepositoryError,
    repository_configs,
)
from trtllm_truss.repository.llmapi import write_model_yaml
from trtllm_truss.repository.pbtxt import to_pbtxt

if TYPE_CHECKING:
    from trtllm_truss.planning.plan import ServingPlan

PACKAGES_DIR = Path(__file__).resolve().parent.parent.parent  # holds trtllm_truss
TRITON_MODELS_DIR = PACKAGES_DIR / "trtllm_truss" / "triton_models"
# Present in every repository we render; lets a re-render replace our own output but never a
# directory the user pointed us at by mistake.
MARKER_FILE = ".trtllm_truss_repository"


def python_model_sources(plan: ServingPlan, engine_model_source: Path | None = None) -> dict[str, Path]:
    """Model name -> the model.py copied to <model>/1/model.py."""
    sources = {
        PREPROCESSING: TRITON_MODELS_DIR / "preprocessing" / "model.py",
        POSTPROCESSING: TRITON_MODELS_DIR / "postprocessing" / "model.py",
    }
    if plan.backend == "pytorch":
        sources[ENGINE] = engine_model_source or TRITON_MODELS_DIR / "tensorrt_llm_pytorch" / "model.py"
    elif plan.backend == "llmapi" and engine_model_source is None:
        sources[ENGINE] = TRITON_MODELS_DIR / "tensorrt_llm_llmapi" / "model.py"
    elif engine_model_source is not None:
        raise RepositoryError("engine_model_source: only a python engine (backend 'pytorch') can be replaced")
    return sources


def default_import_path(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Where the python models import from: our package's directory, then $PYTHONPATH's entries."""
    env = os.environ if environ is None else environ
    extra = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return tuple(dict.fromkeys([str(PACKAGES_DIR), *extra]))


def with_import_path(source: str, import_path: Sequence[str]) -> str:
    """`source` with `import_path` put at the front of sys.path before its first import.

    Triton's python backend stub embeds the interpreter but does not read PYTHONPATH: only the
    interpreter's own site-packages are visible. Without this, `import trtllm_truss` works only where
    the package happens to be pip-installed (a dev venv), never from truss's /packages.
    """
    if not import_path:
        return source
    body = ast.parse(source).body
    after = 0  # the line after the module docstring and `from __future__` imports
    for node in body:
        is_docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        if is_docstring or (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            after = node.end_lineno or after
        else:
            break
    lines = source.splitlines(keepends=True)
    header = (
        "import sys as _sys  # rendered by trtllm-truss: the python backend stub ignores PYTHONPATH\n"
        f"_sys.path[:0] = [_p for _p in {list(import_path)!r} if _p not in _sys.path]\n"
    )
    return "".join(lines[:after]) + header + "".join(lines[after:])


def _write(
    repo: Path,
    plan: ServingPlan,
    engine_model_source: Path | None,
    window_relay: bool | None,
    import_path: Sequence[str],
    final_repo: Path,
) -> None:
    tokenizer_info = None
    if plan.backend == "tensorrtllm" and plan.guided_decoding_off is None:
        # NVIDIA's C++ backend reads xgrammar's tokenizer info from a JSON file (guides.engines):
        # written beside the engine's config.pbtxt, named by its final path.
        write_xgrammar_tokenizer_info(plan.tokenizer_dir, repo / ENGINE / TOKENIZER_INFO_FILE)
        tokenizer_info = final_repo / ENGINE / TOKENIZER_INFO_FILE
    configs = repository_configs(plan, window_relay=window_relay, xgrammar_tokenizer_info=tokenizer_info)
    sources = python_model_sources(plan, engine_model_source)
    if WINDOW_RELAY in configs:
        sources[WINDOW_RELAY] = TRITON_MODELS_DIR / WINDOW_RELAY / "model.py"
    for name, source in sources.items():
        if not source.is_file():
            raise RepositoryError(f"{name}: python model source {source} is missing from the package")
    for name, config in configs.items():
        model_dir = repo / name
        version_dir = model_dir / "1"  # Triton needs a version directory, even for the ensemble
        version_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "config.pbtxt").write_text(to_pbtxt(config), encoding="utf-8")
        if name in sources:
            source = sources[name].read_text(encoding="utf-8")
            (version_dir / "model.py").write_text(with_import_path(source, import_path), encoding="utf-8")
    if plan.backend == "llmapi":  # our llmapi model reads its LLM() arguments from 1/model.yaml
        write_model_yaml(repo / ENGINE / "1", plan)
    (repo / MARKER_FILE).write_text(f"backend={plan.backend}\n", encoding="utf-8")


def render_repository(
    plan: ServingPlan,
    out_dir: Path,
    *,
    engine_model_source: Path | None = None,
    window_relay: bool | None = None,
    import_path: Sequence[str] | None = None,
) -> Path:
    """Render the repository into `out_dir` (replacing an earlier rendering there) and return it.

    `engine_model_source` replaces the stand-in's model.py for backend "pytorch" (another python
    engine with the same tensor interface, e.g. a test double). `window_relay`: see
    `repository_configs` (default: only for NVIDIA's engine). `import_path`: directories the python
    models import from (default: `default_import_path()`).
    """
    if import_path is None:
        import_path = default_import_path()
    out_dir = Path(out_dir).resolve()
    if out_dir.exists():
        if not out_dir.is_dir():
            raise RepositoryError(f"{out_dir}: exists and is not a directory")
        if any(out_dir.iterdir()) and not (out_dir / MARKER_FILE).is_file():
            raise RepositoryError(f"{out_dir}: not empty and not a repository rendered by trtllm-truss; refusing to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        _write(scratch, plan, engine_model_source, window_relay, import_path, out_dir)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{scratch.name}")
            out_dir.rename(old)
            scratch.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            scratch.rename(out_dir)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return out_dir
