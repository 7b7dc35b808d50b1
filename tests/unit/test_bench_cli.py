"""`trtllm-truss bench` argument handling that needs no server."""

from __future__ import annotations

import pytest

from trtllm_truss.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--concurrency", "1,x"], "--concurrency: expected comma-separated positive integers"),
        (["--request-rate", "0"], "--request-rate: expected comma-separated positive numbers"),
        (["--concurrency", "4", "--request-rate", "2"], "give one of them"),
    ],
)
def test_bad_load_options_exit_2_naming_the_option(argv, message, capsys):
    assert main(["bench", ".", *argv]) == 2
    assert message in capsys.readouterr().err.replace("\n", "")


def test_a_missing_tokenizer_dir_is_named(tmp_path, capsys):
    # URLs given: nothing is started, so the tokenizer check is the first thing that fails.
    code = main(["bench", ".", "--target", "engine", "--url", "127.0.0.1:1", "--tokenizer", str(tmp_path / "nope")])
    assert code == 2
    assert "--tokenizer:" in capsys.readouterr().err


def test_an_unreachable_triton_is_a_clear_error(capsys):
    repo_tokenizer = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "embedded-llama"
    if not (repo_tokenizer / "tokenizer.json").is_file():
        pytest.skip("the embedded model is not generated in this checkout")
    code = main(["bench", ".", "--target", "engine", "--url", "127.0.0.1:9", "--tokenizer", str(repo_tokenizer),
                 "--num-requests", "2", "--concurrency", "1", "--no-progress"])
    assert code == 1
    assert "not reachable" in capsys.readouterr().err


def test_compare_with_a_truss_url_needs_the_triton_behind_it(capsys):
    assert main(["bench", ".", "--compare", "--url", "http://127.0.0.1:9"]) == 2
    assert "--grpc-url" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--compare-backends", "pytorch"], "--compare-backends: expected two different backends"),
        (["--compare-backends", "pytorch,vllm"], "--compare-backends: expected two different backends"),
        (["--compare-backends", "pytorch,llmapi", "--compare"], "--compare-backends starts its own stacks"),
    ],
)
def test_compare_backends_needs_two_backends_and_its_own_stacks(argv, message, capsys):
    assert main(["bench", ".", *argv]) == 2
    assert message in capsys.readouterr().err.replace("\n", "")
