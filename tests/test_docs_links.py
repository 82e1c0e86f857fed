"""The README and the docs point only at files the repository has.

A relative Markdown link must lead to a file or folder, and a `benchmarks/...` path in
backticks (a figure's script or result file) must exist, unless its paragraph names the
commit whose tree holds it (superseded runs left the tree; the docs cite them by commit).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Where superseded runs and their scripts still are.
HISTORY_COMMIT = "e6506c1"
#: Placeholders in command templates, not paths.
PLACEHOLDER = re.compile(r"runN|CELL|\.\.\.|\*|\bMS\b|\bDIR\b|PATH")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CITED_PATH = re.compile(r"`[^`]*?(benchmarks/[^`\s:]+)[^`]*`")


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += sorted((ROOT / "benchmarks").rglob("README.md"))
    return pages


def dead_links(page: Path, text: str) -> list[str]:
    """Relative links of `text` (the page at `page`) that lead nowhere."""
    dead = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in LINK.finditer(line):
            target = match.group(1).split("#")[0]
            if target and "://" not in target and not (page.parent / target).exists():
                dead.append(f"{page.name}:{number}: link to {target}")
    return dead


def missing_cited_paths(page: Path, text: str) -> list[str]:
    """`benchmarks/...` paths of `text` missing from the tree, in paragraphs naming no commit."""
    missing = []
    for paragraph in re.split(r"\n\s*\n", text):
        if HISTORY_COMMIT in paragraph:
            continue
        for match in CITED_PATH.finditer(paragraph):
            path = match.group(1).rstrip(".,;)")
            if not PLACEHOLDER.search(path) and not (ROOT / path).exists():
                missing.append(f"{page.name}: `{path}` is not in the tree")
    return missing


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_cited_files_exist(page: Path) -> None:
    text = page.read_text()
    assert dead_links(page, text) + missing_cited_paths(page, text) == []


def test_the_checks_catch_a_removed_file(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    text = (
        "See [the gate](gone.md) and `benchmarks/gone/run1/results.json`.\n\n"
        f"Superseded: `benchmarks/gone/run2/` in the tree of `{HISTORY_COMMIT}`.\n"
    )
    assert dead_links(page, text) == ["page.md:1: link to gone.md"]
    assert missing_cited_paths(page, text) == [
        "page.md: `benchmarks/gone/run1/results.json` is not in the tree"
    ]
