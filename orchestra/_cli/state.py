"""``orchestra list``, ``orchestra memory`` and ``orchestra timeline``: the cluster's
state from the command line, through orchestra.util.state.

    orchestra list tasks|actors|objects|nodes|workers|jobs [--json] [--limit N]
                  [--filter KEY=VALUE | KEY!=VALUE ...] [--detail]
    orchestra memory [--json] [--limit N]    objects by size, who holds them, where
    orchestra timeline -o trace.json         Chrome trace events (Perfetto, chrome://tracing)
Each connects as a driver to the cluster started on this machine (``orchestra start``),
or to ``--address IP:PORT`` (``--token``, or $ORCHESTRA_TOKEN, or the one recorded here).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

# The columns of each table (every key is in --json).
_COLUMNS = {
    "tasks": ["task_id", "name", "state", "type", "node_id", "worker_pid", "error_type",
              "job_id"],
    "actors": ["actor_id", "class_name", "state", "name", "node_id", "pid", "num_restarts"],
    "objects": ["object_id", "object_size", "location", "node_id", "ref_count", "pid", "type"],
    "nodes": ["node_id", "node_ip", "is_head_node", "state", "store_used", "store_capacity",
              "spilled_bytes"],
    "workers": ["worker_id", "worker_type", "is_alive", "state", "node_id", "pid", "actor_id"],
    "jobs": ["job_id", "status", "driver_pid", "driver_node_id", "entrypoint", "message"],
}


def _connect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="the head's IP:PORT, or an init() cluster's session directory "
                        "(default: the cluster `orchestra start` started on this machine, "
                        "else this user's one init() cluster running here)")
    p.add_argument("--token", default=None, help="the cluster token (default: $ORCHESTRA_TOKEN, "
                                                 "or the one recorded here)")


def _connect(prog: str, args: argparse.Namespace) -> bool:
    import orchestra

    from .cluster import default_address
    address = default_address(prog, args.address)
    if address is None:
        return False
    try:
        from .._api.session import connect_as_tool
        connect_as_tool()
        orchestra.init(address=address, token=args.token)
    except Exception as exc:  # noqa: BLE001 - any failure to connect is reported, not raised
        print(f"{prog}: cannot connect: {exc}", file=sys.stderr)
        return False
    return True


def _filters(items: list[str]) -> list[tuple[str, str, str]]:
    out = []
    for item in items:
        op = "!=" if "!=" in item else "="
        key, sep, value = item.partition(op)
        if not sep or not key:
            raise ValueError(f"bad --filter {item!r}: give KEY=VALUE or KEY!=VALUE, "
                             "e.g. --filter state=RUNNING")
        out.append((key.strip(), op, value.strip()))
    return out


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Rows as aligned text columns (None as "-"; user text through printable)."""
    from .cluster import printable

    def cell(v: object) -> str:
        return "-" if v is None else printable(v)
    cells = [[c.upper() for c in columns]] + [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def list_(argv: list[str]) -> int:
    """``orchestra list WHAT``: print the rows of orchestra.util.state.list_WHAT."""
    p = argparse.ArgumentParser(prog="orchestra list",
                                description="List the cluster's tasks, actors, objects, nodes, "
                                            "workers or jobs (a table, or --json).")
    p.add_argument("what", choices=sorted(_COLUMNS))
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--limit", type=int, default=100, help="at most this many rows (0: all)")
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                   help="keep rows whose KEY is VALUE (KEY!=VALUE: is not); repeatable")
    p.add_argument("--detail", action="store_true", help="more keys per row (tasks: callers)")
    _connect_args(p)
    args = p.parse_args(argv)
    try:
        filters = _filters(args.filter)
    except ValueError as exc:
        p.error(str(exc))
    if not _connect("orchestra list", args):
        return 1
    import orchestra

    from .._api import state
    try:
        rows = getattr(state, f"list_{args.what}")(filters=filters, limit=args.limit,
                                                   detail=args.detail)
    except ValueError as exc:
        print(f"orchestra list: {exc}", file=sys.stderr)
        return 2
    finally:
        orchestra.shutdown()
    print(json.dumps(rows, indent=2) if args.json else table(rows, _COLUMNS[args.what]))
    return 0


def format_memory(rows: list[dict[str, Any]]) -> str:
    """``orchestra memory``'s text: objects by size, where each lives, who holds it."""
    from .cluster import _fmt_bytes
    lines = []
    total = sum(r["object_size"] for r in rows)
    for r in rows:
        held = ", ".join(f"pid {h['pid']} ({h['type'].lower()}) x{h['count']}"
                         for h in r["holders"]) or "no process (held by tasks or objects)"
        where = r["location"].lower().replace("_", " ")
        if r["node_id"]:
            where += f" on node {r['node_id']}"
        lines.append(f"{r['object_id']}  {_fmt_bytes(r['object_size']):>10}  {where}")
        lines.append(f"    refs: {held}")
    lines.append(f"{len(rows)} object(s), {_fmt_bytes(total)}")
    return "\n".join(lines)


def memory(argv: list[str]) -> int:
    """``orchestra memory``: the cluster's objects, largest first."""
    p = argparse.ArgumentParser(prog="orchestra memory",
                                description="The cluster's objects by size: where each lives "
                                            "(inline, shared memory, spilled; which node) and "
                                            "which processes hold refs to it.")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--limit", type=int, default=100, help="the largest this many (0: all)")
    _connect_args(p)
    args = p.parse_args(argv)
    if not _connect("orchestra memory", args):
        return 1
    import orchestra

    from .._api import state
    try:
        rows = state.list_objects(limit=args.limit)
    finally:
        orchestra.shutdown()
    print(json.dumps(rows, indent=2) if args.json else format_memory(rows))
    return 0


def timeline(argv: list[str]) -> int:
    """``orchestra timeline -o FILE``: write the Chrome trace of the cluster's calls."""
    p = argparse.ArgumentParser(prog="orchestra timeline",
                                description="Write every task and actor call the head keeps "
                                            "as Chrome trace events (open the file in "
                                            "https://ui.perfetto.dev or chrome://tracing).")
    p.add_argument("-o", "--output", default="timeline.json", help="the file to write")
    _connect_args(p)
    args = p.parse_args(argv)
    if not _connect("orchestra timeline", args):
        return 1
    import orchestra
    try:
        events = orchestra.timeline()
    finally:
        orchestra.shutdown()
    with open(args.output, "w") as f:
        json.dump(events, f)
    n = sum(1 for e in events or [] if e["ph"] == "X")
    print(f"orchestra timeline: {n} call(s) written to {args.output}")
    return 0


def main(cmd: str, argv: list[str]) -> int:
    """Run ``cmd`` (list, memory or timeline) with its arguments."""
    return {"list": list_, "memory": memory, "timeline": timeline}[cmd](argv)
