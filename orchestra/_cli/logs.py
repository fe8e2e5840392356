"""``orchestra logs [--follow] [TASK|ACTOR|PID]``: the output of workers, from their files.

    where: --session DIR; else every head and node ``orchestra start`` started here
        (their session directories, from the state directory's records, and their own
        stderr.log); else the newest private session of this user (init() without an
        address: <tempdir>/orchestra-session-*)
    what:  every worker's files; PID: that worker's; an actor id: the files of the worker
        that holds it, from the actor's marker on; a task id (or one of its object ids):
        the lines that task printed (between its marker and the next one)
    --follow: then prints what is appended, as ``tail -f`` (new workers' files too)

Workers write ``<session or node dir>/logs/worker-<id>-<pid>.out|.err`` and mark whose
lines follow (_observe/log_capture.py); rotated files (``.1``) are read first.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import TextIO

from .._observe.log_capture import LOGS_DIR, MARKER
from .._platform.procutil import pid_alive
from .._runtime import cluster_file as cf

HELP = """\
orchestra logs [--follow] [--session DIR] [TASK|ACTOR|PID]

Prints what workers wrote to stdout and stderr (kept in the session's log files): all
of it, or that of one worker (its PID), of the worker holding an actor (its id), or of
one task (its id, or one of its ObjectRefs' hex). The cluster is the one `orchestra
start` started on this machine, else the newest local session (init() here); a PID, task
or actor it does not name is looked for in this user's other sessions here, newest
first; --session names a session directory. --follow keeps printing what comes.
"""
_WORKER_FILE = re.compile(r"worker-(\d+)-(\d+)\.(out|err)(\.1)?$")
_POLL_S = 0.25


def session_dirs(session: str | None = None) -> list[str]:
    """The directories whose logs/ to read, and the head and node processes' own logs."""
    if session:
        return [session]
    try:
        records = cf.read_records(cf.state_dir())
    except OSError:
        records = []
    found = [str(r["session_dir"]) for r in records
             if r.get("session_dir") and pid_alive(int(r["pid"]))]
    if found:
        return found
    mine = [d for d in glob.glob(os.path.join(tempfile.gettempdir(), "orchestra-session-*"))
            if os.path.isdir(os.path.join(d, LOGS_DIR)) and os.stat(d).st_uid == os.geteuid()]
    # A running session first, the one whose workers wrote last.
    mine.sort(key=lambda d: (_head_alive(d), os.path.getmtime(os.path.join(d, LOGS_DIR))))
    return mine[-1:]


def every_session_dir() -> list[str]:
    """Every session directory of this user here with worker logs, live or left by
    one that ended, newest first: where a PID, task or actor is looked for when the
    cluster chosen by default does not name it (another session started since)."""
    found: list[str] = []
    try:
        found += [str(r["session_dir"]) for r in cf.read_records(cf.state_dir())
                  if r.get("session_dir")]
    except OSError:
        pass
    found += glob.glob(os.path.join(tempfile.gettempdir(), "orchestra-session-*"))
    mine = []
    for d in dict.fromkeys(found):
        try:
            if os.stat(d).st_uid == os.geteuid():
                mine.append((os.path.getmtime(os.path.join(d, LOGS_DIR)), d))
        except OSError:
            continue
    return [d for _, d in sorted(mine, reverse=True)]


def _head_alive(session_dir: str) -> bool:
    try:
        with open(os.path.join(session_dir, "head.pid")) as f:
            return pid_alive(int(f.read().strip()))
    except (OSError, ValueError):
        return False


def process_logs() -> list[str]:
    """The stderr.log of each head and node ``orchestra start`` started here."""
    try:
        records = cf.read_records(cf.state_dir())
    except OSError:
        return []
    return [p for r in records if pid_alive(int(r["pid"]))
            for p in [os.path.join(r["run_dir"], cf.LOG)] if os.path.exists(p)]


def worker_files(dirs: list[str]) -> list[str]:
    """Every worker log file under ``dirs``, by worker then stream (rotated part first)."""
    out = []
    for d in dirs:
        for path in glob.glob(os.path.join(d, LOGS_DIR, "worker-*")):
            m = _WORKER_FILE.search(path)
            if m:
                out.append((int(m.group(1)), int(m.group(2)), m.group(3), not m.group(4), path))
    return [p[-1] for p in sorted(out)]


def _pid_of(path: str) -> int:
    m = _WORKER_FILE.search(path)
    return int(m.group(2)) if m else -1


def _lines(path: str) -> Iterator[str]:
    try:
        with open(path, encoding="utf-8", errors="backslashreplace") as f:
            yield from f
    except OSError:
        return


def _marker(line: str) -> tuple[str, str, str, str] | None:
    """(kind, id hex, name, the constructor's task id hex for an actor) of a marker line."""
    if not line.startswith(MARKER):
        return None
    parts = line[len(MARKER):].split() + ["", ""]
    return (parts[0], parts[1], parts[2], parts[3]) if parts[1] else None


def _shown(line: str) -> str:
    """A file's line as printed: markers as headers of what follows."""
    m = _marker(line)
    if m is None:
        return line
    return f"--- {m[0]} {m[2]} {m[1]} ---\n"


def select(files: list[str], target: str | None) -> tuple[list[str], str, str, str]:
    """The files to print, the marker kind and id whose lines alone are printed ("" =
    all lines), and (an actor's) the task marker its lines start at: for a PID, an
    actor id or a task id (a prefix of at least 8 hex digits, or an ObjectRef of the
    task)."""
    if target is None:
        return files, "", "", ""
    if target.isdigit() and len(target) < 9:
        return [f for f in files if _pid_of(f) == int(target)], "", "", ""
    want = target.lower()
    if len(want) < 8 or not re.fullmatch(r"[0-9a-f]+", want):
        raise ValueError(f"{target!r} is no PID, task id or actor id: give a worker's pid, "
                         "or the hex id of a task (get_runtime_context().get_task_id(), an "
                         "ObjectRef's .hex()) or of an actor")
    for path in files:
        for line in _lines(path):
            m = _marker(line)
            if m is not None and (m[1].startswith(want) or want.startswith(m[1])):
                pid = _pid_of(path)
                return [f for f in files if _pid_of(f) == pid], m[0], m[1], m[3]
    return [], "", want, ""


def _section(lines: Iterator[str], kind: str, ident: str, start: str = "") -> Iterator[str]:
    """The lines after the marker of (kind, ident): a task's up to the next task marker;
    an actor's to the end, from its constructor's task marker (``start``) on."""
    inside = not kind
    for line in lines:
        m = _marker(line)
        if m is not None and kind:
            if (m[0] == kind and m[1] == ident) or (start and m[0] == "task" and m[1] == start):
                inside = True
            elif kind == "task" or m[0] == "actor":
                inside = False
        if inside:
            yield line


def print_files(files: list[str], kind: str, ident: str, start: str = "",
                out: TextIO | None = None) -> dict[str, int]:
    """Print the selected lines of each file under a ``==> file <==`` header; the size
    each file had (where --follow goes on from)."""
    stream = out if out is not None else sys.stdout
    sizes = {}
    for path in files:
        try:
            sizes[path] = os.path.getsize(path)
        except OSError:
            continue
        body = list(_section(_lines(path), kind, ident, start))
        if any(_marker(line) is None for line in body):   # not markers alone
            stream.write(f"==> {path} <==\n")
            stream.writelines(_shown(line) for line in body)
    stream.flush()
    return sizes


def follow(dirs: list[str], files: list[str], sizes: dict[str, int], target: str | None) -> None:
    """Print what is appended to the files (and, with no target, new workers' files)."""
    last = next((p for p in reversed(files) if sizes.get(p)), None)   # its header is up
    while True:
        if target is None:
            files = worker_files(dirs)
        for path in files:
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            start = sizes.get(path, 0)
            if size < start:   # rotated: the new file starts over
                start = 0
            if size > start:
                with open(path, encoding="utf-8", errors="backslashreplace") as f:
                    f.seek(start)
                    data = f.read()
                if last != path:
                    sys.stdout.write(f"==> {path} <==\n")
                    last = path
                sys.stdout.writelines(_shown(line) for line in data.splitlines(True))
                sys.stdout.flush()
            sizes[path] = size
        time.sleep(_POLL_S)


def logs(argv: list[str]) -> int:
    """``orchestra logs``: see HELP."""
    p = argparse.ArgumentParser(prog="orchestra logs", description=HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?", help="a worker's PID, a task id or an actor id")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing what comes")
    p.add_argument("--session", help="a session directory (default: this machine's cluster)")
    args = p.parse_args(argv)
    dirs = session_dirs(args.session)
    if not dirs:
        print("orchestra logs: no cluster runs here and no session was left: start one "
              "(orchestra.init() or `orchestra start --head`), or give --session DIR",
              file=sys.stderr)
        return 1
    try:
        files, kind, ident, start = select(worker_files(dirs), args.target)
    except ValueError as exc:
        print(f"orchestra logs: {exc}", file=sys.stderr)
        return 2
    if args.target is not None and not files and not args.session:
        # Not in the default cluster: in this user's other sessions here, newest first.
        for other in every_session_dir():
            if other in dirs:
                continue
            found = select(worker_files([other]), args.target)
            if found[0]:
                dirs = [other]
                files, kind, ident, start = found
                print(f"orchestra logs: found in {other}", file=sys.stderr)
                break
    if args.target is not None and not files:
        print(f"orchestra logs: no worker log names {args.target} in {', '.join(dirs)} nor "
              "in this user's other sessions here (a task that printed nothing leaves no "
              "mark)", file=sys.stderr)
        return 1
    if args.target is None and not args.session:
        files = process_logs() + files
    sizes = print_files(files, kind, ident, start)
    if args.follow:
        try:
            follow(dirs, files, sizes, args.target)
        except KeyboardInterrupt:
            return 0
    return 0
