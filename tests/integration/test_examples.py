"""The scripts in examples/ run as a user would run them, with small arguments.

Each runs in its own interpreter (it calls orchestra.init() itself) from a scratch cwd,
so the head and workers it starts import orchestra the way the driver did: under tox,
the installed package, never the source tree.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import orchestra
from _probes import child_env

pytestmark = pytest.mark.timeout(180)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))




def run_script(args: list[str], cwd: Path) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=child_env(), capture_output=True,
                          text=True, timeout=150, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def value(pattern: str, text: str) -> str:
    m = re.search(pattern, text, re.MULTILINE)
    assert m, f"no match for {pattern!r} in:\n{text}"
    return m.group(1)


def test_there_are_examples() -> None:
    assert {"monte_carlo_pi.py", "zero_copy_pipeline.py", "parameter_server.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_importing_an_example_starts_nothing(script: str) -> None:
    spec = importlib.util.spec_from_file_location(f"example_{script[:-3]}", EXAMPLES / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    was_initialized = orchestra.is_initialized()
    spec.loader.exec_module(module)
    assert callable(module.main)
    assert orchestra.is_initialized() == was_initialized


def test_monte_carlo_pi_estimates_pi(tmp_path: Path) -> None:
    out = run_script([str(EXAMPLES / "monte_carlo_pi.py"), "--tasks", "8", "--samples", "50000",
                      "--num-cpus", "2"], tmp_path)
    estimate = float(value(r"^pi ~= ([0-9.]+)", out))
    assert abs(estimate - math.pi) < 0.1
    assert "400,000 samples in 8 tasks" in out


def test_zero_copy_pipeline_matches_numpy_and_copies_nothing(tmp_path: Path) -> None:
    mb = 8
    out = run_script([str(EXAMPLES / "zero_copy_pipeline.py"), "--mb", str(mb), "--tasks", "4",
                      "--passes", "2", "--num-cpus", "2"], tmp_path)
    data = np.random.default_rng(0).random(int(mb * 1e6) // 8)   # the example's array
    assert math.isclose(float(value(r"^sum = (\S+)$", out)), float(data.sum()), rel_tol=1e-9)
    assert math.isclose(float(value(r"^sum of squares = (\S+)$", out)), float(np.dot(data, data)),
                        rel_tol=1e-9)
    assert "zero-copy view: True, read-only: True" in out
    assert "zero-copy in every task: True" in out


def test_parameter_server_moves_the_weights_to_the_target(tmp_path: Path) -> None:
    dim, workers, rounds = 100_000, 3, 4   # 800 KB of weights: they go through shared memory
    out = run_script([str(EXAMPLES / "parameter_server.py"), "--dim", str(dim), "--workers",
                      str(workers), "--rounds", str(rounds), "--num-cpus", "2"], tmp_path)
    target_norm = float(np.linalg.norm(np.linspace(-1.0, 1.0, dim)))   # the example's target
    norm = float(value(r"^final weights: norm ([0-9.]+)", out))
    distance = float(value(r"distance ([0-9.e+-]+)\)", out))
    # Each round shrinks the distance at least 3-fold (lr 0.3, at most 3 stale pushes).
    assert distance < 0.05 * target_norm
    assert abs(norm - target_norm) < 0.05 * target_norm
    assert f"{workers * rounds} updates from {workers} workers in {rounds} rounds" in out
    assert re.search(r"^time: [0-9.]+ s$", out, re.MULTILINE)


def test_streaming_generator_reads_every_chunk_and_word(tmp_path: Path) -> None:
    out = run_script([str(EXAMPLES / "streaming_generator.py"), "--chunks", "5", "--mb", "2",
                      "--num-cpus", "2"], tmp_path)
    assert "5 chunks of 2 MB, sum of firsts = 10" in out   # 0 + 1 + 2 + 3 + 4
    assert "words: streams arrive while the task runs" in out


def test_gang_allreduce_sums_over_four_members(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = run_script([str(EXAMPLES / "gang_allreduce.py"), "--members", "4", "--num-cpus", "1",
                      "--timeout", "100"], tmp_path)
    assert "all_reduce over 4 members: sum = 10, count = 4" in out
    assert "every member agrees: True" in out


_WHERE_IS_ORCHESTRA = textwrap.dedent("""
    import json, orchestra

    @orchestra.remote
    def where():
        import orchestra
        return orchestra.__file__

    orchestra.init(num_cpus=1)
    try:
        print(json.dumps({"driver": orchestra.__file__, "worker": orchestra.get(where.remote())}))
    finally:
        orchestra.shutdown()
""")


def test_workers_import_the_same_orchestra_as_the_driver(tmp_path: Path) -> None:
    where = json.loads(run_script(["-c", _WHERE_IS_ORCHESTRA], tmp_path))
    assert where["worker"] == where["driver"]
    if os.environ.get("ORCHESTRA_TEST_INSTALLED") == "1":
        source = EXAMPLES.parent / "orchestra"
        assert not Path(where["worker"]).resolve().is_relative_to(source), (
            "workers imported orchestra from the source tree, not the installed package")


def test_workers_ignore_an_orchestra_folder_in_the_drivers_cwd(tmp_path: Path) -> None:
    cwd, scripts = tmp_path / "cwd", tmp_path / "scripts"
    shutil.copytree(Path(orchestra.__file__).parent, cwd / "orchestra")   # a checkout's root
    scripts.mkdir()
    (scripts / "where.py").write_text(_WHERE_IS_ORCHESTRA)
    where = json.loads(run_script([str(scripts / "where.py")], cwd))
    assert where["worker"] == where["driver"]
