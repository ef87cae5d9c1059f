"""The documents hold at HEAD: no history in any project file, a short README, no dead links.

A figure in the documents is stated with the command that reproduces it, the machine and the
commit it was measured at; a figure that a change made stale is re-measured or removed, and
no text tells the rounds of development that led here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
TEXT_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".md", ".toml", ".txt", ".cfg", ".json"}
README_MAX_LINES = 300

HISTORY = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bsession[- ]\d",
        r"\bissue[- ]#?\d+",
        r"\bbefore commit\b",
        r"\bround of development\b",
        r"\bbefore this change\b",
        r"\bsince (?:session|issue|round)\b",
    )
]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def project_text_files() -> list[Path]:
    """README.md, docs/*.md and the text files of nmt/, scripts/, configs/ and tests/."""
    files = [README, *DOCS]
    for folder in ("nmt", "scripts", "configs", "tests"):
        for path in sorted((REPO / folder).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix in TEXT_SUFFIXES and path != Path(__file__).resolve():
                files.append(path)
    return files


def prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    seen: dict[str, int] = {}
    for line in prose_lines(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        if n:
            seen[f"{slug}-{n}"] = 1
    return set(seen)


def test_no_document_or_source_file_tells_the_history() -> None:
    found = []
    for path in project_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for marker in HISTORY:
                if marker.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "say what holds now, not how it came to be:\n" + "\n".join(found)


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md: {len(lines)} lines; move detail to docs/"


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_at_files_that_exist(doc: Path) -> None:
    dead = []
    for line in prose_lines(doc):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # https:, mailto: and the like
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                dead.append(target)
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                dead.append(f"{target} (no such heading)")
    assert not dead, f"{doc.relative_to(REPO)}: dead links: {dead}"


def test_the_history_markers_are_caught() -> None:
    for text in ("in session 5", "Issue 13 asks", "issue-13", "before commit dfc9eef"):
        assert any(m.search(text) for m in HISTORY), text
    for text in ('@pytest.fixture(scope="session")', "round(x, 2)", "go round again"):
        assert not any(m.search(text) for m in HISTORY), text
