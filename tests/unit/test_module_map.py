"""The architecture page's module map lists every module of the package, and only those."""
from __future__ import annotations

import pathlib
import re

import pytest

pytestmark = pytest.mark.timeout(10)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _map_rows() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("Module map")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return rows


def test_every_module_is_in_the_architecture_pages_module_map_and_no_other() -> None:
    listed: set[str] = set()
    for row in _map_rows():
        first_cell = row.split("|")[1]
        listed.update(re.findall(r"`([\w.]+\.py)`", first_cell))
    modules = {p.name for p in (ROOT / "orchestra").glob("*.py")}
    assert sorted(modules - listed) == [], "modules missing from the module map of docs/architecture.md"
    assert sorted(listed - modules) == [], "docs/architecture.md maps modules that do not exist"


def test_every_module_map_row_says_what_the_module_does() -> None:
    for row in _map_rows()[2:]:   # after the header and its rule
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert len(cells) == 2 and len(cells[1]) > 10, row
