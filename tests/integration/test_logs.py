"""Workers' output on a real cluster: each line on the terminal of the driver whose task
or actor printed it, prefixed ``(name pid=N)`` (and ``ip=`` on a cluster of several
nodes), stderr on stderr, repeated lines folded; the per-worker log files and
``orchestra logs``; remote tracebacks naming the user's file and line; process titles.

Drivers run as subprocesses (a script file, as ``python script.py``), so what they
print is read as a user sees it. One script does the work of several tests (a cluster
start is the costly part); each test checks one behaviour of its result.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import orchestra

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DRIVER = textwrap.dedent('''
    import json, linecache, os, subprocess, sys, time
    import orchestra

    @orchestra.remote
    def shout(word):
        print(word)
        print(word + " on stderr", file=sys.stderr)
        os.write(1, b"written by C code\\n")
        return orchestra.get_runtime_context().get_task_id(), os.getpid()

    @orchestra.remote
    def parent():
        return orchestra.get(shout.remote("nested-line"))

    @orchestra.remote
    class Counter:
        def __init__(self):
            print("counter-made")

        def incr(self):
            print("counter-incr")
            return orchestra.get_runtime_context().get_actor_id(), os.getpid()

    @orchestra.remote
    def titled():
        with open("/proc/self/cmdline") as f:
            return f.read().strip("\\0 ")

    @orchestra.remote
    def fail():
        raise ValueError("boom from the script")

    SECOND = """
    import sys, orchestra
    orchestra.init(address=sys.argv[1])
    @orchestra.remote
    def other():
        print("second-driver-line")
    orchestra.get(other.remote())
    orchestra.shutdown()
    """

    def cmdline(pid):
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().strip("\\0 ")

    def ppid(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    def main():
        info = orchestra.init(num_cpus=2)
        session = info["session_dir"]
        out = {"session_dir": session}
        out["task"] = orchestra.get(shout.remote("first-line"))
        orchestra.get(parent.remote())
        c = Counter.remote()
        out["actor"] = orchestra.get(c.incr.remote())
        out["running_title"] = orchestra.get(titled.remote())
        try:
            orchestra.get(fail.remote())
        except Exception as exc:
            out["error"] = str(exc)
        src = "def cell():\\n    raise KeyError('raised in a cell')\\n"
        name = "<ipython-input-7-0123456789ab>"
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)   # as IPython does
        ns = {}
        exec(compile(src, name, "exec"), ns)
        try:
            orchestra.get(orchestra.remote(ns["cell"]).remote())
        except Exception as exc:
            out["cell_error"] = str(exc)
        r = subprocess.run([sys.executable, "-c", SECOND, session], capture_output=True,
                           text=True, timeout=60)
        out["second_stdout"] = r.stdout
        with open(os.path.join(session, "head.pid")) as f:
            head = int(f.read())
        worker = out["task"][1]
        time.sleep(0.3)   # idle for longer than a moment: titled idle
        out["titles"] = {"head": cmdline(head), "worker": cmdline(worker),
                         "forkserver": cmdline(ppid(worker)), "actor": cmdline(out["actor"][1])}
        logs = {}
        for key, target in (("pid", str(worker)), ("task", out["task"][0]),
                            ("actor", out["actor"][0])):
            r = subprocess.run([sys.executable, "-m", "orchestra._cli", "logs", "--session",
                                session, target], capture_output=True, text=True, timeout=60)
            logs[key] = r.stdout + r.stderr
        out["logs"] = logs
        shout.remote("while-sleeping")   # nobody waits in get(): printed all the same
        time.sleep(1.5)
        print("AFTER-SLEEP", flush=True)
        shout.remote("just-before-shutdown")
        time.sleep(0.2)
        print("RESULT " + json.dumps(out), flush=True)
        orchestra.shutdown()

    if __name__ == "__main__":
        main()
''')


def _run(path: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("ORCHESTRA_ADDRESS", None)
    return subprocess.run([sys.executable, path], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=os.path.dirname(path))


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """The script's run: (stdout, stderr, its RESULT, the script's path)."""
    path = str(tmp_path_factory.mktemp("logs") / "script.py")
    with open(path, "w") as f:
        f.write(DRIVER)
    r = _run(path)
    assert r.returncode == 0, r.stdout + r.stderr
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    stdout = r.stdout.replace(line + "\n", "")
    return stdout, r.stderr, json.loads(line[len("RESULT "):]), path


def test_a_print_in_a_task_shows_on_its_driver_prefixed_with_the_function_and_pid(driver):
    stdout, _, result, _ = driver
    assert f"(shout pid={result['task'][1]}) first-line" in stdout.splitlines()


def test_stderr_of_a_task_goes_to_the_drivers_stderr(driver):
    stdout, stderr, _, _ = driver
    assert "first-line on stderr" in stderr
    assert "on stderr" not in stdout


def test_a_second_driver_sees_its_own_tasks_output_and_not_the_others(driver):
    stdout, _, result, _ = driver
    assert "second-driver-line" in result["second_stdout"]
    assert "first-line" not in result["second_stdout"]
    assert "second-driver-line" not in stdout


def test_nested_tasks_and_actor_calls_print_on_the_root_driver(driver):
    stdout, _, result, _ = driver
    assert "nested-line" in stdout
    assert f"(Counter pid={result['actor'][1]}) counter-made" in stdout
    assert f"(Counter pid={result['actor'][1]}) counter-incr" in stdout


def test_output_shows_while_the_driver_sleeps_and_before_shutdown_returns(driver):
    stdout, _, _, _ = driver
    lines = stdout.splitlines()
    (sleeping,) = [i for i, x in enumerate(lines) if x.endswith(" while-sleeping")]
    assert sleeping < lines.index("AFTER-SLEEP")
    assert any(x.endswith(" just-before-shutdown") for x in lines)


def test_a_remote_traceback_names_the_scripts_file_line_and_source(driver):
    _, _, result, path = driver
    line = DRIVER.splitlines().index('    raise ValueError("boom from the script")') + 1
    assert f'File "{path}", line {line}, in fail' in result["error"]
    assert 'raise ValueError("boom from the script")' in result["error"]
    assert "<dynamic-code>" not in result["error"]


def test_a_remote_traceback_of_notebook_code_shows_the_cells_line(driver):
    _, _, result, _ = driver
    assert 'File "<ipython-input-7-0123456789ab>", line 2, in cell' in result["cell_error"]
    assert "raise KeyError('raised in a cell')" in result["cell_error"]


def test_processes_are_titled_by_what_they_run(driver):
    _, _, result, _ = driver
    assert result["titles"] == {"head": "orchestra::head", "worker": "orchestra::worker",
                                "forkserver": "orchestra::forkserver",
                                "actor": "orchestra::actor Counter"}
    assert result["running_title"] == "orchestra::worker titled"


def test_orchestra_logs_prints_a_workers_files_by_pid(driver):
    _, _, result, _ = driver
    text = result["logs"]["pid"]
    assert f"worker-1-{result['task'][1]}.out" in text or f"-{result['task'][1]}.out" in text
    assert "first-line" in text and "first-line on stderr" in text


def test_orchestra_logs_prints_what_one_task_printed(driver):
    _, _, result, _ = driver
    text = result["logs"]["task"]
    assert "first-line" in text
    assert "nested-line" not in text and "counter-incr" not in text


def test_orchestra_logs_prints_the_output_of_the_worker_holding_an_actor(driver):
    _, _, result, _ = driver
    text = result["logs"]["actor"]
    assert "counter-made" in text and "counter-incr" in text
    assert "first-line" not in text


def test_the_log_files_go_with_the_session_directory(driver):
    _, _, result, _ = driver
    assert not os.path.exists(result["session_dir"])


FOLD = textwrap.dedent('''
    import time, orchestra

    @orchestra.remote
    def same(i):
        print("the very same line")
        time.sleep(0.05)

    orchestra.init(num_cpus=2)
    orchestra.get([same.remote(i) for i in range(12)])
    orchestra.shutdown()
''')


def test_identical_lines_of_many_workers_are_folded_into_a_repeated_count(tmp_path):
    path = str(tmp_path / "fold.py")
    with open(path, "w") as f:
        f.write(FOLD)
    r = _run(path)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if "the very same line" in x]
    assert 2 <= len(lines) < 12, r.stdout
    assert any(x.endswith("x across cluster]") and "[repeated " in x for x in lines), r.stdout


QUIET = textwrap.dedent('''
    import glob, json, os
    os.environ["ORCHESTRA_LOG_MAX_BYTES"] = "4096"   # the workers inherit it
    import orchestra

    @orchestra.remote
    def hidden():
        print("a line kept in the files only")
        os.write(1, b"written by C code\\n")
        for i in range(300):
            print(f"line {i:04d} " + "x" * 90)
        return os.getpid()

    info = orchestra.init(num_cpus=1, log_to_driver=False)
    pid = orchestra.get(hidden.remote())
    (out,) = glob.glob(os.path.join(info["session_dir"], "logs", f"worker-*-{pid}.out"))
    with open(out) as f:
        text = f.read()
    print("RESULT " + json.dumps({"size": os.path.getsize(out), "rotated": os.path.exists(out + ".1"),
                                  "last": "line 0299" in text}))
    orchestra.shutdown()
''')


def test_log_to_driver_false_prints_nothing_and_capped_files_keep_the_latest(tmp_path):
    path = str(tmp_path / "quiet.py")
    with open(path, "w") as f:
        f.write(QUIET)
    r = _run(path)
    assert r.returncode == 0, r.stderr
    assert "kept in the files" not in r.stdout + r.stderr
    assert "line 0001" not in r.stdout and "written by C code" not in r.stdout
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result == {"size": result["size"], "rotated": True, "last": True}
    assert result["size"] < 4096 + 1024


def test_c_level_output_of_a_task_lands_in_its_workers_file(driver):
    _, _, result, _ = driver
    assert "written by C code" in result["logs"]["pid"]


@orchestra.remote(resources={"far": 1})
def print_far() -> int:
    print("printed on the far node")
    return os.getpid()


def test_a_worker_on_another_node_prints_on_the_driver_with_its_address(capfd):
    from _helpers import joined_cluster
    with joined_cluster({"num_cpus": 1}, {"num_cpus": 1, "resources": {"far": 1}}):
        pid = orchestra.get(print_far.remote())
        deadline = time.monotonic() + 10
        seen = ""
        while "printed on the far node" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
            seen += capfd.readouterr().out
    assert f"(print_far pid={pid}, ip=" in seen
    assert ") printed on the far node" in seen


@orchestra.remote
def print_started() -> int:
    print("printed on the started cluster")
    return os.getpid()


@pytest.mark.shared_machine
def test_orchestra_logs_finds_the_cluster_orchestra_start_started_here(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHESTRA_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("ORCHESTRA_ADDRESS", raising=False)
    env = dict(os.environ, PYTHONPATH=ROOT)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "orchestra._cli", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    r = cli("start", "--head", "--port", "0", "--num-cpus", "1",
            "--object-store-memory", str(64 << 20))
    assert r.returncode == 0, r.stderr
    try:
        if orchestra.is_initialized():
            orchestra.shutdown()
        orchestra.init(address="auto", log_to_driver=False)
        try:
            pid = orchestra.get(print_started.remote())
        finally:
            orchestra.shutdown()
        r = cli("logs", str(pid))
        assert r.returncode == 0, r.stderr
        assert "printed on the started cluster" in r.stdout
        assert "printed on the started cluster" in cli("logs").stdout
        missing = cli("logs", "12345678")
        assert missing.returncode == 1 and "no worker log names 12345678" in missing.stderr
    finally:
        cli("stop", "--timeout", "5")


_SESSION = """
import os, sys, orchestra
orchestra.init(num_cpus=1, log_to_driver=False)

