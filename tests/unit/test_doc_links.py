"""Every relative link in README.md and docs/ leads to a file that exists, and every file of the performance
record that the repository names (`docs/performance/<study>/<file>`) is there."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# [text](target) and [text]: target (reference definitions); images too.
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_PERFORMANCE_PATH = re.compile(r"docs/performance/[\w.+-]+(?:/[\w.+-]+)*")


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text outside code blocks that name a file of the repository."""
    text = _FENCE.sub("", text)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    targets = _INLINE.findall(text) + _REFERENCE.findall(text)
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t, flags=re.I)]


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for doc in _documents():
        for target in relative_links(doc.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_link_reader_finds_links_and_skips_code_and_urls():
    text = (
        "see [a](docs/a.md#part), ![plot](b.png) and [c][r]\n\n[r]: <c.md>\n"
        "`[not](x.md)` [web](https://example.com) [here](#anchor)\n```\n[in code](y.md)\n```\n"
    )
    assert relative_links(text) == ["docs/a.md#part", "b.png", "c.md"]


def test_every_named_file_of_the_performance_record_exists():
    """Paths such as docs/performance/<study>/<file> in any tracked text file (docs, harnesses, scripts,
    tests, code comments) name files that are there; patterns (`*`, `{a,b}`, `$n`) are left out."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    missing = []
    for name in tracked:
        path = ROOT / name
        if path.suffix in {".json", ".gz", ".png", ".safetensors", ".bin", ".xz"} or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for match in _PERFORMANCE_PATH.finditer(text):
            named = match.group(0).rstrip(".-")
            following = text[match.end() : match.end() + 1]
            if following and following in "*{$<[":
                continue  # a pattern of files, not one file
            if not (ROOT / named).exists():
                missing.append(f"{name}: {named}")
    assert not missing, "named files of docs/performance that do not exist:\n" + "\n".join(sorted(set(missing)))
