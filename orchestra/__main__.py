"""``python -m orchestra``: the ``orchestra`` command (_cli/main.py), for where the console
script is not on PATH."""
import sys

from ._cli.main import main

if __name__ == "__main__":
    sys.exit(main())
