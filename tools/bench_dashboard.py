"""What the dashboard costs the head, in figures (prints them; asserts nothing).

    python tools/bench_dashboard.py [--seconds 20] [--actors 1000] [--tasks 100000] [--views-only]

1. The head's CPU (its /proc/<pid>/stat over the window) idle, without and with the page
   open in headless Chromium (the system's, driven by Playwright) on each view.
2. The same and the driver's no-op task throughput while a driver submits as fast as it
   can (``--load-seconds``), without and with the page open on the task stream.
3. With --tasks task records in the head's table (run as no-op tasks) and --actors actors
   (each a process: num_cpus=0): each view's poll, its answer's bytes and the page's update
   time (fetch and draw, measured in the page with performance.now()).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
import urllib.request
from typing import Any

import orchestra


def head_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def head_pid(session_dir: str) -> int:
    with open(os.path.join(session_dir, "head.pid")) as f:
        return int(f.read().strip())


@orchestra.remote(num_cpus=0)
class Idle:
    def ping(self) -> int:
        return 1


@orchestra.remote
def noop() -> None:
    return None


def cpu_share(pid: int, seconds: float, work: Any = None) -> tuple[float, int]:
    """The head's CPU share of a core over ``seconds`` (and the tasks ``work`` ran)."""
    c0, t0 = head_cpu_s(pid), time.monotonic()
    done = 0
    if work is None:
        time.sleep(seconds)
    else:
        while time.monotonic() - t0 < seconds:
            done += work()
    return (head_cpu_s(pid) - c0) / (time.monotonic() - t0), done


def burst() -> int:
    orchestra.get([noop.remote() for _ in range(2000)])
    return 2000


class StreamPoller:
    """Polls api/stream once a second, as the page does (without a browser's CPU)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.bytes = self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        seq = 0
        while not self._stop.wait(1.0):
            with urllib.request.urlopen(f"{self.url}api/stream?since={seq}") as r:
                body = r.read()
            seq = json.loads(body)["seq"]
            self.bytes += len(body)
            self.polls += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--load-seconds", type=float, default=15.0)
    ap.add_argument("--actors", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--views-only", action="store_true",
                    help="skip the CPU figures (idle, load): only the views' update times")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    info = orchestra.init(num_cpus=2)
    url, pid = info["dashboard_url"], head_pid(info["session_dir"])
    burst()
    print(f"head pid {pid}, {os.cpu_count()} cores")
    time.sleep(10)   # the start-up's own work (workers importing the driver's modules) done
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        if not args.views_only:
            cpu_figures(args, url, pid, page)
        views(args, url, page)
        browser.close()
    print(json.dumps({"done": True}))
    orchestra.shutdown()
    sys.exit(0)


def cpu_figures(args: Any, url: str, pid: int, page: Any) -> None:
    share, _ = cpu_share(pid, args.seconds)
    print(f"idle, no page:                head {share * 100:.2f}% of a core")
    for view in ("overview", "stream", "nodes", "tasks"):
        page.goto(url + "#" + view)
        page.wait_for_selector("body[data-loaded='1']")
        time.sleep(2)
        share, _ = cpu_share(pid, args.seconds)
        print(f"idle, page on {view:9s}:      head {share * 100:.2f}% of a core")
    page.goto("about:blank")
    share, n = cpu_share(pid, args.load_seconds, burst)
    print(f"load, no page:                head {share * 100:.1f}% of a core, "
          f"{n / args.load_seconds:,.0f} tasks/s")
    poller = StreamPoller(url)
    poller.start()
    share, n = cpu_share(pid, args.load_seconds, burst)
    poller.stop()
    print(f"load, stream polled (HTTP):   head {share * 100:.1f}% of a core, "
          f"{n / args.load_seconds:,.0f} tasks/s; {poller.bytes / max(poller.polls, 1):,.0f} "
          f"bytes per poll")
    page.goto(url + "#stream")
    page.wait_for_selector("body[data-view='stream']")
    share, n = cpu_share(pid, args.load_seconds, burst)
    stats = page.evaluate("window.orchestraStats")
    print(f"load, page on the stream:     head {share * 100:.1f}% of a core, "
          f"{n / args.load_seconds:,.0f} tasks/s; stream draw {stats['renderMs']:.1f} ms")


def views(args: Any, url: str, page: Any) -> None:
    # Many records and actors.
    have = 0
    while have < args.tasks:
        have += burst()
    actors = []
    for i in range(0, args.actors, 50):
        batch = [Idle.remote() for _ in range(min(50, args.actors - i))]
        orchestra.get([a.ping.remote() for a in batch])
        actors += batch
    print(f"{len(actors)} actors alive, {have:,} more task records")
    time.sleep(10)
    for path in ("summary", "actors", "tasks", "stream?since=0", "history?since=0",
                 "objects", "drivers"):
        took = []
        for _ in range(3):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url + "api/" + path) as r:
                size = len(r.read())
            took.append(time.perf_counter() - t0)
        print(f"api/{path:16s}: {sorted(took)[1] * 1000:7.1f} ms, {size:>9,} bytes")
    for view, fn in (("overview", "poll"), ("actors", "pollActors"), ("tasks", "pollTasks"),
                     ("stream", "pollStream"), ("nodes", "pollNodes"),
                     ("objects", "pollObjects"), ("drivers", "pollDrivers")):
        page.goto(url + "#" + view)
        page.wait_for_selector("body[data-loaded='1']")
        time.sleep(2.5)
        got = page.evaluate("""async (fn) => {
            const before = window.orchestraStats.bytes, polls = window.orchestraStats.polls;
            const t0 = performance.now();
            if (fn !== "poll") await window[fn](); else {
              const r = await fetch("api/summary"); const t = await r.text();
              window.orchestraStats.bytes += t.length; window.orchestraStats.polls += 1;
              render(JSON.parse(t)); }
            return [performance.now() - t0, window.orchestraStats.bytes - before,
                    window.orchestraStats.polls - polls];
        }""", fn)
        print(f"view {view:9s}: update {got[0]:7.1f} ms, {got[1]:>9,} bytes in "
              f"{got[2]} answer(s)")


if __name__ == "__main__":
    main()
