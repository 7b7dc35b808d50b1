"""The layers of docs/design.md hold: import-linter's contracts (pyproject.toml [tool.importlinter]) pass on
the package, and fail on a copy of it with one import against the flow or one cycle. The package root
composes the stages only, and no module grows past 600 lines."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "packages" / "trtllm_truss"
LINT_IMPORTS = REPO_ROOT / ".venv-lint" / "bin" / "lint-imports"
MAX_MODULE_LINES = 600

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.is_file(), reason="no .venv-lint (scripts/bootstrap.sh installs it)")


def _lint(packages_dir: Path, config_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(packages_dir), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(config_dir / "pyproject.toml")],
        cwd=config_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy_with(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package whose `module` (a path under trtllm_truss/) gains `line` at the end."""
    packages = tmp_path / "packages"
    shutil.copytree(PACKAGE, packages / "trtllm_truss", ignore=shutil.ignore_patterns("__pycache__"))
    target = packages / "trtllm_truss" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return packages


def test_the_package_keeps_every_contract():
    result = _lint(REPO_ROOT / "packages", REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # the stand-in runs inside Triton: it must never reach the serving side
        ("engine_standin/words.py", "import trtllm_truss.serving.core", "never imports the serving side"),
        # a lower stage importing a higher one
        ("planning/plan.py", "from trtllm_truss.repository import models", "a stage imports only the stages below"),
        # one dialect leaning on another
        ("serving/chat.py", "from trtllm_truss.serving import completions", "dialects never import one another"),
        # a cycle inside one stage (config.speculative builds on config.fields)
        ("config/fields.py", "import trtllm_truss.config.speculative", "No import cycles"),
    ],
)
def test_a_wrong_import_breaks_its_contract(tmp_path, module, line, contract):
    result = _lint(_copy_with(tmp_path, module, line), tmp_path)
    assert result.returncode != 0, result.stdout
    broken = [row for row in result.stdout.splitlines() if row.endswith("BROKEN")]
    assert any(contract in row for row in broken), result.stdout


def test_the_root_composes_the_stages_only():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "cli.py"]


def test_no_module_is_over_600_lines():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
