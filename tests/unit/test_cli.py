"""The ``orchestra`` command's own surface: help, --version, and a usage text that lists
every command main() dispatches (read from main()'s source, so a command added there
is checked without a change here). Each command's ``--help``: test_cli_commands.py."""
from __future__ import annotations

import re

import pytest

import orchestra
from _cli_commands import dispatched_commands, usage_commands
from orchestra._cli import main as _cli

pytestmark = pytest.mark.timeout(10)


def test_main_dispatches_the_commands_it_is_known_to() -> None:
    # The dispatch is read right: a floor, not the list (others add commands).
    assert {"start", "stop", "status", "microbenchmark", "coordinator", "run"} <= \
        dispatched_commands()


def test_usage_lists_every_command_main_dispatches_and_no_other() -> None:
    assert usage_commands() == dispatched_commands()


@pytest.mark.parametrize("argv", [["--help"], ["-h"]])
def test_help_prints_the_usage_to_stdout_and_succeeds(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert out.strip() == _cli._USAGE.strip() and err == ""


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """The usage on stderr and exit status 2, as for any command line that is not one
    (it exited 0, so a script calling `orchestra` by mistake went on as if it worked)."""
    assert _cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == _cli._USAGE.strip()


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_version(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main([flag]) == 0
    out = capsys.readouterr().out
    assert out == f"orchestra {_cli.version()}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", _cli.version())


def test_version_is_the_package_version() -> None:
    assert _cli.version() == orchestra.__version__


def test_an_unknown_command_says_so_on_stderr_with_the_usage(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["frobnicate"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "unknown command 'frobnicate'" in err and "commands:" in err


def test_names_from_user_code_reach_the_terminal_escaped_and_cut() -> None:
    from orchestra._cli.cluster import MAX_CELL, format_status, printable
    from orchestra._cli.state import table
    evil = "a\x1b]0;owned\x07b\nc\r\x9bd\u2028e"
    shown = printable(evil)
    assert shown == "a\\x1b]0;owned\\x07b\\nc\\r\\x9bd\\u2028e"
    assert shown.isprintable()
    assert printable("x" * 100_000) == "x" * (MAX_CELL - 3) + "..."
    assert printable("naïve 名前") == "naïve 名前"   # printable text stays as it is
    out = table([{"name": evil, "state": "ALIVE"}, {"name": "y" * 100_000, "state": "DEAD"}],
                ["name", "state"])
    assert out.isascii() and "\x1b" not in out and len(out.splitlines()) == 3
    assert max(len(line) for line in out.splitlines()) < 2 * MAX_CELL
    status = format_status([{"NodeID": "n\x1b[2J", "NodeManagerAddress": "1.2.3.4", "Alive": True,
                             "Resources": {"evil\x07" + "r" * 500: 1.0}}],
                           {"evil\x07" + "r" * 500: 1.0}, {})
    assert "\x1b" not in status and "\x07" not in status
    assert max(len(line) for line in status.splitlines()) < 4 * MAX_CELL


def test_status_says_a_state_store_that_does_not_answer_and_what_waits() -> None:
    import time as _time

    from orchestra._cli.cluster import format_summary
    summary = {"store": {"used": 0, "capacity": 1 << 30, "spilled_bytes": 0,
                         "spilled_objects": 0}, "tasks": {}, "actors": {}, "workers": 2,
               "drivers": 0, "head_restarts": 0,
               "state_store": {"url": "redis://10.0.0.9:6379/0", "waiting": 3,
                               "kept": {"actors": 2, "groups": 1, "nodes": 4, "jobs": 5},
                               "away_since": _time.time() - 12}}
    text = format_summary(summary)
    assert ("state store: redis://10.0.0.9:6379/0: 2 actor(s), 1 detached placement "
            "group(s), 4 joined node(s), 5 job(s) kept; DOES NOT ANSWER for 12 s, 3 change(s) wait to "
            "be written") in text
    summary["state_store"] = None   # a head that keeps no store says nothing of one
    assert "state store" not in format_summary(summary)
