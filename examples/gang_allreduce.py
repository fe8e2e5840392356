"""A gang of actors that sum a tensor with torch.distributed (gloo, on CPU).

    python examples/gang_allreduce.py --members 4

orchestra.gang starts the members together and gives each its rank; torch_env() hands
them the rendezvous (MASTER_ADDR/PORT from member 0, RANK, WORLD_SIZE, ...), so
``init_process_group("gloo")`` needs no other setup. Member r contributes r + 1; after
all_reduce every member holds 1 + 2 + ... + n. With GPUs, ask for ``--gpus-per-member 1``
and use "nccl" the same way.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from datetime import timedelta

import orchestra


class AllReduceMember:
    """One member: joins the torch process group lazily, on its first all_reduce."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.ctx = orchestra.gang_context()

    def all_reduce(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            os.environ.update(self.ctx.torch_env())
            dist.init_process_group("gloo", timeout=timedelta(seconds=self.timeout_s))
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor)   # sum over the members, in place
        return [float(v) for v in tensor]

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4, help="gang size (torch world size)")
    parser.add_argument("--gpus-per-member", type=int, default=0,
                        help="GPUs per member (default 0: gloo on CPU)")
    parser.add_argument("--num-cpus", type=int, default=None, help="workers (default: all cores)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds for the gang to form and for each collective")
    args = parser.parse_args(argv)
    if args.members < 1:
        parser.error("--members must be >= 1")
    if importlib.util.find_spec("torch") is None:
        sys.exit("gang_allreduce.py needs PyTorch: pip install torch (a CPU build is enough)")

    orchestra.init(num_cpus=args.num_cpus)
    try:
        start = time.perf_counter()
        with orchestra.gang(AllReduceMember, args.members, args=(args.timeout,),
                            num_gpus=args.gpus_per_member, timeout_s=args.timeout) as gang:
            values = [[float(rank + 1), 1.0] for rank in range(args.members)]
            refs = [member.all_reduce.remote(v) for member, v in zip(gang, values, strict=True)]
            results = orchestra.get(refs, timeout=args.timeout)
            orchestra.get(gang.call("close"), timeout=args.timeout)
        elapsed = time.perf_counter() - start
    finally:
        orchestra.shutdown()

    total = results[0]
    expected = [args.members * (args.members + 1) / 2, float(args.members)]
    print(f"all_reduce over {args.members} members: sum = {total[0]:g}, count = {total[1]:g}")
    print(f"expected: sum = {expected[0]:g}, count = {expected[1]:g}; "
          f"every member agrees: {all(r == total for r in results)}")
    print(f"time: {elapsed:.2f} s (gang start, torch import, process group, all_reduce)")
    if total != expected or any(r != total for r in results):
        sys.exit("all_reduce gave a wrong result")
    return total


if __name__ == "__main__":
    main()
