"""The project's Markdown renders: every table row has as many cells as its header (a row with one cell more or less
breaks the table on GitHub and the Hub)."""

from __future__ import annotations

import re
from pathlib import Path

from spacy_fixtures import REPO

DOCS = sorted(path for pattern in ("*.md", "benchmarks/**/*.md", "hf_elmo/**/*.md", "spacy_elmo/**/*.md",
                                   "training/**/*.md") for path in REPO.glob(pattern))


def table_widths(path: Path) -> list[tuple[int, list[int]]]:
    """(first line number, cells per row) of every table: a run of lines starting with `|`."""
    tables: list[tuple[int, list[int]]] = []
    previous_in_table = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        row = line.strip()
        if not row.startswith("|"):
            previous_in_table = False
            continue
        cells = len(re.findall(r"(?<!\\)\|", re.sub(r"`[^`]*`", "", row))) - 1
        if not previous_in_table:
            tables.append((number, []))
        tables[-1][1].append(cells)
        previous_in_table = True
    return tables


def test_every_markdown_table_has_as_many_cells_in_each_row_as_in_its_header():
    assert len(DOCS) >= 6 and REPO / "README.md" in DOCS
    uneven = [f"{path.relative_to(REPO)}:{line}: {widths}" for path in DOCS for line, widths in table_widths(path)
              if len(set(widths)) > 1]
    assert not uneven, "tables with rows of different widths:\n" + "\n".join(uneven)
