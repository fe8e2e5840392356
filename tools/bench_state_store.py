"""How fast the head's state store takes its records, and what a store costs actor
creations.

    python tools/bench_state_store.py [--records 20000] [--actors 40] [--redis URL]

1. The store's thread alone (HeadState.write from one thread, as the head's loop calls
   it): records of the size of a detached actor's (~1 KiB) written per second, SQLite
   (a file in a temporary directory) and, with --redis, that Redis.
2. Detached actors created end to end on ``orchestra start --head`` (num_cpus=0 each,
   created and one call answered), with the default SQLite store and with none (port 0
   keeps none): actors per second and the records the head wrote.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from orchestra._head import state_store as ss  # noqa: E402

CREATE = """
import sys, time, orchestra
orchestra.init(address="auto")

@orchestra.remote(num_cpus=0)
class Keeper:
    def ping(self):
        return 1

n = int(sys.argv[1])
t0 = time.perf_counter()
handles = [Keeper.options(name=f"k{i}", lifetime="detached").remote() for i in range(n)]
assert sum(orchestra.get([h.ping.remote() for h in handles], timeout=600)) == n
took = time.perf_counter() - t0
for h in handles:
    orchestra.kill(h)
print(f"{n / took:.1f}")
"""


def store_rate(url: str, records: int) -> float:
    head = ss.HeadState(url, "bench", "tok", print, lambda _text: None)
    head.start()
    value = os.urandom(1024)
    t0 = time.perf_counter()
    for i in range(records):
        head.write("actors", f"{i:08x}", value)
    while head.writes < records:
        time.sleep(0.001)
    took = time.perf_counter() - t0
    for i in range(records):
        head.write("actors", f"{i:08x}", None)
    head.stop()
    return records / took


def actors_rate(n: int, store: bool) -> float:
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, ORCHESTRA_STATE_DIR=state, PYTHONPATH=ROOT)
        args = [sys.executable, "-m", "orchestra", "start", "--head", "--num-cpus", "2"]
        args += ["--state-store", "sqlite://" + os.path.join(state, "s.db")] if store else \
            ["--port", "0"]
        subprocess.run(args, check=True, env=env, capture_output=True, timeout=120)
        try:
            r = subprocess.run([sys.executable, "-c", CREATE, str(n)], env=env, text=True,
                               capture_output=True, timeout=900)
            if r.returncode != 0:
                raise SystemExit(r.stderr)
            return float(r.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run([sys.executable, "-m", "orchestra", "stop"], env=env,
                           capture_output=True, timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--actors", type=int, default=40)
    ap.add_argument("--redis", default="", help="redis://HOST:PORT/DB to measure too")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        print(f"sqlite store: {store_rate('sqlite://' + os.path.join(d, 'h.db'), a.records):,.0f} "
              "records/s (1 KiB each)")
    if a.redis:
        print(f"redis store:  {store_rate(a.redis, a.records):,.0f} records/s (1 KiB each)")
    for store in (False, True):
        rate = actors_rate(a.actors, store)
        print(f"{a.actors} detached actors created and called, "
              f"{'SQLite store' if store else 'no store    '}: {rate:.1f} actors/s")


if __name__ == "__main__":
    main()
