"""The environment of each NVIDIA image our docs name (tests/data/images/*.json).

* layout (fast, every run): given a file tree laid out as the image lays it out (fake executables and
  scripts at the recorded paths), the supervisor finds the image's tritonserver and its backends
  directory, and the engine builder finds TensorRT-LLM's examples where the image keeps them (or, for
  images without them, none, and says which setting to use).
* environment (`image_env`, slow, once per `make test`): a venv of the image's Python with the
  installable part of what the image pins (TensorRT-LLM's requirements where they could be read,
  the pins NVIDIA's image build applies, the backend's requirements where TensorRT-LLM's are unread),
  then the example's `requirements:` resolve without changing a version the image pins; `pip check`
  finds no broken requirement but the ones recorded (with why) in the image's data; our package (from
  packages/, as truss puts it on sys.path) imports there, plans the build for the image's TensorRT-LLM
  version and renders the repository. The venv is cached in .venv-images/ (rebuilt when what it
  installs changes).

What this does not prove: TensorRT-LLM, TensorRT, CUDA torch and nvidia-* are not installed (they do
not install here), so neither their own pins nor the image's real site-packages are checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from trtllm_truss.artifacts.build_recipes import TrtllmVersion, convert_script_relpath
from trtllm_truss.artifacts.engine_builder import EXAMPLES_DIR_CANDIDATES, EXAMPLES_DIR_ENV, find_examples_dir
from trtllm_truss.config.enums import Architecture
from trtllm_truss.runtime.tritonserver_install import OPT_TRITONSERVER, locate_tritonserver, prepare_installation

ROOT = Path(__file__).resolve().parents[2]
IMAGES = sorted((ROOT / "tests" / "data" / "images").glob("*.json"))
IDS = [p.stem for p in IMAGES]
# The images whose Python environment is rebuilt from PyPI (minutes each on two cores): the legacy
# C++-engine examples' image and the first and last TensorRT-LLM 1.x lines. The other records are
# checked by the fast tests above (sources, examples, tritonserver and examples paths).
ENV_IMAGES = [p for p in IMAGES if p.stem.split("-")[1] in ("24.12", "25.10", "26.07")]
CACHE = ROOT / ".venv-images"
# The example whose requirements and plan each image environment is checked with: a C++-engine build on
# TensorRT-LLM 0.x images, the default LLM-API example on 1.x images.
ENGINE_EXAMPLE = ROOT / "examples" / "legacy-llama3-8b-fp8-engine-h100"
LLMAPI_EXAMPLE = ROOT / "examples" / "llama3.1-8b-fp8-h100"
PLAN_SCRIPT = Path(__file__).with_name("plan_in_image_env.py")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _example_for(data: dict) -> Path:
    return LLMAPI_EXAMPLE if TrtllmVersion.parse(data["trtllm_version"]).major >= 1 else ENGINE_EXAMPLE


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _interpreter(minor: str) -> str | None:
    """The machine's Python `minor` (pyenv's, as bootstrap uses, else pythonX.Y on PATH)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for candidate in sorted(root.glob(f"versions/{minor}.*"), reverse=True):
        if (candidate / "bin" / f"python{minor}").is_file():
            return str(candidate / "bin" / f"python{minor}")
    return shutil.which(f"python{minor}")


def _image_requirements(data: dict) -> list[str]:
    """What the environment test installs as the image's: TensorRT-LLM's pins (where read), the pins
    NVIDIA's image build applies, and the backend's requirements (a stand-in where TensorRT-LLM's are unread)."""
    return [
        *(data["trtllm_requirements"] or []),
        *(pin["requirement"] for pin in data["image_pins"]),
        *data["backend_requirements"],
    ]


def test_every_image_is_described_with_its_sources():
    tags = {(_load(p)["python"], _load(p)["image"].rsplit(":", 1)[1][:3]) for p in IMAGES}
    assert {("3.10", "24."), ("3.12", "25."), ("3.12", "26.")} <= tags, "24.x on Python 3.10, 25.x and 26.x on 3.12"
    for path in IMAGES:
        data = _load(path)
        assert data["image"].startswith("nvcr.io/nvidia/tritonserver:")
        assert data["image"].rsplit("/", 1)[1].replace(":", "-") == path.stem
        assert data["trtllm_version_source"] and data["python_source"] and data["layout_source"]
        assert data["trtllm_requirements"] is not None or data["trtllm_requirements_note"]
        assert data["backend_requirements_source"] and data["trtllm_examples_source"]
        assert all(pin["requirement"] and pin["source"] for pin in data["image_pins"])
        assert _image_requirements(data), f"{path.name}: nothing to resolve the example against"
        for conflict in data.get("known_conflicts", []):
            assert conflict["package"] and conflict["requirement"] and conflict["why"]
        for extra in data.get("extra_requirements", []):
            assert extra["name"] and extra["why"]
        if TrtllmVersion.parse(data["trtllm_version"]).major >= 1:  # the LLM-API images: where their Python is
            assert data["python_executable"] and data["python_executable_source"]


