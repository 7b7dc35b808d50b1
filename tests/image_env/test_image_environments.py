"""The environment of each NVIDIA image our docs name (tests/data/images/*.json).

* layout (fast, every run): the supervisor, given a file tree laid out as the image lays it out (fake
  executables at the recorded paths), finds the image's tritonserver and its backends directory.
* environment (`image_env`, slow, once per `make test`): a venv of the image's Python with the
  installable part of its TensorRT-LLM's requirement pins, then the example's `requirements:` resolve
  without changing a package the image already has; our package (from packages/, as truss puts it on
  sys.path) imports there, plans the build for the image's TensorRT-LLM version and renders the
  repository. The venv is cached in .venv-images/ (rebuilt when the data or the example changes).

What this does not prove: TensorRT-LLM, TensorRT, CUDA torch and nvidia-* are not installed (they do
not install here), so neither their own pins nor the image's real site-packages are checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from trtllm_truss.tritonserver_install import OPT_TRITONSERVER, locate_tritonserver, prepare_installation

ROOT = Path(__file__).resolve().parents[2]
IMAGES = sorted((ROOT / "tests" / "data" / "images").glob("*.json"))
IDS = [p.stem for p in IMAGES]
CACHE = ROOT / ".venv-images"
# The example whose requirements and build each image environment is checked with.
EXAMPLE = ROOT / "examples" / "llama3-8b-fp8-h100"
PLAN_SCRIPT = Path(__file__).with_name("plan_in_image_env.py")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _interpreter(minor: str) -> str | None:
    """The machine's Python `minor` (pyenv's, as bootstrap uses, else pythonX.Y on PATH)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for candidate in sorted(root.glob(f"versions/{minor}.*"), reverse=True):
        if (candidate / "bin" / f"python{minor}").is_file():
            return str(candidate / "bin" / f"python{minor}")
    return shutil.which(f"python{minor}")


def test_every_image_is_described_with_its_sources():
    assert {_load(p)["python"] for p in IMAGES} >= {"3.10", "3.12"}, "one 24.x (3.10) and one 25.x (3.12) image"
    for path in IMAGES:
        data = _load(path)
        assert data["image"].startswith("nvcr.io/nvidia/tritonserver:")
        assert data["image"].rsplit("/", 1)[1].replace(":", "-") == path.stem
        assert data["trtllm_version_source"] and data["python_source"] and data["layout_source"]
        assert data["trtllm_requirements"] is not None or data["trtllm_requirements_note"]


def test_examples_name_an_image_that_is_described():
    described = {_load(p)["image"] for p in IMAGES}
    for config in sorted((ROOT / "examples").glob("*/config.yaml")):
        image = (yaml.safe_load(config.read_text()).get("base_image") or {}).get("image")
        assert image is None or image in described, f"{config}: {image} has no tests/data/images entry"


@pytest.mark.parametrize("image", IMAGES, ids=IDS)
def test_supervisor_finds_the_images_tritonserver_and_backends(tmp_path: Path, image: Path):
    data = _load(image)
    # the recorded paths are the ones the locator knows: /opt/tritonserver/{bin/tritonserver,backends}
    assert Path(data["tritonserver"]) == OPT_TRITONSERVER / "bin" / "tritonserver"
    fake_root = tmp_path / "image"
    binary = fake_root / data["tritonserver"].lstrip("/")
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    for backend in data["backends"]:
        (fake_root / data["backends_dir"].lstrip("/") / backend).mkdir(parents=True)
    opt_root = fake_root / str(OPT_TRITONSERVER).lstrip("/")

    found = locate_tritonserver(None, {"PATH": ""}, opt_root=opt_root, wheel_root=None)
    assert (found.source, found.path) == ("/opt/tritonserver", binary)
    installation = prepare_installation(found, tmp_path / "work")
    assert not installation.from_wheel
    assert installation.backend_dir == fake_root / data["backends_dir"].lstrip("/")
    assert sorted(p.name for p in installation.backend_dir.iterdir()) == sorted(data["backends"])


