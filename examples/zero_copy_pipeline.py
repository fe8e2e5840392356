"""Put one large numpy array into shared memory once; many tasks read slices of it.

    python examples/zero_copy_pipeline.py --mb 200 --tasks 16

``orchestra.put`` copies the array into the object store once. Every ``get`` of it, in
the driver or in a task (an ObjectRef passed as an argument arrives as its value), maps
that shared memory: a read-only numpy view, no copy. Each task reduces its slice to
partial sums; the driver adds them up.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import orchestra


def is_zero_copy_view(a: np.ndarray) -> bool:
    """A read-only array that does not own its memory: a view of the shared segment."""
    return not a.flags.writeable and not a.flags.owndata


@orchestra.remote
def partial_sums(data: np.ndarray, start: int, stop: int) -> tuple[float, float, bool]:
    """(sum, sum of squares) of data[start:stop], and whether ``data`` arrived zero-copy."""
    part = data[start:stop]
    return float(part.sum()), float(np.dot(part, part)), is_zero_copy_view(data)


def main(argv: list[str] | None = None) -> tuple[float, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200, help="array size in MB (float64)")
    parser.add_argument("--tasks", type=int, default=16, help="number of slices, one task each")
    parser.add_argument("--passes", type=int, default=3, help="times to run all the tasks")
    parser.add_argument("--num-cpus", type=int, default=None, help="workers (default: all cores)")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.passes < 1 or args.mb <= 0:
        parser.error("--tasks and --passes must be >= 1 and --mb > 0")

    data = np.random.default_rng(0).random(int(args.mb * 1e6) // 8)
    gb = data.nbytes / 1e9
    orchestra.init(num_cpus=args.num_cpus, object_store_memory=max(64 << 20, 2 * data.nbytes))
    try:
        t0 = time.perf_counter()
        ref = orchestra.put(data)                    # the one copy, into shared memory
        t_put = time.perf_counter() - t0

        t0 = time.perf_counter()
        view = orchestra.get(ref)                    # maps the segment: no copy
        t_get = time.perf_counter() - t0
        driver_view = is_zero_copy_view(view)
        try:
            view[0] = 0.0
            read_only = False
        except ValueError:                           # "assignment destination is read-only"
            read_only = True
        del view

        bounds = np.linspace(0, len(data), args.tasks + 1).astype(int)
        t_tasks = []
        for _ in range(args.passes):                 # the first pass also warms up the workers
            t0 = time.perf_counter()
            refs = [partial_sums.remote(ref, int(a), int(b))
                    for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            parts = orchestra.get(refs)
            t_tasks.append(time.perf_counter() - t0)
    finally:
        orchestra.shutdown()

    total = sum(p[0] for p in parts)
    total_sq = sum(p[1] for p in parts)
    print(f"array: {data.nbytes / 1e6:.0f} MB in {args.tasks} slices")
    print(f"put:   {t_put * 1e3:8.1f} ms  {gb / t_put:6.2f} GB/s (the only copy)")
    print(f"get:   {t_get * 1e3:8.3f} ms  zero-copy view: {driver_view}, read-only: {read_only}")
    for i, t in enumerate(t_tasks, 1):
        print(f"pass {i}: {t * 1e3:7.1f} ms  {gb / t:6.2f} GB/s read by {args.tasks} tasks")
    print(f"zero-copy in every task: {all(p[2] for p in parts)}")
    print(f"sum = {total!r}")
    print(f"sum of squares = {total_sq!r}")
    return total, total_sq


if __name__ == "__main__":
    main()
