"""The project's Markdown renders (every table row has as many cells as its header: a row with one cell more or less
breaks the table on GitHub and the Hub), and what it names exists (the registered spaCy names)."""

from __future__ import annotations

import re
from pathlib import Path

from spacy_fixtures import REPO

DOCS = sorted(path for pattern in ("*.md", "docs/*.md", "benchmarks/**/*.md", "hf_elmo/**/*.md", "spacy_elmo/**/*.md",
                                   "recipes/**/*.md") for path in REPO.glob(pattern))


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


def test_every_registered_name_is_in_the_plugins_readme_and_every_name_the_docs_give_is_registered():
    """The names of setup.cfg's spaCy entry points (what configs name) all resolve in spaCy's registries and are all
    in spacy_elmo/README.md's table; every `spacy-elmo.*` name the docs and shipped configs give is one of them."""
    import configparser

    import spacy

    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    registered = {}
    for group, lines in setup["options.entry_points"].items():
        if group.startswith("spacy_") and group not in ("spacy_factories", "spacy_cli"):
            for line in filter(None, lines.splitlines()):
                registered[line.split("=")[0].strip()] = group.removeprefix("spacy_")
    assert len(registered) >= 15
    for name, registry in registered.items():
        assert getattr(spacy.util.registry, registry).get(name) is not None, name
    readme = (REPO / "spacy_elmo" / "README.md").read_text(encoding="utf-8")
    assert sorted(name for name in registered if f"`{name}`" not in readme) == []
    texts = [path.read_text(encoding="utf-8") for path in [*DOCS, *REPO.glob("spacy_elmo/configs/*.cfg")]]
    documented = {name for text in texts for name in re.findall(r"spacy-elmo\.[A-Za-z_]+\.v\d+", text)}
    assert sorted(documented - set(registered)) == []
