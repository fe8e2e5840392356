"""Estimate pi by throwing random darts at the unit square, in many tasks at once.

    python examples/monte_carlo_pi.py --tasks 200 --samples 1000000

Each task draws ``--samples`` points with its own seeded numpy generator and counts
those inside the quarter circle; the driver adds the counts: pi ~= 4 * inside / total.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import orchestra


@orchestra.remote
def count_inside(samples: int, seed: int) -> int:
    """How many of ``samples`` uniform points in [0, 1)^2 fall inside the unit circle."""
    rng = np.random.default_rng(seed)
    inside = 0
    for start in range(0, samples, 1_000_000):  # bounded memory whatever --samples is
        n = min(1_000_000, samples - start)
        x, y = rng.random(n), rng.random(n)
        inside += int(np.count_nonzero(x * x + y * y < 1.0))
    return inside


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100, help="number of tasks")
    parser.add_argument("--samples", type=int, default=1_000_000, help="points per task")
    parser.add_argument("--num-cpus", type=int, default=None, help="workers (default: all cores)")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.samples < 1:
        parser.error("--tasks and --samples must be >= 1")

    orchestra.init(num_cpus=args.num_cpus)
    try:
        start = time.perf_counter()
        refs = [count_inside.remote(args.samples, seed) for seed in range(args.tasks)]
        inside = sum(orchestra.get(refs))
        elapsed = time.perf_counter() - start
    finally:
        orchestra.shutdown()

    total = args.tasks * args.samples
    estimate = 4.0 * inside / total
    print(f"pi ~= {estimate:.6f} (error {abs(estimate - np.pi):.2e}) "
          f"from {total:,} samples in {args.tasks} tasks")
    print(f"time: {elapsed:.3f} s, {total / elapsed / 1e6:.1f} M samples/s")
    return estimate


if __name__ == "__main__":
    main()
