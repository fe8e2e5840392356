"""Train a toy model with a parameter server: one actor holds the weights, tasks push gradients.

    python examples/parameter_server.py --workers 4 --rounds 10 --dim 1000000

The ParameterServer actor keeps the numpy weights for its whole life. Each round, every
worker task fetches the current weights from it, computes a fake gradient (that of
0.5 * ||w - target||^2, plus a little noise) and pushes it back; the actor applies each
gradient as it arrives (asynchronous SGD), so the weights move towards the target.
Weights above 100 KB travel through shared memory: a task reads them without a copy.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import orchestra


def make_target(dim: int) -> np.ndarray:
    """The weights the fake loss is minimal at (every task computes the same one)."""
    return np.linspace(-1.0, 1.0, dim)


@orchestra.remote
class ParameterServer:
    """Holds the weights; applies every pushed gradient, one call at a time."""

    def __init__(self, dim: int, learning_rate: float) -> None:
        self.weights = np.zeros(dim)
        self.learning_rate = learning_rate
        self.updates = 0

    def get_weights(self) -> np.ndarray:
        return self.weights

    def apply_gradients(self, gradient: np.ndarray) -> int:
        self.weights -= self.learning_rate * gradient
        self.updates += 1
        return self.updates


@orchestra.remote
def train_step(server: Any, worker: int, step: int, noise: float) -> float:
    """Fetch the weights, compute a fake gradient, push it; returns the loss it saw."""
    weights = orchestra.get(server.get_weights.remote())
    error = weights - make_target(len(weights))
    rng = np.random.default_rng([worker, step])
    gradient = error + rng.normal(scale=noise, size=error.shape)
    orchestra.get(server.apply_gradients.remote(gradient))
    return 0.5 * float(np.dot(error, error))


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="worker tasks per round")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of training")
    parser.add_argument("--dim", type=int, default=1_000_000, help="number of weights")
    parser.add_argument("--learning-rate", type=float, default=0.3)
    parser.add_argument("--noise", type=float, default=1e-3, help="gradient noise (std)")
    parser.add_argument("--num-cpus", type=int, default=None, help="workers (default: all cores)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.rounds < 1 or args.dim < 1:
        parser.error("--workers, --rounds and --dim must be >= 1")

    orchestra.init(num_cpus=args.num_cpus)
    try:
        start = time.perf_counter()
        server = ParameterServer.remote(args.dim, args.learning_rate)
        for step in range(args.rounds):
            losses = orchestra.get([train_step.remote(server, w, step, args.noise)
                                    for w in range(args.workers)])
            print(f"round {step + 1}: mean loss seen {np.mean(losses):.4g}")
        weights = orchestra.get(server.get_weights.remote())
        updates = orchestra.get(server.apply_gradients.remote(np.zeros(args.dim))) - 1
        elapsed = time.perf_counter() - start
    finally:
        orchestra.shutdown()

    norm = float(np.linalg.norm(weights))
    target = make_target(args.dim)
    print(f"final weights: norm {norm:.6f} (target norm {np.linalg.norm(target):.6f}, "
          f"distance {np.linalg.norm(weights - target):.3e})")
    print(f"{updates} updates from {args.workers} workers in {args.rounds} rounds")
    print(f"time: {elapsed:.3f} s")
    return norm


if __name__ == "__main__":
    main()