def _pip(python: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", "pip", *args, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _image_venv(data: dict, interpreter: str, example_requirements: list[str]) -> tuple[Path, dict[str, str], list]:
    """Cached venv with the image's installable TensorRT-LLM pins, then the example's requirements.

    Returns its python, the image's packages (name -> version) and what pip's resolver said installing
    the example's requirements over them would install (its --dry-run --report "install" list)."""
    slug = data["image"].rsplit(":", 1)[1]
    venv = CACHE / slug
    stamp = hashlib.sha256(json.dumps([data, example_requirements], sort_keys=True).encode()).hexdigest()[:16]
    python = venv / "bin" / "python"
    record = venv / "image-resolution.json"
    if (venv / ".stamp").is_file() and (venv / ".stamp").read_text() == stamp and record.is_file():
        saved = json.loads(record.read_text())
        return python, saved["image_pins"], saved["would_install"]
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, timeout=300)
    # wheels only: nothing is compiled, and nothing pulls CUDA torch (left out of the data)
    result = _pip(python, "install", "-q", "--only-binary=:all:", *data["trtllm_requirements"])
    assert result.returncode == 0, f"the image's pins do not install on Python {data['python']}:\n{result.stderr[-3000:]}"
    image_pins = {_canonical(p["name"]): p["version"] for p in json.loads(_pip(python, "list", "--format=json").stdout)}
    report_path = venv / "example-report.json"
    result = _pip(python, "install", "--dry-run", "--only-binary=:all:", "--report", str(report_path), *example_requirements)
    assert result.returncode == 0, result.stderr[-3000:]
    would_install = [
        (_canonical(i["metadata"]["name"]), i["metadata"]["version"]) for i in json.loads(report_path.read_text())["install"]
    ]
    result = _pip(python, "install", "-q", "--only-binary=:all:", *example_requirements)
    assert result.returncode == 0, result.stderr[-3000:]
    record.write_text(json.dumps({"image_pins": image_pins, "would_install": would_install}, indent=1))
    (venv / ".stamp").write_text(stamp)
    return python, image_pins, would_install


@pytest.mark.image_env
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("image", IMAGES, ids=IDS)
def test_image_environment_resolves_imports_plans_and_renders(image: Path, tmp_path: Path):
    data = _load(image)
    if data["trtllm_requirements"] is None:
        pytest.skip(data["trtllm_requirements_note"])
    interpreter = _interpreter(data["python"])
    if interpreter is None:
        pytest.skip(f"no Python {data['python']} on this machine (pyenv or python{data['python']})")
    example_requirements = yaml.safe_load((EXAMPLE / "config.yaml").read_text())["requirements"]
    python, image_pins, would_install = _image_venv(data, interpreter, example_requirements)

    # The packages TensorRT-LLM pins must stay as the image has them. Other installed packages are
    # whatever pip picked today for the unpinned ranges (not the image's real versions): reported only.
    pinned = {_canonical(Requirement(r).name) for r in data["trtllm_requirements"]}
    changed = {name: (image_pins[name], version) for name, version in would_install if image_pins.get(name, version) != version}
    pinned_changed = {name: versions for name, versions in changed.items() if name in pinned}
    assert not pinned_changed, f"the example's requirements would change TensorRT-LLM's pins (image, ours): {pinned_changed}"
    print(f"{data['image']}: unpinned packages the example's requirements would move (image, ours): {changed}")
    assert {name for name, _ in would_install} >= {"tritonclient", "boto3"}  # the resolver did run

    env = {**os.environ, "PYTHONPATH": str(ROOT / "packages")}
    run = subprocess.run(
        [str(python), str(PLAN_SCRIPT), str(EXAMPLE), data["trtllm_version"]],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    outcome = json.loads(run.stdout.strip().splitlines()[-1])
    assert outcome["python"] == data["python"]
    assert outcome["backend"] == "tensorrtllm" and outcome["build_trtllm_version"] == data["trtllm_version"]
    assert {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing"} <= set(outcome["models"])
    assert outcome["build_steps"] >= 2  # convert_checkpoint (or quantize), then trtllm-build
    print(f"{data['image']}: {outcome}")
