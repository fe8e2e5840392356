"""The ``orchestra`` command as a user runs it: ``python -m orchestra``, and every
command's ``--help`` (the commands read from main()'s dispatch: test_cli.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import orchestra
from _cli_commands import dispatched_commands
from _probes import child_env
from orchestra._cli import main as _cli

pytestmark = pytest.mark.timeout(60)




def _orchestra(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestra", *args], cwd=cwd, env=child_env(),
                          capture_output=True, text=True, timeout=50, stdin=subprocess.DEVNULL)


def test_python_dash_m_orchestra_without_a_command_prints_the_usage_as_an_error(
        tmp_path: Path) -> None:
    proc = _orchestra(cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == _cli._USAGE.strip() and proc.stdout == ""
    proc = _orchestra("--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == _cli._USAGE.strip()


def test_python_dash_m_orchestra_version(tmp_path: Path) -> None:
    proc = _orchestra("--version", cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, f"orchestra {orchestra.__version__}\n")


@pytest.mark.parametrize("command", sorted(dispatched_commands()))
def test_every_command_has_a_help_that_succeeds(command: str, tmp_path: Path) -> None:
    proc = _orchestra(command, "--help", cwd=tmp_path)
    assert proc.returncode == 0, f"orchestra {command} --help: {proc.stdout}\n{proc.stderr}"
    assert "usage" in proc.stdout.lower()
