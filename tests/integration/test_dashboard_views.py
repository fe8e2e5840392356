"""The dashboard's views on a two-node cluster (a head node and a joined node on this
machine): actors by name with their node, failed tasks with their error and traceback,
the live task stream, nodes over time, objects, a worker's log, drivers and user
metrics; over HTTP, and in headless Chromium (the system's, driven with Playwright;
skipped with the reason where either is absent). Names and messages from user code are
shown as text, never as markup.

With ORCHESTRA_DASHBOARD_SHOTS=DIR the browser test leaves a screenshot of each view
there (the docs' images come from it)."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import _helpers as h
import orchestra
from orchestra.util.metrics import Counter, Histogram
from orchestra.util.scheduling_strategies import NodeAffinitySchedulingStrategy

pytestmark = pytest.mark.timeout(180)

EVIL = "<img src=x onerror=alert(1)>"
METRIC_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
                         r'(-?[0-9.e+]+|NaN|[+-]Inf)$')

requests_total = Counter("app_requests", "Requests served.", tag_keys=("route",))
latency = Histogram("app_latency_s", "Request latency.", boundaries=[0.01, 0.1, 1.0])


@orchestra.remote
class Greeter:
    def hello(self, who: str) -> int:
        print(f"hello {who} from the greeter")
        return os.getpid()


@orchestra.remote
class Doomed:
    def ping(self) -> int:
        return 1


@orchestra.remote
def explode(x: int) -> int:
    raise ValueError(f"kaboom <b>{x}</b>")


@orchestra.remote
def step(i: int) -> int:
    requests_total.inc(tags={"route": "/a" if i % 2 else '/b"\\\n</script>'})
    latency.observe(0.005 * (i % 5))
    time.sleep(0.01)
    return i


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=20) as r:
        body = r.read()
    return json.loads(body) if r.headers.get_content_type() == "application/json" else body.decode()


def wait_for(fn: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not come within {timeout:g} s")
        time.sleep(0.2)


class Scene:
    """What the module's cluster ran, for the tests to find on the dashboard."""
    url: str
    head_node: str
    other_node: str
    greeter_pid: int
    big: Any
    steps: list[int]

    def run_steps(self, n: int) -> None:
        """Run step() n times (counted: the metrics test knows what was recorded)."""
        assert orchestra.get([step.remote(i) for i in range(n)]) == list(range(n))
        self.steps.extend(range(n))


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    with h.joined_cluster({"num_cpus": 1}, {"num_cpus": 2}) as (c, node):
        s = Scene()
        info = orchestra.init(address=c.address, token=c.token, ignore_reinit_error=True)
        s.url = info["dashboard_url"]
        assert s.url, "the head serves no dashboard"
        s.head_node = orchestra.get_runtime_context().get_node_id()
        s.other_node = next(n["NodeID"] for n in orchestra.nodes() if n["NodeID"] != s.head_node)
        on_other = NodeAffinitySchedulingStrategy(s.other_node, soft=False)
        greeter = Greeter.options(name=EVIL, scheduling_strategy=on_other).remote()
        s.greeter_pid = orchestra.get(greeter.hello.remote("dashboard"))
        doomed = Doomed.remote()
        orchestra.get(doomed.ping.remote())
        orchestra.kill(doomed)
        with pytest.raises(ValueError):
            orchestra.get(explode.remote(7))
        s.steps = []
        s.run_steps(300)
        s.big = orchestra.put(b"x" * (3 << 20))
        wait_for(lambda: get(s.url + "api/summary")["tasks"].get("FAILED", 0) >= 1,
                 "the failed task in the summary")
        yield s
        del greeter


def test_actors_show_by_name_with_node_pid_and_the_cause_of_death(scene: Scene) -> None:
    rows = wait_for(lambda: [a for a in get(scene.url + "api/actors")["actors"]
                             if a["state"] == "DEAD" or a["name"] == EVIL], "the actors")
    greeter = next(a for a in rows if a["name"] == EVIL)
    assert greeter["class_name"] == "Greeter" and greeter["state"] == "ALIVE"
    assert greeter["node_id"] == scene.other_node and greeter["pid"] == scene.greeter_pid
    dead = wait_for(lambda: [a for a in get(scene.url + "api/actors")["actors"]
                             if a["class_name"] == "Doomed" and a["state"] == "DEAD"], "the dead actor")
    assert "kill" in dead[0]["cause"]


