"""The entry points of the processes that own a fork server: the head's
(``python -c BOOTSTRAP <config> <head socket>``) and, when the node runs in a process of
its own, the node's (``python -c NODE_BOOTSTRAP <config> <head socket> <node socket>
<node id>``).

It starts the fork server (orchestra/_worker/zygote.py) before anything else, so that the fork
server's imports (~0.2 s) run while the head imports its own instead of after them:
the first task finds its workers ready ~0.2 s sooner (7 ms instead of 0.23 s after
init() returns, on 2 cores). Nothing of orchestra is imported before the fork, and
this module imports nothing, so that init() can read the text cheaply. The fork
server's workers connect to the head socket (argv[2]) in both cases.
"""

_START_ZYGOTE = """\
import os, subprocess, sys
os.umask(0o077)
req_r, req_w = os.pipe()
rep_r, rep_w = os.pipe()
try:
    started = (subprocess.Popen(
        [sys.executable, "-m", "orchestra._worker.zygote", sys.argv[2], str(req_r), str(rep_w)],
        stdin=subprocess.DEVNULL, pass_fds=(req_r, rep_w)), req_w, rep_r)
except OSError:
    started = None   # workers are started by exec instead
os.close(req_r)
os.close(rep_w)
"""

# The head and the node process use none of the public API's modules (the client,
# actors, gangs, cloudpickle's users): the package is loaded without running its
# __init__, which imports them all. The head then imports ~0.08 s less on init()'s path.
_BARE_PACKAGE = """\
import importlib.util
_spec = importlib.util.find_spec("orchestra")
sys.modules["orchestra"] = importlib.util.module_from_spec(_spec)
"""

BOOTSTRAP = _START_ZYGOTE + _BARE_PACKAGE + """\
from orchestra._head import process as _head
_head.main([sys.argv[1]], zygote=started)
"""

# A node joining a cluster (orchestra start --address): it starts its fork server once
# it holds the token (orchestra/_node/process.py), with the package loaded bare too.
JOIN_BOOTSTRAP = "import sys\n" + _BARE_PACKAGE + """\
from orchestra._node import process as _node_process
_node_process.main(sys.argv[1:])
"""

NODE_BOOTSTRAP = _START_ZYGOTE + _BARE_PACKAGE + """\
from orchestra._node import process as _node_process
_node_process.main(sys.argv[1:], zygote=started)
"""
