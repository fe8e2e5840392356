"""Another session of this user on the machine, as CI may meet one: it starts and ends
orchestra clusters, untidily on purpose, until STOP_FILE exists; then prints how many.

    python _churn.py STOP_FILE
    all along: one init() cluster that stays up (found by `orchestra status` and the
    like, which read this user's init() clusters)
    each round, in turn: an init() cluster that runs a task and shuts down; one whose
    head is SIGKILLed (its session directory and segments left to the next init()'s
    sweep, whoever's); one that stays up 3 s (while other sessions look for clusters);
    one whose driver is SIGKILLed (its head cleans up); an
    `orchestra start --head` cluster in a state directory of its own, stopped, or its
    supervisor SIGKILLed (the head follows it)

Used by tests/integration/test_shared_machine.py.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_T = 60

_INIT = """
import os, signal, sys, orchestra
info = orchestra.init(num_cpus=1, include_dashboard=False)
@orchestra.remote
def f(x):
    return x + 1
assert orchestra.get(f.remote(1), timeout=30) == 2
ref = orchestra.put(b"x" * (2 << 20))   # a segment of its own
how = sys.argv[1]
if how == "kill_head":
    from orchestra._api import session
    os.kill(session._session.head.pid, signal.SIGKILL)
    os._exit(0)
if how == "kill_driver":
    os.kill(os.getpid(), signal.SIGKILL)
if how == "hold":
    import time
    time.sleep(3)   # up while other sessions look for clusters
orchestra.shutdown()
"""


_HOLD = """
import os, sys, time, orchestra
orchestra.init(num_cpus=1, include_dashboard=False)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
orchestra.shutdown()
"""


def _run(args: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=_T, env=env)


def main(stop_file: str) -> int:
    env = dict(os.environ, PYTHONPATH=REPO)
    rounds = 0
    hows = ["clean", "kill_head", "hold", "kill_driver", "start_stop", "start_kill"]
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, stop_file], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="churn-") as tmp:
        state = os.path.join(tmp, "state")
        cli_env = dict(env, ORCHESTRA_STATE_DIR=state)
        while not os.path.exists(stop_file):
            how = hows[rounds % len(hows)]
            if how.startswith("start"):
                _run([sys.executable, "-m", "orchestra._cli", "start", "--head", "--port", "0",
                      "--num-cpus", "1", "--include-dashboard", "false"], cli_env)
                if how == "start_kill":
                    from orchestra._runtime import cluster_file as cf
                    for rec in cf.read_records(state):
                        if rec.get("kind") == "head":
                            try:
                                os.kill(int(rec["pid"]), signal.SIGKILL)
                            except ProcessLookupError:
                                pass
                    time.sleep(0.5)
                _run([sys.executable, "-m", "orchestra._cli", "stop", "--timeout", "5"], cli_env)
            else:
                _run([sys.executable, "-c", _INIT, how], env)
            rounds += 1
    if holder.wait(_T) != 0:
        print("the cluster held up all along failed", file=sys.stderr)
        return 1
    print(rounds, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
