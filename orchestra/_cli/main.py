"""The ``orchestra`` command (also ``python -m orchestra``): ``orchestra start|stop|status
...`` (_cli/cluster.py), ``orchestra microbenchmark ...``, ``orchestra coordinator ...``,
``orchestra run --ray SCRIPT [ARGS]`` (orchestra/compat/ray.py); ``orchestra --version``.
Each command is one line of main() and its lines in _USAGE."""
from __future__ import annotations

import sys

_USAGE = """usage: orchestra COMMAND [ARGS]    (or: python -m orchestra COMMAND [ARGS])
       orchestra --version | -V       print orchestra's version
       orchestra COMMAND --help       a command's own options

commands:
  start            start a cluster's head (--head), or a node that joins one
                   (--address IP:PORT --token TOKEN); --block stays in the foreground
  stop             stop every head and node `orchestra start` started on this machine
  status           print the cluster's nodes, resources, object store use, tasks and
                   actors by state
  logs             print workers' output from their log files: all, or one worker's
                   (PID), actor's or task's (its id); --follow keeps printing
  list             list tasks|actors|objects|nodes|workers (a table, or --json;
                   --filter KEY=VALUE, --limit N)
  memory           the cluster's objects by size: where each lives, who holds refs
  timeline         write task and actor calls as a Chrome trace: -o trace.json
  microbenchmark   measure the hot path (add --compare ray to run Ray side by side;
                   --nodes 3 --compare ray,dask: a head and two nodes on this machine)
  coordinator      run an XLA DistributedRuntimeService coordinator (with
                   $ORCHESTRA_COORDINATOR_TOKEN set, it serves only clients sending it)
  run --ray        run a Ray Core script unchanged: `orchestra run --ray SCRIPT [ARGS]`
                   (`import ray` gives orchestra under Ray's names)
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:   # a usage error, as a command line without its command is
        print(_USAGE, file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"orchestra {version()}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("start", "stop", "status"):
        from . import cluster as _cli_cluster
        return int(getattr(_cli_cluster, cmd)(rest))
    if cmd == "logs":
        from .logs import logs
        return logs(rest)
    if cmd in ("list", "memory", "timeline"):
        from . import state as _cli_state
        return _cli_state.main(cmd, rest)
    if cmd == "microbenchmark":
        from .microbenchmark import main as bench
        return bench(rest)
    if cmd == "run":
        return _run(rest)
    if cmd == "coordinator":
        from ..coordinator import main as coord
        return coord(rest) or 0
    print(f"orchestra: unknown command {cmd!r}\n\n{_USAGE}", file=sys.stderr)
    return 2


def version() -> str:
    """The installed distribution's version; orchestra.__version__ where the package runs
    from a source tree (no metadata)."""
    from importlib import metadata
    try:
        return metadata.version("orchestra-runtime")
    except metadata.PackageNotFoundError:
        from .. import __version__
        return __version__


def _run(argv: list[str]) -> int:
    """``run --ray SCRIPT [ARGS]``: the script runs with ``import ray`` mapped to orchestra."""
    if argv[:1] in (["-h"], ["--help"]):
        print("usage: orchestra run --ray SCRIPT [ARGS]\n\nRun a Ray Core script unchanged: "
              "`import ray` in it (and in its tasks) gives orchestra under Ray's names.")
        return 0
    if not argv or argv[0] != "--ray":
        print("orchestra run: give --ray (the one mode): orchestra run --ray SCRIPT [ARGS]",
              file=sys.stderr)
        return 2
    from ..compat.ray import run_script
    return run_script(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