def test_failed_tasks_come_first_with_their_error_and_traceback(scene: Scene) -> None:
    tasks = wait_for(lambda: [t for t in get(scene.url + "api/tasks")["tasks"]
                              if t["state"] == "FAILED" and t.get("error_message")], "the error")
    first = get(scene.url + "api/tasks")["tasks"][0]
    assert first["state"] == "FAILED"
    t = tasks[0]
    assert t["name"].endswith("explode") and t["error_type"] == "ValueError"
    assert t["error_message"] == "kaboom <b>7</b>"
    detail = get(scene.url + f"api/task?id={t['task_id']}")["task"]
    assert "raise ValueError" in detail["traceback"] and "kaboom <b>7</b>" in detail["traceback"]

    def counted() -> Any:   # the workers report what they ran about twice a second
        only = get(scene.url + "api/tasks?state=FINISHED&name=step")
        by_fn = {f["name"]: f["counts"] for f in only["by_function"]}
        return any(k.endswith("step") and v.get("FINISHED", 0) >= 300
                   for k, v in by_fn.items()) and only
    only = wait_for(counted, "300 finished steps counted")
    assert only["tasks"] and {x["state"] for x in only["tasks"]} == {"FINISHED"}
    assert {x["name"].rsplit(".", 1)[-1] for x in only["tasks"]} == {"step"}


def test_the_task_stream_sends_what_changed_since_the_last_poll(scene: Scene) -> None:
    first = get(scene.url + "api/stream?since=0")
    assert first["reset"] and sum(t[5] for t in first["tasks"]) >= 300   # bars count their tasks
    nodes = {w.split(":")[0] for w in first["workers"]}
    assert nodes == {scene.head_node, scene.other_node}, first["workers"]
    scene.run_steps(7)
    later = wait_for(lambda: (d := get(scene.url + f"api/stream?since={first['seq']}"))["tasks"]
                     and sum(t[5] for t in d["tasks"] if t[3] is not None) >= 7 and d, "the new tasks")
    assert not later["reset"] and 7 <= sum(t[5] for t in later["tasks"]) < 20, later
    assert later["names"] == [n for n in later["names"] if n.endswith("step")]


def test_nodes_over_time_chart_each_node(scene: Scene) -> None:
    d = wait_for(lambda: (d := get(scene.url + "api/history?since=0"))
                 and all(len(d["series"].get(f"node:{n}:store", [])) >= 2
                         for n in (scene.head_node, scene.other_node)) and d, "two samples")
    for n in (scene.head_node, scene.other_node):
        for key in ("cpu", "mem", "store", "spilled", "alive"):
            assert f"node:{n}:{key}" in d["series"]
    assert max(v for _, v in d["series"][f"node:{scene.other_node}:mem"]) > 10 << 20
    newer = get(scene.url + f"api/history?since={d['time']}")
    assert all(p[0] > d["time"] for pts in newer["series"].values() for p in pts)


def test_objects_drivers_and_a_workers_log(scene: Scene) -> None:
    objs = get(scene.url + "api/objects")["objects"]
    big = next(o for o in objs if o["object_id"] == scene.big.hex())
    assert big["size"] >= 3 << 20 and big["holders"][0]["pid"] == os.getpid()
    drivers = get(scene.url + "api/drivers")["drivers"]   # the jobs, newest first
    me = next(d for d in drivers if d["pid"] == os.getpid())
    assert me["tasks"].get("FINISHED", 0) >= 300 and me["tasks"].get("FAILED", 0) >= 1
    assert me["status"] == "RUNNING" and me["end_time_ms"] is None and me["entrypoint"]
    log = wait_for(lambda: (d := get(scene.url + f"api/logs?pid={scene.greeter_pid}"))
                   .get("out", {}).get("text") and d, "the greeter's log")
    assert "hello dashboard from the greeter" in log["out"]["text"]
    assert "--- actor Greeter" in log["out"]["text"]   # markers as `orchestra logs` shows them
    again = get(scene.url + f"api/logs?pid={scene.greeter_pid}&offset_out={log['out']['offset']}"
                f"&offset_err={log['err']['offset']}")
    assert again["out"]["text"] == ""   # follow: only what was added since
    assert "no log" in get(scene.url + "api/logs?pid=1")["error"]


def test_user_metrics_are_exported_with_their_types_and_escaped(scene: Scene) -> None:
    odd = sum(1 for i in scene.steps if i % 2)
    count = f"app_latency_s_count {float(len(scene.steps))}"
    text = wait_for(lambda: (t := get(scene.url + "metrics")) and count in t.splitlines() and t,
                    "every step's metrics")   # each process reports about once a second
    lines = text.splitlines()
    assert "# TYPE app_requests_total counter" in lines and "# TYPE app_latency_s histogram" in lines
    assert f'app_requests_total{{route="/a"}} {float(odd)}' in lines
    assert f'app_requests_total{{route="/b\\"\\\\\\n</script>"}} {float(len(scene.steps) - odd)}' in lines
    assert all(ln.startswith("#") or METRIC_LINE.match(ln) for ln in lines if ln), text
    rows = get(scene.url + "api/metrics")["metrics"]
    assert {r["name"] for r in rows} == {"app_requests", "app_latency_s"}