def test_examples_name_a_2026_image_or_are_marked_legacy_with_why():
    users: dict[str, list[str]] = {}
    for config in sorted((ROOT / "examples").glob("*/config.yaml")):
        text = config.read_text()
        base = yaml.safe_load(text)["base_image"]
        tag = base["image"].rsplit(":", 1)[1]
        users.setdefault(base["image"], []).append(str(config.parent.relative_to(ROOT)))
        if config.parent.name.startswith("legacy-"):
            assert text.startswith("# LEGACY (TensorRT-LLM 0.x C++ engine") and "Why it is kept" in text, config
            continue
        assert tag.startswith("26."), f"{config}: {base['image']} is not a 2026 image and the example is not marked legacy"
        recorded = next(_load(p) for p in IMAGES if _load(p)["image"] == base["image"])
        # the interpreter that sees the image's TensorRT-LLM (a venv from 26.03 on)
        assert base["python_executable_path"] == recorded["python_executable"], config
    for path in IMAGES:  # each record lists the examples that name it
        assert sorted(_load(path)["used_by"]) == sorted(users.get(_load(path)["image"], [])), path.name


def test_examples_name_an_image_that_is_described():
    described = {_load(p)["image"] for p in IMAGES}
    # images known by their TensorRT-LLM version only (environment not recorded): examples needing a newer release
    described |= set(json.loads((ROOT / "tests" / "data" / "image_versions.json").read_text())["images"])
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


@pytest.mark.parametrize("image", IMAGES, ids=IDS)
def test_engine_builder_finds_the_examples_where_the_image_keeps_them(tmp_path: Path, image: Path):
    data = _load(image)
    fake_root = tmp_path / "image"
    (fake_root / data["backends_dir"].lstrip("/")).mkdir(parents=True)  # every image has /opt/tritonserver
    version = TrtllmVersion.parse(data["trtllm_version"])
    if data["trtllm_examples_dir"] is None:
        # 24.x images ship no examples: nothing is found, so a build from a checkpoint asks for the setting
        assert find_examples_dir({}, root=fake_root) is None
        assert find_examples_dir({EXAMPLES_DIR_ENV: "/src/TensorRT-LLM/examples"}, root=fake_root) == Path(
            "/src/TensorRT-LLM/examples"
        )
        return
    assert Path(data["trtllm_examples_dir"]) in EXAMPLES_DIR_CANDIDATES
    examples = fake_root / data["trtllm_examples_dir"].lstrip("/")
    script = examples / convert_script_relpath(Architecture.LLAMA, version)  # the release's own layout
    script.parent.mkdir(parents=True)
    script.write_text("# stands for NVIDIA's convert_checkpoint.py\n")
    (examples / "quantization").mkdir()
    (examples / "quantization" / "quantize.py").write_text("# stands for NVIDIA's quantize.py\n")
    # a decoy at the other candidate must not win over the image's own directory
    for other in EXAMPLES_DIR_CANDIDATES:
        if other != Path(data["trtllm_examples_dir"]):
            (fake_root / str(other).lstrip("/")).mkdir(parents=True, exist_ok=True)
    found = find_examples_dir({}, root=fake_root)
    assert found == examples
    expected = "llama/convert_checkpoint.py" if version.major == 0 else "models/core/llama/convert_checkpoint.py"
    assert convert_script_relpath(Architecture.LLAMA, version, found) == expected
    assert (found / convert_script_relpath(Architecture.LLAMA, version, found)).is_file()


