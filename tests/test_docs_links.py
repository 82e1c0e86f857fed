"""The README and the docs point only at files the repository has.

A relative Markdown link must lead to a file or folder (its `#anchor` to a heading there),
and a `benchmarks/...` path in backticks (a figure's script or result file) must exist, unless
its paragraph names the commit whose tree holds it (superseded runs left the tree; the docs
cite them by commit).
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


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page."""
    found = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def dead_links(page: Path, text: str) -> list[str]:
    """Relative links of `text` (the page at `page`) that lead nowhere."""
    dead = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in LINK.finditer(line):
            target, _, anchor = match.group(1).partition("#")
            if "://" in target or match.group(1).startswith("mailto:"):
                continue
            path = page.parent / target if target else page
            if target and not path.exists():
                dead.append(f"{page.name}:{number}: link to {target}")
                continue
            if not anchor or path.suffix != ".md":
                continue
            if anchor not in anchors(path.read_text() if target else text):
                dead.append(f"{page.name}:{number}: no heading for #{anchor} in {path.name}")
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
    (tmp_path / "other.md").write_text("# Title\n\n## The gate's cells (`x/`)\n")
    good = "[a](other.md#the-gates-cells-x) [b](other.md#title) [c](#top)\n\n# Top\n"
    assert dead_links(page, good) == []
    assert dead_links(page, "[a](other.md#gone)") == ["page.md:1: no heading for #gone in other.md"]
    text = (
        "See [the gate](gone.md) and `benchmarks/gone/run1/results.json`.\n\n"
        f"Superseded: `benchmarks/gone/run2/` in the tree of `{HISTORY_COMMIT}`.\n"
    )
    assert dead_links(page, text) == ["page.md:1: link to gone.md"]
    assert missing_cited_paths(page, text) == [
        "page.md: `benchmarks/gone/run1/results.json` is not in the tree"
    ]
