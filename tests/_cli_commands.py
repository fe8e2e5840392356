"""The commands of ``orchestra``: those main() dispatches, read from its source (so a
command added there is tested without a list to keep), and those _USAGE lists.

Used by tests/unit/test_cli.py and tests/integration/test_cli_commands.py.
"""
from __future__ import annotations

import ast
import inspect
import re
import textwrap

from orchestra._cli import main as _cli


def dispatched_commands() -> set[str]:
    """The command names main() compares ``cmd`` with (``cmd == "x"``, ``cmd in (...)``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(_cli.main)))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) \
                and node.left.id == "cmd":
            for comp in node.comparators:
                for c in ast.walk(comp):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        names.add(c.value)
    return names


def usage_commands() -> set[str]:
    """The names in _USAGE's ``commands:`` list (each on a line indented two spaces)."""
    listing = _cli._USAGE.split("commands:", 1)[1]
    return set(re.findall(r"^  (\S+)", listing, re.M))
