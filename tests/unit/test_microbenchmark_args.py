"""The benchmark's command line and table: what --compare and --nodes accept, and a table
that still prints when one framework failed. No benchmark runs here."""
from __future__ import annotations

import argparse

import pytest

from orchestra._cli import bench_nodes as _bench_nodes
from orchestra._cli.microbenchmark import _compare_list, main, node_rows, report

pytestmark = pytest.mark.timeout(10)


def test_compare_takes_a_comma_separated_list() -> None:
    assert _compare_list("ray,dask") == ["ray", "dask"]
    assert _compare_list("ray") == ["ray"]


def test_compare_refuses_an_unknown_framework_by_name() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="'spark'"):
        _compare_list("ray,spark")


def test_nodes_below_three_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--nodes", "2"])
    assert exc.value.code == 2


def test_dask_without_nodes_says_to_add_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--compare", "dask"]) == 2
    assert "--nodes 3" in capsys.readouterr().err


def test_cluster_run_needs_two_nodes_besides_the_head() -> None:
    with pytest.raises(ValueError, match="--nodes 3"):
        _bench_nodes.run("ray", 2, quick=True)


def test_cluster_rows_name_this_runs_node_count_and_transfer_size() -> None:
    labels = [label for _, label, _ in node_rows([{"nodes": 4, "transfer_mib": 8.0}])]
    assert "cluster start: head + 3 nodes (s)" in labels
    assert "8 MiB array node to node, a task reads it (GB/s)" in labels


def test_a_failed_framework_prints_as_dashes_and_the_others_with_ratios() -> None:
    results = [{"framework": "orchestra", "error": "no cluster"},
               {"framework": "ray", "nodes": 3, "spread_tasks_per_s": 1000.0},
               {"framework": "dask", "nodes": 3, "spread_tasks_per_s": 200.0}]
    table = report(results, node_rows(results))
    spread = next(line for line in table.splitlines() if line.startswith("no-op tasks/s spread"))
    assert spread.split()[-5:] == ["-", "1,000", "200", "-", "-"]
    ok = [{"framework": "orchestra", "nodes": 3, "spread_tasks_per_s": 2000.0}] + results[1:]
    spread = next(line for line in report(ok, node_rows(ok)).splitlines()
                  if line.startswith("no-op tasks/s spread"))
    assert "2.00x better" in spread and "10.00x better" in spread


def test_the_cluster_benchmark_runs_by_path_beside_microbenchmark_py() -> None:
    # Ray's half runs this file by path under a Python without orchestra: it must find
    # microbenchmark.py beside it itself (it broke when one of them moved).
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-I", _bench_nodes.__file__, "ray", "2", "--quick"],
                          capture_output=True, text=True, timeout=8, cwd="/")
    assert "--nodes 3" in proc.stderr, proc.stderr
    assert "ImportError" not in proc.stderr and "ModuleNotFoundError" not in proc.stderr


def test_tls_without_nodes_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--tls"])
    assert exc.value.code == 2
    assert "--nodes" in capsys.readouterr().err
