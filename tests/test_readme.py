"""The README is the front door: short, every link in it resolves, and each headline figure
names its date and its baseline. (The documentation site under docs/ is checked by
`./dev docs`, which builds it in strict mode.)"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    parts = re.split(r"^```.*$", text, flags=re.M)
    return "\n".join(part for i, part in enumerate(parts) if i % 2 == 0)


def slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's toc slugify)."""
    text = re.sub(r"[`*]|\[([^]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose(page.read_text()), flags=re.M)}


def test_the_readme_is_at_most_250_lines() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_every_relative_link_of_the_readme_resolves() -> None:
    links = [t for t in LINK.findall(prose(README.read_text())) if "://" not in t]
    assert any(t.startswith("docs/") for t in links)
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        page = ROOT / path if path else README
        if not page.is_file():
            broken.append(target)
        elif anchor and anchor not in anchors(page):
            broken.append(target)
    assert broken == []


def test_the_slug_is_mkdocs_own() -> None:
    # As the built site names them (./dev docs fails on a link to an anchor that is not there).
    assert slug("Walk-through: examples/game_server.py") == "walk-through-examplesgame_serverpy"
    assert slug("Measured (C1, C2, H)") == "measured-c1-c2-h"
    assert slug("echo-lobby, echo-lobby-client and echo-lobby-announce") == (
        "echo-lobby-echo-lobby-client-and-echo-lobby-announce"
    )


def test_every_headline_figure_has_a_date_and_a_baseline() -> None:
    # The block is written by ./dev bench-report (tests/bench/test_report.py checks that it is
    # what bench/results gives); here: each figure a reader sees has its date and its baseline.
    text = README.read_text()
    section = text[text.index("\n## Headline figures\n") :]
    section = section[: section.index("\n## ", 1)]
    begin, end = "<!-- headline:begin -->", "<!-- headline:end -->"
    assert section.index(begin) < section.index(end)
    block = section[section.index(begin) : section.index(end)]
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        for line in block.splitlines()
        if line.startswith("| ")
    ]
    header, figures = rows[0], rows[1:]
    date, baseline = header.index("date (UTC), load"), header.index("same-run baseline")
    assert len(figures) >= 3
    for row in figures:
        assert re.match(r"20\d\d-\d\d-\d\d, ", row[date]), row
        assert row[baseline] not in ("", "—"), row
    if any("**busy**" in row[date] for row in figures):
        # A run that shared its CPUs is said so in plain words above the table.
        assert "**Measured on a busy machine:**" in block.split("\n| ")[0]
    assert "docs/benchmarks.md" in section
