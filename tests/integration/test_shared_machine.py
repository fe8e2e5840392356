"""The suite holds on a machine where other orchestra sessions of the same user run:
the tests that look at what this user has across the machine (marked shared_machine:
sessions in the temp directory, /dev/shm, processes, the clusters found by default)
run again here while another process of this user starts and ends clusters, untidily
(_churn.py: init() clusters shut down, held up, their head or driver SIGKILLed;
`orchestra start` clusters stopped or their supervisor killed). Before, one of them
failed that way in CI (a killed head's directory swept by someone else's init(), and
`orchestra status` reading another session's init() cluster as its own)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FILES = ["test_lifecycle.py", "test_cluster_cli.py", "test_logs.py", "test_dead_driver.py"]

pytestmark = [pytest.mark.load, pytest.mark.timeout(300)]


def test_the_machine_wide_tests_pass_while_another_session_churns_clusters(
        tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    churn = subprocess.Popen([sys.executable, str(HERE / "_churn.py"), str(stop)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "-m", "shared_machine", *(str(HERE / f) for f in FILES)],
            cwd=HERE.parent, capture_output=True, text=True, timeout=240,
            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    finally:
        stop.touch()
        out, err = churn.communicate(timeout=90)
    assert churn.returncode == 0, err
    assert int(out.strip().splitlines()[-1]) >= 3, "the other session ran too few rounds"
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "deselected" in r.stdout, r.stdout[-2000:]
