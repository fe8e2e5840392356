"""The architecture page's module map lists every module of the package, and only those."""
from __future__ import annotations

import pathlib
import re

import pytest

pytestmark = pytest.mark.timeout(10)

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestra"


def _map_rows() -> list[str]:
    """The rows of the module map's tables (one table per part of the package)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("Module map")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append(line)
        elif line.startswith("#"):
            break
    return [r for r in rows if not r.startswith(("| module", "|---"))]


def _modules() -> set[str]:
    """Every module of the package by its path below orchestra/, but the generated code,
    the empty __init__.py of the private subpackages, and the public util/ (one row)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("_proto", "util"):
            continue
        if path.name == "__init__.py" and len(rel.parts) > 1 and not path.read_text().strip():
            continue
        found.add(rel.as_posix())
    return found


def test_every_module_is_in_the_architecture_pages_module_map_and_no_other() -> None:
    listed: set[str] = set()
    for row in _map_rows():
        listed.update(re.findall(r"`([\w./]+\.py)`", row.split("|")[1]))
    modules = _modules()
    assert sorted(modules - listed) == [], "modules missing from the module map of docs/architecture.md"
    assert sorted(listed - modules) == [], "docs/architecture.md maps modules that do not exist"
    assert any("`util/`" in row.split("|")[1] for row in _map_rows())


def test_every_module_map_row_says_what_the_module_does() -> None:
    for row in _map_rows():
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert len(cells) == 2 and len(cells[1]) > 10, row


MAX_LINES = 800   # CONTRIBUTING.md, rule 10


def test_no_hand_written_module_is_over_800_lines() -> None:
    long = {path.relative_to(PACKAGE).as_posix(): n for path in PACKAGE.rglob("*.py")
            if "_proto" not in path.parts
            and (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by responsibility): {long}"
