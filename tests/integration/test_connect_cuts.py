"""init() to a head that goes away in the middle of the handshake (killed, and started
again by its supervisor): each connection cut at any of its steps is made again, until
init's deadline; the session then runs as any other. A relay in front of a real head
cuts the connections (_cutter.py): a plain-TCP handshake is 3 writes of the head's (its
hello, its verdict on the caller's token, its HelloReply), so a cut at write 0-3 covers
every step: before the head's first byte, and instead of each of them. The session's
connection is cut before the head accepted the driver (0-2): cut after (its HelloReply
withheld) by a head that lives on, the driver's job ends as at its exit, and is not taken
back (a head that dies there restores the job: test_head_restart.py); the prints'
connection at any step."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from _cli import REPO, T, cluster_logs, start_head
from _cutter import Cutter

pytestmark = pytest.mark.timeout(120)

DRIVER = """
import json, sys, orchestra
orchestra.init(address=sys.argv[1], token=sys.argv[2])

@orchestra.remote
def inc(x):
    print("said", x)
    return x + 1

# (on stderr: the task's print comes to stdout from another thread, maybe mid-line)
print(json.dumps(orchestra.get(inc.remote(41), timeout=30)), file=sys.stderr, flush=True)
orchestra.shutdown()
"""


def drive(head: dict[str, Any], cuts: dict[int, int]) -> tuple[subprocess.CompletedProcess[str], Cutter]:
    host, port = head["address"].rsplit(":", 1)
    cutter = Cutter((host, int(port)), cuts)
    try:
        r = subprocess.run([sys.executable, "-c", DRIVER, cutter.address, head["token"]],
                           capture_output=True, text=True, timeout=T,
                           env=dict(os.environ, PYTHONPATH=REPO))
    finally:
        cutter.close()
    return r, cutter


def ran(r: subprocess.CompletedProcess[str]) -> None:
    """The driver's task ran, and its print came to the driver (the prints' connection)."""
    assert "42" in r.stderr.splitlines(), r.stdout + r.stderr
    assert any(line.endswith("said 41") for line in r.stdout.splitlines()), r.stdout + r.stderr
    assert "not shown here" not in r.stderr, r.stderr


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from _cli import cli, records
    state = str(tmp_path_factory.mktemp("cuts") / "state")
    old = os.environ.get("ORCHESTRA_STATE_DIR")
    os.environ["ORCHESTRA_STATE_DIR"] = state
    try:
        yield dict(start_head(state), state=state)
    finally:
        cli("stop", "--timeout", "5")
        if old is None:
            del os.environ["ORCHESTRA_STATE_DIR"]
        else:
            os.environ["ORCHESTRA_STATE_DIR"] = old
        assert not records(state)


def test_the_relay_counts_a_whole_handshake_as_three_writes(head: Any) -> None:
    """What the cuts below rest on: uncut, init's two connections (the session's, the
    prints') each take 3 writes of the head's before the session runs."""
    r, cutter = drive(head, {})
    assert r.returncode == 0, (cutter.writes, r.stderr[-3000:], cluster_logs(head["state"]))
    ran(r)
    assert len(cutter.writes) == 2 and all(n >= 3 for n in cutter.writes), cutter.writes


@pytest.mark.parametrize("at", [0, 1, 2])
def test_init_connects_again_when_the_head_goes_away_at_any_step_of_the_handshake(
        head: Any, at: int) -> None:
    r, cutter = drive(head, {0: at})
    assert r.returncode == 0, (cutter.writes, r.stderr[-3000:], cluster_logs(head["state"]))
    ran(r)
    # The cut one, the session's, the prints' (and, cut before the head's hello reached
    # the caller, one that tried TLS: a server that closes without a word may speak it).
    assert len(cutter.writes) == (4 if at <= 1 else 3), cutter.writes


@pytest.mark.parametrize("at", [0, 1, 2, 3])
def test_the_prints_connection_is_made_again_too(head: Any, at: int) -> None:
    r, cutter = drive(head, {1: at})
    assert r.returncode == 0, (cutter.writes, r.stderr[-3000:], cluster_logs(head["state"]))
    ran(r)
    assert len(cutter.writes) == (4 if at <= 1 else 3), cutter.writes


def test_init_goes_through_several_cuts_in_a_row(head: Any) -> None:
    r, cutter = drive(head, {0: 2, 1: 0, 3: 1, 6: 3})
    assert r.returncode == 0, (cutter.writes, r.stderr[-3000:], cluster_logs(head["state"]))
    ran(r)
    # The session's cut three times (after two of them, a try of TLS: 2 and 4), then
    # made (5); the prints' cut once (6), then made.
    assert len(cutter.writes) == 8, cutter.writes

