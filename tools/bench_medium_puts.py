"""Medium puts, orchestra and Ray alternating in one sitting: fresh memory, and memory
objects of another size freed.

    python tools/bench_medium_puts.py --ray-python /path/to/ray-venv/bin/python
                                      [--rounds 2]

Each round starts Ray's child then orchestra's. A child runs two clusters (a 3 GiB
store each). In the first: 10,000 puts of a 100 KB array into fresh memory (puts/s),
their refs dropped; then 1,000 puts of a 1 MiB array (GB/s) into the memory they freed
(orchestra carves its slabs again for the larger size: docs/objects.md), dropped; then
1,000 more into the memory those freed. In the second: 1,000 puts of 1 MiB into fresh
memory. The refs of each step are kept until it ends. Without ``--ray-python`` only
orchestra runs.
"""
from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
COLUMNS = ("100KB fresh/s", "1MiB after 100KB", "1MiB after 1MiB", "1MiB fresh")


def child(framework: str) -> None:
    import numpy as np
    if framework == "ray":
        import ray as fw

        def init() -> None:
            fw.init(num_cpus=2, include_dashboard=False, object_store_memory=3 << 30,
                    log_to_driver=False)
    else:
        sys.path.insert(0, ROOT)
        import orchestra as fw  # type: ignore[no-redef]

        def init() -> None:
            fw.init(num_cpus=2, object_store_memory=3 << 30)

    small, big = np.ones(100_000 // 8), np.ones(MiB // 8)

    def timed(value: object, n: int) -> float:
        for _ in range(3):   # the put path warm (a segment of another class each)
            fw.get(fw.put(np.ones(3)))
        gc.collect()
        time.sleep(0.5)
        t = time.perf_counter()
        refs = [fw.put(value) for _ in range(n)]
        took = time.perf_counter() - t
        del refs
        gc.collect()
        time.sleep(1.0)   # the frees reach the store
        return took

    out = []
    init()
    out.append(f"{10_000 / timed(small, 10_000):,.0f}")
    out.append(f"{1000 * MiB / timed(big, 1000) / 1e9:.2f}")
    out.append(f"{1000 * MiB / timed(big, 1000) / 1e9:.2f}")
    fw.shutdown()
    init()
    out.append(f"{1000 * MiB / timed(big, 1000) / 1e9:.2f}")
    fw.shutdown()
    print(" ".join(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray-python", help="a Python with ray and numpy")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", choices=("ray", "orchestra"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    runs = [("ray", args.ray_python)] if args.ray_python else []
    runs.append(("orchestra", sys.executable))
    print(f"{'':<10}" + "".join(f"{c:>18}" for c in COLUMNS))
    for _ in range(args.rounds):
        for framework, python in runs:
            got = subprocess.run([python, os.path.abspath(__file__), "--child", framework],
                                 cwd=tempfile.gettempdir(), capture_output=True, text=True,
                                 timeout=900)
            line = got.stdout.strip().splitlines()[-1].split() if got.returncode == 0 and \
                got.stdout.strip() else [f"failed: {got.stderr.strip()[-60:]}"]
            print(f"{framework:<10}" + "".join(f"{v:>18}" for v in line), flush=True)


if __name__ == "__main__":
    main()
