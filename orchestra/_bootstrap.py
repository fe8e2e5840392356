"""The head process's entry point: ``python -c BOOTSTRAP <config> <head socket>``.

It starts the fork server (orchestra/_zygote.py) before anything else, so that the fork
server's imports (~0.2 s) run while the head imports its own instead of after them:
the first task finds its workers ready ~0.2 s sooner (7 ms instead of 0.23 s after
init() returns, on 2 cores). Nothing of orchestra is imported before the fork, and
this module imports nothing, so that init() can read the text cheaply.
"""

BOOTSTRAP = """\
import os, subprocess, sys
os.umask(0o077)
req_r, req_w = os.pipe()
rep_r, rep_w = os.pipe()
try:
    started = (subprocess.Popen(
        [sys.executable, "-m", "orchestra._zygote", sys.argv[2], str(req_r), str(rep_w)],
        stdin=subprocess.DEVNULL, pass_fds=(req_r, rep_w)), req_w, rep_r)
except OSError:
    started = None   # the head starts workers by exec instead
os.close(req_r)
os.close(rep_w)
from orchestra import _head
_head.main([sys.argv[1]], zygote=started)
"""
