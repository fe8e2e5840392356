"""The directory ``orchestra.compat.ray.install()`` puts on sys.path and $PYTHONPATH: it
holds a package named ``ray`` whose import installs orchestra's Ray names, so that the
processes a Ray script starts itself (a ``multiprocessing`` or ``ProcessPoolExecutor``
pool with the spawn or forkserver method, a ``subprocess`` running Python) resolve
``import ray`` as the script does."""
import os

PATH = os.path.dirname(os.path.abspath(__file__))
