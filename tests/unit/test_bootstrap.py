"""The head's entry point loads only what the head runs."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestra._platform import bootstrap as _bootstrap

pytestmark = pytest.mark.timeout(60)


def _modules_after(code: str) -> set[str]:
    probe = ("import sys\n" + code +
             "import json\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('orchestra'))))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=50,
                         check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize("entry", ["_head.head", "_node.process"])
def test_the_head_and_node_processes_import_no_client_actor_or_gang_code(entry: str) -> None:
    package, _, module = entry.partition(".")
    loaded = _modules_after(_bootstrap._BARE_PACKAGE + f"from orchestra.{package} import {module}\n")
    assert f"orchestra.{entry}" in loaded
    driver_side = {"orchestra._runtime.client", "orchestra._runtime.direct", "orchestra._api.session",
                   "orchestra._api.actor", "orchestra._gang.gang", "orchestra._api.remote_function",
                   "orchestra._objects.io"}
    assert loaded & driver_side == set()


def test_without_the_bare_package_the_public_api_comes_along() -> None:
    """What the bare package saves: importing a submodule runs the package's __init__."""
    assert "orchestra._runtime.client" in _modules_after("from orchestra._head import head\n")
