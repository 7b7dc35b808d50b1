"""The docs' generated tables (images, examples, backends x features, model families) are what the code says
today: each region between `<!-- generated:NAME -->` markers is regenerated (trtllm_truss.commands.doc_tables)
and compared with the committed docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trtllm_truss.commands import doc_tables

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(doc_tables.REGIONS))
def test_generated_table_matches_the_code(name):
    doc, make = doc_tables.REGIONS[name]
    committed = doc_tables.region_body((ROOT / doc).read_text(encoding="utf-8"), name)
    assert committed is not None, f"{doc} lost its <!-- generated:{name} --> ... <!-- /generated:{name} --> markers"
    fresh = make().rstrip("\n") + "\n"
    assert committed == fresh, (
        f"{doc}'s generated table {name!r} differs from the code; run `{doc_tables.COMMAND}` and commit the docs:\n"
        + doc_tables.diff(name, Path(doc), committed, fresh)
    )


def test_a_region_is_rewritten_in_place_with_its_indentation():
    text = "intro\n  <!-- generated:t -->\n  | old |\n  <!-- /generated:t -->\nafter\n"
    rewritten = doc_tables.replace_region(text, "t", "| a |\n|---|\n")
    assert rewritten == "intro\n  <!-- generated:t -->\n  | a |\n  |---|\n  <!-- /generated:t -->\nafter\n"
    assert doc_tables.region_body(rewritten, "t") == "| a |\n|---|\n"
    with pytest.raises(ValueError, match="generated:missing"):
        doc_tables.replace_region(text, "missing", "x")


def test_check_names_the_stale_region_and_the_command(tmp_path, monkeypatch, capsys):
    doc, _ = doc_tables.REGIONS["images"]
    copy = tmp_path / doc
    copy.parent.mkdir(parents=True)
    text = (ROOT / doc).read_text(encoding="utf-8")
    copy.write_text(doc_tables.replace_region(text, "images", "| stale |\n"), encoding="utf-8")
    monkeypatch.setattr(doc_tables, "REGIONS", {"images": doc_tables.REGIONS["images"]})
    monkeypatch.setattr(doc_tables, "REPO", tmp_path)
    assert doc_tables.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert "-| stale |" in out and doc_tables.COMMAND in err
    assert doc_tables.main([]) == 0 and doc_tables.main(["--check"]) == 0
    assert copy.read_text(encoding="utf-8") == text


def test_the_matrix_is_the_planners_answer():
    """Spot checks against the planning code itself: a refusal in the matrix is the plan's own refusal."""
    titles, rows = doc_tables.feature_matrix()
    by_feature = {row[0]: dict(zip(titles, row[1:])) for row in rows}
    lookahead = by_feature["speculative: lookahead"]
    assert lookahead["`tensorrtllm`, TensorRT-LLM 0.19.0 to 0.21.0"] == "yes"
    assert "refuses Lookahead" in lookahead["`llmapi`, TensorRT-LLM 1.1.0 to 1.2.1"]
    assert by_feature["`top_logprobs`"]["`llmapi`, TensorRT-LLM 1.0.0"].startswith("1: ")
    interval = by_feature["`runtime.stream_interval` > 1"]
    assert all(cell.startswith("no: ") for title, cell in interval.items() if "`tensorrtllm`" in title)
    assert all(cell == "yes" for title, cell in interval.items() if "`tensorrtllm`" not in title)


def test_every_family_in_the_registry_has_its_row_of_what_it_writes():
    """docs/api.md's hand-written table (what each family's model writes, how it streams, its test data) names
    exactly the registry's families, so a family added to the code is missing from the docs loudly."""
    from trtllm_truss.parsers import FAMILIES

    text = (ROOT / "docs/api.md").read_text(encoding="utf-8")
    table = text[text.index("<!-- /generated:families -->") :].split("\n\n", 3)[2]
    named = {name for line in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", line.strip().split(" | ")[0])}
    assert named == set(FAMILIES)


def test_every_example_has_a_one_line_description():
    for config in sorted((ROOT / "examples").glob("*/config.yaml")):
        import yaml

        description = yaml.safe_load(config.read_text()).get("description")
        assert isinstance(description, str) and description and "\n" not in description.strip(), config
