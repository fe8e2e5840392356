"""From a head's SIGKILL to a detached actor answering again.

    python tools/bench_head_restart.py [--runs 10] [--on-node]

Each run: ``orchestra start --head`` (its own state directory, the default SQLite
store), a driver makes a detached named actor and calls it, the head is SIGKILLed, and
a new driver started at once connects (retrying until the restarted head answers),
finds the actor by name and calls it. Printed: per run, the seconds from the SIGKILL to
the driver connected and to the actor's answer (both include the new driver process's
own start, ~0.3 s here); then the median, min and max.

``--on-node``: the actor runs on a node joined with ``orchestra start --address``: its
process outlives the head and is taken back with its state (checked: the counter goes
on), and the driver that made it stays (it connects to the restarted head by itself);
the time is from the SIGKILL to that driver's next call answered.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from orchestra._cluster.supervisor import head_pid  # noqa: E402
from orchestra._runtime import cluster_file as cf  # noqa: E402

MAKE = """
import orchestra
orchestra.init(address="auto", namespace="bench")

@orchestra.remote
class Counter:
    def __init__(self):
        self.n = 0
    def inc(self):
        self.n += 1
        return self.n

c = Counter.options(name="c", lifetime="detached").remote()
assert orchestra.get(c.inc.remote(), timeout=60) == 1
"""

USE = """
import sys, time, orchestra
killed = float(sys.argv[1])
while True:
    try:
        orchestra.init(address="auto", namespace="bench")
        break
    except Exception:
        time.sleep(0.02)
connected = time.time()
c = orchestra.get_actor("c")
orchestra.get(c.inc.remote(), timeout=60)
print(f"{connected - killed:.3f} {time.time() - killed:.3f}")
"""


ON_NODE = """
import sys, time, orchestra
orchestra.init(address="auto", namespace="bench")

@orchestra.remote(resources={"far": 1})
class Counter:
    def __init__(self):
        self.n = 0
    def inc(self):
        self.n += 1
        return self.n

c = Counter.options(name="c", lifetime="detached").remote()
assert orchestra.get(c.inc.remote(), timeout=60) == 1
print("ready", flush=True)
killed = float(sys.stdin.readline())
time.sleep(0.05)   # (a call sent before this driver saw the head go would go with it)
assert orchestra.get(c.inc.remote(), timeout=60) == 2, "the actor's state was lost"
print(f"{time.time() - killed:.3f}", flush=True)
orchestra.shutdown()
"""


def one_run_on_node() -> float:
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, ORCHESTRA_STATE_DIR=state, PYTHONPATH=ROOT)
        run = [sys.executable, "-m", "orchestra", "start"]
        out = subprocess.run([*run, "--head", "--num-cpus", "1", "--port", "0",
                              "--state-store", "sqlite://" + os.path.join(state, "s.db")],
                             env=env, check=True, capture_output=True, text=True, timeout=120)
        try:
            [rec] = [r for r in cf.read_records(state) if r["kind"] == "head"]
            subprocess.run([*run, "--address", rec["address"], "--token", rec["token"],
                            "--num-cpus", "1", "--resources", '{"far": 1}'], env=env,
                           check=True, capture_output=True, timeout=120)
            driver = subprocess.Popen([sys.executable, "-c", ON_NODE], env=env, text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert driver.stdin is not None and driver.stdout is not None
            assert driver.stdout.readline().strip() == "ready", out.stderr
            killed = time.time()
            os.kill(head_pid(rec["run_dir"]), signal.SIGKILL)
            driver.stdin.write(f"{killed}\n")
            driver.stdin.flush()
            answered, _ = driver.communicate(timeout=120)
            assert driver.returncode == 0
            return float(answered.split()[-1])
        finally:
            subprocess.run([*run[:-1], "stop"], env=env, capture_output=True, timeout=120)


def one_run() -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, ORCHESTRA_STATE_DIR=state, PYTHONPATH=ROOT)
        subprocess.run([sys.executable, "-m", "orchestra", "start", "--head", "--num-cpus", "2",
                        "--port", "0", "--state-store", "sqlite://" + os.path.join(state, "s.db")],
                       env=env, check=True, capture_output=True, timeout=120)
        try:
            [rec] = [r for r in cf.read_records(state) if r["kind"] == "head"]
            subprocess.run([sys.executable, "-c", MAKE], env=env, check=True, timeout=120)
            killed = time.time()
            os.kill(head_pid(rec["run_dir"]), signal.SIGKILL)
            out = subprocess.run([sys.executable, "-c", USE, str(killed)], env=env, check=True,
                                 capture_output=True, text=True, timeout=120).stdout.split()
            return float(out[0]), float(out[1])
        finally:
            subprocess.run([sys.executable, "-m", "orchestra", "stop"], env=env,
                           capture_output=True, timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--on-node", action="store_true",
                    help="the actor on a joined node; the driver that made it calls it again")
    args = ap.parse_args()
    runs = args.runs
    answered = []
    if args.on_node:
        for i in range(runs):
            answered.append(one_run_on_node())
            print(f"run {i + 1}: the same driver's call answered {answered[-1]:.2f} s after the "
                  "SIGKILL, by the actor's process of before")
        print(f"answered after the SIGKILL: median {statistics.median(answered):.2f} s "
              f"(min {min(answered):.2f}, max {max(answered):.2f}, {runs} runs)")
        return
    for i in range(runs):
        connected, answer = one_run()
        answered.append(answer)
        print(f"run {i + 1}: driver connected {connected:.2f} s, actor answered {answer:.2f} s "
              "after the SIGKILL")
    print(f"actor answered after the SIGKILL: median {statistics.median(answered):.2f} s "
          f"(min {min(answered):.2f}, max {max(answered):.2f}, {runs} runs)")


if __name__ == "__main__":
    main()
