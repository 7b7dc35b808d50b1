"""User docs say what the code does: quoted error messages exist, no tracker numbers, the examples listed are
the examples there are.

- docs/troubleshooting.md quotes messages in ```text blocks, `<...>` where the text varies. Each quoted line's
  literal parts must appear in the string literals of packages/trtllm_truss (f-strings and %-formats read as
  templates, a module's string constants substituted by name), so a message reworded in the code fails here
  until the page follows.
- README.md, CONTRIBUTING.md, docs/*.md and the study READMEs of docs/performance/ cite no "issue N" of this project's
  tracker: the facts stay, the numbers, which mean nothing to a reader, go. Upstream issues are cited as
  owner/repo#N links.
- README.md names every folder of examples/, and no example that is not there.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "packages" / "trtllm_truss"
USER_DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md"] + sorted((REPO / "docs").glob("*.md"))
STUDY_READMES = sorted((REPO / "docs" / "performance").glob("*/README.md"))
HOLE = "\x00"  # where a template takes a value
PLACEHOLDER = re.compile(r"<[^<>]+>")
TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```", re.M | re.S)
ISSUE_NUMBER = re.compile(r"\bissues?[\s-]*#?\d+", re.I)
PERCENT_FORMAT = re.compile(r"%[-+ #0-9.]*[sdifr]")
FRAGMENT_EDGES = " \t:;,.()'\"`"
MIN_FRAGMENT = 4  # shorter literal parts (" (", "but") say nothing about which message it is
MIN_DISTINCT = 12  # each quoted message has at least one literal part this long


def _module_constants(tree: ast.Module) -> dict[str, str]:
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = node.value.value
    return constants


def _template(node: ast.JoinedStr, constants: dict[str, str]) -> str:
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif (
            isinstance(value, ast.FormattedValue)
            and isinstance(value.value, ast.Name)
            and value.value.id in constants
            and value.conversion == -1
            and value.format_spec is None
        ):
            parts.append(constants[value.value.id])
        else:
            parts.append(HOLE)
    return "".join(parts)


@lru_cache(maxsize=1)
def package_texts() -> str:
    """Every string literal of the package as a template, one per line."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*.py"))}
    shared: dict[str, str] = {}
    for tree in trees.values():
        shared.update(_module_constants(tree))
    texts = []
    for tree in trees.values():
        constants = {**shared, **_module_constants(tree)}
        inside_fstrings = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                texts.append(_template(node, constants))
                inside_fstrings.update(id(v) for v in node.values)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_fstrings:
                texts.append(PERCENT_FORMAT.sub(HOLE, node.value))
    return "\n".join(text.replace("\n", " ") for text in texts)


def quoted_messages() -> list[str]:
    page = (REPO / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    return [line.strip() for block in TEXT_BLOCK.findall(page) for line in block.splitlines() if line.strip()]


def missing_parts(message: str, texts: str) -> list[str]:
    """The literal parts of a quoted message that no string of the package contains."""
    parts = [part.strip(FRAGMENT_EDGES) for part in PLACEHOLDER.split(message)]
    parts = [part for part in parts if len(part) >= MIN_FRAGMENT]
    if not any(len(part) >= MIN_DISTINCT for part in parts):
        return [f"(no literal part of {MIN_DISTINCT}+ characters to check in {message!r})"]
    return [part for part in parts if part not in texts]


def test_troubleshooting_quotes_messages_the_package_prints():
    messages = quoted_messages()
    assert len(messages) >= 12, "docs/troubleshooting.md should quote the messages of every failure it lists"
    texts = package_texts()
    problems = {message: missing for message in messages if (missing := missing_parts(message, texts))}
    assert not problems, "quoted but not in packages/trtllm_truss:\n" + "\n".join(
        f"- {message}\n    missing: {missing}" for message, missing in problems.items()
    )


def test_a_reworded_message_would_be_caught():
    texts = package_texts()
    assert not missing_parts("too many requests in flight (<reason>); retry shortly", texts)
    assert missing_parts("too many requests at once (<reason>); retry shortly", texts)
    assert missing_parts("<repo>: <n>", texts)  # nothing distinctive to check is itself a failure


def test_user_docs_cite_no_tracker_numbers():
    found = [
        f"{doc.relative_to(REPO)}:{number}: {line.strip()[:120]}"
        for doc in USER_DOCS + STUDY_READMES
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert not found, "user docs cite issue numbers (keep the fact, drop the number):\n" + "\n".join(found)


def test_readme_lists_the_examples_there_are():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    examples = {p.parent.name for p in (REPO / "examples").glob("*/config.yaml")}
    listed = set(re.findall(r"^- `([a-z0-9.-]+)`:", readme, re.M))
    assert listed == examples, f"README lists {sorted(listed - examples)} not in examples/; misses {sorted(examples - listed)}"


def test_readme_quickstart_reaches_a_deployed_model_in_40_lines():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    code = [line for block in re.findall(r"^```[^\n]*\n(.*?)^```", quickstart, re.M | re.S) for line in block.splitlines()]
    assert len(code) <= 40, f"the quickstart's commands and code are {len(code)} lines"
    text = "\n".join(code)
    for step in ("pip install truss==", "truss login", "hf_access_token", "trtllm-truss init", "trtllm-truss validate",
                 "truss push", "api.baseten.co/environments/production/sync/v1", "OpenAI("):
        assert step in text, f"the quickstart lacks {step!r}"
    pinned = re.search(r"truss==([0-9.]+)", text)[1]
    assert f'"truss=={pinned}"' in (REPO / "pyproject.toml").read_text(encoding="utf-8"), "the quickstart's truss is not the pinned one"
    assert "make predict" in readme and "make test" in readme  # the two commands of a fresh machine (CI runs make test)
