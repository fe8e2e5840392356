"""The dashboard's page as the files it ships as (orchestra/_observe/dashboard_assets/):
installed with the package, checked as what they are (the HTML parsed, the script by
Node.js where it is installed), and inlined into the one page the dashboard serves with
a Content-Security-Policy that pins exactly what was inlined.
"""
from __future__ import annotations

import base64
import hashlib
import html.parser
import importlib.resources
import re
import shutil
import subprocess

import pytest

from orchestra._observe import dashboard_page

pytestmark = pytest.mark.timeout(60)

NAMES = ("dashboard.html", "dashboard.css", "dashboard.js")
VOID = {"meta", "link", "input", "br", "img", "hr", "col", "source", "wbr"}


def asset(name: str) -> str:
    return (importlib.resources.files("orchestra._observe") / "dashboard_assets" / name
            ).read_text(encoding="utf-8")


class _Page(html.parser.HTMLParser):
    """The page's ids, data-view names and whether every element it opens is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.views: list[str] = []
        self.open: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            if found["id"] in self.ids:
                self.errors.append(f"id {found['id']!r} twice")
            self.ids.add(str(found["id"]))
        if found.get("data-view"):
            self.views.append(str(found["data-view"]))
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.open[-1] if self.open else None}>")
            return
        self.open.pop()


def parsed(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


def test_the_page_is_installed_with_the_package_as_files() -> None:
    for name in NAMES:
        assert len(asset(name)) > 1000, name
    assert dashboard_page.SCRIPT == asset("dashboard.js")
    assert dashboard_page.STYLE == asset("dashboard.css")


def test_the_html_closes_every_element_and_names_each_id_once() -> None:
    page = parsed(asset("dashboard.html"))
    assert page.errors == [] and page.open == []
    # it links its style and script as files, so that it opens as it is from the tree
    assert asset("dashboard.html").count('href="dashboard.css"') == 1
    assert asset("dashboard.html").count('src="dashboard.js"') == 1


def test_every_element_the_script_looks_up_by_a_literal_id_is_in_the_page() -> None:
    script, page = asset("dashboard.js"), parsed(asset("dashboard.html"))
    wanted = set(re.findall(r'\$\("([\w-]+)"\)', script))
    wanted |= set(re.findall(r'getElementById\("([\w-]+)"\)', script))
    assert len(wanted) > 30   # the pattern still finds the script's lookups
    assert sorted(wanted - page.ids) == []
    # each view the navigation offers is one the script knows, and has its section
    views = re.search(r"const VIEWS = \[(.*?)\];", script)
    assert views is not None
    known = re.findall(r'"(\w+)"', views.group(1))
    assert sorted(page.views) == sorted(known)
    assert all(f"view-{v}" in page.ids for v in known)


def test_the_script_is_valid_javascript() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed here (the Chromium test loads the page in CI)")
    js = dashboard_page.ASSETS / "dashboard.js"
    proc = subprocess.run([node, "--check", str(js)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_the_served_page_inlines_the_files_and_its_policy_pins_them() -> None:
    page = dashboard_page.PAGE.decode()
    assert f"<style>{asset('dashboard.css')}</style>" in page
    assert f"<script>{asset('dashboard.js')}</script>" in page
    assert "dashboard.css" not in page.replace("dashboard_page.py", "")   # nothing to fetch
    assert 'src="dashboard.js"' not in page
    assert parsed(page).errors == []

    def sha(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    assert f"script-src {sha(asset('dashboard.js'))};" in dashboard_page.CSP
    assert f"style-src {sha(asset('dashboard.css'))};" in dashboard_page.CSP
