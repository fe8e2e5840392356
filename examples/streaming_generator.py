"""Stream results out of a running task, and out of an actor, as they are made.

    python examples/streaming_generator.py --chunks 8 --mb 4

A generator task yields ``--chunks`` arrays of ``--mb`` MB (each goes to shared memory
and is read zero-copy); the driver reads each one as soon as it is yielded, while the
task makes the next, and with backpressure the task never runs more than two chunks
ahead. Then an async actor streams words of a sentence, read with ``async for``.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np

import orchestra


@orchestra.remote(_generator_backpressure_num_objects=2)
def chunks(n: int, nbytes: int) -> Any:
    """Yield n arrays of nbytes each; chunk i is filled with i."""
    for i in range(n):
        time.sleep(0.05)   # the work of one chunk
        yield np.full(nbytes // 8, float(i))


@orchestra.remote
class Speaker:
    async def words(self, sentence: str) -> Any:
        for word in sentence.split():
            await asyncio.sleep(0.01)
            yield word


async def read_words(speaker: Any, sentence: str) -> list[str]:
    return [await ref async for ref in speaker.words.remote(sentence)]


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=8, help="arrays the task yields")
    parser.add_argument("--mb", type=float, default=4.0, help="size of each array (MB)")
    parser.add_argument("--num-cpus", type=int, default=None, help="workers (default: all cores)")
    args = parser.parse_args(argv)
    if args.chunks < 1 or args.mb <= 0:
        parser.error("--chunks must be >= 1 and --mb > 0")

    orchestra.init(num_cpus=args.num_cpus)
    try:
        start = time.perf_counter()
        total, first_s = 0.0, None
        for ref in chunks.remote(args.chunks, int(args.mb * 1e6)):
            chunk = orchestra.get(ref)            # a read-only view of shared memory
            total += float(chunk[0])
            if first_s is None:
                first_s = time.perf_counter() - start
            del chunk, ref                        # its memory goes back to the store
        elapsed = time.perf_counter() - start
        words = asyncio.run(read_words(Speaker.remote(), "streams arrive while the task runs"))
    finally:
        orchestra.shutdown()

    print(f"{args.chunks} chunks of {args.mb:g} MB, sum of firsts = {total:g}")
    print(f"first chunk after {first_s:.3f} s, all after {elapsed:.3f} s")
    print("words: " + " ".join(words))
    return total


if __name__ == "__main__":
    main()