# ---------------------------------------------------------------------------- the browser

def _chromium() -> str | None:
    return next((p for n in ("chromium", "chromium-browser", "google-chrome")
                 if (p := shutil.which(n))), None)


def _playwright() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    return sync_playwright


@pytest.mark.skipif(_chromium() is None, reason="Chromium is not installed here "
                    "(Debian: apt-get install chromium); .ci/run installs it as root")
@pytest.mark.skipif(_playwright() is None, reason="playwright is not installed (pip install "
                    "playwright; it is in the test extras)")
def test_the_views_in_chromium(scene: Scene, tmp_path: Path) -> None:
    shots = Path(os.environ.get("ORCHESTRA_DASHBOARD_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with _playwright()() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        # bypass_csp: the test's own waits evaluate strings (eval, which the page's CSP
        # forbids); it also means markup put in the page would run, so the checks below
        # see the page's own escaping, not the CSP's backstop.
        page = browser.new_page(viewport={"width": 1280, "height": 800}, bypass_csp=True)
        dialogs: list[str] = []
        errors: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("pageerror", lambda e: errors.append(str(e)))

        def view(name: str) -> None:
            page.goto(scene.url + "#" + name)
            page.wait_for_selector(f"body[data-view='{name}']", timeout=20_000)

        page.goto(scene.url)
        page.wait_for_selector("body[data-loaded='1']")
        page.screenshot(path=str(shots / "dashboard-overview.png"))

        view("actors")   # the actor by its name, as text; its node
        row = page.locator("#actor-rows tr", has_text="Greeter")
        assert row.locator("td").nth(2).text_content() == EVIL
        assert scene.other_node in (row.text_content() or "")
        assert page.locator("#actor-rows img").count() == 0
        page.screenshot(path=str(shots / "dashboard-actors.png"))

        view("tasks")    # the failed task first; a click shows its traceback
        failed = page.locator("#task-rows tr.failed").first
        assert "kaboom <b>7</b>" in (failed.text_content() or "")
        failed.click()
        page.wait_for_selector("#traceback-box:not([hidden])")
        assert "raise ValueError" in (page.text_content("#traceback") or "")
        assert page.locator("#task-rows b").count() == 0
        page.screenshot(path=str(shots / "dashboard-tasks.png"))

        scene.run_steps(50)
        view("stream")   # bars on the canvas, one row per worker; hovering shows the task
        page.wait_for_function("stream.drawn > 0")
        x, y = page.evaluate("(() => { const r = document.getElementById('stream-canvas')"
                             ".getBoundingClientRect(); const hh = stream.hits[stream.hits.length - 1];"
                             " return [r.left + hh[0] + hh[2] / 2, r.top + hh[1] + 5]; })()")
        page.mouse.move(x, y)
        page.wait_for_selector("#stream-tip:not([hidden])")
        assert "step" in (page.text_content("#stream-tip") or "")
        assert page.evaluate("stream.workers.length") >= 2
        page.screenshot(path=str(shots / "dashboard-stream.png"))

        view("nodes")    # a card of charts per node
        page.wait_for_function("document.querySelectorAll('#node-charts .nodecard').length >= 2")
        for n in (scene.head_node, scene.other_node):
            assert page.locator(f"#node-charts [data-node='{n}'] canvas").count() == 4
        page.screenshot(path=str(shots / "dashboard-nodes.png"))

        page.goto(scene.url + f"#logs:{scene.greeter_pid}")
        try:
            page.wait_for_function("document.getElementById('log-out').textContent"
                                   ".includes('hello dashboard from the greeter')", timeout=20_000)
        except Exception as exc:
            raise AssertionError(f"no log line in the page: {page.text_content('#log-note')!r}, "
                                 f"{page.text_content('#log-out')!r}") from exc
        page.screenshot(path=str(shots / "dashboard-logs.png"))

        view("metrics")
        page.wait_for_selector("#metric-charts [data-metric]")
        assert page.locator("#metric-rows tr").count() >= 3
        assert page.locator("#metric-rows script").count() == 0
        page.screenshot(path=str(shots / "dashboard-metrics.png"))
        for name in ("objects", "drivers"):
            view(name)
            page.screenshot(path=str(shots / f"dashboard-{name}.png"))
        browser.close()
    assert dialogs == [] and errors == [], (dialogs, errors)
