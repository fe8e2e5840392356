"""Progress bars made in tasks and actors, drawn on the driver (orchestra.util.tqdm;
ray.experimental.tqdm_ray under the Ray names): one line per bar, redrawn in place in a
terminal, one final line per bar elsewhere, never one log line per update.

Drivers run as scripts, their stderr a pipe or a pseudo-terminal, and the test reads what
a user would see there."""
from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = str(Path(__file__).resolve().parents[2])

DRIVER = textwrap.dedent("""
    import sys, time, orchestra
    from orchestra.util.tqdm import tqdm, safe_print

    orchestra.init(num_cpus=2)

    @orchestra.remote
    def work(i):
        for _ in tqdm(range(200), desc=f"task {i}"):
            time.sleep(0.004)
        print("work done", i)
        return i

    @orchestra.remote
    class Loader:
        def load(self, n):
            bar = tqdm(total=n, desc="actor", unit="rows")
            for _ in range(n):
                bar.update(1)
            bar.set_postfix(rows=n)
            bar.close()
            return n

    assert orchestra.get([work.remote(i) for i in range(2)] + [Loader.remote().load.remote(5000)],
                         timeout=60) == [0, 1, 5000]
    safe_print("driver line")
    orchestra.shutdown()
""")


def _run(tmp_path: Path, tty: bool) -> tuple[str, str]:
    script = tmp_path / "bars.py"
    script.write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("ORCHESTRA_ADDRESS", None)
    if not tty:
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=100, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout, r.stderr
    main, sub = pty.openpty()
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=sub,
                         env=env)
    os.close(sub)
    chunks = []
    while True:
        try:
            data = os.read(main, 1 << 16)
        except OSError:   # the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    out = p.stdout.read().decode() if p.stdout else ""
    assert p.wait(timeout=100) == 0
    os.close(main)
    return out, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


BAR = re.compile(r"^(task \d|actor): +\d+%\|")


def test_bars_from_tasks_and_actors_print_once_each_where_stderr_is_no_terminal(tmp_path):
    out, err = _run(tmp_path, tty=False)
    bars = [line for line in err.splitlines() if BAR.match(line)]
    # One line per bar, its final state, not one line per update (200 and 5,000 of them).
    assert sorted(b.split(":")[0] for b in bars) == ["actor", "task 0", "task 1"], err
    for b in bars:
        assert re.search(r"100%\|#+\| (200/200|5000/5000) ", b), b
    assert "rows=5000" in next(b for b in bars if b.startswith("actor")), bars
    assert "orchestra-bar" not in out + err   # the lines that carry them are never shown
    assert "work done 0" in out and "work done 1" in out and "driver line" in out


def test_bars_are_redrawn_in_place_in_a_terminal(tmp_path):
    out, err = _run(tmp_path, tty=True)
    assert "\x1b[" in err and re.search(r"\x1b\[\dA", err), err[:500]   # cursor up: redrawn
    # What stays on the screen once every bar closed: each bar's final line, once.
    finals = [line for line in err.split("\n") if re.search(r"100%\|#+\|", line)]
    names = sorted(re.sub(r"^.*\x1b\[J", "", f).split(":")[0] for f in finals)
    assert names == ["actor", "task 0", "task 1"], finals
    # Redraws, not new lines: far fewer lines than updates reached the terminal.
    assert err.count("\n") < 200, err.count("\n")
    assert "orchestra-bar" not in out + err
    assert "work done 0" in out


def test_bar_options_and_errors(no_cluster):
    from orchestra.util.tqdm import tqdm
    with pytest.raises(TypeError, match="options it does not take: colors"):
        tqdm(range(3), colors=True)
    bar = tqdm(range(4), desc="here", disable=True)   # in the driver, drawn here; disabled
    assert list(bar) == [0, 1, 2, 3] and bar.n == 4 and len(bar) == 4
    with pytest.raises(TypeError, match="update"):
        iter(tqdm(total=3)).__next__()