def _pip(python: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", "pip", *args, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _broken_requirements(pip_check_output: str) -> list[list[str]]:
    """`pip check` lines -> [package, requirement] pairs:
    "pkg 1.0 has requirement dep<2, but you have dep 2.1." and "pkg 1.0 requires dep, which is not installed."."""
    pairs = []
    for line in pip_check_output.splitlines():
        match = re.match(r"^(\S+) \S+ (?:has requirement|requires) ([A-Za-z0-9_.\-\[\]]+)", line)
        if match:
            pairs.append([_canonical(match[1]), _canonical(Requirement(match[2]).name)])
    return pairs


def _lock_pins(python: str) -> dict[str, str]:
    """requirements/lock.txt (3.11) or lock-py3.X.txt: name -> exact version."""
    lock = ROOT / "requirements" / ("lock.txt" if python == "3.11" else f"lock-py{python}.txt")
    pins = {}
    for line in lock.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;#]+)", line.strip())
        if match:
            pins[_canonical(match[1])] = match[2]
    return pins


def _requirements_for_python(requirements: list[str], python: str) -> list[str]:
    """The example's `requirements:` as a truss for this image's Python writes them: each exact pin at
    the version of our lock for that Python (the pins of tests/unit/test_config_shipped.py's check)."""
    pins = _lock_pins(python)
    repinned = []
    for requirement in requirements:
        parsed = Requirement(requirement)
        extras = f"[{','.join(sorted(parsed.extras))}]" if parsed.extras else ""
        repinned.append(f"{parsed.name}{extras}=={pins[_canonical(parsed.name)]}")
    return repinned


def _image_venv(data: dict, interpreter: str, example_requirements: list[str]) -> tuple[Path, dict[str, str], list, list]:
    """Cached venv with the image's installable pins, then the example's requirements.

    Returns its python, the image's packages (name -> version), what pip's resolver said installing
    the example's requirements over them would install (its --dry-run --report "install" list) and
    `pip check`'s complaints once both are installed."""
    # keyed by what is installed (not by the data's prose): images whose pins agree (26.03 and 26.07) share one venv
    inputs = [data["python"], _image_requirements(data), example_requirements]
    stamp = hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]
    venv = CACHE / f"py{data['python']}-{stamp}"
    python = venv / "bin" / "python"
    record = venv / "image-resolution.json"
    if (venv / ".stamp").is_file() and (venv / ".stamp").read_text() == stamp and record.is_file():
        saved = json.loads(record.read_text())
        return python, saved["image_pins"], saved["would_install"], saved["pip_check"]
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, timeout=300)
    # wheels only: nothing is compiled, and nothing pulls CUDA torch (left out of the data)
    result = _pip(python, "install", "-q", "--only-binary=:all:", *_image_requirements(data))
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
    pip_check = _broken_requirements(_pip(python, "check").stdout)
    record.write_text(json.dumps({"image_pins": image_pins, "would_install": would_install, "pip_check": pip_check}, indent=1))
    (venv / ".stamp").write_text(stamp)
    return python, image_pins, would_install, pip_check


@pytest.mark.image_env
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("image", ENV_IMAGES, ids=[p.stem for p in ENV_IMAGES])
def test_image_environment_resolves_imports_plans_and_renders(image: Path, tmp_path: Path):
    data = _load(image)
    interpreter = _interpreter(data["python"])
    if interpreter is None:
        pytest.skip(f"no Python {data['python']} on this machine (pyenv or python{data['python']})")
    # the example's requirements, plus what a truss on this image must add (recorded with why)
    example = _example_for(data)
    example_requirements = _requirements_for_python(
        yaml.safe_load((example / "config.yaml").read_text())["requirements"]
        + [extra["name"] for extra in data.get("extra_requirements", [])],
        data["python"],
    )
    python, image_pins, would_install, pip_check = _image_venv(data, interpreter, example_requirements)

    # A package the image pins to a version (or range) must stay at the version installed for it.
    # Other installed packages are whatever pip picked today for unversioned names (not the image's
    # real versions): their moves are reported only.
    pinned = {_canonical(Requirement(r).name) for r in _image_requirements(data) if Requirement(r).specifier}
    changed = {name: (image_pins[name], version) for name, version in would_install if image_pins.get(name, version) != version}
    pinned_changed = {name: versions for name, versions in changed.items() if name in pinned}
    assert not pinned_changed, f"the example's requirements would change the image's pins (image, ours): {pinned_changed}"
    print(f"{data['image']}: packages the example's requirements would move (image, ours): {changed}")
    # Requirements broken once both are installed: only the recorded ones (each says why it is accepted).
    known = {(_canonical(c["package"]), _canonical(c["requirement"])) for c in data.get("known_conflicts", [])}
    assert {tuple(pair) for pair in pip_check} <= known, f"pip check: {pip_check}; recorded: {sorted(known)}"
    assert {tuple(pair) for pair in pip_check} == known, f"a recorded conflict no longer happens: {sorted(known)}"
    assert {name for name, _ in would_install} >= {"tritonclient", "boto3"}  # the resolver did run

    env = {**os.environ, "PYTHONPATH": str(ROOT / "packages")}
    run = subprocess.run(
        [str(python), str(PLAN_SCRIPT), str(example), data["trtllm_version"]],
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
    if example == LLMAPI_EXAMPLE:  # planned for the example's own image (26.07), in this image's environment
        assert outcome["backend"] == "llmapi" and "TensorRT-LLM 1." in outcome["planned_for"]
        # our llmapi model's model.yaml holds LLM() arguments only (Triton's settings are in its config.pbtxt)
        assert {"model", "backend", "kv_cache_config"} <= set(outcome["model_yaml_keys"])
        assert "triton_config" not in outcome["model_yaml_keys"]
    else:
        assert outcome["backend"] == "tensorrtllm" and outcome["build_trtllm_version"] == data["trtllm_version"]
        assert {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing"} <= set(outcome["models"])
        assert outcome["build_steps"] >= 2  # convert_checkpoint (or quantize), then trtllm-build
    print(f"{data['image']}: {outcome}")
