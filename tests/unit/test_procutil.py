"""What /proc says of processes, read in one place (orchestra/_platform/procutil.py):
the product's liveness checks and the tests' process counts use the same reading."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from orchestra._platform.procutil import group_members, pid_alive, proc_stat, process_tree

pytestmark = pytest.mark.timeout(30)


def test_this_process_stat_names_its_parent_and_group() -> None:
    st = proc_stat(os.getpid())
    assert st is not None
    assert (st.state, st.ppid, st.pgid) == ("R", os.getppid(), os.getpgrp())


def test_a_child_is_in_the_tree_and_its_own_group_until_it_ends() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             start_new_session=True)
    try:
        assert pid_alive(child.pid)
        assert child.pid in process_tree(os.getpid())
        assert group_members(child.pid) == [child.pid]
    finally:
        child.kill()
    deadline = time.monotonic() + 10
    while proc_stat(child.pid) is not None and proc_stat(child.pid).state != "Z":  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # Exited, not yet reaped: a zombie counts as gone, and is in no group.
    assert not pid_alive(child.pid)
    assert group_members(child.pid) == []
    child.wait()
    assert proc_stat(child.pid) is None and not pid_alive(child.pid)
