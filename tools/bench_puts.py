"""Large puts, orchestra and Ray alternating in one sitting (their speeds move with the
machine from run to run, more than one run of the microbenchmark can tell apart).

    python tools/bench_puts.py --ray-python /path/to/ray-venv/bin/python [--rounds 3]
                               [--puts 9]

Each round starts Ray's child then orchestra's; each child puts a 512 MiB array, a
10-million-row DataFrame of 10 numeric columns and a 1 GiB Arrow table ``--puts`` times,
each into the memory the last one freed (as the microbenchmark does), and prints the
median GB/s of all but the first put (the first faults fresh memory in). Without
``--ray-python`` only orchestra runs.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VALUES = ("array", "frame", "table")


def child(framework: str, puts: int) -> None:
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    if framework == "ray":
        import ray as fw
        fw.init(num_cpus=2, include_dashboard=False, object_store_memory=4 << 30)
    else:
        sys.path.insert(0, ROOT)
        import orchestra as fw
        fw.init(num_cpus=2)
    values = {
        "array": np.random.default_rng(0).random((512 << 20) // 8),
        "frame": pd.DataFrame({f"c{i}": np.arange(10_000_000, dtype=np.float64 if i % 2 else np.int64)
                               for i in range(10)}),
        "table": pa.table({f"c{i}": np.full(1 << 24, float(i)) for i in range(8)}),
    }
    sizes = {"array": values["array"].nbytes, "frame": 10 * 8 * 10_000_000,
             "table": values["table"].nbytes}
    out = []
    for name in VALUES:
        took, ref = [], None
        for _ in range(puts):
            ref = None
            gc.collect()
            time.sleep(0.2)
            t = time.perf_counter()
            ref = fw.put(values[name])
            took.append(time.perf_counter() - t)
            fw.get(ref)
        out.append(f"{sizes[name] / statistics.median(took[1:]) / 1e9:.1f}")
    print(" ".join(out))
    fw.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray-python", help="a Python with ray, numpy, pandas and pyarrow")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--puts", type=int, default=9)
    parser.add_argument("--child", choices=("ray", "orchestra"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.puts)
        return
    runs = [("ray", args.ray_python)] if args.ray_python else []
    runs.append(("orchestra", sys.executable))
    print(f"{'put (GB/s)':<12}" + "".join(f"{v:>8}" for v in VALUES))
    for _ in range(args.rounds):
        for framework, python in runs:
            got = subprocess.run([python, os.path.abspath(__file__), "--child", framework,
                                  "--puts", str(args.puts)], cwd=tempfile.gettempdir(),
                                 capture_output=True, text=True, timeout=900)
            line = got.stdout.strip().splitlines()[-1:] or [f"failed: {got.stderr[-300:]}"]
            print(f"{framework:<12}" + "".join(f"{v:>8}" for v in line[0].split()))


if __name__ == "__main__":
    main()