@orchestra.remote
def mark(text):
    print(text, flush=True)
    return os.getpid()

print(orchestra.get(mark.remote(sys.argv[1])), flush=True)
sys.stdin.readline()
orchestra.shutdown()
"""


@pytest.mark.shared_machine
def test_orchestra_logs_finds_a_pid_in_an_older_session_of_this_user(tmp_path, monkeypatch):
    """A crash message says `orchestra logs PID`; with a session of the same user started
    since, the default (the newest session) did not name that PID, and the command said
    so instead of looking further."""
    monkeypatch.setenv("ORCHESTRA_STATE_DIR", str(tmp_path / "state"))   # no start cluster
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("ORCHESTRA_ADDRESS", None)
    sessions = []
    try:
        pids = []
        for text in ("from-the-older-session", "from-the-newer-session"):
            p = subprocess.Popen([sys.executable, "-c", _SESSION, text], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            sessions.append(p)
            pids.append(int(p.stdout.readline()))
            time.sleep(0.2)   # the second session's logs are the newer
        r = subprocess.run([sys.executable, "-m", "orchestra._cli", "logs", str(pids[0])],
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "from-the-older-session" in r.stdout and "newer" not in r.stdout
        assert "found in " in r.stderr
    finally:
        for p in sessions:
            p.stdin.write("\n")
            p.stdin.flush()
        for p in sessions:
            p.wait(60)
