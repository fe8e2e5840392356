"""The dashboard's one page, served with its CSS and JavaScript inline (no CDN: clusters
run offline), and the Content-Security-Policy that lets only that script and that style
run (by their hashes), fetching from its own origin only.

The page is package data, files of what they are, in ``dashboard_assets/``:

    dashboard.html   the page, which links the two below (it opens as it is, from the tree)
    dashboard.css    its style
    dashboard.js     its script: polls api/summary every 1 s and the shown view's api/NAME

    views, one shown at a time (location.hash): overview (the summary: cards, tasks and
    actors by state, resources, nodes), actors, tasks, task stream, nodes over time,
    objects, logs, drivers, user metrics. Text goes in with textContent, never as HTML;
    charts and the task stream are drawn on canvases.

Read once, when the dashboard first serves its page (this module is imported then).
"""
from __future__ import annotations

import base64
import hashlib
import pathlib

ASSETS = pathlib.Path(__file__).with_name("dashboard_assets")
STYLE_LINK = '<link rel="stylesheet" href="dashboard.css">'
SCRIPT_TAG = '<script src="dashboard.js"></script>'


def _read(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


STYLE = _read("dashboard.css")
SCRIPT = _read("dashboard.js")
_HTML = _read("dashboard.html")
# Inlined as they are: neither may close its own element early, and the page links each
# once (tests/unit/test_dashboard_assets.py checks the files; this, what was installed).
if ("</style" in STYLE.lower() or "</script" in SCRIPT.lower()
        or _HTML.count(STYLE_LINK) != 1 or _HTML.count(SCRIPT_TAG) != 1):
    raise RuntimeError(f"the dashboard's page in {ASSETS} is damaged: reinstall orchestra")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE = (_HTML.replace(STYLE_LINK, f"<style>{STYLE}</style>")
        .replace(SCRIPT_TAG, f"<script>{SCRIPT}</script>").encode())

# Only this page's own script and style run; it fetches from its own origin only; no
# frame may embed it, and no form or base URL goes elsewhere.
CSP = (f"default-src 'none'; script-src {_sha256(SCRIPT)}; style-src {_sha256(STYLE)}; "
       "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
